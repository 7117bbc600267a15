"""MS-CXR (PhysioNet v1.0.0 / v1.1.0; Boecking et al. 2022): phrase grounding on MIMIC-CXR-JPG images,
and the synthetic ``ms_cxr_demo`` in the same format.

Layout as downloaded (MS-CXR and MIMIC-CXR-JPG are two PhysioNet downloads)::

    root/MS_CXR_Local_Alignment_v1.1.0.csv       (or v1.0.0: any one MS_CXR_Local_Alignment_v*.csv in root,
                                                   or the file given as ``csv``)
    root/MS_CXR_Local_Alignment_v1.1.0.json      the same boxes as COCO JSON (not read)
    image_root/files/p15/p15638883/s57069838/<dicom_id>.jpg
                                                  MIMIC-CXR-JPG, where the csv's ``path`` points
                                                  (``image_root`` defaults to ``root``)

Columns read (others are ignored): ``dicom_id, category_name, label_text, path, x, y, w, h,
image_width, image_height``. Boxes are **xywh** in the original image's pixels, top-left origin ->
``Box(x, y, x + w, y + h)``; ``image_width x image_height`` is the size of the image they are drawn on,
checked against the JPEG at setup.

Items: one ``Record`` per (image, phrase): 1,162 pairs in MS-CXR as published (Boecking et al. 2022).
Rows with the same ``dicom_id`` and ``label_text`` are one phrase, whose boxes are united into one region. Its id is
``<dicom_id>#<n>``, ``n`` counting (from 0) that image's phrases in order of their first row in the
csv: stable for one csv file (a split file lists these ids), but another MS-CXR version may number
them differently. Per record: ``labels`` 1 for every category the image's phrases name (an image with
phrases of two categories is two records, each positive for both; recognition keys therefore count such an
image once per phrase: MS-CXR measures grounding), ``regions`` the phrase's boxes under its own category alone,
``queries = {category: label_text}`` (what a model grounds, ``Batch.query_texts``),
``patient_id`` the MIMIC subject folder of ``path`` (``pNNNNNNNN``; the image's ``dicom_id`` where the path has
none), so bootstrap and ``fit`` resample and split by patient, keeping an image's phrases together.

Classes: MS-CXR's 8 categories in its own (alphabetical) order, ``MS_CXR_CLASSES``. ``classes``
restricts them; phrases of the other categories are left out.

Bad input, each an error naming the csv and row (or with ``on_error='skip'`` a counted skip of the
whole phrase, since a phrase missing one of its boxes would be graded against the wrong region): an
empty ``dicom_id`` / ``label_text`` / ``path``, an unknown ``category_name``, a non-numeric or
non-finite number, a box of non-positive size or reaching outside ``image_width x image_height``,
an image size that is not a positive integer, rows of one image that disagree on ``path`` or size,
rows of one phrase that disagree on its category. A missing or undecodable image is found by setup's
image check (naming the image and the row listing it), and so is an image whose real size is not
``image_width x image_height`` (the boxes would not be where the csv says). A missing csv or column
is a ``DataError`` naming the file. Exact duplicate rows are dropped and recorded.

``ms_cxr_demo`` (``MSCXRDemoData``): ``write_ms_cxr_demo`` draws phantoms with
``xbench_pl.data.synthetic`` and writes them as MS-CXR + MIMIC-CXR-JPG; see ``DEMO_IMAGES``.
"""

from __future__ import annotations

import csv
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np
from PIL import Image

from xbench_pl.data.annotations import parse_box
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import DataError
from xbench_pl.data.io import drop_duplicate_rows, parse_floats, read_table
from xbench_pl.data.regions import Box
from xbench_pl.data.synthetic import GENERATOR_VERSION, draw_case, demo_cache_dir, ensure_generated
from xbench_pl.data.vocabulary import canonical
from xbench_pl.registry import lightning_datamodules

#: MS-CXR's categories, in its own (alphabetical) order: the default classes
MS_CXR_CLASSES = ("Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Lung Opacity", "Pleural Effusion",
                  "Pneumonia", "Pneumothorax")
