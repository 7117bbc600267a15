"""NIH ChestX-ray14 boxes (``BBox_List_2017.csv``) and the shipped real ``demo`` subset.

Layout as downloaded: ``BBox_List_2017.csv`` (header ``Image Index,Finding Label,Bbox [x,y,w,h],,,``),
images under ``images/`` or ``images_0NN/images/``, optional ``Data_Entry_2017*.csv`` for labels.
Boxes are float xywh, top-left origin, in the 1024² frame -> ``Box(x, y, x + w, y + h)``.
Without ``Data_Entry`` a finding is positive when it has a box; with it, labels come from
its ``Finding Labels`` (so boxed images that also carry other findings are positives there).
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import pandas as pd

from xbench_pl.data.base import Record, XBenchDataModule
from xbench_pl.data.io import DataError
from xbench_pl.data.regions import Box
from xbench_pl.data.vocabulary import canonical

BOX_TABLE = "BBox_List_2017.csv"
NIH_BOX_CLASSES = ("Atelectasis", "Cardiomegaly", "Pleural Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax")


def read_box_table(path: Path) -> pd.DataFrame:
    """The box list as columns ``image_id, finding, x, y, w, h, row`` (row = 1-based line in the file)."""
    table = pd.read_csv(path, header=None, skiprows=1, usecols=range(6), dtype=str, skip_blank_lines=False)
    table.columns = ["image_id", "finding", "x", "y", "w", "h"]
    table["row"] = range(2, len(table) + 2)
    return table.dropna(how="all", subset=["image_id", "finding", "x", "y", "w", "h"])


def find_image(root: Path, image_id: str, index: dict[str, Path]) -> Path:
    return index.get(image_id, root / "images" / image_id)


class NIHBoxDataModule(XBenchDataModule):
    name = "nih_bbox"
    default_classes = NIH_BOX_CLASSES

    def load_records(self) -> list[Record]:
        root = self.root
        if root is None or not (root / BOX_TABLE).is_file():
            raise DataError(root / BOX_TABLE if root else BOX_TABLE, "NIH box list not found (set --data.root)")
        table_path = root / BOX_TABLE
        images = {p.name: p for p in root.glob("images*/**/*.png")}
        records: dict[str, Record] = {}
        for row in read_box_table(table_path).itertuples(index=False):
            try:
                finding = canonical(str(row.finding))
                x, y, w, h = (float(v) for v in (row.x, row.y, row.w, row.h))
                if not all(math.isfinite(v) for v in (x, y, w, h)) or w <= 0 or h <= 0:
                    raise ValueError(f"box {row.x, row.y, row.w, row.h} is not a finite positive-size xywh box")
            except (KeyError, ValueError, TypeError) as error:
                self.report(DataError(table_path, str(error).strip('"'), row=row.row))
                continue
            record = records.setdefault(
                row.image_id, Record(row.image_id, find_image(root, row.image_id, images), {}, {}, f"{table_path}, row {row.row}")
            )
            record.labels[finding] = 1
            record.regions.setdefault(finding, []).append(Box(x, y, x + w, y + h))
        self.add_entry_labels(root, records)
        return list(records.values())

    def add_entry_labels(self, root: Path, records: dict[str, Record]) -> None:
        entries = sorted(root.glob("Data_Entry_2017*.csv"))
        if not entries:
            return
        table = pd.read_csv(entries[0], usecols=["Image Index", "Finding Labels"], dtype=str)
        labels = dict(zip(table["Image Index"], table["Finding Labels"]))
        for image_id, record in records.items():
            if image_id not in labels:
                continue
            for spelling in labels[image_id].split("|"):
                try:
                    finding = canonical(spelling.replace("_", " "))
                except KeyError:
                    continue  # Data_Entry findings without boxes anywhere in this dataset (e.g. Hernia)
                if finding in self.classes:
                    record.labels[finding] = 1


class DemoDataModule(NIHBoxDataModule):
    """The 12 real NIH ChestX-ray14 images with radiologist boxes, shipped in the package.

    Downscaled 1024² -> 512² with boxes halved (original frame = 512²). Labels from the NIH
    ``Data_Entry_2017_v2020.csv`` rows of these images. NIH Clinical Center; cite Wang et al.,
    "ChestX-ray8", CVPR 2017.
    """

    name = "demo"

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root=root or str(resources.files("xbench_pl.data") / "assets" / "demo"), **kwargs)
