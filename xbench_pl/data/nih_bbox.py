"""NIH ChestX-ray14 boxes (``BBox_List_2017.csv``), and the synthetic ``demo`` in the same format.

Layout as downloaded (NIH box folder or Kaggle ``nih-chest-xrays/data``)::

    root/BBox_List_2017.csv          (or .csv.gz) header ``Image Index,Finding Label,Bbox [x,y,w,h],,,``
    root/images/*.png                 or root/images_001 ... images_012/images/*.png
    root/Data_Entry_2017*.csv         optional (``_v2020`` preferred; or .csv.gz): image-level labels

The two tables are found anywhere under ``root`` (one copy each: two are an error naming both).

Coordinates: float **xywh**, top-left origin, in the PNG's pixel frame (1024² for NIH) ->
``Box(x, y, x + w, y + h)``. The PNGs are 8-bit, some RGBA (read as luminance).

Labels: without ``Data_Entry`` a finding is positive where it has a box; with it, a boxed
image is also positive for every other finding its ``Finding Labels`` lists (``|``-separated,
``Pleural_Thickening`` style), so a class's negatives are the other boxed images.
``negatives=N`` adds N ``No Finding`` images from ``Data_Entry`` (seeded sample, not boxed
images), all-zero labels and no regions, for a recognition test against normals.

Default evaluation set: the whole box list, as XBench: **880 images, 984 boxes** (Atelectasis
180, Pleural Effusion 153, Cardiomegaly 146, Infiltration 123, Pneumonia 120, Pneumothorax 98,
Mass 85, Nodule 79); ``split_file`` restricts it.

Bad input: a malformed row (missing or non-numeric value, NaN, non-positive size) or an
unknown finding name is an error naming file and row (or a counted skip with
``on_error='skip'``: a row whose image and finding are valid but whose box is malformed
keeps the image positive for the finding and drops only the box); so is a missing or undecodable image, found by the setup image check. A
box reaching outside its image is clipped to it (entirely outside: an error), and an exact
duplicate row is dropped; both corrections are always recorded in ``problems``, never raised.
"""

from __future__ import annotations

from typing import Literal

from pathlib import Path

import numpy as np
import pandas as pd
from jsonargparse.typing import NonNegativeInt

from xbench_pl.data.annotations import ImageIndex, find_one, parse_box
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import UNUSABLE_BOX, DataError
from xbench_pl.data.groups import metadata_groups
from xbench_pl.data.io import drop_duplicate_rows, read_table
from xbench_pl.data.synthetic import ensure_demo
from xbench_pl.data.vocabulary import canonical, dataset_classes
from xbench_pl.registry import lightning_datamodules

BOX_TABLE = "BBox_List_2017.csv"
BOX_COLUMNS = ("image_id", "finding", "x", "y", "w", "h")
NIH_BOX_CLASSES = dataset_classes("nih_bbox")
NO_FINDING = "No Finding"
ENTRY_COLUMNS = ("Image Index", "Finding Labels")
PATIENT_COLUMN = "Patient ID"  # optional: the record's patient_id
#: optional: the record's subgroups (``xbench_pl.data.groups``): sex, age in years, PA/AP
GROUP_COLUMNS = {"sex": "Patient Gender", "age": "Patient Age", "view": "View Position"}
ENTRY_TABLES = ("Data_Entry_2017_v2020.csv*", "Data_Entry_2017.csv*")  # NIH's current release first, then Kaggle's


def read_box_table(path: str | Path) -> pd.DataFrame:
    """The box list as stripped string columns ``image_id, finding, x, y, w, h`` (empty cells ``""``)
    and ``row`` (1-based line in the file); blank lines dropped. The header's ``Bbox [x,y,w,h],,,``
    spans four columns, so the header is skipped and the first six columns taken by position."""
    try:
        table = pd.read_csv(path, header=None, skiprows=1, usecols=range(6), dtype=str, keep_default_na=False,
                            skip_blank_lines=False)
    except (ValueError, OSError, pd.errors.ParserError) as error:  # e.g. fewer than 6 columns
        raise DataError(path, f"not an NIH box list with columns Image Index, Finding Label, x, y, w, h ({error})") from error
    table.columns = list(BOX_COLUMNS)
    table = table.apply(lambda column: column.str.strip())
    table["row"] = range(2, len(table) + 2)
    return table[(table[list(BOX_COLUMNS)] != "").any(axis=1)]


NIH_LAYOUT = f"{BOX_TABLE} and the images*/ folders of PNGs"


#: the evaluation sets (``xbench_pl/data/sources.yaml``), as a type so that a wrong name is refused while parsing
Split = Literal["boxed"]


