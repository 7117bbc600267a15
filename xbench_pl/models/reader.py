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

An image the file does not have gets zero maps and scores (the reader marked nothing).

CheXlocalize-comparable mode (``--model.cxl true``): the reader is judged as CheXlocalize's
``eval.py --if_human_benchmark`` judges its human benchmark (``metrics/chexlocalize.py``,
``reader_pair``), not through a resampled eval-grid map: its annotation is drawn at each image's full
resolution (``regions.rasterize_original``, the ground truth's own rule there) and is itself the
segmentation of ``cxl_miou``/``cxl_miou_all`` (no Otsu, no contour filling). ``cxl_hit_rate``: with
``--model.salient_points hb_salient_pt_test.json`` (``{cxr_id: {task: [[x, y], ...]}}``, task names as
CheXlocalize spells them) their human-benchmark hit: 1 where any of the reader's salient points of the
finding lies in the ground truth (row ``int(y)``, column ``int(x)``), 0 where none does or the reader
gave none, not counted where the ground truth has no region of the finding; without that file, the
annotation's first marked pixel (row-major) as a model's map would be judged (not CheXlocalize's
human benchmark). A prediction store of a reader run holds its eval-grid maps; a run resumed from one
replays them into the reader itself, whose ``update_cxl`` draws each stored image's annotation at full
resolution as the run does, so the cxl keys equal an uninterrupted run's. ``score`` on its store judges the
stored maps as any model's (no reader, no annotation).
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
from xbench_pl.data.chexlocalize import CheXlocalizeData
from xbench_pl.data.errors import DataError
from xbench_pl.data.regions import Region, rasterize_original, rasterize_union
from xbench_pl.data.vindr_cxr import parse_vindr_reader_boxes, reader_item_id
from xbench_pl.data.vocabulary import canonical
from xbench_pl.external_boxes import eval_grid_affine
from xbench_pl.geometry import Preprocess
from xbench_pl.metrics.chexlocalize import reader_pair, region_mask
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput

# Lightning's note that the model's (the reader's) on_after_batch_transfer is used with a datamodule: that is the design
warnings.filterwarnings("ignore", message=r"You have overridden `on_after_batch_transfer` in `LightningModule` but have passed")

#: per item id, per canonical finding: the reader's regions in original pixels
Annotations = dict[str, dict[str, list[Region]]]
#: per cxr id, per canonical finding: the reader's most salient points ``(x, y)`` in original pixels
SalientPoints = dict[str, dict[str, list[tuple[float, float]]]]


def chexlocalize_tasks(path: Path):
    """``(image_id, task, finding, value)`` of each task of a CheXlocalize JSON ``{cxr_id: {task: value}}`` (their
    ``img_size`` entries skipped); a malformed entry or unknown task is a ``DataError`` naming the file and entry."""
    for image_id, tasks in read_json(path, dict).items():
        if not isinstance(tasks, dict):
            raise DataError(path, f"expected an object of tasks, got {type(tasks).__name__}", row=image_id)
        for task, value in tasks.items():
            if task == "img_size":
                continue
            try:
                finding = canonical(task, "chexlocalize")
            except KeyError as error:
                raise DataError(path, str(error).strip('"'), row=f"{image_id} / {task}") from None
            yield image_id, task, finding, value


def read_chexlocalize_annotations(path: Path) -> Annotations:
    """A CheXlocalize RLE (``{"size", "counts"}``) or polygon (``[[[x, y], ...], ...]``) JSON as ``Annotations``."""
    out: Annotations = {}
    for image_id, task, finding, value in chexlocalize_tasks(path):
        try:
            read = CheXlocalizeData.read_annotation if isinstance(value, list) else CheXlocalizeData.read_segmentation
            regions = read(value)
        except (KeyError, ValueError, TypeError) as error:
            raise DataError(path, str(error).strip('"'), row=f"{image_id} / {task}") from None
        if regions:
            out.setdefault(image_id, {}).setdefault(finding, []).extend(regions)
    return out


def read_salient_points(path: str | Path) -> SalientPoints:
    """CheXlocalize's ``hb_salient_pt_test.json`` (``{cxr_id: {task: [[x, y], ...]}}``) as ``SalientPoints``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "salient point file not found")
    out: SalientPoints = {}
    for image_id, task, finding, points in chexlocalize_tasks(path):
        if not isinstance(points, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)
                for p in points):
            raise DataError(path, "expected a list of [x, y] points", row=f"{image_id} / {task}")
        out.setdefault(image_id, {}).setdefault(finding, []).extend((float(x), float(y)) for x, y in points)
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
        annotations: the reader's annotation file (module docstring); required unless ``random_init`` (a stand-in
            reader who marked nothing).
        salient_points: CheXlocalize's ``hb_salient_pt_test.json``: the reader's ``cxl_hit_rate`` by their
            human-benchmark hit rule (needs ``cxl=True``).
        random_init: without ``annotations``, smoke-test the set-up with a reader who marked nothing (reports say so).
        **kwargs: ``ZeroShotModel`` arguments.
    """

    def __init__(self, annotations: str | None = None, salient_points: str | None = None, random_init: bool = False, **kwargs):
        super().__init__(**kwargs)
        if self.trust:
            raise ValueError("reader: trust measures test a model's maps against its weights and inputs; a reader's "
                             "annotation has neither (leave --model.trust out)")
        if annotations is None and not random_init:
            raise ValueError("reader needs annotations=FILE: CheXlocalize's hb_segmentations_test.json or VinDr-CXR's "
                             "annotations_train.csv (or random_init=True for a smoke test)")
        self.annotations = None if annotations is None else str(annotations)
        if annotations is None:
            self.regions = self.stand_in("reader who marked nothing", {})
            self.warn_random_weights()
        else:
            self.regions = read_annotations(annotations)
        if salient_points is not None and not self.cxl:
            raise ValueError("reader: salient_points is read by the CheXlocalize-comparable mode only: set cxl=True "
                             "(--model.cxl true)")
        self.salient_points_file = None if salient_points is None else str(salient_points)
        self.salient_points = None if salient_points is None else read_salient_points(salient_points)
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

    def drawn(self, image_id: str, finding: str, height: int, width: int, draw, *args) -> np.ndarray:
        """``draw(regions, height, width, *args)`` of the reader's regions of ``finding`` in ``image_id`` (a
        ``regions`` rasteriser); regions that do not fit the image are a ``DataError`` naming the annotation file."""
        try:
            return draw(self.regions.get(image_id, {}).get(finding, []), height, width, *args)
        except ValueError as error:
            raise DataError(self.annotations, f"does not fit the {width}x{height} image: {error}",
                            row=f"{image_id} / {finding}") from None

    def reader_map(self, image_id: str, finding: str, height: int, width: int, size: int) -> np.ndarray:
        """``[E, E]`` bool: the reader's regions of ``finding`` in ``image_id`` on its eval grid."""
        return self.drawn(image_id, finding, height, width, rasterize_union, size)

    def batch_output(self, batch: Batch) -> ZeroShotOutput:
        """Each image's annotation, looked up by its id and drawn on the eval grid at its original size."""
        size = batch.images.shape[-1]
        maps = np.stack([np.stack([self.reader_map(image_id, c, h, w, size) for c in batch.classes])
                         for image_id, (h, w) in zip(batch.image_ids, batch.original_size.tolist())])
        saliency = torch.from_numpy(maps).to(batch.images.device, torch.float32)
        return ZeroShotOutput(scores=saliency.flatten(2).amax(2), saliency=saliency)

    def update_cxl(self, batch: Batch, saliency: torch.Tensor, units: torch.Tensor) -> None:
        """The cxl keys of every finding of the batch's counted images from the annotation itself at each image's full
        resolution (``reader_pair``; the eval-grid ``saliency`` is not used), pairs in the base class's order."""
        dataset = self.region_dataset(batch)
        counted = batch.counted.nonzero().flatten().cpu().tolist()

        def judged():  # lazily: one full-resolution pair at a time
            for i in counted:
                image_id, (height, width) = batch.image_ids[i], batch.original_size[i].tolist()
                record = dataset.records[int(batch.index[i])]
                for c, finding in enumerate(batch.classes):
                    yield self.judge(image_id, finding, region_mask(record.regions.get(finding), height, width), height, width), c

        units = units[torch.tensor(counted, dtype=torch.long)].repeat_interleave(len(batch.classes))
        self.benchmark[batch.dataset].update_cxl(judged(), units.tolist(), judged=True)

    def judge(self, image_id: str, finding: str, region: np.ndarray | None, height: int, width: int) -> tuple[float, float, float]:
        """``reader_pair`` of the reader's annotation of ``finding`` in ``image_id`` at full resolution against ``region``."""
        annotation = self.drawn(image_id, finding, height, width, rasterize_original)
        points = None if self.salient_points is None else self.salient_points.get(image_id, {}).get(finding, ())
        try:
            return reader_pair(annotation, region, points)
        except ValueError as error:
            raise DataError(self.salient_points_file, str(error), row=f"{image_id} / {finding}") from None

    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        raise ValueError("the reader draws each image's annotation by its id: it runs on a Batch (batch_output, test_step)")
