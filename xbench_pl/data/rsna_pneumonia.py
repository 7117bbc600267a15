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
row (a counted skip with ``on_error='skip'``); exact duplicate rows are dropped and recorded.
"""

from __future__ import annotations

from pathlib import Path

from xbench_pl.data.base import Record, XBenchDataModule
from xbench_pl.data.io import DataError, Report, drop_duplicate_rows, parse_floats, raise_error, read_table
from xbench_pl.data.regions import Box
from xbench_pl.data.vocabulary import dataset_classes

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
        try:
            box = parse_row(row)
        except ValueError as error:
            report(DataError(table_path, str(error), row=row.row))
            continue
        record = records.get(row.patientId)
        if record is None:
            path = image_dir / f"{row.patientId}.dcm"
            record = records[row.patientId] = Record(row.patientId, path, {PNEUMONIA: 0}, {}, f"{table_path}, row {row.row}")
        if box is not None:
            record.labels[PNEUMONIA] = 1
            record.add_region(PNEUMONIA, box, table_path, row.row)
    return list(records.values())


def parse_row(row) -> Box | None:
    """The box of one labels row (``None`` for a negative); ``ValueError`` saying what is wrong."""
    if not row.patientId:
        raise ValueError("empty patientId")
    coordinates = (row.x, row.y, row.width, row.height)
    if row.Target == "0":
        if any(coordinates):
            raise ValueError(f"Target 0 row has box coordinates {coordinates}")
        return None
    if row.Target != "1":
        raise ValueError(f"Target {row.Target!r} is not 0 or 1")
    x, y, width, height = parse_floats(coordinates, "box x,y,width,height")
    if width <= 0 or height <= 0:
        raise ValueError(f"box x,y,width,height {coordinates} has a non-positive size")
    return Box(x, y, x + width, y + height)


class RSNAPneumoniaDataModule(XBenchDataModule):
    name = "rsna_pneumonia"
    default_classes = (PNEUMONIA,)

    def load_records(self) -> list[Record]:
        if self.root is None:
            raise DataError(LABEL_TABLE, "RSNA root not set (--data.root: the folder holding stage_2_train_labels.csv)")
        return parse_rsna_labels(self.root / LABEL_TABLE, self.root / IMAGE_DIR, self.report)