CSV_PATTERN = "MS_CXR_Local_Alignment_v*.csv"
#: what a phrase's region is queried by (``MSCXRData(queries=...)``)
QueryTexts = Literal["phrases", "names"]
COLUMNS = ("dicom_id", "category_name", "label_text", "path", "x", "y", "w", "h", "image_width", "image_height")
SUBJECT = re.compile(r"p\d+")  # MIMIC-CXR subject folder: files/pNN/<subject>/sNNNNNNNN/<dicom_id>.jpg
#: the end of the reason for a bad row: what ``on_error="skip"`` does
SKIPS_PHRASE = "on_error=skip leaves out its whole phrase"
LAYOUT = "MS_CXR_Local_Alignment_v*.csv (and, unless --data.image_root is given, MIMIC-CXR-JPG's files/ folder)"


def phrase_id(dicom_id: str, n: int) -> str:
    """The id of image ``dicom_id``'s ``n``-th phrase (from 0, in csv order)."""
    return f"{dicom_id}#{n}"


def subject_of(path: str) -> str | None:
    """The MIMIC-CXR subject (``pNNNNNNNN``) of a ``files/pNN/pNNNNNNNN/sNNNNNNNN/x.jpg`` path, else None."""
    parts = Path(path).parts
    return parts[-3] if len(parts) >= 3 and SUBJECT.fullmatch(parts[-3]) else None


@dataclass(frozen=True)
class PhraseRow:
    """One parsed csv row: a box of a phrase."""

    dicom_id: str
    category: str
    text: str
    path: str
    box: Box
    size: tuple[int, int]  # (width, height) the csv gives
    row: int


def image_size(width: str, height: str) -> tuple[int, int]:
    """``(width, height)`` from the csv cells: positive integers (``3056`` or ``3056.0``); ``ValueError`` if not."""
    values = parse_floats((width, height), "image_width, image_height")
    if not all(v > 0 and v == int(v) for v in values):
        raise ValueError(f"image_width, image_height {(width, height)} are not positive integers")
    return int(values[0]), int(values[1])


def parse_row(row) -> PhraseRow:
    """A csv row as a ``PhraseRow``; ``ValueError`` / ``KeyError`` saying what is wrong."""
    for column in ("dicom_id", "label_text", "path"):
        if not getattr(row, column):
            raise ValueError(f"empty {column}")
    try:
        category = canonical(row.category_name)
    except KeyError:
        category = None
    if category not in MS_CXR_CLASSES:
        raise KeyError(f"category_name {row.category_name!r} is not an MS-CXR category {list(MS_CXR_CLASSES)}")
    box = parse_box((row.x, row.y, row.w, row.h), "xywh")
    width, height = image_size(row.image_width, row.image_height)
    if box.x0 < 0 or box.y0 < 0 or box.x1 > width or box.y1 > height:
        raise ValueError(f"box xywh {(row.x, row.y, row.w, row.h)} reaches outside the {width}x{height} image "
                         "(image_width x image_height)")
    return PhraseRow(row.dicom_id, category, row.label_text, row.path, box, (width, height), row.row)


#: the evaluation sets (``xbench_pl/data/sources.yaml``), as a type so that a wrong name is refused while parsing
Split = Literal["all"]


