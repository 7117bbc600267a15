"""The stated-box metrics (``xbench_pl.metrics.boxes``) against their yardsticks: RadFact's ``compute_box_metrics``
(its outputs on every case, run from microsoft/RadFact in a scratch environment and committed under
``tests/data/generative``), torchmetrics' ``MeanAveragePrecision`` run directly on the same boxes, hand geometry for
IoU and clipping, and the DDP property (the same records in any split and order of updates give the same table)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.boxes import (BOX_KEYS, BOX_MAP_KEYS, BOX_PAIR_KEYS, BoxMode, best_iou, box_iou, box_precision_recall,
                                     clip_boxes, mean_average_precision, pair_box_values, radfact_mask)
from xbench_pl.metrics.functional import bootstrap_weights
from xbench_pl.metrics.resampling import image_key, unit_key

MeanAveragePrecision = pytest.importorskip("torchmetrics.detection").MeanAveragePrecision
pytest.importorskip("pycocotools")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")

RADFACT = json.loads((Path(__file__).resolve().parent / "data" / "generative" / "radfact_box_metrics.json").read_text())
NAN = float("nan")


def value(v) -> float:
    return NAN if v == "nan" else float(v)


def same(a: float, b: float) -> bool:
    """Equal, NaN equal to NaN."""
    return (math.isnan(a) and math.isnan(b)) or a == b


# -- RadFact's box precision and recall ------------------------------------------------------------------
SCORED = [c for c in RADFACT["cases"] if "raises" not in c["output"]]


def test_radfact_cases_cover_nan_and_the_raw_slicing():
    assert RADFACT["source"].startswith("microsoft/RadFact@") and "compute_box_metrics" in RADFACT["source"]
    assert len(SCORED) >= 25 and any(c["box_type"] != "NormalizedBox" for c in SCORED)
    assert {c["mask_size"] for c in SCORED} == {224, 512, 1000}
    assert any(c["output"]["precision"] == "nan" for c in SCORED) and any(c["output"]["recall"] == "nan" for c in SCORED)


def pixels(boxes: list, height: int, width: int) -> torch.Tensor:
    scale = torch.tensor([width, height, width, height], dtype=torch.float64)
    return torch.tensor(boxes, dtype=torch.float64).reshape(-1, 4) * scale


# (1, 1): the normalised boxes themselves, bit for bit; the others: in pixels of a square, a landscape and a portrait
# image, where x / W * size gives back RadFact's x * size to the same integer pixel on every case
@pytest.mark.parametrize("height,width", [(1, 1), (800, 1000), (2500, 2048)])
@pytest.mark.parametrize("case", SCORED, ids=[f"{c['name']}-{c['box_type'][:4]}" for c in SCORED])
def test_box_precision_recall_is_radfacts(case, height, width):
    size = case["mask_size"]
    stated, truth = pixels(case["pred_boxes"], height, width), pixels(case["gt_boxes"], height, width)
    pred, true = radfact_mask(stated, height, width, size), radfact_mask(truth, height, width, size)
    assert pred.shape == true.shape == (size, size)
    counts = case["pixel_counts"]  # by RadFact's own get_mask_from_boxes (its mask is transposed: areas agree)
    assert (int(pred.sum()), int(true.sum()), int((pred & true).sum()), int((pred | true).sum())) == (
        counts["pred_area"], counts["true_area"], counts["intersection"], counts["union"])
    union = int((pred | true).sum())
    assert same(int((pred & true).sum()) / union if union else NAN, value(case["output"]["iou"]))
    precision, recall = box_precision_recall(stated, truth, height, width, size)
    assert same(precision, value(case["output"]["precision"])) and same(recall, value(case["output"]["recall"]))


def test_radfact_mask_defaults_to_radfacts_224_square():
    case = next(c for c in SCORED if c["name"] == "overlapping_shifted")
    stated, truth = pixels(case["pred_boxes"], 600, 500), pixels(case["gt_boxes"], 600, 500)
    assert radfact_mask(stated, 600, 500).shape == (224, 224)
    assert box_precision_recall(stated, truth, 600, 500) == (value(case["output"]["precision"]), value(case["output"]["recall"]))


# -- IoU and clipping -----------------------------------------------------------------------------------
def test_box_iou_and_best_iou_by_hand():
    first = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 2.0, 2.0]])
    second = torch.tensor([[5.0, 0.0, 15.0, 10.0], [0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0], [2.5, 2.5, 7.5, 7.5],
                           [1.0, 1.0, 3.0, 3.0]])
    iou = box_iou(first, second)
    assert iou.dtype == torch.float64 and iou.shape == (2, 5)
    # overlap / (area + area - overlap), continuous coordinates
    expected = [[50 / 150, 1.0, 0.0, 25 / 100, 4 / 100], [0.0, 4 / 100, 0.0, 0.0, 1 / 7]]
    np.testing.assert_allclose(iou.numpy(), expected, rtol=1e-12, atol=0)
    assert box_iou(first, torch.zeros(0, 4)).shape == (2, 0) and box_iou(torch.zeros(0, 4), second).shape == (0, 5)
    assert best_iou(first, second) == 1.0
    assert math.isclose(best_iou(first[1:], second[[0, 2, 4]]), 1 / 7, rel_tol=1e-12)
    assert best_iou(torch.zeros(0, 4), second) == 0.0  # no stated box: nothing found
    assert math.isnan(best_iou(first, torch.zeros(0, 4)))  # no ground truth: undefined


def test_clip_boxes_orders_clips_drops_and_says_which_were_kept():
    height, width = 80, 100
    boxes = torch.tensor([[30.0, 40.0, 10.0, 20.0],  # inverted corners: put in order
                          [-5.0, -5.0, 50.0, 50.0],  # clipped at 0
                          [90.0, 70.0, 120.0, 95.0],  # clipped at the width and the height
                          [120.0, 10.0, 150.0, 30.0],  # wholly right of the image: no area left, dropped
                          [10.0, 10.0, 10.0, 20.0],  # zero width: dropped
                          [0.0, 0.0, 100.0, 80.0]])  # the whole image, unchanged
    kept_boxes, kept = clip_boxes(boxes, height, width)
    assert kept.tolist() == [True, True, True, False, False, True]
    assert kept_boxes.dtype == torch.float64
    assert kept_boxes.tolist() == [[10.0, 20.0, 30.0, 40.0], [0.0, 0.0, 50.0, 50.0], [90.0, 70.0, 100.0, 80.0],
                                   [0.0, 0.0, 100.0, 80.0]]
    empty, none = clip_boxes(torch.zeros(0, 4), height, width)
    assert empty.shape == (0, 4) and none.shape == (0,)


# -- one pair's values ----------------------------------------------------------------------------------
def pair(stated, truth, label, failed=False, height=100, width=100) -> dict:
    stated = torch.tensor(stated, dtype=torch.float64).reshape(-1, 4)
    truth = torch.tensor(truth, dtype=torch.float64).reshape(-1, 4)
    return dict(zip(BOX_PAIR_KEYS, pair_box_values(stated, truth, height, width, label, failed)))


def test_pair_box_values_semantics():
    truth = [[10.0, 10.0, 30.0, 30.0]]
    # a box stated for a finding the image does not have: drawn where absent; nothing to match it against
    absent = pair([[10.0, 10.0, 30.0, 30.0]], [], label=0)
    assert absent["box_absent_drawn"] == 1.0 and absent["parse_failure_rate"] == 0.0
    assert all(math.isnan(absent[k]) for k in ("box_acc@0.5", "box_miou", "box_precision", "box_recall"))
    assert pair([], [], label=0)["box_absent_drawn"] == 0.0  # absent and left unboxed
    # a positive without a region: nothing is defined but the parse flag
    unregioned = pair([[10.0, 10.0, 30.0, 30.0]], [], label=1)
    assert [k for k, v in unregioned.items() if not math.isnan(v)] == ["parse_failure_rate"]
    # an answer that did not parse, scored as no box: found nothing, no stated pixel (precision undefined), recall 0
    failed = pair([], truth, label=1, failed=True)
    assert failed["parse_failure_rate"] == 1.0 and math.isnan(failed["box_absent_drawn"])
    assert failed["box_acc@0.5"] == 0.0 and failed["box_miou"] == 0.0 and failed["box_recall"] == 0.0
    assert math.isnan(failed["box_precision"])
    # no stated box where there is a region, without a parse failure: the same scores, flag 0
    unboxed = pair([], truth, label=1)
    assert unboxed["parse_failure_rate"] == 0.0 and (unboxed["box_acc@0.5"], unboxed["box_miou"]) == (0.0, 0.0)
    assert math.isnan(unboxed["box_precision"])
    # exactly the region; then IoU exactly 0.5 (found: >= 0.5), its RadFact precision 1/2 and recall 1
    exact = pair(truth, truth, label=1)
    assert [exact[k] for k in ("box_acc@0.5", "box_miou", "box_precision", "box_recall")] == [1.0, 1.0, 1.0, 1.0]
    half = pair([[10.0, 10.0, 30.0, 50.0]], truth, label=1)
    assert (half["box_acc@0.5"], half["box_miou"], half["box_recall"]) == (1.0, 0.5, 1.0)
    assert math.isclose(half["box_precision"], 0.5, abs_tol=0.02)  # on RadFact's 224 grid
    assert pair([[10.0, 10.0, 30.0, 51.0]], truth, label=1)["box_acc@0.5"] == 0.0  # IoU 20/41: just short
    # self-consistency is filled in by self_consistency on the eval grid, never here
    assert all(math.isnan(v[k]) for v in (absent, failed, exact) for k in ("self_consistency_mass", "self_consistency_pg"))


# -- a synthetic dataset of stated and ground-truth boxes ------------------------------------------------
CLASSES = ["often", "sometimes", "never_true", "never_stated"]


def synthetic(n_images: int = 9, seed: int = 3) -> list[dict]:
    """Per (image, finding) pair: its keys, label, ground-truth and stated boxes (original pixels, clipped) and scores.
    ``often``: ground truth on most images, stated near it and elsewhere, tied scores; ``sometimes``: an image with
    ground truth and no statement, statements on images without ground truth; ``never_true``: stated, never in the
    ground truth (mAP undefined); ``never_stated``: ground truth, never stated (mAP 0)."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.rand(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    scores = torch.tensor([0.3, 0.5, 0.5, 0.9, 1.0], dtype=torch.float64)  # ties on purpose
    pairs = []
    for i in range(n_images):
        name = f"img{i}"
        height, width = 200 + 37 * i, 260 - 11 * i
        scale = torch.tensor([width, height, width, height], dtype=torch.float64)

        def box() -> torch.Tensor:
            x0, y0 = rand(2) * 0.6
            w, h = 0.1 + rand(2) * 0.3
            return torch.stack([x0, y0, x0 + w, y0 + h]) * scale

        for c, finding in enumerate(CLASSES):
            n_truth = {"often": 1 + int(i % 4 != 0) if i % 3 else 0, "sometimes": int(i % 3 == 0),
                       "never_true": 0, "never_stated": int(i % 2 == 0)}[finding]
            truth = torch.stack([box() for _ in range(n_truth)]) if n_truth else torch.zeros(0, 4, dtype=torch.float64)
            stated = []
            if finding == "often":
                stated = [t + (rand(4) - 0.5) * 0.08 * scale for t in truth] + [box() for _ in range(i % 3)]
            elif finding == "sometimes" and i % 3 != 1:  # i = 0, 3, 6: ground truth; i = 1, 4, 7: neither
                stated = [truth[0] + (rand(4) - 0.5) * 0.1 * scale] if n_truth and i != 3 else [box()] if i % 3 == 2 else []
            elif finding == "never_true" and i % 2:
                stated = [box(), box()]
            raw = torch.stack(stated) if stated else torch.zeros(0, 4, dtype=torch.float64)
            if i == 5 and finding == "often":
                raw[0] = raw[0][[2, 3, 0, 1]]  # inverted corners; clip_boxes puts them in order
                raw = torch.cat([raw, torch.tensor([[-50.0, -50.0, -10.0, -10.0]], dtype=torch.float64)])  # outside: dropped
            clipped, kept = clip_boxes(raw, height, width)
            drawn = scores[torch.randint(0, len(scores), (raw.shape[0],), generator=gen)][kept]
            label = float(n_truth > 0 or (finding == "sometimes" and i == 4))  # img4: positive without a region
            failed = finding == "sometimes" and i == 7
            values = pair_box_values(clipped, truth, height, width, label, failed)
            if clipped.shape[0]:  # self-consistency stand-ins: only their bookkeeping is under test here
                values[4:6] = [float(rand(1)), float(rand(1) > 0.5)]
            pairs.append({"image": image_key(name), "unit": unit_key(name, f"P{i // 2}"), "cls": c, "values": values,
                          "stated": clipped, "scores": drawn, "truth": truth})
    return pairs


