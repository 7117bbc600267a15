"""Bad input: an error naming file and row, or with on_error='skip' a counted, reported skip;
corrections (clipped boxes, duplicate rows) are always recorded. Never a silent drop."""

from __future__ import annotations

import pickle
import re
import shutil

import numpy as np
import pytest
from PIL import Image
from synthetic_dicom import RSNA_LABELS, grey, make_rsna, make_siim, make_vindr, write_dicom

from xbench_pl import create_datamodule
from xbench_pl.data.errors import DataError
from xbench_pl.data.io import read_image
from xbench_pl.data.synthetic import ensure_demo
from xbench_pl.geometry import Preprocess

PRE = Preprocess(size=16)


def datamodule(name, root, on_error="raise", **kwargs):
    return create_datamodule(name, root=str(root), preprocess=PRE, eval_size=8, on_error=on_error, **kwargs)


def raise_then_skip(name, root, match):
    """The error ``on_error="raise"`` stops at (matching ``match``), and the datamodule set up with ``"skip"``."""
    with pytest.raises(DataError, match=match) as caught:
        datamodule(name, root).setup()
    dm = datamodule(name, root, "skip")
    dm.setup()
    return caught.value.problem, dm


def images_seen(dm) -> list[str]:
    dm.setup()
    return [i for batch in dm.test_dataloader() for i in batch.image_ids]


def test_missing_image(tmp_path):
    root = make_rsna(tmp_path / "rsna", images=("pos",))
    first, dm = raise_then_skip("rsna_pneumonia", root, "image file not found")
    assert first.file.endswith("neg.dcm") and "stage_2_train_labels.csv, row 3" in first.reason
    assert first.row == "3" and str(first).startswith(f"{first.file}: image file not found")  # the row is the table's
    assert images_seen(dm) == ["pos"]
    assert len(dm.problems) == 1 and dm.problems[0].file.endswith("neg.dcm")


def test_dicom_corrupt_after_its_header_is_dropped_at_setup_in_skip_mode(tmp_path):
    root = make_rsna(tmp_path / "rsna")
    bad = root / "stage_2_train_images" / "neg.dcm"
    write_dicom(bad, np.zeros((64, 64), np.uint16))
    bad.write_bytes(bad.read_bytes()[:-3000])  # header intact, pixel data cut
    strict = datamodule("rsna_pneumonia", root)
    strict.setup()  # raise mode reads headers only at setup ...
    with pytest.raises(DataError, match="cannot decode DICOM pixel data") as caught:
        images_seen(strict)  # ... and stops at the image when it is decoded
    assert caught.value.problem.file == str(bad)
    dm = datamodule("rsna_pneumonia", root, "skip")
    assert images_seen(dm) == ["pos"]
    assert [p.file for p in dm.problems] == [str(bad)] and "cannot decode" in dm.problems[0].reason


def test_not_a_dicom_fails_at_setup(tmp_path):
    root = make_rsna(tmp_path / "rsna")
    (root / "stage_2_train_images" / "neg.dcm").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match="not a readable DICOM"):
        datamodule("rsna_pneumonia", root).setup()


def test_truncated_png_and_corrupt_jpeg(tmp_path):
    png, jpg = tmp_path / "a.png", tmp_path / "b.jpg"
    Image.fromarray(grey(64, 64)).save(png)
    Image.fromarray(grey(64, 64)).save(jpg, quality=90)
    png.write_bytes(png.read_bytes()[:2000])
    jpg.write_bytes(jpg.read_bytes()[:600])
    for path in (png, jpg):
        with pytest.raises(DataError, match="cannot decode image") as caught:
            read_image(path)
        assert caught.value.problem.file == str(path)