class MSCXRData(XBenchData):
    """MS-CXR phrase grounding: one item per (image, phrase) (module docstring).

    Args:
        root: the MS-CXR folder (holding ``MS_CXR_Local_Alignment_v*.csv``).
        csv: the csv to read instead of the one found in ``root``.
        image_root: the MIMIC-CXR-JPG folder the csv's ``path`` is relative to (holding ``files/``);
            default ``root`` (without one, the csv's folder).
        queries: what a model grounds for each phrase's region: ``phrases`` (the radiologist's phrase, MS-CXR's
            protocol) or ``names`` (its category's name, prompted as for any class-name dataset: the sweep
            ``sweeps/phrases_x_models.yaml`` compares the two).
        **kwargs: ``XBenchData`` arguments.
    """

    name = "ms_cxr"
    default_classes = MS_CXR_CLASSES

    def __init__(self, root: str | None = None, split: Split | None = None, csv: str | None = None,
                 image_root: str | None = None, queries: QueryTexts = "phrases", **kwargs):
        super().__init__(root=root, split=split, **kwargs)
        if queries not in get_args(QueryTexts):
            raise ValueError(f"queries must be 'phrases' or 'names', got {queries!r}")
        self.queries = queries
        self.csv = None if csv is None else Path(csv)
        self.image_root = None if image_root is None else Path(image_root)
        # image id -> (width, height) the csv gives, and the row giving it; checked against the image at setup
        self.declared_sizes: dict[str, tuple[tuple[int, int], Path, int]] = {}

    def find_csv(self) -> Path:
        if self.csv is not None:
            return self.csv
        root = self.checked_root(LAYOUT)
        found = sorted(root.glob(CSV_PATTERN))
        if not found:
            raise DataError(root / CSV_PATTERN, f"not found in --data.root {root}, which should hold {LAYOUT} "
                            "(or give the csv as --data.csv)")
        if len(found) > 1:
            raise DataError(found[0], f"{CSV_PATTERN} is ambiguous: also {[str(p) for p in found[1:]]}; "
                            "choose one with --data.csv")
        return found[0]

    def load_records(self) -> list[Record]:
        path = self.find_csv()
        image_root = self.image_root or self.root or path.parent
        table = drop_duplicate_rows(read_table(path, COLUMNS), COLUMNS, path, self.report)
        phrases: dict[tuple[str, str], list[PhraseRow]] = {}  # (dicom_id, label_text) -> its rows, in csv order
        images: dict[str, PhraseRow] = {}  # dicom_id -> its first row
        broken: set[tuple[str, str]] = set()  # phrases with a bad row: left out whole
        for row in table.itertuples(index=False):
            key = (row.dicom_id, row.label_text)
            try:
                parsed = parse_row(row)
                first = images.setdefault(parsed.dicom_id, parsed)
                if (parsed.path, parsed.size) != (first.path, first.size):
                    raise ValueError(f"path, image size {parsed.path}, {parsed.size} differ from row {first.row}'s "
                                     f"{first.path}, {first.size} for the same dicom_id {parsed.dicom_id}")
                same = phrases.get(key)
                if same and same[0].category != parsed.category:
                    raise ValueError(f"category {parsed.category!r} differs from row {same[0].row}'s {same[0].category!r} "
                                     f"for the same phrase {parsed.text!r}")
            except (KeyError, ValueError) as error:
                self.report(DataError(path, f"{str(error).strip(chr(34))} ({SKIPS_PHRASE})", row=row.row))
                if all(key):  # the phrase keeps its number, so that the other phrases' ids do not depend on errors
                    broken.add(key)
                    phrases.setdefault(key, [])
                continue
            phrases.setdefault(key, []).append(parsed)
        self.declared_sizes = {}
        image_labels: dict[str, dict[str, int]] = {}  # each image's findings: those its kept phrases name
        for key, rows in phrases.items():
            if key not in broken and rows and rows[0].category in self.classes:
                image_labels.setdefault(key[0], {})[rows[0].category] = 1
        records, count = [], {}
        for key, rows in phrases.items():
            n = count[key[0]] = count.get(key[0], -1) + 1
            if key in broken or not rows or rows[0].category not in self.classes:
                continue
            first = rows[0]
            record = Record(phrase_id(first.dicom_id, n), image_root / first.path, dict(image_labels[first.dicom_id]), {},
                            f"{path}, row {first.row}", patient_id=subject_of(first.path) or first.dicom_id,
                            queries={first.category: first.text} if self.queries == "phrases" else {})
            for parsed in rows:
                record.add_region(parsed.category, parsed.box, path, parsed.row)
            self.declared_sizes[record.image_id] = (first.size, path, first.row)
            records.append(record)
        return records

    def fit_regions(self, record: Record, height: int, width: int) -> bool:
        """The image's real size must be the csv's ``image_width x image_height``, else the boxes are not
        where it says: a bad input (left out with ``on_error='skip'``)."""
        (declared_width, declared_height), path, row = self.declared_sizes[record.image_id]
        if (width, height) != (declared_width, declared_height):
            self.report(DataError(path, f"image_width x image_height {declared_width}x{declared_height}, but the image "
                                        f"{record.path} is {width}x{height}", row=row))
            return False
        return super().fit_regions(record, height, width)


