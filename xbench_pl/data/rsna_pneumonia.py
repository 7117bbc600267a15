"""RSNA Pneumonia Detection Challenge (Kaggle 2018): the labelled ``stage_2_train`` set.

Layout as downloaded::

    root/stage_2_train_images/<patientId>.dcm     26,684 DICOMs, 1024², 8-bit MONOCHROME2
    root/stage_2_train_labels.csv                 patientId,x,y,width,height,Target

One row per box (0-4 per image); negatives have one row with empty coordinates and
``Target`` 0. Boxes are float **xywh**, top-left origin, in the 1024² stored-pixel frame
(the NIH frame; never PixelSpacing) -> ``Box(x, y, x + w, y + h)``; all boxes of an image
are united. The one class is ``Pneumonia`` (RSNA's positive class is spelled ``Lung Opacity``,
its target is pneumonia).

Default evaluation set: every labelled image, **26,684 images: 6,012 positive (9,555
boxes) and 20,672 negative**. The stage-2 test labels are not public, so stage_2_train is
the only labelled pool; taking all of it needs no arbitrary sampling, and the negatives make
AUROC/AUPRC defined. ``split_file`` restricts it (XBench's own split is not public).

Bad input: a row with a Target other than 0/1, non-numeric/NaN coordinates, a non-positive
size, a positive row without a box or a negative row with one is an error naming file and
row (a counted skip with ``on_error='skip'``: a Target 1 row with a bad box drops only the
box, the image stays positive); exact duplicate rows are dropped and recorded.
"""

from __future__ import annotations

from typing import Literal

from pathlib import Path

from xbench_pl.data.annotations import parse_box
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import UNUSABLE_BOX, DataError
from xbench_pl.data.io import Report, drop_duplicate_rows, raise_error, read_table
from xbench_pl.data.vocabulary import dataset_classes
from xbench_pl.registry import lightning_datamodules

LABEL_TABLE = "stage_2_train_labels.csv"
IMAGE_DIR = "stage_2_train_images"
COLUMNS = ("patientId", "x", "y", "width", "height", "Target")
(PNEUMONIA,) = dataset_classes("rsna_pneumonia")


def parse_rsna_labels(table_path: str | Path, image_dir: str | Path, report: Report = raise_error) -> list[Record]:
    """Records of ``stage_2_train_labels.csv`` (``.zip``/``.gz`` too), one per patientId, images
    at ``image_dir/<patientId>.dcm``; bad rows go to ``report`` and are left out."""
    table_path, image_dir = Path(table_path), Path(image_dir)
    table = drop_duplicate_rows(read_table(table_path, COLUMNS), COLUMNS, table_path, report)
    records: dict[str, Record] = {}
    for row in table.itertuples(index=False):
        coordinates = (row.x, row.y, row.width, row.height)
        try:
            positive = parse_target(row.patientId, row.Target, coordinates)
        except ValueError as error:
            report(DataError(table_path, str(error), row=row.row))
            continue
        record = records.get(row.patientId)
        if record is None:
            path = image_dir / f"{row.patientId}.dcm"
            record = records[row.patientId] = Record(row.patientId, path, {PNEUMONIA: 0}, {}, f"{table_path}, row {row.row}",
                                                    patient_id=row.patientId)
        if not positive:
            continue
        record.labels[PNEUMONIA] = 1  # Target 1: positive whether or not its box parses
        try:
            box = parse_box(coordinates, "xywh")
        except ValueError as error:
            report(DataError(table_path, f"{error} ({UNUSABLE_BOX})", row=row.row))
            continue
        record.add_region(PNEUMONIA, box, table_path, row.row)
    return list(records.values())


def parse_target(patient_id: str, target: str, coordinates: tuple[str, ...]) -> bool:
    """Whether a labels row is positive; ``ValueError`` saying what is wrong."""
    if not patient_id:
        raise ValueError("empty patientId")
    if target == "0" and any(coordinates):
        raise ValueError(f"Target 0 row has box coordinates {coordinates}")
    if target not in ("0", "1"):
        raise ValueError(f"Target {target!r} is not 0 or 1")
    return target == "1"


#: the evaluation sets (``xbench_pl/data/sources.yaml``), as a type so that a wrong name is refused while parsing
Split = Literal["all", "positives"]


class RSNAPneumoniaData(XBenchData):
    name = "rsna_pneumonia"
    default_classes = (PNEUMONIA,)
    dicom_groups = True  # sex, age, view from each DICOM header (setup's image check)

    def __init__(self, root: str | None = None, split: Split | None = None, **kwargs):
        super().__init__(root=root, split=split, **kwargs)

    def load_records(self) -> list[Record]:
        self.checked_root(f"{LABEL_TABLE} and {IMAGE_DIR}/")
        return parse_rsna_labels(self.root / LABEL_TABLE, self.root / IMAGE_DIR, self.report)

#: ``RSNAPneumoniaDataModule``: its ``LightningDataModule``, built on first use (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(RSNAPneumoniaData)
