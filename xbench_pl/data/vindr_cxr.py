"""VinDr-CXR (PhysioNet v1.0.0): the official test set, consensus boxes of 5 radiologists.

Layout as downloaded::

    root/test/<image_id>.dicom                      3,000 DICOMs, MONOCHROME1/2 mixed, 12-16 bit
    root/annotations/annotations_test.csv           image_id,class_name,x_min,y_min,x_max,y_max
    root/annotations/image_labels_test.csv          image_id, one 0/1 column per label

Boxes are float **xyxy** in stored DICOM pixels -> ``Box(x_min, y_min, x_max, y_max)``;
``No finding`` rows have empty coordinates; several boxes of a class in an image are united.
A box reaching outside its image is clipped to it at setup and recorded (action ``clipped``).
Image labels come from ``image_labels_test.csv`` (a class is positive where the radiologists
labelled it); without that file, a class is positive where it has a box. The reader also
accepts the train layout (``annotations_train.csv`` or Kaggle VinBigData ``train.csv``:
extra ``rad_id``/``class_id`` columns; boxes of all radiologists are united).

Classes: VinDr has 22 local labels; XBench evaluates 21 and does not say which one it drops.
We drop ``Other lesion``: it is a catch-all with no appearance a text prompt can describe, so
zero-shot recognition and grounding of it is not measurable. The 21 defaults are the other
local labels in VinDr's order (canonical names); ``classes=[..., "Other Lesion"]`` adds it
back. Global labels (``Pneumonia``, ``Tuberculosis``, ...) have no boxes and are not read.
Classes with no positive test image have undefined AUROC (``describe`` shows the counts).

Default evaluation set: the official test split, **all 3,000 images of
image_labels_test.csv**; ``split_file`` restricts it.

Bad input: an unknown class name, non-numeric/NaN coordinates, an empty or inverted box,
a ``No finding`` row with coordinates, a box for an image missing from the labels file or
for a class its labels row marks 0, or a label that is not 0/1 is an error naming file and
row (a counted skip with ``on_error='skip'``); exact duplicate rows are dropped and recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from xbench_pl.data.annotations import parse_box
from xbench_pl.data.base import Record, XBenchDataModule
from xbench_pl.data.errors import DataError
from xbench_pl.data.io import Report, drop_duplicate_rows, raise_error, read_table
from xbench_pl.data.regions import Box
from xbench_pl.data.vocabulary import canonical, dataset_classes

BOX_TABLE = "annotations/annotations_test.csv"
LABEL_TABLE = "annotations/image_labels_test.csv"
IMAGE_DIR = "test"
BOX_COLUMNS = ("image_id", "class_name", "x_min", "y_min", "x_max", "y_max")
NO_FINDING = "No finding"
LOCAL_LABELS = dataset_classes("vindr_cxr")
DROPPED = "Other Lesion"
VINDR_CLASSES = tuple(c for c in LOCAL_LABELS if c != DROPPED)


def parse_vindr_boxes(table_path: str | Path, classes: tuple[str, ...] = LOCAL_LABELS,
                      report: Report = raise_error) -> dict[str, list[tuple[str, Box, int]]]:
    """``image_id -> [(class, box, row)]`` of ``annotations_*.csv`` for the ``classes`` asked for.

    Every image of the table is a key (``No finding`` images have an empty list). Boxes of
    other known labels are left out; bad rows go to ``report``.
    """
    table_path = Path(table_path)
    table = read_table(table_path, BOX_COLUMNS)
    identity = [c for c in table.columns if c != "row"]  # with rad_id: one radiologist's box is one row
    table = drop_duplicate_rows(table, identity, table_path, report)
    boxes: dict[str, list[tuple[str, Box, int]]] = {}
    for row in table.itertuples(index=False):
        coordinates = (row.x_min, row.y_min, row.x_max, row.y_max)
        try:
            if not row.image_id:
                raise ValueError("empty image_id")
            if row.class_name == NO_FINDING:
                if any(coordinates):
                    raise ValueError(f"'No finding' row has box coordinates {coordinates}")
                boxes.setdefault(row.image_id, [])
                continue
            finding = canonical(row.class_name, "vindr_cxr")
            box = parse_box(coordinates, "xyxy")
        except (KeyError, ValueError) as error:
            report(DataError(table_path, str(error).strip('"'), row=row.row))
            continue
        image_boxes = boxes.setdefault(row.image_id, [])
        if finding in classes:
            image_boxes.append((finding, box, row.row))
    return boxes


def parse_vindr_labels(table_path: str | Path, classes: tuple[str, ...],
                       report: Report = raise_error) -> dict[str, tuple[dict[str, int], int]]:
    """``image_id -> ({class: 0/1}, row)`` of ``image_labels_test.csv`` for ``classes``."""
    table_path = Path(table_path)
    table = read_table(table_path, ("image_id",))
    column_of = {}
    for column in table.columns.drop(["image_id", "row"]):
        try:
            column_of[canonical(column, "vindr_cxr")] = column
        except KeyError:
            continue  # "No finding" and other labels outside the vocabulary are not evaluated
    missing = [c for c in classes if c not in column_of]
    if missing:
        raise DataError(table_path, f"missing label column(s) for {missing}; found {list(table.columns.drop('row'))}")
    table = drop_duplicate_rows(table, list(table.columns.drop("row")), table_path, report)
    labels: dict[str, tuple[dict[str, int], int]] = {}
    for row in table.to_dict("records"):
        try:
            if not row["image_id"]:
                raise ValueError("empty image_id")
            if row["image_id"] in labels:
                raise ValueError(f"second, different labels row for {row['image_id']} (first: row {labels[row['image_id']][1]})")
            values = {c: row[column_of[c]] for c in classes}
            bad = {c: v for c, v in values.items() if v not in ("0", "1")}
            if bad:
                raise ValueError(f"labels {bad} are not 0 or 1")
        except ValueError as error:
            report(DataError(table_path, str(error), row=row["row"]))
            continue
        labels[row["image_id"]] = ({c: int(v) for c, v in values.items()}, row["row"])
    return labels


def vindr_records(box_path: str | Path, label_path: str | Path | None, image_path: Callable[[str], Path],
                  classes: tuple[str, ...], report: Report = raise_error) -> list[Record]:
    """Records of the VinDr tables: images of the labels file (or of the box file without one)."""
    box_path = Path(box_path)
    boxes = parse_vindr_boxes(box_path, classes, report)
    if label_path is None:
        labels = {i: ({c: int(any(f == c for f, _, _ in b)) for c in classes}, None) for i, b in boxes.items()}
        source = box_path
    else:
        labels, source = parse_vindr_labels(label_path, classes, report), Path(label_path)
    records = {}
    for image_id, (image_labels, row) in labels.items():
        where = f"{source}, row {row}" if row else str(source)
        records[image_id] = Record(image_id, image_path(image_id), dict(image_labels), {}, where)
    for image_id, image_boxes in boxes.items():
        record = records.get(image_id)
        for finding, box, row in image_boxes:
            if record is None:
                report(DataError(box_path, f"image {image_id} is not in {source}", row=row))
            elif not record.labels[finding]:
                report(DataError(box_path, f"{finding} box for {image_id}, whose labels row marks {finding} 0", row=row))
            else:
                record.add_region(finding, box, box_path, row)
    return list(records.values())


class VinDrCXRDataModule(XBenchDataModule):
    name = "vindr_cxr"
    default_classes = VINDR_CLASSES
    available_classes = LOCAL_LABELS

    def load_records(self) -> list[Record]:
        self.checked_root(f"{BOX_TABLE} and {IMAGE_DIR}/")
        label_path = self.root / LABEL_TABLE
        return vindr_records(self.root / BOX_TABLE, label_path if label_path.is_file() else None,
                             lambda image_id: self.root / IMAGE_DIR / f"{image_id}.dicom", tuple(self.classes), self.report)