def box_batch(pairs: list[dict]) -> tuple:
    """``BoxMode.update``'s arguments for these pairs."""
    image = torch.tensor([p["image"] for p in pairs], dtype=torch.long)
    unit = torch.tensor([p["unit"] for p in pairs], dtype=torch.long)
    cls = torch.tensor([p["cls"] for p in pairs], dtype=torch.long)
    values = torch.tensor([p["values"] for p in pairs], dtype=torch.float64).reshape(-1, len(BOX_PAIR_KEYS))

    def listed(boxes: str, scores: str | None) -> dict:
        counts = torch.tensor([p[boxes].shape[0] for p in pairs], dtype=torch.long)
        stacked = torch.cat([p[boxes] for p in pairs]) if pairs else torch.zeros(0, 4, dtype=torch.float64)
        return {"image": image.repeat_interleave(counts), "cls": cls.repeat_interleave(counts), "boxes": stacked,
                "scores": torch.cat([p[scores] for p in pairs]) if scores else torch.ones(stacked.shape[0], dtype=torch.float64)}

    return image, unit, cls, values, listed("stated", "scores"), listed("truth", None)


def images_in_key_order(pairs: list[dict]) -> list[int]:
    return sorted({p["image"] for p in pairs})


def torchmetrics_inputs(pairs: list[dict], classes: list[int]) -> tuple[list[dict], list[dict]]:
    """Per image (in image-key order, every image), its boxes of ``classes`` with their labels, for
    ``MeanAveragePrecision``."""
    preds, targets = [], []
    for key in images_in_key_order(pairs):
        mine = [p for p in pairs if p["image"] == key and p["cls"] in classes]
        preds.append({"boxes": torch.cat([p["stated"] for p in mine]).float(),
                      "scores": torch.cat([p["scores"] for p in mine]).float(),
                      "labels": torch.cat([torch.full((p["stated"].shape[0],), p["cls"]) for p in mine])})
        targets.append({"boxes": torch.cat([p["truth"] for p in mine]).float(),
                        "labels": torch.cat([torch.full((p["truth"].shape[0],), p["cls"]) for p in mine])})
    return preds, targets


