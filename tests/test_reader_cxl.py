"""The reader in the CheXlocalize-comparable mode (``--model reader --model.cxl true``): CheXlocalize's human benchmark.

Its hit rule from ``hb_salient_pt_test.json`` (their ``eval.py --if_human_benchmark``) and its IoU from the annotation
itself at full resolution, each against a direct computation written here from the documented rule."""

import json

import lightning as L
import numpy as np
import pytest
from test_chexlocalize import A, B, H, W, label_row, write_chexlocalize
from test_reader import mask, rle

import xbench_pl
from xbench_pl.data.chexlocalize import cxr_id
from xbench_pl.data.errors import DataError
from xbench_pl.metrics.chexlocalize import hb_hit, reader_pair

EVAL = 40
TASK = {"Cardiomegaly": "Cardiomegaly", "Airspace Opacity": "Lung Opacity", "Edema": "Edema"}


def run(model, datamodule):
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.test(model, datamodule=datamodule, verbose=False)
    return model.results[datamodule.name]


#: ground truth: A has Cardiomegaly and Airspace Opacity, B Cardiomegaly; Edema is empty in both
GT = {cxr_id(A): {"Cardiomegaly": mask(10, 20, 5, 25), "Airspace Opacity": mask(2, 8, 2, 12), "Edema": mask(0, 0, 0, 0)},
      cxr_id(B): {"Cardiomegaly": mask(15, 28, 0, 20), "Edema": mask(0, 0, 0, 0)}}
#: the reader's segmentations: A's Cardiomegaly shifted, its opacity as the ground truth, a false Edema on B
HB = {cxr_id(A): {"Cardiomegaly": mask(12, 24, 8, 30), "Airspace Opacity": mask(2, 8, 2, 12)},
      cxr_id(B): {"Edema": mask(1, 5, 1, 5)}}
#: their layout: {cxr_id: {task: [[x, y], ...]}}, float pixels. A's Cardiomegaly: the second point hits (x 4.9 -> column 4 is
#: outside [5, 25), x 5.9 -> 5 inside); A's opacity: outside; B: no Cardiomegaly point (a miss), an Edema point (no region: not counted)
SALIENT = {cxr_id(A): {"Cardiomegaly": [[4.9, 15.2], [5.9, 15.7]], "Airspace Opacity": [[20.0, 20.0]]},
           cxr_id(B): {"Edema": [[2.0, 2.0]]}}


def chexlocalize(tmp_path, hb=HB, salient=SALIENT, **model_args):
    rows = [label_row("test/" + A, ["Cardiomegaly", "Lung Opacity"]), label_row("test/" + B, ["Cardiomegaly"])]
    write_chexlocalize(tmp_path, rows, {i: {t: rle(m) for t, m in tasks.items()} for i, tasks in GT.items()})
    annotations = tmp_path / "hb_segmentations_test.json"
    annotations.write_text(json.dumps({i: {t: rle(m) for t, m in tasks.items()} for i, tasks in hb.items()}))
    if salient is not None:
        (tmp_path / "hb_salient_pt_test.json").write_text(json.dumps(salient))
        model_args["salient_points"] = str(tmp_path / "hb_salient_pt_test.json")
    dm = xbench_pl.create_datamodule("chexlocalize", root=str(tmp_path), eval_size=EVAL, batch_size=2)
    model = xbench_pl.create_model("reader", annotations=str(annotations), **{"cxl": True, "bootstrap": 0, **model_args})
    return dm, model


def direct_human_benchmark(gt, hb, salient):
    """Per finding the means of their human-benchmark loop: for every ground-truth image and task, the hit (any point at
    [int(y), int(x)] inside a non-empty region; no point: 0; empty region: not counted) and the IoUs of the reader's mask."""
    out = {}
    for image_id, tasks in gt.items():
        for task, g in tasks.items():
            r = hb.get(image_id, {}).get(task, np.zeros((H, W), bool))
            row = out.setdefault(TASK[task], {"cxl_hit_rate": [], "cxl_miou": [], "cxl_miou_all": []})
            inter, union = (r & g).sum(), (r | g).sum()
            if g.any():
                points = salient.get(image_id, {}).get(task, [])
                row["cxl_hit_rate"].append(float(any(g[int(y), int(x)] for x, y in points)))
                if r.any():
                    row["cxl_miou"].append(inter / union)
            if union:
                row["cxl_miou_all"].append(inter / union)
    return {f: {k: (float(np.mean(v)) if v else None) for k, v in row.items()} for f, row in out.items()}


def test_human_benchmark_hit_and_iou_equal_a_direct_computation(tmp_path):
    dm, model = chexlocalize(tmp_path)
    results = run(model, dm)
    want = direct_human_benchmark(GT, HB, SALIENT)
    assert want["Cardiomegaly"]["cxl_hit_rate"] == 0.5 and want["Lung Opacity"]["cxl_hit_rate"] == 0.0
    assert want["Edema"] == {"cxl_hit_rate": None, "cxl_miou": None, "cxl_miou_all": 0.0}
    for finding, row in want.items():
        for key, value in row.items():
            got = results["classes"][finding][key]
            assert (got is None) if value is None else got == pytest.approx(value, abs=1e-12), (finding, key)


def test_annotation_equal_to_the_ground_truth_is_drawn_at_full_resolution(tmp_path):
    """The annotation itself is the segmentation: IoU 1 exactly (a resampled eval-grid map through Otsu is not)."""
    dm, model = chexlocalize(tmp_path, hb=GT, salient=None)
    results = run(model, dm)
    assert results["mean"]["cxl_miou"] == 1.0 and results["mean"]["cxl_miou_all"] == 1.0
    # no salient-point file: the annotation's first marked pixel (row-major) as a model's map: inside the region
    assert results["mean"]["cxl_hit_rate"] == 1.0


