"""The reader ceiling: another radiologist's annotation scored as a model (``--model reader``)."""

import json

import lightning as L
import numpy as np
import pytest
import torch
from synthetic_dicom import VINDR_SIZE, grey, write_dicom
from test_chexlocalize import A, B, H, W, coco_string, label_row, write_chexlocalize

import xbench_pl
from xbench_pl.data.chexlocalize import cxr_id
from xbench_pl.data.errors import DataError
from xbench_pl.data.regions import Box, Mask
from xbench_pl.data.vindr_cxr import LONE_READER, VINDR_CLASSES
from xbench_pl.geometry import Preprocess

EVAL = 40


def run(model, datamodule):
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.test(model, datamodule=datamodule, verbose=False)
    return model.results[datamodule.name]


def expected(pairs):
    """Direct per-class means over ``(class, reader mask R, region G)`` eval-grid pairs: tie-aware Pointing
    Game of a binary map (the share of R inside G), Dice and IoU of R (the map at 0.5)."""
    out = {}
    for finding, r, g in pairs:
        inter = (r & g).sum()
        row = out.setdefault(finding, {"pointing_game": [], "dice@0.5": [], "iou@0.5": []})
        row["pointing_game"].append(inter / r.sum() if r.any() else g.mean())
        row["dice@0.5"].append(2 * inter / (r.sum() + g.sum()))
        row["iou@0.5"].append(inter / (r | g).sum())
    return {f: {k: float(np.mean(v)) for k, v in row.items()} for f, row in out.items()}


def assert_matches(results, want):
    for finding, row in want.items():
        for key, value in row.items():
            assert results["classes"][finding][key] == pytest.approx(value, abs=1e-12), (finding, key)


# -- CheXlocalize: hb_segmentations_test.json against gt_segmentations_test.json ----------------------
def mask(y0, y1, x0, x1):
    out = np.zeros((H, W), bool)
    out[y0:y1, x0:x1] = True
    return out


def rle(m):
    return {"size": [H, W], "counts": coco_string(m)}


def chexlocalize(tmp_path, hb):
    gt = {cxr_id(A): {"Cardiomegaly": mask(10, 20, 5, 25), "Airspace Opacity": mask(2, 8, 2, 12)},
          cxr_id(B): {"Cardiomegaly": mask(15, 28, 0, 20)}}
    rows = [label_row("test/" + A, ["Cardiomegaly", "Lung Opacity"]), label_row("test/" + B, ["Cardiomegaly"])]
    write_chexlocalize(tmp_path, rows, {i: {t: rle(m) for t, m in tasks.items()} for i, tasks in gt.items()})
    hb_masks = hb(gt)
    path = tmp_path / "hb_segmentations_test.json"
    path.write_text(json.dumps({i: {t: rle(m) for t, m in tasks.items()} for i, tasks in hb_masks.items()}))
    dm = xbench_pl.create_datamodule("chexlocalize", root=str(tmp_path), eval_size=EVAL, batch_size=1)
    return dm, xbench_pl.create_model("reader", annotations=str(path), bootstrap=0), gt, hb_masks


def test_reader_identical_to_the_ground_truth_scores_one(tmp_path):
    dm, model, _, _ = chexlocalize(tmp_path, lambda gt: gt)
    results = run(model, dm)
    for key in ("pointing_game", "dice@0.5", "iou@0.5", "dice_best", "iou_best", "pg_any_tie"):
        assert results["mean"][key] == 1.0, key
    assert results["classes"]["Cardiomegaly"]["f1"] == 1.0  # scores 1 exactly where the reader marked