# -- the synthetic demo --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoPhrase:
    """A demo phrase: its MS-CXR category, its text and the lesions drawn for it, ``(drawn finding, size,
    side)`` (``synthetic.Phantom.lesion``; side 0 is the image's left, the patient's right), one box each."""

    category: str
    text: str
    lesions: tuple[tuple[str, float, int | None], ...]


RIGHT, LEFT = 0, 1  # the patient's side, as the phantom's image side
#: each demo image: (patient number, its phrases); patient 2 has two studies, image 3's phrase two boxes
DEMO_IMAGES: tuple[tuple[int, tuple[DemoPhrase, ...]], ...] = (
    (0, (DemoPhrase("Pneumothorax", "small left apical pneumothorax", (("Pneumothorax", 0.1, LEFT),)),)),
    (1, (DemoPhrase("Pleural Effusion", "large right pleural effusion", (("Pleural Effusion", 0.9, RIGHT),)),)),
    (2, (DemoPhrase("Cardiomegaly", "enlarged cardiac silhouette", (("Cardiomegaly", 0.6, None),)),
         DemoPhrase("Pleural Effusion", "small left pleural effusion", (("Pleural Effusion", 0.15, LEFT),)))),
    (3, (DemoPhrase("Edema", "bilateral perihilar opacities, consistent with pulmonary edema",
                    (("Infiltration", 0.6, RIGHT), ("Infiltration", 0.6, LEFT))),)),
    (4, (DemoPhrase("Consolidation", "right lower lobe consolidation", (("Pneumonia", 0.7, RIGHT),)),)),
    (2, (DemoPhrase("Cardiomegaly", "moderate cardiomegaly", (("Cardiomegaly", 0.4, None),)),)),
    (5, (DemoPhrase("Pneumonia", "left lower lobe pneumonia", (("Pneumonia", 0.5, LEFT),)),)),
    (6, (DemoPhrase("Atelectasis", "right basilar atelectasis", (("Atelectasis", 0.5, RIGHT),)),
         DemoPhrase("Lung Opacity", "patchy opacity in the left mid lung", (("Infiltration", 0.4, LEFT),)))),
    (7, (DemoPhrase("Pneumothorax", "large right pneumothorax", (("Pneumothorax", 0.9, RIGHT),)),)),
    (8, (DemoPhrase("Pleural Effusion", "small right pleural effusion", (("Pleural Effusion", 0.2, RIGHT),)),
         DemoPhrase("Pleural Effusion", "small left pleural effusion", (("Pleural Effusion", 0.2, LEFT),)))),
)
DEMO_VERSION = 1  # bumped whenever the demo's files change (with synthetic.GENERATOR_VERSION, which it draws with)
DEMO_STREAM = 2  # the phantoms' random stream (synthetic: 0 NIH, 1 SIIM)
DEMO_CSV = "MS_CXR_Local_Alignment_v1.1.0.csv"
#: the 512² phantom padded to a portrait image as MIMIC-CXR's are, so width and height differ (rows above, below)
DEMO_PAD = (24, 40)
DEMO_README = """# xbench_pl ms_cxr_demo data: SYNTHETIC

Generated by xbench_pl.data.ms_cxr (demo version {version}, phantoms of xbench_pl.data.synthetic version
{generator}, seed {seed}). Drawn phantoms, not radiographs of anyone: each phrase's boxes are the tight boxes
of the lesions drawn for it. Layout and columns follow MS-CXR ({csv}) on MIMIC-CXR-JPG
(files/pNN/pNNNNNNNN/sNNNNNNNN/<dicom_id>.jpg), so `--data ms_cxr_demo` uses the real reader.
"""


