import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from xbench_pl import create_datamodule
from xbench_pl.data.annotations import RLEMask
from xbench_pl.data.chexlocalize import CheXlocalizeDataModule, cxr_id
from xbench_pl.data.errors import DataError
from xbench_pl.data.regions import Mask
from xbench_pl.geometry import Preprocess

TASKS = ["Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Lung Opacity", "Edema",
         "Consolidation", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Support Devices"]
HEADER = ("Path,Sex,Age,Frontal/Lateral,AP/PA,No Finding,Enlarged Cardiomediastinum,Cardiomegaly,Lung Opacity,"
          "Lung Lesion,Edema,Consolidation,Pneumonia,Atelectasis,Pneumothorax,Pleural Effusion,Pleural Other,Fracture,"
          "Support Devices")


def ready(dm, eval_size=128):
    dm.preprocess, dm.eval_size = Preprocess(resize="squash", size=32), eval_size
    dm.setup("test")
    return dm


def coco_string(mask: np.ndarray) -> str:
    """pycocotools' encoding (rleToString of the column-major runs), written independently of the reader."""
    flat = mask.T.ravel().astype(np.int8)
    changes = np.flatnonzero(np.diff(np.concatenate(([0], flat, [1 - flat[-1]]))))
    counts = np.diff(np.concatenate(([0], changes))).tolist()
    out = []
    for i, x in enumerate(counts):
        x = x - counts[i - 2] if i > 2 else x
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            out.append(chr(c + 48 + (0x20 if more else 0)))
    return "".join(out)


def draw(polygon, height, width):
    canvas = Image.new("1", (width, height))
    ImageDraw.Draw(canvas).polygon(list(polygon.points), outline=1, fill=1)
    return np.asarray(canvas, dtype=bool)


# -- the real CheXlocalize sample ------------------------------------------------------------------


def test_real_labels_and_regions(real_cxr):
    root = real_cxr / "chexlocalize"
    dm = ready(create_datamodule("chexlocalize", root=str(root), split="val"))
    assert dm.classes == TASKS and dm.problems == []
    records = {r.image_id: r for r in dm.test_set.records}
    assert sorted(records) == ["patient64541_study1_view1_frontal", "patient64542_study1_view1_frontal"]
    first, second = records["patient64541_study1_view1_frontal"], records["patient64542_study1_view1_frontal"]
    assert (first.patient_id, second.patient_id) == ("patient64541", "patient64542")  # the CheXpert patient folder
    assert [t for t in TASKS if first.labels[t]] == ["Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity"]
    assert [t for t in TASKS if second.labels[t]] == ["Support Devices"]
    assert sorted(first.regions) == ["Cardiomegaly", "Enlarged Cardiomediastinum", "Lung Opacity"]
    sample = dm.test_set[[r.image_id for r in dm.test_set.records].index(first.image_id)]
    assert sample["original_size"].tolist() == [2320, 2828]  # native size; img_size [H, W] = [2320, 2828]
    assert sorted(sample["region_class"].tolist()) == [0, 1, 3]


def test_real_polygons_and_masks_agree(real_cxr):
    root = real_cxr / "chexlocalize"
    masks = CheXlocalizeDataModule(root=str(root), split="val", regions="segmentations").load_records()
    polygons = {r.image_id: r for r in CheXlocalizeDataModule(root=str(root), split="val", regions="annotations").load_records()}
    pairs = 0
    for record in masks:
        other = polygons[record.image_id]
        assert sorted(record.regions) == sorted(other.regions)
        for task, (rle,) in record.regions.items():
            height, width = rle.size
            full = rle.decode()
            drawn = np.logical_or.reduce([draw(polygon, height, width) for polygon in other.regions[task]])
            assert (full & drawn).sum() / (full | drawn).sum() > 0.999  # full resolution: same pixels
            a, b = rle.rasterize(height, width, 256), np.zeros((256, 256), bool)
            for polygon in other.regions[task]:
                b |= polygon.rasterize(height, width, 256)
            assert (a & b).sum() / (a | b).sum() > 0.99  # eval grid
            assert (a == Mask(full).rasterize(height, width, 256)).all()  # run sampling == decoding then sampling
            pairs += 1
    assert pairs == 4


# -- synthetic files in the native layout ---------------------------------------------------------

H, W = 30, 40


@pytest.mark.parametrize("seed", range(4))
def test_coco_rle_round_trip(seed):
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 60)), int(rng.integers(1, 60)))
    for mask in (rng.random(shape) < 0.5, np.zeros(shape, bool), np.ones(shape, bool), rng.random(shape) < 0.02):
        rle = RLEMask.from_coco(coco_string(mask), shape)
        assert (rle.decode() == mask).all() and rle.any() == mask.any()
        assert (rle.rasterize(*shape, 17) == Mask(mask).rasterize(*shape, 17)).all()