def test_reader_shifted_equals_a_direct_computation(tmp_path):
    def shifted(gt):  # down 3, right 4 (cut at the edge); B's Cardiomegaly not marked by the reader
        return {cxr_id(A): {t: np.roll(np.roll(m, 3, 0), 4, 1) & mask(3, H, 4, W) for t, m in gt[cxr_id(A)].items()}}

    dm, model, gt, hb = chexlocalize(tmp_path, shifted)
    results = run(model, dm)
    names = {"Cardiomegaly": "Cardiomegaly", "Airspace Opacity": "Lung Opacity"}
    pairs = []
    for image_id, tasks in gt.items():
        for task, g in tasks.items():
            r = hb.get(image_id, {}).get(task, np.zeros((H, W), bool))
            pairs.append((names[task], Mask(r).rasterize(H, W, EVAL), Mask(g).rasterize(H, W, EVAL)))
    assert_matches(results, expected(pairs))
    assert results["classes"]["Cardiomegaly"]["pointing_game"] < 1


def test_reader_annotation_file_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        xbench_pl.create_model("reader", annotations=str(tmp_path / "missing.json"))
    bad = tmp_path / "hb.json"
    bad.write_text(json.dumps({"x": {"Cardiomegaly": {"size": [H, W], "counts": "0c1"}}}))
    with pytest.raises(DataError, match="x / Cardiomegaly"):
        xbench_pl.create_model("reader", annotations=str(bad))


# -- VinDr-CXR train: leave-one-reader-out ---------------------------------------------------------
TRAIN = """image_id,rad_id,class_name,x_min,y_min,x_max,y_max
aaa,R1,Cardiomegaly,30,40,90,70
aaa,R2,Cardiomegaly,35,42,95,72
aaa,R3,Cardiomegaly,20,30,60,60
aaa,R1,Nodule/Mass,10,10,20,20
aaa,R2,Nodule/Mass,12,8,22,18
aaa,R3,No finding,,,,
aaa,R1,Aortic enlargement,50,5,70,25
bbb,R4,Pleural effusion,80,50,119,79
bbb,R4,Pleural effusion,0,50,30,79
bbb,R5,Pleural effusion,85,55,119,79
bbb,R6,No finding,,,,
"""


def vindr_train(tmp_path, table=TRAIN):
    root = tmp_path / "vindr"
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "annotations_train.csv").write_text(table)
    for i, name in enumerate(("aaa", "bbb")):
        write_dicom(root / "train" / f"{name}.dicom", grey(*VINDR_SIZE, seed=i, dtype=np.uint16), "MONOCHROME2", bits_stored=12)
    return root


def leave_one_out_loop(table: str):
    """The reference: a plain loop over the table's rows."""
    height, width = VINDR_SIZE
    rows = [line.split(",") for line in table.strip().splitlines()[1:]]
    boxes = {}  # image -> reader -> finding -> [Box]
    for image, rad, finding, *xyxy in rows:
        reader = boxes.setdefault(image, {}).setdefault(rad, {})
        if finding != "No finding":
            reader.setdefault(finding, []).append(Box(*map(float, xyxy)))
    pairs, lone = [], 0
    names = {"Cardiomegaly": "Cardiomegaly", "Nodule/Mass": "Nodule/Mass", "Pleural effusion": "Pleural Effusion",
             "Aortic enlargement": "Aortic Enlargement"}
    for image, readers in boxes.items():
        for rad, findings in readers.items():
            for finding, own in findings.items():
                others = [b for other, f in readers.items() if other != rad for b in f.get(finding, [])]
                if not others:
                    lone += 1
                    continue
                union = lambda bs: np.any([b.rasterize(height, width, EVAL) for b in bs], axis=0)
                pairs.append((names[finding], union(own), union(others)))
    return pairs, lone


def test_vindr_leave_one_reader_out_equals_a_loop(tmp_path):
    dm = xbench_pl.create_datamodule("vindr_cxr", root=str(vindr_train(tmp_path)), split="train", readers="split",
                                     eval_size=EVAL, batch_size=2)
    model = xbench_pl.create_model("reader", annotations=str(tmp_path / "vindr" / "annotations" / "annotations_train.csv"),
                                   bootstrap=0)
    results = run(model, dm)
    pairs, lone = leave_one_out_loop(TRAIN)
    assert dm.lone_marks == lone == 1  # R1's Aortic enlargement
    assert [p.action for p in dm.problems if p.action == LONE_READER] == [LONE_READER]
    assert sorted(r.image_id for r in dm.test_set.records) == ["aaa@R1", "aaa@R2", "aaa@R3", "bbb@R4", "bbb@R5", "bbb@R6"]
    assert {r.patient_id for r in dm.test_set.records} == {"aaa", "bbb"}
    assert len(pairs) == 7 and results["mean"]["n_regions"] == 7  # Cardiomegaly 3, Nodule/Mass 2, effusion 2
    assert_matches(results, expected(pairs))
    assert results["classes"]["Aortic Enlargement"]["pointing_game"] is None  # marked by one reader: not judged


