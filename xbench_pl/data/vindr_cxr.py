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

``split="train"`` evaluates the 15,000 train images (``annotations/annotations_train.csv``,
``train/<image_id>.dicom``; each image read by 3 of 17 radiologists, ``rad_id``). Its labels come
from the boxes (a class is positive where a reader boxed it; ``image_labels_train.csv`` has one row
per reader and is not read). ``readers="united"`` (default) unites all readers' boxes as the test
set does. ``readers="split"`` keeps them apart for the leave-one-reader-out reader ceiling: one
evaluated item per (image, reader A), id ``<image_id>@<rad_id>`` (``reader_item_id``; a split file
lists these ids), patient = the image (bootstrap units are images). Its label of a class is 1 where
another reader boxed it; its region of a class is the union of the other readers' boxes, kept only
where A boxed the class too, so the positive pairs are exactly (image, class, A) with A and another
reader marking it. A class A alone marked has no region to judge A against: it is not evaluated and
is recorded once per (image, class, A) (action ``lone_reader``; ``lone_marks`` counts them). The
``reader`` model with ``annotations=annotations_train.csv`` gives A's boxes as the map
(``xbench_pl.models.reader``); the metrics are the unchanged ones.

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

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, get_args

from xbench_pl.data.annotations import parse_box
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import DataError
from xbench_pl.data.io import Report, drop_duplicate_rows, raise_error, read_table
from xbench_pl.data.regions import Box
from xbench_pl.data.vocabulary import canonical, dataset_classes
from xbench_pl.registry import lightning_datamodules

BOX_TABLE = "annotations/annotations_{split}.csv"
LABEL_TABLE = "annotations/image_labels_test.csv"
IMAGE_DIR = "{split}"
#: how readers' boxes are used: ``united`` (one region per image and class) or ``split`` (leave-one-reader-out items)
Readers = Literal["united", "split"]
#: joins an image id and a reader in a ``readers="split"`` item id
READER_SEPARATOR = "@"
#: the problem action of a class only one reader marked (``readers="split"``)
LONE_READER = "lone_reader"
BOX_COLUMNS = ("image_id", "class_name", "x_min", "y_min", "x_max", "y_max")
NO_FINDING = "No finding"
LOCAL_LABELS = dataset_classes("vindr_cxr")
DROPPED = "Other Lesion"
VINDR_CLASSES = tuple(c for c in LOCAL_LABELS if c != DROPPED)


def reader_item_id(image_id: str, rad_id: str) -> str:
    """The id of the ``readers="split"`` item of ``image_id`` read by ``rad_id``."""
    return f"{image_id}{READER_SEPARATOR}{rad_id}"


def _box_rows(table_path: Path, classes: tuple[str, ...], report: Report,
              readers: bool) -> Iterator[tuple[str, str | None, str | None, Box | None, int]]:
    """``(image_id, rad_id, class, box, row)`` per usable row of a box table (class and box None for a
    ``No finding`` row or a box of a class not asked for; rad_id None unless ``readers``)."""
    table = read_table(table_path, BOX_COLUMNS + (("rad_id",) if readers else ()))
    identity = [c for c in table.columns if c != "row"]  # with rad_id: one radiologist's box is one row
    table = drop_duplicate_rows(table, identity, table_path, report)
    for row in table.itertuples(index=False):
        coordinates = (row.x_min, row.y_min, row.x_max, row.y_max)
        try:
            if not row.image_id:
                raise ValueError("empty image_id")
            if readers and not row.rad_id:
                raise ValueError("empty rad_id")
            if row.class_name == NO_FINDING:
                if any(coordinates):
                    raise ValueError(f"'No finding' row has box coordinates {coordinates}")
                finding, box = None, None
            else:
                finding = canonical(row.class_name, "vindr_cxr")
                box = parse_box(coordinates, "xyxy")
        except (KeyError, ValueError) as error:
            report(DataError(table_path, str(error).strip('"'), row=row.row))
            continue
        keep = finding in classes
        yield row.image_id, row.rad_id if readers else None, finding if keep else None, box if keep else None, row.row


def parse_vindr_boxes(table_path: str | Path, classes: tuple[str, ...] = LOCAL_LABELS,
                      report: Report = raise_error) -> dict[str, list[tuple[str, Box, int]]]:
    """``image_id -> [(class, box, row)]`` of ``annotations_*.csv`` for the ``classes`` asked for.

    Every image of the table is a key (``No finding`` images have an empty list). Boxes of
    other known labels are left out; bad rows go to ``report``.
    """
    boxes: dict[str, list[tuple[str, Box, int]]] = {}
    for image_id, _, finding, box, row in _box_rows(Path(table_path), classes, report, readers=False):
        image_boxes = boxes.setdefault(image_id, [])
        if box is not None:
            image_boxes.append((finding, box, row))
    return boxes


