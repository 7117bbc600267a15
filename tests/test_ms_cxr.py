"""MS-CXR: one record per (image, phrase) read from the csv as downloaded, the synthetic demo in its format,
and every bad input named by file and row (or a counted skip of its phrase)."""

from __future__ import annotations

import csv
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_cli import python

from xbench_pl import create_datamodule
from xbench_pl.data.errors import DataError
from xbench_pl.data.ms_cxr import (COLUMNS, DEMO_CSV, DEMO_IMAGES, DEMO_PAD, DEMO_STREAM, LEFT, RIGHT, demo_dicom_id,
                                   ensure_ms_cxr_demo, write_ms_cxr_demo)
from xbench_pl.data.regions import Box
from xbench_pl.data.synthetic import draw_case
from xbench_pl.geometry import Preprocess

PRE = Preprocess(size=32)
MS_CXR_ORDER = ["Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Lung Opacity", "Pleural Effusion",
                "Pneumonia", "Pneumothorax"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return ensure_ms_cxr_demo(tmp_path_factory.mktemp("ms_cxr") / "demo")


@pytest.fixture
def root(demo, tmp_path) -> Path:
    """A copy of the demo to break."""
    return Path(shutil.copytree(demo, tmp_path / "ms_cxr"))


def datamodule(root, on_error="raise", name="ms_cxr", **kwargs):
    return create_datamodule(name, root=str(root), preprocess=PRE, eval_size=64, on_error=on_error, **kwargs)


def records(root, **kwargs):
    dm = datamodule(root, **kwargs)
    dm.setup()
    return dm.test_set.records


def read_rows(root: Path) -> list[dict[str, str]]:
    with open(root / DEMO_CSV, newline="") as file:
        return list(csv.DictReader(file))


def write_rows(root: Path, rows: list[dict[str, str]], columns=COLUMNS) -> None:
    with open(root / DEMO_CSV, "w", newline="") as file:
        writer = csv.DictWriter(file, columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def edit_row(root: Path, index: int, **values) -> int:
    """Set cells of data row ``index`` (from 0); returns its line in the csv (header = 1)."""
    rows = read_rows(root)
    rows[index].update(values)
    write_rows(root, rows)
    return index + 2


def raise_then_skip(root, match, **kwargs):
    """The error ``on_error="raise"`` stops at (matching ``match``), and the datamodule set up with ``"skip"``."""
    with pytest.raises(DataError, match=match) as caught:
        datamodule(root, **kwargs).setup()
    dm = datamodule(root, "skip", **kwargs)
    dm.setup()
    return caught.value.problem, dm


def ids(dm) -> list[str]:
    return [r.image_id for r in dm.test_set.records]


# -- reading ----------------------------------------------------------------------------------------


def test_records_equal_a_direct_read_of_the_csv(demo):
    expected: dict[str, dict] = {}
    phrase_of: dict[tuple[str, str], str] = {}
    image_categories: dict[str, dict[str, int]] = {}  # labels: every category the image's phrases name
    for row in read_rows(demo):
        image_categories.setdefault(row["dicom_id"], {})[row["category_name"]] = 1
    for line, row in enumerate(read_rows(demo), start=2):
        key = (row["dicom_id"], row["label_text"])
        if key not in phrase_of:
            n = sum(dicom == row["dicom_id"] for dicom, _ in phrase_of)
            phrase_of[key] = f"{row['dicom_id']}#{n}"
            expected[phrase_of[key]] = {"path": demo / row["path"], "labels": image_categories[row["dicom_id"]],
                                        "queries": {row["category_name"]: row["label_text"]}, "boxes": [],
                                        "patient": row["path"].split("/")[2], "rows": []}
        x, y, w, h = (float(row[c]) for c in "xywh")
        expected[phrase_of[key]]["boxes"].append(Box(x, y, x + w, y + h))
        expected[phrase_of[key]]["rows"].append(line)
    dm = datamodule(demo)
    dm.setup()
    got = {r.image_id: {"path": r.path, "labels": r.labels, "queries": r.queries,
                        "boxes": r.regions[next(iter(r.queries))], "patient": r.patient_id,
                        "rows": [row for _, row in r.region_sources[next(iter(r.queries))]]} for r in dm.test_set.records}
    assert got == expected and ids(dm) == list(expected)  # and in csv order
    assert dm.classes == MS_CXR_ORDER and dm.problems == []
    # the demo's shape, as DEMO_IMAGES says: 13 phrases on 10 images, one phrase with two boxes, a patient with two studies
    assert len(got) == 13 and len({i.split("#")[0] for i in got}) == 10
    assert [len(g["boxes"]) for g in got.values()].count(2) == 1
    assert len({g["patient"] for g in got.values()}) == 9 and all(g["patient"].startswith("p1") for g in got.values())
    assert {c for g in got.values() for c in g["queries"]} == set(MS_CXR_ORDER)
    assert sum(len(g["labels"]) > 1 for g in got.values()) == 4  # two images with phrases of two categories: 2 records each


def test_demo_datamodule_reads_the_generated_folder(demo):
    dm = datamodule(demo, name="ms_cxr_demo")
    dm.setup()
    assert ids(dm) == [r.image_id for r in records(demo)] and dm.root == demo


def test_phrases_of_one_image_are_numbered_in_csv_order(demo):
    by_id = {r.image_id: r for r in records(demo)}
    two = [i for i in by_id if i.endswith("#1")]
    assert len(two) == 3 and all(f"{i[:-2]}#0" in by_id for i in two)
    same_category = [i for i in two if by_id[i].queries.keys() == by_id[f"{i[:-2]}#0"].queries.keys()]
    assert len(same_category) == 1  # two Pleural Effusion phrases on one image: two records, two queries
    first, second = by_id[f"{same_category[0][:-2]}#0"], by_id[same_category[0]]
    assert (first.queries["Pleural Effusion"], second.queries["Pleural Effusion"]) == (
        "small right pleural effusion", "small left pleural effusion")


def test_classes_restrict_the_phrases(demo):
    kept = records(demo, classes=["Pleural Effusion", "Edema"])
    assert sorted({c for r in kept for c in r.labels}) == ["Edema", "Pleural Effusion"] and len(kept) == 5
    assert all(set(r.labels) >= set(r.queries) for r in kept)


def test_csv_and_image_root_can_be_given_apart(demo, tmp_path):
    table = tmp_path / "tables" / "MS_CXR_Local_Alignment_v1.0.0.csv"
    table.parent.mkdir()
    shutil.copy(demo / DEMO_CSV, table)
    images = Path(shutil.copytree(demo / "files", tmp_path / "mimic-cxr-jpg" / "files")).parent
    dm = create_datamodule("ms_cxr", csv=str(table), image_root=str(images), preprocess=PRE, eval_size=64)
    dm.setup()
    assert [r.image_id for r in dm.test_set.records] == [r.image_id for r in records(demo)]
    assert all(r.path.is_relative_to(images) for r in dm.test_set.records)
    assert dm.test_set.records[0].source.startswith(f"{table}, row 2")


def test_a_batch_carries_each_samples_phrase(demo):
    dm = datamodule(demo)
    dm.setup()
    batch = next(iter(dm.test_dataloader()))
    wanted = dm.test_set.records[:dm.batch_size]
    assert batch.queries == [r.queries for r in wanted] and batch.image_ids == [r.image_id for r in wanted]
    assert batch.original_size.tolist() == [[576, 512]] * len(wanted)
    # each sample's region is its phrase's class, and the model grounds the phrase in place of that class name
    assert [(int(b), dm.classes[int(c)]) for b, c in batch.region_index] == [
        (b, next(iter(r.queries))) for b, r in enumerate(wanted)]
    for texts, samples in batch.query_texts():
        for b in samples.tolist():
            (category, phrase), = wanted[b].queries.items()
            assert texts[dm.classes.index(category)] == phrase
            assert [t for t, c in zip(texts, dm.classes) if c != category] == [c for c in dm.classes if c != category]


def test_fit_keeps_a_patients_images_and_phrases_in_one_set(demo):
    dm = datamodule(demo, val_fraction=0.3)
    dm.setup("fit")
    train, val = ({r.patient_id for r in part.records} for part in (dm.train_set, dm.val_set))
    assert train and val and not train & val
    assert len(dm.train_set) + len(dm.val_set) == 13


# -- the synthetic demo -----------------------------------------------------------------------------


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def drawn_with_two_seeds(folder: Path) -> subprocess.CompletedProcess:
    """The background job of the test below: the demo of seed 0 drawn again (``folder/again``) and that of seed 1
    (``folder/other``), in a process of its own."""
    draw = ("import sys\nfrom xbench_pl.data.ms_cxr import write_ms_cxr_demo\n"
            "write_ms_cxr_demo(sys.argv[1], seed=0)\nwrite_ms_cxr_demo(sys.argv[2], seed=1)\n")
    return python("-c", draw, str(folder / "again"), str(folder / "other"))


@pytest.mark.background(job=drawn_with_two_seeds)
def test_demo_is_deterministic_from_its_seed(demo, background):
    folder, drawn = background
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    again = files(folder / "again")
    assert again == files(demo)
    other = folder / "other"
    assert set(files(other)).isdisjoint(f for f in again if f.startswith("files/"))  # other ids, subjects, studies
    assert [(r["category_name"], r["label_text"]) for r in read_rows(other)] == [
        (r["category_name"], r["label_text"]) for r in read_rows(demo)]  # the same phrases on other phantoms
    with pytest.raises(FileExistsError):
        write_ms_cxr_demo(folder / "again", seed=0)


def test_demo_boxes_are_tight_around_the_drawn_lesions_on_the_side_the_phrase_says(demo):
    rows = read_rows(demo)
    top = DEMO_PAD[0]
    for index, (_, phrases) in enumerate(DEMO_IMAGES):
        dicom_id = demo_dicom_id(0, index)
        findings = [lesion for phrase in phrases for lesion in phrase.lesions]
        changed = draw_case(dicom_id, 0, DEMO_STREAM, index, findings).pixels != draw_case(
            dicom_id, 0, DEMO_STREAM, index, []).pixels
        changed = np.pad(changed, ((top, DEMO_PAD[1]), (0, 0)))
        own = [r for r in rows if r["dicom_id"] == dicom_id]
        assert [r["label_text"] for r in own] == [p.text for p in phrases for _ in p.lesions]
        inside = np.zeros_like(changed)
        for row, (_, _, side) in zip(own, [lesion for p in phrases for lesion in p.lesions]):
            x, y, w, h = (int(row[c]) for c in "xywh")
            assert changed[y:y + h, x:x + w].any() and min(w, h) >= 17
            inside[y:y + h, x:x + w] = True
            centre = x + w / 2
            if side is not None:
                assert centre < 256 if side == RIGHT else centre > 256  # the patient's right is the image's left
            words = row["label_text"].split()
            if "bilateral" not in words:
                assert ("left" in words) == (side == LEFT) and ("right" in words) == (side == RIGHT)
        assert not (changed & ~inside).any(), dicom_id  # no drawn pixel outside the phrases' boxes
        jpeg = np.asarray(Image.open(demo / own[0]["path"]), dtype=np.float64)
        assert jpeg.shape == (576, 512) == (int(own[0]["image_height"]), int(own[0]["image_width"]))


# -- bad input --------------------------------------------------------------------------------------


def test_missing_csv(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"MS_CXR_Local_Alignment_v\*\.csv: not found in --data.root"):
        datamodule(tmp_path / "empty").setup()
    with pytest.raises(DataError, match="annotation table not found") as caught:
        create_datamodule("ms_cxr", csv=str(tmp_path / "nope.csv"), preprocess=PRE).setup()
    assert caught.value.problem.file == str(tmp_path / "nope.csv")


def test_two_csvs_are_ambiguous(root):
    shutil.copy(root / DEMO_CSV, root / "MS_CXR_Local_Alignment_v1.0.0.csv")
    with pytest.raises(DataError, match="ambiguous.*--data.csv"):
        datamodule(root).setup()
    assert len(records(root, csv=str(root / DEMO_CSV))) == 13  # an explicit csv settles it


def test_missing_column(root):
    write_rows(root, read_rows(root), [c for c in COLUMNS if c != "image_height"])
    with pytest.raises(DataError, match=r"missing column\(s\) \['image_height'\]") as caught:
        datamodule(root).setup()
    assert caught.value.problem.file == str(root / DEMO_CSV)


@pytest.mark.parametrize("column, value, match", [
    ("x", "12a", "is not numeric"), ("h", "nan", "is not finite"), ("image_width", "", "is not numeric"),
    ("image_height", "575.5", "are not positive integers"), ("w", "0", "non-positive size"),
    ("h", "-4", "non-positive size"), ("category_name", "Nodule", "'Nodule' is not an MS-CXR category"),
    ("category_name", "Pneumonitis", "'Pneumonitis' is not an MS-CXR category"),
    ("label_text", "", "empty label_text"), ("dicom_id", "", "empty dicom_id"), ("path", "", "empty path"),
    ("x", "500", r"reaches outside the 512x576 image"), ("y", "-1", r"reaches outside the 512x576 image"),
])
def test_bad_cell_names_file_and_row_and_skip_leaves_out_its_phrase(root, column, value, match):
    line = edit_row(root, 0, **{column: value})
    problem, dm = raise_then_skip(root, match)
    assert (problem.file, problem.row) == (str(root / DEMO_CSV), str(line))
    assert str(problem).startswith(f"{root / DEMO_CSV}, row {line}: ")
    assert len(dm.problems) == 1 and dm.problems[0] == problem and len(dm.test_set) == 12
    assert f"{demo_dicom_id(0, 0)}#0" not in ids(dm)  # the phrase of that row


def test_a_bad_box_of_a_two_box_phrase_leaves_out_the_whole_phrase(root):
    rows = read_rows(root)
    first, second = [i for i, r in enumerate(rows) if r["category_name"] == "Edema"]
    line = edit_row(root, second, w="-3")
    problem, dm = raise_then_skip(root, "non-positive size")
    assert problem.row == str(line) and "leaves out its whole phrase" in problem.reason
    assert "Edema" not in {c for r in dm.test_set.records for c in r.labels}  # not kept with one box of two
    assert len(dm.problems) == 1


def test_ids_do_not_depend_on_a_skipped_phrase(root):
    rows = read_rows(root)
    dicom = rows[2]["dicom_id"]  # image 2: its phrases are #0 and #1
    edit_row(root, 2, x="?")
    _, dm = raise_then_skip(root, "not numeric")
    assert f"{dicom}#1" in ids(dm) and f"{dicom}#0" not in ids(dm)


def test_rows_that_disagree(root):
    rows = read_rows(root)
    edema = [i for i, r in enumerate(rows) if r["category_name"] == "Edema"]
    line = edit_row(root, edema[1], category_name="Lung Opacity")
    problem, _ = raise_then_skip(root, f"category 'Lung Opacity' differs from row {edema[0] + 2}'s 'Edema'")
    assert problem.row == str(line)
    edit_row(root, edema[1], category_name="Edema", image_width="600")
    problem, dm = raise_then_skip(root, f"differ from row {edema[0] + 2}'s .* for the same dicom_id")
    assert problem.row == str(line) and len(dm.test_set) == 12


def test_missing_image(root):
    path = root / read_rows(root)[1]["path"]
    path.unlink()
    problem, dm = raise_then_skip(root, "image file not found")
    assert problem.file == str(path) and problem.row == "3" and f"{root / DEMO_CSV}, row 3" in problem.reason
    assert len(dm.test_set) == 12 and [p.file for p in dm.problems] == [str(path)]


def test_corrupt_image(root):
    rows = read_rows(root)
    path = root / rows[2]["path"]  # image 2: two phrases, both left out
    path.write_bytes(b"\xff\xd8\xff not a jpeg")
    problem, dm = raise_then_skip(root, "cannot decode image")
    assert problem.file == str(path) and problem.row == "4"
    assert len(dm.test_set) == 11 and len(dm.problems) == 2


def test_truncated_image_fails_when_decoded(root):
    path = root / read_rows(root)[0]["path"]
    path.write_bytes(path.read_bytes()[:800])  # the header (size) reads, the pixels do not
    strict = datamodule(root)
    strict.setup()
    with pytest.raises(DataError, match="cannot decode image") as caught:
        next(iter(strict.test_dataloader()))
    assert caught.value.problem.file == str(path)
    dm = datamodule(root, "skip")
    dm.setup()  # skip mode decodes at setup
    assert len(dm.test_set) == 12 and dm.problems[0].file == str(path)


def test_image_of_another_size_than_the_csv_says(root):
    rows = read_rows(root)
    path = root / rows[0]["path"]
    Image.open(path).transpose(Image.Transpose.ROTATE_90).save(path)  # 576 x 512: the boxes would be elsewhere
    problem, dm = raise_then_skip(root, f"image_width x image_height 512x576, but the image {path} is 576x512")
    assert (problem.file, problem.row) == (str(root / DEMO_CSV), "2")
    assert len(dm.test_set) == 12 and len(dm.problems) == 1


def test_duplicate_row_is_dropped_and_recorded(root):
    rows = read_rows(root)
    write_rows(root, rows + [rows[4]])
    dm = datamodule(root)
    dm.setup()
    assert len(dm.test_set) == 13
    assert [(p.row, p.action) for p in dm.problems] == [(str(len(rows) + 2), "deduplicated")]
    assert [len(r.regions[next(iter(r.queries))]) for r in dm.test_set.records].count(2) == 1  # not a third box
