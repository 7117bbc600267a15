"""ChestX-Det10 (Deepwise AI Lab): 3,543 NIH images renamed to integers, boxes of 10 findings.

Layout as downloaded (``train_data.zip`` / ``test_data.zip`` unpacked into ``root``, plus the
repository's JSONs)::

    root/test.json, root/train.json    [{"file_name": "36204.png", "syms": [...], "boxes": [[x1, y1, x2, y2], ...]}, ...]
    root/**/<integer>.png              1024², 8-bit (found anywhere under root, or under ``image_dir``)

Coordinates: integer **xyxy, both ends inclusive** (the challenge ``eval.py`` adds 1 to
widths) -> ``Box(x1, y1, x2 + 1, y2 + 1)``. ``syms`` and ``boxes`` are parallel; an image
with empty lists is a negative of every class. Classes, as spelled: Atelectasis,
Calcification, Consolidation, Effusion (-> Pleural Effusion), Emphysema, Fibrosis, Fracture,
Mass, Nodule, Pneumothorax.

Default evaluation split: ``test.json``, **542 images (459 with boxes, 83 negatives), 1,476
boxes**: Consolidation 446, Pleural Effusion 372, Nodule 166, Fibrosis 120, Fracture 115,
Calcification 67, Emphysema 66, Atelectasis 51, Pneumothorax 42, Mass 31. ``split="train"``
reads ``train.json`` (3,001 images, 2,320 with boxes, 6,863 boxes).

Bad input: the JSON not being a list of such entries is a ``DataError``. An entry without
``file_name``/``syms``/``boxes``, with lists of different lengths, an unknown finding or a
malformed box (not 4 numbers, NaN, x2 < x1) is an error naming the file and entry (``row``:
1-based entry number and file name), or a counted skip with ``on_error='skip'`` (a bad box
drops only itself: its finding, being listed in ``syms``, stays positive). A file name listed twice is a duplicate (dropped and recorded) when the
entries are equal, else an error. Boxes reaching outside the image are clipped at setup.
"""

from __future__ import annotations

from typing import Literal


from xbench_pl.data.annotations import ImageIndex, parse_box, read_json
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import UNUSABLE_BOX, DataError
from xbench_pl.data.vocabulary import canonical, dataset_classes
from xbench_pl.registry import lightning_datamodules



#: the evaluation sets (``xbench_pl/data/sources.yaml``), as a type so that a wrong name is refused while parsing
Split = Literal["test", "train"]


class ChestXDet10Data(XBenchData):
    """ChestX-Det10 boxes.

    Args:
        split: (``XBenchData``) ``"test"`` (default, ``test.json``) or ``"train"`` (``train.json``).
        image_dir: folder of the PNGs relative to ``root`` (default: search all of ``root``;
            set it if train and test images sit in different folders under one root).
        **kwargs: ``XBenchData`` arguments.
    """

    name = "chestx_det10"
    default_classes = dataset_classes("chestx_det10")
    fit_official_split = "train"

    def __init__(self, root: str | None = None, split: Split | None = None, image_dir: str | None = None, **kwargs):
        super().__init__(root=root, split=split, **kwargs)
        self.image_dir = image_dir

    def load_records(self) -> list[Record]:
        self.checked_root("test.json, train.json and the PNG images")
        path = self.root / f"{self.split}.json"
        entries = read_json(path, list)
        image_folder = self.root / self.image_dir if self.image_dir else self.root
        images = ImageIndex(image_folder, "**/*.png")
        records: dict[str, Record] = {}
        first: dict[str, tuple[int, dict]] = {}
        for number, entry in enumerate(entries, start=1):
            name = entry.get("file_name") if isinstance(entry, dict) and isinstance(entry.get("file_name"), str) else None
            row = f"{number} ({name})"
            if name in first:
                earlier, earlier_entry = first[name]
                equal = earlier_entry == entry
                self.report(DataError(path, f"{name} is also entry {earlier}" + ("; dropped" if equal else " with other boxes"),
                                      row=row, action="deduplicated" if equal else "skipped"))
                continue
            try:
                findings, boxes = self.parse_entry(entry)
            except (KeyError, ValueError, TypeError) as error:
                self.report(DataError(path, str(error).strip('"'), row=row))
                continue
            first[name] = (number, entry)
            record = records[name] = Record(name, images.get(name, default=image_folder), {}, {}, f"{path}, row {row}")
            for index, (finding, box) in enumerate(zip(findings, boxes)):
                record.labels[finding] = 1  # listed in syms: positive whether or not its box parses
                try:
                    box = parse_box(box, "xyxy_inclusive")
                except (ValueError, TypeError) as error:
                    self.report(DataError(path, f"{finding} box {index}: {error} ({UNUSABLE_BOX})", row=row))
                    continue
                record.add_region(finding, box, path, row)
        return list(records.values())

    def parse_entry(self, entry) -> tuple[list[str], list]:
        """The canonical findings and raw boxes of one entry; errors say what is wrong."""
        if not isinstance(entry, dict):
            raise TypeError(f"entry is a {type(entry).__name__}, not an object")
        missing = [k for k in ("file_name", "syms", "boxes") if k not in entry]
        if missing:
            raise ValueError(f"entry lacks {missing}")
        if not isinstance(entry["file_name"], str) or not entry["file_name"]:
            raise ValueError(f"file_name {entry['file_name']!r} is not a file name")
        syms, boxes = entry["syms"], entry["boxes"]
        if not isinstance(syms, list) or not isinstance(boxes, list) or len(syms) != len(boxes):
            raise ValueError(f"syms and boxes are not parallel lists ({syms!r} vs {boxes!r})")
        return [canonical(s, self.name) for s in syms], boxes

#: ``ChestXDet10DataModule``: its ``LightningDataModule``, built on first use (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(ChestXDet10Data)
