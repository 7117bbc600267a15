import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from xbench_pl import create_datamodule
from xbench_pl.data.chestx_det10 import ChestXDet10DataModule
from xbench_pl.data.errors import DataError
from xbench_pl.data.regions import Box
from xbench_pl.geometry import Preprocess

CLASSES = ["Atelectasis", "Calcification", "Consolidation", "Pleural Effusion", "Emphysema",
           "Fibrosis", "Fracture", "Mass", "Nodule", "Pneumothorax"]


def write_det10(root: Path, entries: list, split="test", size=64, folder="test_data") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{split}.json").write_text(json.dumps(entries))
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("file_name"), str):
            path = root / folder / entry["file_name"]
            path.parent.mkdir(exist_ok=True)
            Image.fromarray(np.full((size, size), 100, np.uint8)).save(path)
    return root


def ready(dm):
    dm.preprocess = Preprocess(resize="squash", size=32)
    dm.setup("test")
    return dm


def test_reads_inclusive_boxes_and_negatives(tmp_path):
    write_det10(tmp_path, [
        {"file_name": "101.png", "syms": ["Effusion", "Nodule", "Effusion"], "boxes": [[10, 20, 29, 39], [0, 0, 0, 0], [40, 40, 50, 50]]},
        {"file_name": "102.png", "syms": [], "boxes": []},
    ])
    dm = ready(create_datamodule("chestx_det10", root=str(tmp_path), eval_size=64))
    assert dm.classes == CLASSES and dm.problems == []
    first, negative = dm.test_set[0], dm.test_set[1]
    assert first["labels"].tolist() == [1.0 if c in ("Pleural Effusion", "Nodule") else 0.0 for c in CLASSES]
    assert negative["labels"].sum() == 0 and negative["region_masks"].shape[0] == 0
    assert dm.test_set.records[0].regions["Nodule"] == [Box(0, 0, 1, 1)]  # a one-pixel inclusive box
    masks = dict(zip(first["region_class"].tolist(), first["region_masks"]))
    effusion = masks[CLASSES.index("Pleural Effusion")].numpy()
    expected = np.zeros((64, 64), bool)
    expected[20:40, 10:30] = expected[40:51, 40:51] = True  # inclusive ends: 20 rows x 20 columns, 11 x 11
    assert (effusion == expected).all()
    assert masks[CLASSES.index("Nodule")].sum() == 1


def test_split_option_and_split_file(tmp_path):
    write_det10(tmp_path, [{"file_name": "1.png", "syms": ["Mass"], "boxes": [[1, 1, 5, 5]]}], split="train", folder="train_data")
    write_det10(tmp_path, [{"file_name": "2.png", "syms": ["Mass"], "boxes": [[1, 1, 5, 5]]},
                           {"file_name": "3.png", "syms": [], "boxes": []}])
    assert [r.image_id for r in ChestXDet10DataModule(root=str(tmp_path), split="train").load_records()] == ["1.png"]
    (tmp_path / "split.csv").write_text("file\n3.png\n")
    dm = ready(ChestXDet10DataModule(root=str(tmp_path), split_file=str(tmp_path / "split.csv")))
    assert [r.image_id for r in dm.test_set.records] == ["3.png"]
    with pytest.raises(ValueError, match="split"):
        ChestXDet10DataModule(root=str(tmp_path), split="val")


def test_same_name_in_two_folders_needs_image_dir(tmp_path):
    write_det10(tmp_path, [{"file_name": "7.png", "syms": [], "boxes": []}], folder="test_data")
    write_det10(tmp_path, [{"file_name": "7.png", "syms": [], "boxes": []}], folder="train_data")
    with pytest.raises(DataError, match="ambiguous"):
        ChestXDet10DataModule(root=str(tmp_path)).load_records()
    (record,) = ChestXDet10DataModule(root=str(tmp_path), image_dir="test_data").load_records()
    assert record.path == tmp_path / "test_data" / "7.png"


GOOD = {"file_name": "1.png", "syms": ["Mass"], "boxes": [[1, 1, 5, 5]]}