def parse_vindr_reader_boxes(table_path: str | Path, classes: tuple[str, ...] = LOCAL_LABELS,
                             report: Report = raise_error) -> dict[str, dict[str, list[tuple[str, Box, int]]]]:
    """``image_id -> rad_id -> [(class, box, row)]`` of a train table (``rad_id`` column required): every
    reader of an image is a key (one who found nothing has an empty list)."""
    boxes: dict[str, dict[str, list[tuple[str, Box, int]]]] = {}
    for image_id, rad_id, finding, box, row in _box_rows(Path(table_path), classes, report, readers=True):
        reader_boxes = boxes.setdefault(image_id, {}).setdefault(rad_id, [])
        if box is not None:
            reader_boxes.append((finding, box, row))
    return boxes


def reader_records(box_path: str | Path, image_path: Callable[[str], Path], classes: tuple[str, ...],
                   report: Report = raise_error) -> tuple[list[Record], int]:
    """Leave-one-reader-out items of a train table (module docstring, ``readers="split"``) and the number
    of (image, class, reader) marks no other reader shares (each also sent to ``report`` as ``lone_reader``)."""
    box_path = Path(box_path)
    records, lone = [], 0
    for image_id, by_reader in parse_vindr_reader_boxes(box_path, classes, report).items():
        for rad_id, own in by_reader.items():
            others = [item for other, boxes in by_reader.items() if other != rad_id for item in boxes]
            marked, seen = {f for f, _, _ in own}, {f for f, _, _ in others}
            record = Record(reader_item_id(image_id, rad_id), image_path(image_id), {c: int(c in seen) for c in classes}, {},
                            str(box_path), patient_id=image_id)
            for finding, box, row in others:
                if finding in marked:
                    record.add_region(finding, box, box_path, row)
            for finding in [c for c in classes if c in marked - seen]:
                lone += 1
                first = min(row for f, _, row in own if f == finding)
                report(DataError(box_path, f"{finding} of {image_id} marked by {rad_id} alone: no other reader's region "
                                 "to judge it against; not evaluated", row=first, action=LONE_READER))
            records.append(record)
    return records, lone


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


#: the evaluation sets (``xbench_pl/data/sources.yaml``), as a type so that a wrong name is refused while parsing
Split = Literal["test", "train"]


class VinDrCXRData(XBenchData):
    """VinDr-CXR boxes.

    Args:
        split: (``XBenchData``) ``"test"`` (default: the 5-radiologist consensus) or ``"train"`` (3 readers per image).
        readers: ``"united"`` (default: all readers' boxes of a class united) or ``"split"`` (``train`` only:
            one leave-one-reader-out item per (image, reader); module docstring).
        **kwargs: ``XBenchData`` arguments.
    """

    name = "vindr_cxr"
    default_classes = VINDR_CLASSES
    dicom_groups = True  # sex, age, view from each DICOM header (setup's image check)
    available_classes = LOCAL_LABELS

    def __init__(self, root: str | None = None, split: Split | None = None, readers: Readers = "united", **kwargs):
        super().__init__(root=root, split=split, **kwargs)
        if readers not in get_args(Readers):
            raise ValueError(f"readers must be one of {get_args(Readers)}, got {readers!r}")
        if readers == "split" and self.split != "train":
            raise ValueError("readers='split' needs split='train': only the train table keeps each radiologist's boxes (rad_id)")
        self.readers = readers
        self.lone_marks = 0  # readers="split": (image, class, reader) marks no other reader shares

    def load_records(self) -> list[Record]:
        box_table, image_dir = BOX_TABLE.format(split=self.split), IMAGE_DIR.format(split=self.split)
        self.checked_root(f"{box_table} and {image_dir}/")

        def image_path(image_id: str) -> Path:
            return self.root / image_dir / f"{image_id}.dicom"

        if self.readers == "split":
            records, self.lone_marks = reader_records(self.root / box_table, image_path, tuple(self.classes), self.report)
            return records
        label_path = self.root / LABEL_TABLE
        use_labels = self.split == "test" and label_path.is_file()
        return vindr_records(self.root / box_table, label_path if use_labels else None, image_path, tuple(self.classes), self.report)

#: ``VinDrCXRDataModule``: its ``LightningDataModule``, built on first use (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(VinDrCXRData)
