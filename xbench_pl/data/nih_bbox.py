"""NIH ChestX-ray14 boxes (``BBox_List_2017.csv``) and the shipped real ``demo`` subset.

Layout as downloaded (NIH box folder or Kaggle ``nih-chest-xrays/data``)::

    root/BBox_List_2017.csv          (or .csv.gz) header ``Image Index,Finding Label,Bbox [x,y,w,h],,,``
    root/images/*.png                 or root/images_001 ... images_012/images/*.png
    root/Data_Entry_2017*.csv         optional (``_v2020`` too; or .csv.gz): image-level labels

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

Bad input: a malformed row (missing or non-numeric value, NaN, non-positive size), an unknown
finding name or a boxed image that is missing is an error naming file and row (or a counted
skip with ``on_error='skip'``). A box reaching outside the image is clipped to it, and an
exact duplicate row is dropped; both are always recorded in ``problems`` (never raised).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from xbench_pl.data.annotations import ImageIndex, checked_box, image_size
from xbench_pl.data.base import Record, XBenchDataModule
from xbench_pl.data.io import DataError
from xbench_pl.data.vocabulary import canonical, dataset_classes

BOX_TABLE = "BBox_List_2017.csv"
NIH_BOX_CLASSES = dataset_classes("nih_bbox")
NO_FINDING = "No Finding"


def read_box_table(path: str | Path) -> pd.DataFrame:
    """The box list as string columns ``image_id, finding, x, y, w, h, row`` (row = 1-based line in the file)."""
    try:
        table = pd.read_csv(path, header=None, skiprows=1, usecols=range(6), dtype=str, skip_blank_lines=False)
    except ValueError as error:  # fewer than 6 columns
        raise DataError(path, f"not an NIH box list with columns Image Index, Finding Label, x, y, w, h ({error})") from error
    table.columns = ["image_id", "finding", "x", "y", "w", "h"]
    table["row"] = range(2, len(table) + 2)
    return table.dropna(how="all", subset=["image_id", "finding", "x", "y", "w", "h"])


def find_table(root: Path, stem: str) -> Path | None:
    """``root/stem`` or its gzipped copy (the first ``root/stem*`` match, sorted)."""
    found = sorted(root.glob(f"{stem}*"))
    return found[0] if found else None


class NIHBoxDataModule(XBenchDataModule):
    """NIH ChestX-ray14 with radiologist boxes.

    Args:
        negatives: number of ``No Finding`` images from ``Data_Entry_2017*.csv`` to add as
            negatives of every class (0: the box list only, as XBench).
        seed: seed of the negatives' sample.
        **kwargs: ``XBenchDataModule`` arguments.
    """

    name = "nih_bbox"
    default_classes = NIH_BOX_CLASSES

    def __init__(self, root: str | None = None, negatives: int = 0, seed: int = 0, **kwargs):
        super().__init__(root=root, **kwargs)
        if negatives < 0:
            raise ValueError(f"negatives must be >= 0, got {negatives}")
        self.negatives, self.seed = negatives, seed

    def load_records(self) -> list[Record]:
        root = self.root
        table_path = find_table(root, BOX_TABLE) if root is not None else None
        if table_path is None:
            raise DataError(root / BOX_TABLE if root else BOX_TABLE, "NIH box list not found (set --data.root)")
        images = ImageIndex(root, "images*/**/*.png")
        records: dict[str, Record] = {}
        sizes: dict[str, tuple[int, int]] = {}
        first_row: dict[tuple, int] = {}
        for row in read_box_table(table_path).itertuples(index=False):
            key = (row.image_id, row.finding, row.x, row.y, row.w, row.h)
            if key in first_row:
                self.problems.append(DataError(table_path, f"duplicate of row {first_row[key]}; dropped", row=row.row).problem)
                continue
            first_row[key] = row.row
            try:
                if not isinstance(row.image_id, str):
                    raise ValueError("no image index")
                finding = canonical(str(row.finding), self.name)
                x, y, w, h = (float(v) for v in (row.x, row.y, row.w, row.h))
                if row.image_id not in sizes:
                    sizes[row.image_id] = image_size(images.get(row.image_id))
                box, clipped = checked_box(x, y, x + w, y + h, *sizes[row.image_id])
            except (KeyError, ValueError, TypeError) as error:
                self.report(DataError(table_path, str(error).strip('"'), row=row.row))
                continue
            if clipped:
                self.problems.append(DataError(table_path, f"box xywh {x, y, w, h} reaches outside the image; clipped", row=row.row).problem)
            record = records.setdefault(
                row.image_id, Record(row.image_id, images.get(row.image_id), {}, {}, f"{table_path}, row {row.row}")
            )
            record.labels[finding] = 1
            record.regions.setdefault(finding, []).append(box)
        entries = self.read_entries(root)
        if entries is not None:
            self.add_entry_labels(entries, records)
        if self.negatives:
            records.update(self.sample_negatives(entries, records, images))
        return list(records.values())

    def read_entries(self, root: Path) -> pd.DataFrame | None:
        """``Data_Entry_2017*.csv`` as ``image_id, findings, row``; None if the folder has none."""
        path = find_table(root, "Data_Entry_2017")
        if path is None:
            return None
        try:
            table = pd.read_csv(path, usecols=["Image Index", "Finding Labels"], dtype=str)
        except ValueError as error:  # missing columns
            raise DataError(path, str(error)) from error
        table.columns = ["image_id", "findings"]
        table["row"] = range(2, len(table) + 2)
        table.attrs["path"] = path
        return table

    def add_entry_labels(self, entries: pd.DataFrame, records: dict[str, Record]) -> None:
        path = entries.attrs["path"]
        for row in entries[entries["image_id"].isin(records.keys())].itertuples(index=False):
            if not isinstance(row.findings, str):
                self.report(DataError(path, "empty Finding Labels", row=row.row))
                continue
            for spelling in row.findings.split("|"):
                if spelling.strip() == NO_FINDING:
                    continue
                try:
                    records[row.image_id].labels[canonical(spelling, self.name)] = 1
                except KeyError as error:
                    self.report(DataError(path, str(error).strip('"'), row=row.row))

    def sample_negatives(self, entries: pd.DataFrame | None, boxed: dict[str, Record], images: ImageIndex) -> dict[str, Record]:
        if entries is None:
            raise DataError(self.root / "Data_Entry_2017.csv", "negatives need the NIH Data_Entry_2017*.csv label table")
        normal = entries[(entries["findings"].str.strip() == NO_FINDING) & ~entries["image_id"].isin(boxed.keys())]
        normal = normal.sort_values("image_id")
        if self.negatives > len(normal):
            raise ValueError(f"negatives={self.negatives} but {entries.attrs['path']} has only {len(normal)} unboxed No Finding images")
        chosen = np.sort(np.random.default_rng(self.seed).choice(len(normal), self.negatives, replace=False))
        path = entries.attrs["path"]
        out = {}
        for row in normal.iloc[chosen].itertuples(index=False):
            # no boxes, so no size needed now: a missing file is an error when the image is read
            file = images.get(row.image_id) if row.image_id in images else self.root / "images" / row.image_id
            out[row.image_id] = Record(row.image_id, file, {}, {}, f"{path}, row {row.row}")
        return out


class DemoDataModule(NIHBoxDataModule):
    """The 12 real NIH ChestX-ray14 images with radiologist boxes, shipped in the package.

    Downscaled 1024² -> 512² with boxes halved (original frame = 512²). Labels from the NIH
    ``Data_Entry_2017_v2020.csv`` rows of these images. 12 images, 12 boxes (Cardiomegaly 3,
    Nodule 3, Pneumonia 3, Atelectasis 1, Infiltration 1, Mass 1). NIH Clinical Center; cite
    Wang et al., "ChestX-ray8", CVPR 2017.
    """

    name = "demo"

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root=root or str(resources.files("xbench_pl.data") / "assets" / "demo"), **kwargs)