def label_row(path: str, positives=(), value="1.0") -> str:
    columns = HEADER.split(",")[5:]
    return ",".join([path, "Male", "70", "Frontal", "AP"] + [value if c in positives else "0.0" for c in columns])


def write_chexlocalize(root: Path, rows: list[str], segmentations: dict, annotations: dict | None = None, split="test"):
    for row in rows:
        image = root / "CheXpert" / split / Path(*row.split(",")[0].split("/")[-3:])
        image.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((H, W, 3), 90, np.uint8)).save(image)
    (root / "CheXpert" / f"{split}_labels.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    (root / "CheXlocalize").mkdir(exist_ok=True)
    (root / "CheXlocalize" / f"gt_segmentations_{split}.json").write_text(json.dumps(segmentations))
    (root / "CheXlocalize" / f"gt_annotations_{split}.json").write_text(json.dumps(annotations or {}))


def rect(y0, y1, x0, x1, shape=(H, W)):
    mask = np.zeros(shape, bool)
    mask[y0:y1, x0:x1] = True
    return {"size": list(shape), "counts": coco_string(mask)}


A, B = "patient1/study1/view1_frontal.jpg", "patient2/study1/view2_lateral.jpg"


def test_synthetic_layout_labels_and_masks(tmp_path):
    rows = [label_row("CheXpert-v1.0/test/" + A, ["Cardiomegaly", "Lung Opacity"]), label_row("test/" + B)]
    empty = {"size": [H, W], "counts": coco_string(np.zeros((H, W), bool))}
    write_chexlocalize(tmp_path, rows, {cxr_id(A): {"Cardiomegaly": rect(10, 20, 5, 25), "Airspace Opacity": empty, "Edema": empty}},
                       {cxr_id(A): {"img_size": [H, W], "Cardiomegaly": [[[5, 10], [24, 10], [24, 19], [5, 19]]]}})
    dm = ready(CheXlocalizeDataModule(root=str(tmp_path)), eval_size=60)
    assert dm.problems == [] and [r.image_id for r in dm.test_set.records] == [cxr_id(A), cxr_id(B)]
    assert cxr_id(B) == "patient2_study1_view2_lateral"
    sample = dm.test_set[0]
    assert sample["labels"].tolist() == [1.0 if t in ("Cardiomegaly", "Lung Opacity") else 0.0 for t in TASKS]
    assert sample["region_class"].tolist() == [1]  # the empty Airspace Opacity mask is no region
    expected = np.zeros((60, 60), bool)
    expected[20:40, 7:37] = True  # eval pixels whose centres fall in rows 10-19, cols 5-24 (0.5 px, 2/3 px apart)
    assert (sample["region_masks"][0].numpy() == expected).all()
    polygons = ready(CheXlocalizeDataModule(root=str(tmp_path), regions="annotations"), eval_size=60)
    assert (polygons.test_set[0]["region_masks"][0].numpy() == expected).all()  # outline included: same pixels


@pytest.mark.parametrize(
    "rows, segmentations, reason, row",
    [
        ([label_row(A, ["Edema"], value="-1.0")], {}, "Edema label '-1.0' is not 0 or 1", "2"),
        ([label_row(A, ["Edema"], value="")], {}, "Edema label '' is not 0 or 1", "2"),
        ([label_row(A, ["Edema"])], {cxr_id(A): {"Pneumonitis": rect(1, 2, 1, 2)}}, "Pneumonitis", "patient1_study1_view1_frontal / Pneumonitis"),
        ([label_row(A, ["Edema"])], {cxr_id(A): {"Fracture": rect(1, 2, 1, 2)}}, "not a CheXlocalize localisation task", None),
        ([label_row(A, ["Edema"])], {cxr_id(A): {"Edema": {"size": [H, W], "counts": "0c1"}}}, "do not tile", None),
        ([label_row(A, ["Edema"])], {cxr_id(A): {"Edema": [1, 2]}}, "expected {'size'", None),
        ([label_row(A, ["Edema"])], {cxr_id(A): {"Atelectasis": rect(1, 2, 1, 2)}}, "the label CSV says Atelectasis is absent", None),
        ([label_row(A, ["Edema"])], {"patient9_study1_view1_frontal": {}}, "not in the label CSV", "patient9_study1_view1_frontal"),
        ([label_row(A, ["Edema"])], {cxr_id(A): {"Edema": rect(0, 5, 0, 5, shape=(H + 1, W))}}, "does not fit", None),
    ],
)
def test_bad_input_names_file_and_row(tmp_path, rows, segmentations, reason, row):
    write_chexlocalize(tmp_path, rows + [label_row(B, ["Cardiomegaly"])], segmentations)
    with pytest.raises(DataError, match=reason) as error:
        ready(CheXlocalizeDataModule(root=str(tmp_path)))
    dm = ready(CheXlocalizeDataModule(root=str(tmp_path), on_error="skip"))
    (problem,) = dm.problems
    assert problem.action == "skipped" and reason in problem.reason and str(problem) == str(error.value)
    if row is not None:
        assert problem.row == row
    assert cxr_id(B) in [r.image_id for r in dm.test_set.records]


def test_polygon_errors_and_duplicates(tmp_path):
    rows = [label_row(A, ["Edema"]), label_row(A, ["Edema"]), label_row(A, ["Atelectasis"])]
    write_chexlocalize(tmp_path, rows, {}, {cxr_id(A): {"img_size": [H, W], "Edema": [[[1, 2]], [[1, 1], [5, 1], [5, 5]]]}})
    dm = ready(CheXlocalizeDataModule(root=str(tmp_path), regions="annotations", on_error="skip"))
    problems = {p.row: p for p in dm.problems}
    assert sorted((row, p.action) for row, p in problems.items()) == [
        ("3", "deduplicated"), ("4", "skipped"), ("patient1_study1_view1_frontal / Edema", "skipped")]
    assert "with other labels" in problems["4"].reason and "at least 2" in problems["patient1_study1_view1_frontal / Edema"].reason
    (record,) = dm.test_set.records
    assert record.labels["Edema"] == 1 and record.labels["Atelectasis"] == 0 and "Edema" not in record.regions


def test_missing_files_and_columns(tmp_path):
    with pytest.raises(DataError, match="test_labels.csv"):
        CheXlocalizeDataModule(root=str(tmp_path)).load_records()
    write_chexlocalize(tmp_path, [label_row(A)], {})
    (tmp_path / "CheXpert" / "test_labels.csv").write_text("Path,Edema\n" + A + ",1.0\n")
    with pytest.raises(DataError, match="missing label column"):
        CheXlocalizeDataModule(root=str(tmp_path)).load_records()
    write_chexlocalize(tmp_path, [label_row(B)], {}, split="val")
    (tmp_path / "CheXlocalize" / "gt_segmentations_val.json").unlink()
    with pytest.raises(DataError, match="gt_segmentations_val.json"):
        CheXlocalizeDataModule(root=str(tmp_path), split="val").load_records()