def test_hb_hit_rule():
    region = mask(10, 20, 5, 25)
    assert hb_hit([[4.9, 15.0]], region) == 0.0 and hb_hit([[4.9, 15.0], [5.0, 19.99]], region) == 1.0
    assert hb_hit([], region) == 0.0 and np.isnan(hb_hit([[6, 12]], None)) and np.isnan(hb_hit([[6, 12]], mask(0, 0, 0, 0)))
    assert hb_hit([[-0.5, 12.0]], mask(10, 20, 0, 5)) == 1.0  # int(-0.5) = 0, as their int()
    with pytest.raises(ValueError, match="outside the 40x30 image"):
        hb_hit([[6, 12], [40.0, 3.0]], region)
    # without points the annotation is judged as a 0/1 map: its first marked pixel in row-major order
    annotation = mask(3, 6, 30, 35) | mask(12, 14, 6, 8)
    assert reader_pair(annotation, region)[0] == 0.0 and reader_pair(annotation, region, [[7, 12]])[0] == 1.0


def test_salient_point_file_errors(tmp_path):
    with pytest.raises(ValueError, match="set cxl=True"):
        chexlocalize(tmp_path / "a", cxl=False)
    with pytest.raises(DataError, match=r"hb_salient_pt_test.json.*list of \[x, y\] points"):
        chexlocalize(tmp_path / "b", salient={cxr_id(A): {"Cardiomegaly": [[1.0, 2.0, 3.0]]}})
    with pytest.raises(DataError, match="unknown finding name"):
        chexlocalize(tmp_path / "c", salient={cxr_id(A): {"Heart": [[1.0, 2.0]]}})
    dm, model = chexlocalize(tmp_path / "d", salient={cxr_id(B): {"Cardiomegaly": [[10.0, 30.0]]}})
    with pytest.raises(DataError, match=r"hb_salient_pt_test.json.*outside the 40x30 image"):
        run(model, dm)


# -- the real CheXlocalize sample: no human-benchmark files ship with it ---------------------------------------
def test_real_sample_ground_truth_as_reader(real_cxr, tmp_path):
    """The real sample holds no hb_* files, so its ground truth plays the reader, with salient points made from it:
    mIoU 1 exactly at the real ~2000 x 2800 sizes, and hits as the direct rule on the decoded masks."""
    from xbench_pl.data.annotations import RLEMask

    root = real_cxr / "chexlocalize"
    assert not list(root.rglob("hb_*"))
    gt_path = root / "gt_segmentations_val.json"
    gt = json.loads(gt_path.read_text())
    decoded = {i: {t: RLEMask.from_coco(v["counts"], tuple(v["size"])).decode() for t, v in tasks.items() if t != "img_size"}
               for i, tasks in gt.items()}
    salient = {}
    for image_id, tasks in decoded.items():
        for k, (task, m) in enumerate(sorted(tasks.items())):
            if m.any():  # alternately a point on the region's first pixel (a hit) and one on the image corner (a miss)
                y, x = np.argwhere(m)[0] if k % 2 == 0 else (0, 0)
                salient.setdefault(image_id, {})[task] = [[float(x) + 0.5, float(y) + 0.5]]
    (tmp_path / "hb_salient_pt_val.json").write_text(json.dumps(salient))
    dm = xbench_pl.create_datamodule("chexlocalize", root=str(root), split="val", eval_size=64, batch_size=2)
    model = xbench_pl.create_model("reader", annotations=str(gt_path), salient_points=str(tmp_path / "hb_salient_pt_val.json"),
                                   cxl=True, bootstrap=0)
    results = run(model, dm)
    assert results["mean"]["cxl_miou"] == 1.0 and results["mean"]["cxl_miou_all"] == 1.0
    from xbench_pl.data.vocabulary import canonical

    hits = {}
    for image_id, tasks in decoded.items():
        for task, m in tasks.items():
            if m.any():
                points = salient.get(image_id, {}).get(task, [])
                hits.setdefault(canonical(task, "chexlocalize"), []).append(float(any(m[int(y), int(x)] for x, y in points)))
    assert {0.0, 1.0} <= {h for v in hits.values() for h in v}
    for finding, row in results["classes"].items():
        want = np.mean(hits[finding]) if finding in hits else None
        assert row["cxl_hit_rate"] == (None if want is None else pytest.approx(want, abs=1e-9)), finding


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """A resumed run replays the stored images into the reader itself: their cxl keys are drawn from the annotation at
    full resolution, as in the run, not judged from the stored eval-grid maps."""
    from xbench_pl.callbacks.predictions import PredictionWriter

    def stored_run(store, resume):
        dm, model = chexlocalize(tmp_path)
        dm.batch_size = 1
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            callbacks=[PredictionWriter(str(store), dtype="float32", resume=resume, shard_images=1)])
        trainer.test(model, datamodule=dm, verbose=False)
        return model.results[dm.name]

    whole = stored_run(tmp_path / "store", resume=False)
    shards = sorted((tmp_path / "store" / "shards").glob("*.safetensors"))
    assert len(shards) == 2
    shards[1].unlink()  # the run stopped after its first image
    resumed = stored_run(tmp_path / "store", resume=True)
    assert resumed["mean"]["cxl_miou_all"] is not None
    assert json.dumps(resumed["mean"]) == json.dumps(whole["mean"])
    assert json.dumps(resumed["classes"]) == json.dumps(whole["classes"])