@pytest.mark.parametrize(
    "bad, reason",
    [
        ({"file_name": "2.png", "syms": ["Mass"], "boxes": [[1, 1, float("nan"), 5]]}, "not finite"),
        ({"file_name": "2.png", "syms": ["Mass"], "boxes": [[9, 1, 5, 5]]}, "non-positive size"),
        ({"file_name": "2.png", "syms": ["Mass"], "boxes": [[1, 1, 5]]}, "4 values"),
        ({"file_name": "2.png", "syms": ["Mass"], "boxes": [[1, None, 5, 5]]}, "None"),
        ({"file_name": "2.png", "syms": ["Pneumonitis"], "boxes": [[1, 1, 5, 5]]}, "Pneumonitis"),
        ({"file_name": "2.png", "syms": ["Mass", "Nodule"], "boxes": [[1, 1, 5, 5]]}, "not parallel"),
        ({"file_name": "2.png", "syms": ["Mass"]}, "lacks \\['boxes'\\]"),
        ({"file_name": "2.png", "syms": ["Mass"], "boxes": [[100, 100, 120, 120]]}, "lies outside"),
        ({"file_name": "9.png", "syms": [], "boxes": []}, "image file not found"),
        ({"file_name": "1.png", "syms": ["Nodule"], "boxes": [[1, 1, 5, 5]]}, "also entry 1 with other boxes"),
        (["2.png"], "not an object"),
    ],
)
def test_bad_entries_name_file_and_entry(tmp_path, bad, reason):
    write_det10(tmp_path, [GOOD, bad])
    (tmp_path / "test_data" / "9.png").unlink(missing_ok=True)
    with pytest.raises(DataError, match=reason) as error:
        ready(ChestXDet10DataModule(root=str(tmp_path)))
    assert "test.json, row 2" in str(error.value)
    dm = ready(ChestXDet10DataModule(root=str(tmp_path), on_error="skip"))
    assert len(dm.problems) == 1 and dm.problems[0].action == "skipped" and "test.json, row 2" in str(dm.problems[0])
    first = next(r for r in dm.test_set.records if r.image_id == "1.png")
    assert first.regions == {"Mass": [Box(1, 1, 6, 6)]}


def test_malformed_box_drops_the_box_but_keeps_its_finding_positive(tmp_path):
    write_det10(tmp_path, [GOOD, {"file_name": "2.png", "syms": ["Mass", "Nodule"], "boxes": [[1, 1, "x", 5], [2, 2, 6, 6]]}])
    dm = ready(ChestXDet10DataModule(root=str(tmp_path), on_error="skip"))
    second = next(r for r in dm.test_set.records if r.image_id == "2.png")
    assert second.labels == {"Mass": 1, "Nodule": 1} and second.regions == {"Nodule": [Box(2, 2, 7, 7)]}
    ((row, reason),) = [(p.row, p.reason) for p in dm.problems]
    assert row == "2 (2.png)" and reason.startswith("Mass box 0") and "keeps the label" in reason


def test_exact_duplicate_entry_and_clipping_are_recorded(tmp_path):
    clipped = {"file_name": "3.png", "syms": ["Fracture"], "boxes": [[50, 60, 70, 63]]}
    write_det10(tmp_path, [GOOD, clipped, GOOD])
    dm = ready(ChestXDet10DataModule(root=str(tmp_path)))
    assert len(dm.test_set) == 2
    assert dm.test_set.records[1].regions["Fracture"] == [Box(50, 60, 64, 64)]
    assert sorted((p.row, p.action) for p in dm.problems) == [("2 (3.png)", "clipped"), ("3 (1.png)", "deduplicated")]


def test_file_level_errors(tmp_path):
    with pytest.raises(DataError, match="test.json: annotation file not found"):
        ChestXDet10DataModule(root=str(tmp_path)).load_records()
    (tmp_path / "test.json").write_text('{"file_name": "1.png"}')
    with pytest.raises(DataError, match="expected a JSON list"):
        ChestXDet10DataModule(root=str(tmp_path)).load_records()
    (tmp_path / "test.json").write_text("[{")
    with pytest.raises(DataError, match="not valid JSON"):
        ChestXDet10DataModule(root=str(tmp_path)).load_records()