def test_the_synthetic_dataset_has_the_cases_the_map_must_handle():
    pairs = synthetic()
    by = lambda c: [p for p in pairs if p["cls"] == c]  # noqa: E731
    often, sometimes = by(0), by(1)
    assert len({float(s) for p in often for s in p["scores"]}) >= 3  # varied scores
    scores = torch.cat([p["scores"] for p in often])
    assert scores.numel() > torch.unique(scores).numel()  # ties
    assert any(p["truth"].shape[0] and not p["stated"].shape[0] for p in sometimes)  # ground truth, no statement
    assert any(p["stated"].shape[0] and not p["truth"].shape[0] for p in sometimes)  # a statement, no ground truth
    assert max(p["stated"].shape[0] for p in often) >= 3 and max(p["truth"].shape[0] for p in often) >= 2
    assert all(not p["truth"].shape[0] for p in by(2)) and all(not p["stated"].shape[0] for p in by(3))
    assert any(p["values"][BOX_PAIR_KEYS.index("box_absent_drawn")] == 1.0 for p in pairs)


# -- COCO mAP ---------------------------------------------------------------------------------------------
def test_box_map_per_finding_and_mean_are_torchmetrics_on_the_same_boxes():
    pairs = synthetic()
    mode = BoxMode(len(CLASSES))
    mode.update(*box_batch(pairs))
    columns = mode.columns(mode.state())
    for c, finding in enumerate(CLASSES):
        # the finding's boxes alone over every image, straight into torchmetrics
        metric = MeanAveragePrecision(iou_type="bbox", box_format="xyxy")
        metric.update(*torchmetrics_inputs(pairs, [c]))
        alone = metric.compute()
        if finding == "never_true":  # no ground truth anywhere: COCO has no category; undefined here
            assert float(alone["map"]) == -1.0 and math.isnan(columns["box_map50"][c]) and math.isnan(columns["box_map"][c])
            continue
        assert float(columns["box_map50"][c]) == float(alone["map_50"]), finding
        assert float(columns["box_map"][c]) == float(alone["map"]), finding
    assert float(columns["box_map"][3]) == 0.0 and 0 < float(columns["box_map"][0]) < float(columns["box_map50"][0]) <= 1
    # every finding at once, as COCO: per class map equals ours; the overall map is the mean over the categories
    # with ground truth, which is our mean row (the mean over findings where it is defined)
    metric = MeanAveragePrecision(iou_type="bbox", box_format="xyxy", class_metrics=True)
    metric.update(*torchmetrics_inputs(pairs, list(range(len(CLASSES)))))
    together = metric.compute()
    per_class = dict(zip(together["classes"].tolist(), together["map_per_class"].tolist()))
    for c in range(len(CLASSES)):
        assert same(float(columns["box_map"][c]), NAN if per_class[c] == -1 else per_class[c])
    for key, theirs in (("box_map50", "map_50"), ("box_map", "map")):
        ours = columns[key][~torch.isnan(columns[key])]
        assert ours.numel() == 3 and math.isclose(float(ours.mean()), float(together[theirs]), rel_tol=1e-6, abs_tol=1e-7)