class NIHBoxData(XBenchData):
    """NIH ChestX-ray14 with radiologist boxes.

    Args:
        negatives: number of ``No Finding`` images from ``Data_Entry_2017*.csv`` to add as
            negatives of every class (0: the box list only, as XBench).
        seed: seed of the negatives' sample.
        **kwargs: ``XBenchData`` arguments.
    """

    name = "nih_bbox"
    default_classes = NIH_BOX_CLASSES
    fit_test_list = "test_list.txt"

    def __init__(self, root: str | None = None, split: Split | None = None, negatives: NonNegativeInt = 0, seed: int = 0,
                 **kwargs):
        super().__init__(root=root, split=split, **kwargs)
        if negatives < 0:
            raise ValueError(f"negatives must be >= 0, got {negatives}")
        self.negatives, self.seed = negatives, seed

    def load_records(self) -> list[Record]:
        root = self.checked_root(NIH_LAYOUT)
        table_path = find_one(root, (BOX_TABLE, f"{BOX_TABLE}.gz"), required=False)
        if table_path is None:
            raise DataError(root / BOX_TABLE, f"not found under --data.root {root}, which should hold {NIH_LAYOUT}")
        images = ImageIndex(root, "images*/**/*.png")
        table = drop_duplicate_rows(read_box_table(table_path), BOX_COLUMNS, table_path, self.report)
        records: dict[str, Record] = {}
        for row in table.itertuples(index=False):
            try:
                if not row.image_id:
                    raise ValueError("empty Image Index")
                finding = canonical(row.finding, self.name)
            except (KeyError, ValueError) as error:
                self.report(DataError(table_path, str(error).strip('"'), row=row.row))
                continue
            record = records.get(row.image_id)
            if record is None:
                path = images.get(row.image_id, default=root / "images")
                record = records[row.image_id] = Record(row.image_id, path, {}, {}, f"{table_path}, row {row.row}")
            record.labels[finding] = 1  # the row names the finding: positive whether or not its box parses
            try:
                box = parse_box((row.x, row.y, row.w, row.h), "xywh")
            except ValueError as error:
                self.report(DataError(table_path, f"{finding} {error} ({UNUSABLE_BOX})", row=row.row))
                continue
            record.add_region(finding, box, table_path, row.row)
        entries = self.read_entries(root)
        if entries is not None:
            self.add_entry_labels(entries, records)
        if self.negatives:
            records.update(self.sample_negatives(entries, records, images))
        return list(records.values())

    def read_entries(self, root: Path) -> pd.DataFrame | None:
        """``Data_Entry_2017*.csv`` (``Image Index, Finding Labels, Patient ID, Patient Gender, Patient Age,
        View Position, row``; an empty cell where the table lacks the column); None if ``root`` has none."""
        path = find_one(root, ENTRY_TABLES, required=False)
        if path is None:
            return None
        table = read_table(path, ENTRY_COLUMNS)
        for column in (PATIENT_COLUMN, *GROUP_COLUMNS.values()):
            if column not in table.columns:
                table[column] = ""
        table = table[[*ENTRY_COLUMNS, PATIENT_COLUMN, "row", *GROUP_COLUMNS.values()]]
        table.attrs["path"] = path
        return table

    def add_entry_labels(self, entries: pd.DataFrame, records: dict[str, Record]) -> None:
        path = entries.attrs["path"]
        for image_id, findings, patient, row, sex, age, view in entries[entries["Image Index"].isin(records.keys())].itertuples(index=False):
            records[image_id].patient_id = patient or None
            records[image_id].groups = metadata_groups(sex or None, age or None, view or None)
            if not findings:
                self.report(DataError(path, "empty Finding Labels", row=row))
                continue
            for spelling in findings.split("|"):
                if spelling.strip() == NO_FINDING:
                    continue
                try:
                    records[image_id].labels[canonical(spelling, self.name)] = 1
                except KeyError as error:
                    self.report(DataError(path, str(error).strip('"'), row=row))

    def sample_negatives(self, entries: pd.DataFrame | None, boxed: dict[str, Record], images: ImageIndex) -> dict[str, Record]:
        if entries is None:
            raise DataError(self.root / "Data_Entry_2017.csv", "negatives need the NIH Data_Entry_2017*.csv label table")
        normal = entries[(entries["Finding Labels"] == NO_FINDING) & ~entries["Image Index"].isin(boxed.keys())]
        normal = normal.sort_values("Image Index")
        if self.negatives > len(normal):
            raise ValueError(f"negatives={self.negatives} but {entries.attrs['path']} has only {len(normal)} unboxed No Finding images")
        chosen = np.sort(np.random.default_rng(self.seed).choice(len(normal), self.negatives, replace=False))
        path = entries.attrs["path"]
        out = {}
        for image_id, _, patient, row, sex, age, view in normal.iloc[chosen].itertuples(index=False):
            out[image_id] = Record(image_id, images.get(image_id, default=self.root / "images"), {}, {}, f"{path}, row {row}",
                                   patient_id=patient or None, groups=metadata_groups(sex or None, age or None, view or None))
        return out


class DemoData(NIHBoxData):
    """The synthetic demo in NIH format: phantoms drawn by ``xbench_pl.data.synthetic``.

    16 generated 512² images read by the NIH reader: 12 with one lesion each, boxed tightly
    (Nodule 2, Mass 2, Pleural Effusion 2, Pneumothorax 2, Cardiomegaly, Atelectasis,
    Infiltration, Pneumonia; boxes from 18 to 184 px wide), and 4 No Finding images in
    ``Data_Entry`` (``negatives=4`` adds them). Not patient data.

    Args:
        root: the demo folder; generated there on first use if missing or empty
            (default: the user cache, see ``synthetic.ensure_demo``).
        seed: the generator's seed (also the seed of the negatives' sample).
        **kwargs: ``NIHBoxData`` arguments.
    """

    name = "demo"
    fit_test_list = None  # synthetic: no official test list

    def __init__(self, root: str | None = None, seed: int = 0, **kwargs):
        super().__init__(root=root, seed=seed, **kwargs)
        self.demo_root = root

    def load_records(self) -> list[Record]:
        self.root = ensure_demo(self.demo_root, self.seed) / "nih"
        return super().load_records()

#: ``NIHBoxDataModule`` and ``DemoDataModule``: the ``LightningDataModule`` of each, built on first use
#: (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(NIHBoxData, DemoData)
