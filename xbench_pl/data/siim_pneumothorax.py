"""SIIM-ACR Pneumothorax Segmentation (Kaggle 2019): the labelled stage-1 train set.

Layout as downloaded (e.g. the Kaggle mirror ``siim-acr-pneumothorax-segmentation-data``)::

    root/dicom-images-train/<StudyUID>/<SeriesUID>/<SOPInstanceUID>.dcm   1024², JPEG Baseline
    root/train-rle.csv                                                    ImageId, EncodedPixels

The DICOM tree is walked and files are keyed by stem (the ``ImageId``). The CSV header has a
leading space (``" EncodedPixels"``); one row per pneumothorax instance; ``-1`` marks a
negative image. Masks are **relative** run-length encoded, **column-major**: (gap, run)
pairs, each gap counted from the end of the previous run (the first from pixel 0), over the
pixels in column order; decoded as a flat array reshaped to ``(W, H)`` and transposed.
Instances of an image are united. The one class is ``Pneumothorax``.

Default evaluation set: every image of ``train-rle.csv``, **12,047 images: 2,669 positive
(3,576 instance rows) and 9,378 negative**, so AUROC/AUPRC are defined; ``split_file``
restricts it (XBench's SIIM split is not public).

Bad input: an empty ImageId, an encoding that is not an even list of non-negative integers
(runs >= 1), a mask overrunning its image (found at setup), or a ``-1`` row for an image
that also has instance rows is an error naming file and row (a counted skip with
``on_error='skip'``); exact duplicate rows are dropped and recorded. An ImageId with no
DICOM in the tree is a missing image.
"""

from __future__ import annotations

from typing import Literal

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import numpy as np

from xbench_pl.data.annotations import ImageIndex
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import DataError
from xbench_pl.data.io import Report, drop_duplicate_rows, raise_error, read_table
from xbench_pl.data.regions import Mask
from xbench_pl.data.synthetic import ensure_demo
from xbench_pl.data.vocabulary import dataset_classes
from xbench_pl.registry import lightning_datamodules

RLE_TABLE = "train-rle.csv"
COLUMNS = ("ImageId", "EncodedPixels")
NEGATIVE = "-1"
(PNEUMOTHORAX,) = dataset_classes("siim_pneumothorax")


@dataclass(frozen=True)
class RelativeRLEMask:
    """One SIIM instance mask, kept as its (gap, run) pairs; decoded when rasterised."""

    pairs: tuple[int, ...]

    def decode(self, height: int, width: int) -> np.ndarray:
        """Binary ``[H, W]`` mask; ``ValueError`` if the runs overrun ``H * W`` pixels."""
        flat = np.zeros(height * width, dtype=bool)
        position = 0
        for gap, run in zip(self.pairs[::2], self.pairs[1::2]):
            position += gap
            if position + run > flat.size:
                raise ValueError(f"run-length mask overruns the {width}x{height} image (pixel {position + run})")
            flat[position : position + run] = True
            position += run
        return flat.reshape(width, height).T

    def rasterize(self, height: int, width: int, eval_size: int) -> np.ndarray:
        return Mask(self.decode(height, width)).rasterize(height, width, eval_size)


def parse_rle(encoded: str) -> RelativeRLEMask:
    try:
        pairs = tuple(int(v) for v in encoded.split())
    except ValueError:
        raise ValueError(f"EncodedPixels {encoded[:40]!r} is not a list of integers") from None
    if not pairs or len(pairs) % 2 or min(pairs[::2]) < 0 or min(pairs[1::2]) < 1:
        raise ValueError(f"EncodedPixels {encoded[:40]!r} is not (gap >= 0, run >= 1) pairs")
    return RelativeRLEMask(pairs)


def parse_siim_rle(table_path: str | Path, image_path: Callable[[str], Path], report: Report = raise_error) -> list[Record]:
    """Records of ``train-rle.csv`` (``.gz`` too), one per ImageId, image at ``image_path(ImageId)``;
    bad rows go to ``report`` and are left out."""
    table_path = Path(table_path)
    table = drop_duplicate_rows(read_table(table_path, COLUMNS), COLUMNS, table_path, report)
    records: dict[str, Record] = {}
    negative_rows: dict[str, int] = {}
    for row in table.itertuples(index=False):
        try:
            if not row.ImageId:
                raise ValueError("empty ImageId")
            mask = None if row.EncodedPixels == NEGATIVE else parse_rle(row.EncodedPixels)
            record = records.get(row.ImageId)
            if record is None:
                path = image_path(row.ImageId)
                record = records[row.ImageId] = Record(row.ImageId, path, {PNEUMOTHORAX: 0}, {}, f"{table_path}, row {row.row}")
        except DataError as error:
            report(error)
            continue
        except ValueError as error:
            report(DataError(table_path, str(error), row=row.row))
            continue
        if mask is None:
            negative_rows[row.ImageId] = row.row
        else:
            record.labels[PNEUMOTHORAX] = 1
            record.add_region(PNEUMOTHORAX, mask, table_path, row.row)
    for image_id, row in negative_rows.items():
        if records[image_id].labels[PNEUMOTHORAX]:
            report(DataError(table_path, f"-1 (no pneumothorax) row for {image_id}, which has instance rows", row=row))
    return list(records.values())


#: the evaluation sets (``xbench_pl/data/sources.yaml``), as a type so that a wrong name is refused while parsing
Split = Literal["all", "positives"]


class SIIMPneumothoraxData(XBenchData):
    name = "siim_pneumothorax"
    default_classes = (PNEUMOTHORAX,)
    dicom_groups = True  # sex, age, view from each DICOM header (setup's image check)

    def __init__(self, root: str | None = None, split: Split | None = None, **kwargs):
        super().__init__(root=root, split=split, **kwargs)

    def load_records(self) -> list[Record]:
        self.checked_root(f"{RLE_TABLE} and the DICOM images")
        # a missing ImageId maps to a path that does not exist: setup reports it as a missing image
        dicoms = ImageIndex(self.root, "**/*.dcm", key=attrgetter("stem"))
        return parse_siim_rle(self.root / RLE_TABLE, dicoms.get, self.report)


class DemoDicomData(SIIMPneumothoraxData):
    """The synthetic demo in SIIM format (not patient data).

    6 generated 512² JPEG-Baseline DICOMs read by the SIIM reader, 3 with pneumothorax (one
    bilateral: two RLE rows) and 3 negatives.

    Args:
        root: the demo folder; generated there on first use if missing or empty
            (default: the user cache, see ``synthetic.ensure_demo``).
        seed: the generator's seed.
        **kwargs: ``XBenchData`` arguments.
    """

    name = "demo_dicom"

    def __init__(self, root: str | None = None, seed: int = 0, **kwargs):
        super().__init__(root=root, **kwargs)
        self.demo_root, self.seed = root, seed

    def load_records(self) -> list[Record]:
        self.root = ensure_demo(self.demo_root, self.seed) / "siim"
        return super().load_records()

#: ``SIIMPneumothoraxDataModule`` and ``DemoDicomDataModule``: the ``LightningDataModule`` of each, built on first use
#: (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(SIIMPneumothoraxData, DemoDicomData)