def test_mean_average_precision_is_torchmetrics_and_nan_without_ground_truth():
    pairs = [p for p in synthetic() if p["cls"] == 0]
    order = images_in_key_order(pairs)
    pairs.sort(key=lambda p: order.index(p["image"]))
    ours = mean_average_precision([{"boxes": p["stated"], "scores": p["scores"]} for p in pairs],
                                  [{"boxes": p["truth"]} for p in pairs])
    metric = MeanAveragePrecision(iou_type="bbox", box_format="xyxy")
    metric.update(*torchmetrics_inputs(pairs, [0]))
    theirs = metric.compute()
    assert ours == {"box_map50": float(theirs["map_50"]), "box_map": float(theirs["map"])}
    # the same statements with no ground truth anywhere: undefined, not COCO's -1
    empty = mean_average_precision([{"boxes": p["stated"], "scores": p["scores"]} for p in pairs],
                                   [{"boxes": torch.zeros(0, 4, dtype=torch.float64)} for p in pairs])
    assert all(math.isnan(v) for v in empty.values())


# -- split invariance (the DDP property) ------------------------------------------------------------------
def grounding_inputs(pairs: list[dict], n_classes: int, seed: int = 5) -> dict:
    """A plain ``BenchmarkMetrics.update`` per image (scores, labels, one map per ground-truth region), keyed like the
    box pairs, so the table has its bootstrap draws."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key in images_in_key_order(pairs):
        mine = sorted((p for p in pairs if p["image"] == key), key=lambda p: p["cls"])
        regioned = [p for p in mine if p["truth"].shape[0]]
        masks = torch.zeros(len(regioned), 12, 12, dtype=torch.bool)
        for j, p in enumerate(regioned):
            masks[j, 2 + j:7 + j, 3:9] = True
        out[key] = {"scores": torch.rand(1, n_classes, generator=gen),
                    "labels": torch.tensor([[float(p["truth"].shape[0] > 0) for p in mine]]),
                    "maps": torch.rand(len(regioned), 12, 12, generator=gen), "masks": masks,
                    "cls": torch.tensor([p["cls"] for p in regioned], dtype=torch.long), "unit": mine[0]["unit"]}
    return out


def fed(pairs: list[dict], chunks: list[list[int]], grounding: dict) -> BenchmarkMetrics:
    """A ``BenchmarkMetrics(boxes=True)`` fed the images of each chunk in one update (both its plain and its box update)."""
    bench = BenchmarkMetrics(CLASSES, boxes=True, bootstrap=50, bootstrap_seed=1)
    for chunk in chunks:
        mine = [p for key in chunk for p in pairs if p["image"] == key]
        g = [grounding[key] for key in chunk]
        n = torch.tensor([x["cls"].numel() for x in g])
        keys, units = torch.tensor(chunk), torch.tensor([x["unit"] for x in g])
        bench.update(torch.cat([x["scores"] for x in g]), torch.cat([x["labels"] for x in g]), torch.cat([x["maps"] for x in g]),
                     torch.cat([x["masks"] for x in g]), torch.cat([x["cls"] for x in g]), image_keys=keys.repeat_interleave(n),
                     unit_keys=units.repeat_interleave(n), sample_keys=keys, sample_units=units)
        bench.update_boxes(*box_batch(mine))
    return bench


def box_part(table: dict) -> dict:
    """The table's box keys: per class, the mean row and their intervals."""
    return {"classes": {name: {k: row[k] for k in BOX_KEYS} for name, row in table["classes"].items()},
            "mean": {k: table["mean"][k] for k in BOX_KEYS},
            "ci": {"mean": {k: table["ci"]["mean"].get(k) for k in BOX_PAIR_KEYS},
                   "classes": {name: {k: row.get(k) for k in BOX_PAIR_KEYS} for name, row in table["ci"]["classes"].items()}}}