def _demo_number(seed: int, kind: str, index: int, digits: int) -> int:
    digest = hashlib.sha256(f"xbench_pl ms_cxr demo {seed} {kind} {index}".encode()).hexdigest()
    return int(digest, 16) % 10**digits


def demo_dicom_id(seed: int, index: int) -> str:
    """A MIMIC-CXR-looking dicom id (five groups of 8 hex digits) derived from the seed."""
    digest = hashlib.sha256(f"xbench_pl ms_cxr demo {seed} dicom {index}".encode()).hexdigest()
    return "-".join(digest[i:i + 8] for i in range(0, 40, 8))


def write_ms_cxr_demo(root: str | Path, seed: int = 0) -> Path:
    """Write the demo into ``root`` (created; must not hold files): the csv, the JPEGs, a README."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty")
    top, bottom = DEMO_PAD
    subjects = {p: f"p{10**7 + _demo_number(seed, 'subject', p, 7)}" for p in sorted({p for p, _ in DEMO_IMAGES})}
    rows = []
    for index, (patient, phrases) in enumerate(DEMO_IMAGES):
        dicom_id = demo_dicom_id(seed, index)
        findings = [lesion for phrase in phrases for lesion in phrase.lesions]
        case = draw_case(dicom_id, seed, DEMO_STREAM, index, findings)
        pixels = np.pad(case.pixels, ((top, bottom), (0, 0)), mode="edge")
        height, width = pixels.shape
        subject = subjects[patient]
        relative = f"files/{subject[:3]}/{subject}/s{5 * 10**7 + _demo_number(seed, 'study', index, 7)}/{dicom_id}.jpg"
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / relative, quality=95)
        lesions = iter(case.lesions)
        for phrase in phrases:
            for _ in phrase.lesions:
                x, y, w, h = next(lesions).box
                rows.append((dicom_id, phrase.category, phrase.text, relative, x, y + top, w, h, width, height))
    with open(root / DEMO_CSV, "w", newline="") as file:
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    (root / "README.md").write_text(DEMO_README.format(version=DEMO_VERSION, generator=GENERATOR_VERSION, seed=seed,
                                                       csv=DEMO_CSV))
    return root


def ensure_ms_cxr_demo(root: str | Path | None = None, seed: int = 0) -> Path:
    """The demo folder, generated first if ``root`` is missing or empty (atomically, ``synthetic.ensure_generated``);
    default: ``ms_cxr_demo-v<G>.<V>-seed<S>`` in the demo cache (``synthetic.demo_cache_dir``)."""
    if root is None:
        root = demo_cache_dir() / f"ms_cxr_demo-v{GENERATOR_VERSION}.{DEMO_VERSION}-seed{seed}"
    return ensure_generated(Path(root), lambda folder: write_ms_cxr_demo(folder, seed), "the synthetic MS-CXR demo")


class MSCXRDemoData(MSCXRData):
    """The synthetic demo in MS-CXR format (not patient data), read by the MS-CXR reader.

    10 phantoms of 512 x 576 (9 patients, one with two studies), 13 phrases covering the 8 categories:
    three images with two phrases (one of them two Pleural Effusion phrases), one phrase (pulmonary edema)
    with two boxes, 14 boxes in all (``DEMO_IMAGES``).

    Args:
        root: the demo folder; generated there on first use if missing or empty (default: the user cache).
        seed: the generator's seed.
        **kwargs: ``XBenchData`` arguments.
    """

    name = "ms_cxr_demo"

    def __init__(self, root: str | None = None, seed: int = 0, **kwargs):
        super().__init__(root=root, **kwargs)
        self.demo_root, self.seed = root, seed

    def load_records(self) -> list[Record]:
        self.root = ensure_ms_cxr_demo(self.demo_root, self.seed)
        return super().load_records()

#: ``MSCXRDataModule`` and ``MSCXRDemoDataModule``: the ``LightningDataModule`` of each, built on first use
#: (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(MSCXRData, MSCXRDemoData)