def test_vindr_readers_united_stays_as_today(tmp_path):
    root = vindr_train(tmp_path)
    dm = xbench_pl.create_datamodule("vindr_cxr", root=str(root), split="train", eval_size=EVAL,
                                     preprocess=Preprocess(size=32))
    dm.setup("test")
    assert [r.image_id for r in dm.test_set.records] == ["aaa", "bbb"]
    assert len(dm.test_set.records[0].regions["Cardiomegaly"]) == 3
    with pytest.raises(ValueError, match="needs split='train'"):
        xbench_pl.create_datamodule("vindr_cxr", root=str(root), readers="split")
    no_readers = vindr_train(tmp_path / "other", TRAIN.replace("rad_id,", "").replace(",R1,", ",").replace(",R2,", ",")
                             .replace(",R3,", ",").replace(",R4,", ",").replace(",R5,", ",").replace(",R6,", ","))
    dm = xbench_pl.create_datamodule("vindr_cxr", root=str(no_readers), split="train", readers="split",
                                     preprocess=Preprocess(size=32))
    with pytest.raises(DataError, match="rad_id"):
        dm.setup("test")


def test_reader_maps_are_exactly_the_annotation_on_the_eval_grid(tmp_path):
    """The TestStepOutput maps (what every metric and callback judges) are the binary annotation itself."""
    dm = xbench_pl.create_datamodule("vindr_cxr", root=str(vindr_train(tmp_path)), split="train", readers="split",
                                     eval_size=EVAL, batch_size=6)
    model = xbench_pl.create_model("reader", annotations=str(tmp_path / "vindr" / "annotations" / "annotations_train.csv"),
                                   bootstrap=0)
    outputs = []

    class Keep(L.Callback):
        def on_test_batch_end(self, trainer, module, out, batch, batch_idx, dataloader_idx=0):
            outputs.append((out, batch))

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[Keep()])
    trainer.test(model, datamodule=dm, verbose=False)
    (out, batch), = outputs
    assert batch.images.shape[-1] == EVAL and batch.affine[:, 2:].eq(-1e-9).all()
    sample, cls = out.pairs.unbind(1)
    assert torch.equal(out.maps, out.output.saliency[sample, cls])  # the warp is the identity, bit for bit
    assert set(out.maps.unique().tolist()) == {0.0, 1.0}
    assert VINDR_CLASSES[0] == "Aortic Enlargement"


@pytest.mark.ddp_pair
def test_leave_one_reader_out_is_ddp_exact(tmp_path):
    """Every key of the reader on split VinDr readers (lone marks included) in 1 and in 2 DDP processes."""
    from test_cli import one_and_two_processes

    root = vindr_train(tmp_path)
    a, b, _ = one_and_two_processes(tmp_path, "test", "--model", "reader", "--model.annotations",
                                    str(root / "annotations" / "annotations_train.csv"), "--model.bootstrap", "20",
                                    "--data", "vindr_cxr", "--data.root", str(root), "--data.split", "train",
                                    "--data.readers", "split", "--data.eval_size", str(EVAL), "--data.batch_size", "1",
                                    "--trainer.accelerator", "cpu")
    assert json.dumps(a) == json.dumps(b)
    vindr = a["datasets"]["vindr_cxr"]
    assert vindr["mean"]["n_regions"] == 7 and [p["action"] for p in vindr["problems"]] == [LONE_READER]