def test_one_update_or_several_in_another_order_give_the_same_box_table():
    pairs = synthetic()
    keys = images_in_key_order(pairs)
    grounding = grounding_inputs(pairs, len(CLASSES))
    shuffled = [keys[i] for i in torch.randperm(len(keys), generator=torch.Generator().manual_seed(7)).tolist()]
    assert shuffled != keys
    whole = fed(pairs, [keys], grounding)
    split = fed(pairs, [shuffled[:2], shuffled[2:7], shuffled[7:]], grounding)
    # the synced records: bit for bit, sorted by image key
    for part in ("pairs", "stated", "truth"):
        one, other = whole.boxes.state()[part], split.boxes.state()[part]
        assert one.keys() == other.keys() and all(torch.equal(one[k], other[k]) for k in one), part
    assert torch.all(whole.boxes.state()["pairs"]["image"].diff() >= 0)
    one, other = box_part(whole.compute()), box_part(split.compute())
    assert json.dumps(one, sort_keys=True) == json.dumps(other, sort_keys=True)
    assert one["ci"]["mean"]["box_miou"] is not None and one["mean"]["box_map50"] is not None
    assert one["classes"]["never_true"]["box_map"] is None and one["classes"]["never_stated"]["box_map"] == 0.0
    # the table's mean row of the mAP keys: COCO's mean over the categories with ground truth
    metric = MeanAveragePrecision(iou_type="bbox", box_format="xyxy")
    metric.update(*torchmetrics_inputs(pairs, list(range(len(CLASSES)))))
    coco = metric.compute()
    assert math.isclose(one["mean"]["box_map50"], float(coco["map_50"]), rel_tol=1e-6, abs_tol=1e-7)
    assert math.isclose(one["mean"]["box_map"], float(coco["map"]), rel_tol=1e-6, abs_tol=1e-7)
    # the intervals are the box pair keys' on the dataset's draws (``BoxMode.replicates``)
    state = whole.boxes.state()
    universe = torch.unique(torch.cat([state["pairs"]["unit"]]), sorted=True)
    replicates = whole.boxes.replicates(state, universe, bootstrap_weights(universe.numel(), 50, 1))
    miou = replicates["box_miou"][:, 0]
    low, high = np.nanquantile(miou.numpy(), [0.025, 0.975])
    assert np.allclose(one["ci"]["classes"]["often"]["box_miou"], [low, high], rtol=0, atol=1e-12)