def test_truncated_png_in_a_dataset_is_skipped_and_counted(tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(ensure_demo() / "nih", root)  # the synthetic demo, NIH format
    victim = sorted((root / "images").glob("*.png"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    dm = datamodule("nih_bbox", root, "skip")
    seen = images_seen(dm)
    assert len(seen) == 11 and victim.name not in seen
    # (at eval_size 8 an eval pixel spans 64 original pixels: small boxes are also reported, as empty_on_grid)
    assert [p.file for p in dm.problems if p.action != "empty_on_grid"] == [str(victim)]


def test_malformed_rows(tmp_path):
    labels = RSNA_LABELS + "pos,NaN,1,2,3,1\npos,1,2,-5,3,1\nneg,1,2,3,4,7\n"
    root = make_rsna(tmp_path / "rsna", labels=labels)
    first, dm = raise_then_skip("rsna_pneumonia", root, "not finite")
    assert first.row == "5" and first.file.endswith("stage_2_train_labels.csv")
    assert [(p.row, p.action) for p in dm.problems] == [("5", "skipped"), ("6", "skipped"), ("7", "skipped")]
    assert "non-positive size" in dm.problems[1].reason and "Target '7'" in dm.problems[2].reason
    regions = {r.image_id: len(r.regions.get("Pneumonia", [])) for r in dm.test_set.records}
    assert regions == {"pos": 2, "neg": 0}


def test_positive_row_with_a_bad_box_keeps_the_image_positive(tmp_path):
    root = make_rsna(tmp_path / "rsna", labels=RSNA_LABELS + "sick,1,2,,4,1\n", images=("pos", "neg", "sick"))
    dm = datamodule("rsna_pneumonia", root, "skip")
    dm.setup()
    (sick,) = [r for r in dm.test_set.records if r.image_id == "sick"]
    assert sick.labels == {"Pneumonia": 1} and not sick.regions
    assert [(p.row, p.action) for p in dm.problems] == [("5", "skipped")] and "keeps the label" in dm.problems[0].reason


def test_box_outside_the_image_is_clipped_and_counted(tmp_path):
    # 96 x 128 image: the first box reaches past the right edge, the second lies wholly outside
    labels = "patientId,x,y,width,height,Target\npos,100,-10,50,40,1\npos,200,10,5,5,1\nneg,,,,,0\n"
    root = make_rsna(tmp_path / "rsna", labels=labels)
    first, dm = raise_then_skip("rsna_pneumonia", root, "lies outside")
    assert first.row == "3"
    assert [(p.row, p.action) for p in dm.problems] == [("2", "clipped"), ("3", "skipped")]
    assert "clipped to (100, 0, 128, 30)" in dm.problems[0].reason
    (box,) = dm.test_set.records[0].regions["Pneumonia"]
    assert (box.x0, box.y0, box.x1, box.y1) == (100, 0, 128, 30)


def test_unknown_class_name(tmp_path):
    boxes = "image_id,class_name,x_min,y_min,x_max,y_max\naaa,Cardiomegally,1,1,10,10\nbbb,No finding,,,,\n"
    root = make_vindr(tmp_path / "vindr", boxes=boxes)
    first, dm = raise_then_skip("vindr_cxr", root, "unknown finding name 'Cardiomegally'")
    assert first.row == "2" and first.file.endswith("annotations_test.csv")
    assert len(dm.problems) == 1 and len(dm.test_set) == 2


def test_duplicated_rows_are_dropped_and_recorded(tmp_path):
    root = make_rsna(tmp_path / "rsna", labels=RSNA_LABELS + "pos,10,20,30,40,1\n")
    dm = datamodule("rsna_pneumonia", root)  # not an error, even in raise mode
    dm.setup()
    assert [(p.row, p.action, p.reason) for p in dm.problems] == [("5", "deduplicated", "duplicate of row 2; dropped")]
    assert len(dm.test_set.records[0].regions["Pneumonia"]) == 2


def test_missing_columns(tmp_path):
    root = make_rsna(tmp_path / "rsna", labels="patientId,x,y,width,height\npos,1,2,3,4\n")
    for on_error in ("raise", "skip"):
        with pytest.raises(DataError, match=r"missing column\(s\) \['Target'\]") as caught:
            datamodule("rsna_pneumonia", root, on_error).setup()
        assert caught.value.problem.file.endswith("stage_2_train_labels.csv")


def test_empty_split_and_nothing_left(tmp_path):
    root = make_rsna(tmp_path / "rsna")
    (tmp_path / "empty.csv").write_text("image_id\n")
    with pytest.raises(DataError, match="lists no image ids"):
        datamodule("rsna_pneumonia", root, "skip", split_file=str(tmp_path / "empty.csv")).setup()
    (tmp_path / "unknown.csv").write_text("image_id\nzzz\n")
    with pytest.raises(DataError, match="no images left to evaluate.*'zzz' is not in"):
        datamodule("rsna_pneumonia", root, "skip", split_file=str(tmp_path / "unknown.csv")).setup()


def test_bad_run_length_rows(tmp_path):
    # odd number of values; runs past the end of the 48 x 64 image (found when placed on the image at setup)
    root = make_siim(tmp_path / "siim", extra_rows="1.2.4.2, 5 3 1\n1.2.4.1, 3000 500\n")
    dm = datamodule("siim_pneumothorax", root, "skip")
    dm.setup()
    assert [p.row for p in dm.problems] == ["5", "6"]
    assert "not (gap >= 0, run >= 1) pairs" in dm.problems[0].reason and "overruns" in dm.problems[1].reason
    assert len(dm.test_set.records[0].regions["Pneumothorax"]) == 2
    with pytest.raises(DataError, match="row 5"):
        datamodule("siim_pneumothorax", root).setup()


def test_data_error_pickles_and_survives_dataloader_workers(tmp_path):
    error = DataError(tmp_path / "a.png", "cannot decode image", row=7, action="skipped")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is DataError and str(again) == str(error) and again.problem == error.problem
    root = tmp_path / "demo"
    shutil.copytree(ensure_demo() / "nih", root)  # the synthetic demo, NIH format
    victim = sorted((root / "images").glob("*.png"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # header intact: passes setup in raise mode
    dm = create_datamodule("nih_bbox", root=str(root), preprocess=PRE, eval_size=8, num_workers=1, batch_size=12)
    dm.setup()
    with pytest.raises(DataError, match=f"(?s)DataLoader worker.*{re.escape(str(victim))}: cannot decode image"):
        next(iter(dm.test_dataloader()))


@pytest.mark.parametrize("text, expected", [
    ("neg\npos\n", {"neg": 1, "pos": 2}),                      # no header: the first id is kept
    ("image_id\npos\n\n neg \n", {"pos": 2, "neg": 4}),        # header, blank line, spaces
    ("file\npos\n", {"pos": 2}),                               # any header that is no id
    ("x,ID,z\n1,pos,3\n4,neg,6\n", {"pos": 2, "neg": 3}),      # CSV with an id column
    ("Image Index,Finding\npos,Mass\n", {"pos": 2}),           # CSV without one: its first column
])
def test_split_file_forms(tmp_path, text, expected):
    from xbench_pl.data.splits import read_split_file

    (tmp_path / "split.csv").write_text(text)
    assert read_split_file(tmp_path / "split.csv", {"neg", "pos"}) == expected


def test_split_file_without_header_keeps_every_id_and_names_missing_lines(tmp_path):
    root = make_rsna(tmp_path / "rsna")
    (tmp_path / "ids.txt").write_text("neg\nghost\npos\n")
    dm = datamodule("rsna_pneumonia", root, "skip", split_file=str(tmp_path / "ids.txt"))
    assert sorted(images_seen(dm)) == ["neg", "pos"]
    assert [(p.row, p.reason) for p in dm.problems] == [("2", "image id 'ghost' is not in the rsna_pneumonia annotations")]
    with pytest.raises(DataError, match="split file not found"):
        datamodule("rsna_pneumonia", root, split_file=str(tmp_path / "nope.txt")).setup()
