"""The reader ceiling: another radiologist's annotation scored as if it were a model's saliency.

``reader`` (``--model reader --model.annotations FILE``) has no network. For each (image, finding) its
map is the reader's annotation as a binary map (1 inside, 0 outside) and its score is 1 where the
reader marked the finding, else 0; the benchmark judges it unchanged, as any model.

Exact maps. The map is rasterised straight onto the eval grid by the ground truth's own rule
(``regions.rasterize_union``: an eval pixel is inside when its centre is), so a reader whose
annotation equals the ground truth covers exactly its pixels. ``on_after_batch_transfer`` makes the
batch's input the eval grid itself before ``test_step`` and the callbacks see it: its affine becomes
``external_boxes.eval_grid_affine`` (the ``score --boxes`` route, ``GRID_NUDGE`` included) and its
images the squashed image resized to the eval grid (for heatmaps only; the reader reads no pixel), so
``warp_to_eval_grid`` returns each eval pixel's own value.

Annotation files (by suffix):

* ``.json``: CheXlocalize's format, keyed by cxr id: ``hb_segmentations_test.json`` (COCO RLE, as
  ``gt_segmentations_*.json``) or ``hb_annotations_test.json`` (polygons, as ``gt_annotations_*.json``);
  task names as CheXlocalize spells them (``Airspace Opacity`` is Lung Opacity).
* ``.csv``: VinDr-CXR's train table (``annotations_train.csv``, with ``rad_id``), read per reader and
  keyed ``<image_id>@<rad_id>``: the items of ``vindr_cxr`` with ``split=train, readers=split``
  (leave-one-reader-out: reader A's boxes against the other readers' union).

An image the file does not have gets zero maps and scores (the reader marked nothing). In the
CheXlocalize-comparable mode (``cxl``) the full-resolution metrics see the eval-grid map
bilinearly resampled to each image (its pixels, not the annotation's at full resolution), and
CheXlocalize's human-benchmark hit rule (``hb_salient_pt_test.json``) is not implemented.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from xbench_pl.data.annotations import read_json
from xbench_pl.data.base import Batch
from xbench_pl.data.chexlocalize import CheXlocalizeDataModule
from xbench_pl.data.errors import DataError
from xbench_pl.data.regions import Region, rasterize_union
from xbench_pl.data.vindr_cxr import parse_vindr_reader_boxes, reader_item_id
from xbench_pl.data.vocabulary import canonical
from xbench_pl.external_boxes import eval_grid_affine
from xbench_pl.geometry import Preprocess
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput

# Lightning's note that the model's (the reader's) on_after_batch_transfer is used with a datamodule: that is the design
warnings.filterwarnings("ignore", message=r"You have overridden `on_after_batch_transfer` in `LightningModule` but have passed")

#: per item id, per canonical finding: the reader's regions in original pixels
Annotations = dict[str, dict[str, list[Region]]]


def read_chexlocalize_annotations(path: Path) -> Annotations:
    """A CheXlocalize RLE (``{"size", "counts"}``) or polygon (``[[[x, y], ...], ...]``) JSON as ``Annotations``."""
    out: Annotations = {}
    for image_id, tasks in read_json(path, dict).items():
        if not isinstance(tasks, dict):
            raise DataError(path, f"expected an object of tasks, got {type(tasks).__name__}", row=image_id)
        for task, value in tasks.items():
            if task == "img_size":
                continue
            try:
                finding = canonical(task, "chexlocalize")
                read = CheXlocalizeDataModule.read_annotation if isinstance(value, list) else CheXlocalizeDataModule.read_segmentation
                regions = read(value)
            except (KeyError, ValueError, TypeError) as error:
                raise DataError(path, str(error).strip('"'), row=f"{image_id} / {task}") from None
            if regions:
                out.setdefault(image_id, {}).setdefault(finding, []).extend(regions)
    return out


def read_vindr_annotations(path: Path) -> Annotations:
    """A VinDr train table as ``Annotations`` keyed ``reader_item_id(image_id, rad_id)``."""
    out: Annotations = {}
    for image_id, by_reader in parse_vindr_reader_boxes(path).items():
        for rad_id, boxes in by_reader.items():
            item = out.setdefault(reader_item_id(image_id, rad_id), {})
            for finding, box, _ in boxes:
                item.setdefault(finding, []).append(box)
    return out


def read_annotations(path: str | Path) -> Annotations:
    """The reader's annotations of ``path`` (``.json``: CheXlocalize; ``.csv``/``.csv.gz``: VinDr train)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "reader annotation file not found")
    if path.suffix.lower() == ".json":
        return read_chexlocalize_annotations(path)
    if path.name.lower().endswith((".csv", ".csv.gz")):
        return read_vindr_annotations(path)
    raise DataError(path, "a reader annotation file is CheXlocalize's .json (hb_segmentations_test.json) or VinDr's "
                          "train .csv (annotations_train.csv)")


class ReaderModel(ZeroShotModel):
    """Another radiologist's annotation as the map (1 inside, 0 outside) and the score (1 where marked).

    Args:
        annotations: the reader's annotation file (module docstring).
        **kwargs: ``ZeroShotModel`` arguments.
    """

    def __init__(self, annotations: str, **kwargs):
        super().__init__(**kwargs)
        self.annotations = str(annotations)
        self.regions = read_annotations(annotations)
        self.preprocess = Preprocess(resize="squash", size=512)  # the default eval grid: no resize for heatmaps

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """The batch with its input made the eval grid (``eval_grid_affine``): the reader's maps are drawn there."""
        if not isinstance(batch, Batch):
            return batch
        size = batch.region_masks.shape[-1]
        affine = torch.tensor([eval_grid_affine(h, w, size) for h, w in batch.original_size.tolist()],
                              dtype=torch.float64, device=batch.affine.device)
        images = batch.images
        if images.shape[-1] != size:  # the input is the eval grid: test_step and the heatmaps read its size
            images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
        return replace(batch, images=images, affine=affine)

    def reader_map(self, image_id: str, finding: str, height: int, width: int, size: int) -> np.ndarray:
        """``[E, E]`` bool: the reader's regions of ``finding`` in ``image_id`` on its eval grid."""
        regions = self.regions.get(image_id, {}).get(finding, [])
        try:
            return rasterize_union(regions, height, width, size)
        except ValueError as error:
            raise DataError(self.annotations, f"does not fit the {width}x{height} image: {error}",
                            row=f"{image_id} / {finding}") from None

    def batch_output(self, batch: Batch) -> ZeroShotOutput:
        """Each image's annotation, looked up by its id and drawn on the eval grid at its original size."""
        size = batch.images.shape[-1]
        maps = np.stack([np.stack([self.reader_map(image_id, c, h, w, size) for c in batch.classes])
                         for image_id, (h, w) in zip(batch.image_ids, batch.original_size.tolist())])
        saliency = torch.from_numpy(maps).to(batch.images.device, torch.float32)
        return ZeroShotOutput(scores=saliency.flatten(2).amax(2), saliency=saliency)

    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        raise ValueError("the reader draws each image's annotation by its id: it runs on a Batch (batch_output, test_step)")