def test_box_columns_are_the_pair_means():
    pairs = synthetic()
    mode = BoxMode(len(CLASSES))
    mode.update(*box_batch(pairs))
    columns = mode.columns(mode.state())
    for c in range(len(CLASSES)):
        for i, key in enumerate(BOX_PAIR_KEYS):
            defined = [p["values"][i] for p in pairs if p["cls"] == c and not math.isnan(p["values"][i])]
            expected = sum(defined) / len(defined) if defined else NAN
            assert same(round(float(columns[key][c]), 9), round(expected, 9)), (CLASSES[c], key)
    assert set(columns) == set(BOX_PAIR_KEYS) | set(BOX_MAP_KEYS)


def test_box_mode_update_checks_the_values_shape():
    mode = BoxMode(2)
    image, unit, cls, values, stated, truth = box_batch(synthetic(n_images=2)[:2])
    with pytest.raises(ValueError, match="values"):
        mode.update(image, unit, cls, values[:, :-1], stated, truth)


def test_a_dataset_of_one_pair_and_one_box_computes():
    """One pair, one stated box, one ground-truth box in a whole dataset (a tiny split, a model that states one box):
    torchmetrics squeezes one-element records to 0-d; the state puts their shapes back and the table computes."""
    mode = BoxMode(1)
    nan = float("nan")
    mode.update(torch.tensor([7]), torch.tensor([7]), torch.tensor([0]), torch.tensor([[1.0, 0.8, 1.0, 1.0, nan, nan, 0.0, nan]]),
                {"image": torch.tensor([7]), "cls": torch.tensor([0]), "boxes": torch.tensor([[10.0, 10.0, 50.0, 50.0]]),
                 "scores": torch.ones(1)},
                {"image": torch.tensor([7]), "cls": torch.tensor([0]), "boxes": torch.tensor([[12.0, 10.0, 50.0, 50.0]]),
                 "scores": torch.ones(1)})
    state = mode.state()
    assert state["stated"]["boxes"].shape == (1, 4) and state["pairs"]["values"].shape == (1, len(BOX_PAIR_KEYS))
    columns = mode.columns(state)
    assert float(columns["box_map50"][0]) == 1.0 and float(columns["box_miou"][0]) == pytest.approx(0.8)
