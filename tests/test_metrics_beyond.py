"""Issue 12's statistics (beyond the paper) against direct loop computations, split invariance, and 1 vs 2 DDP processes."""

import json

import numpy as np
import pytest
import torch

from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.benchmark import EXTRA_KEYS, pair_keys
from xbench_pl.metrics.functional import (
    area_fraction,
    bootstrap_weights,
    default_thresholds,
    dice_auc,
    dice_iou_curve,
    energy_pointing,
    finding_specificity,
    map_similarity,
    normalize_saliency,
    otsu_dice_iou,
    otsu_threshold,
    pixel_auroc,
    pointing_lift,
    size_stratum,
    to_uint8,
)
from xbench_pl.metrics.grounding import FIXED_POINT_SCALE, to_fixed
from xbench_pl.metrics.resampling import bootstrap_intervals, image_key, strata_means


def pairs(n=16, size=20, seed=0, levels=None):
    gen = torch.Generator().manual_seed(seed)
    maps = torch.rand(n, size, size, generator=gen)
    if levels:  # coarse values: many ties
        maps = (maps * levels).floor() / levels
    masks = torch.zeros(n, size, size, dtype=torch.bool)
    for i in range(n):
        y0, x0 = torch.randint(0, size // 2, (2,), generator=gen).tolist()
        h, w = torch.randint(1, size // 2 + 1, (2,), generator=gen).tolist()
        masks[i, y0:y0 + h, x0:x0 + w] = True
    return maps, masks


def loop_pointing(m, g):
    hi = m.max()
    maximal = m >= hi - 1e-6 * (hi - m.min()) if hi > m.min() else np.ones_like(g)
    return (maximal & g).sum() / maximal.sum()


def test_energy_pointing_and_lift_match_loops():
    maps, masks = pairs(seed=1)
    maps[0] = 0.0  # no mass: spreads evenly, scores chance
    energy, lift = energy_pointing(maps, masks), pointing_lift(maps, masks)
    for i in range(len(maps)):
        m, g = maps[i].double().numpy(), masks[i].numpy()
        expected = g.mean() if m.clip(0).sum() == 0 else (m.clip(0) * g).sum() / m.clip(0).sum()
        assert energy[i].item() == pytest.approx(expected, abs=1e-12)
        assert lift[i].item() == pytest.approx(loop_pointing(m, g) - g.mean(), abs=1e-12)
    empty = torch.zeros_like(masks[:1])
    assert torch.isnan(energy_pointing(maps[:1], empty)).all() and torch.isnan(pointing_lift(maps[:1], empty)).all()
    assert area_fraction(masks)[3].item() == masks[3].sum().item() / masks[3].numel()


def loop_otsu(u8):
    """OpenCV's getThreshVal_Otsu_8u written as its sequential loop."""
    h = np.bincount(u8.ravel(), minlength=256).astype(np.float64) / u8.size
    mu = (np.arange(256) * h).sum()
    q1 = mu1 = 0.0
    best_sigma, best = 0.0, 0
    eps = np.finfo(np.float32).eps
    for i in range(256):
        mu1 *= q1
        q1 += h[i]
        q2 = 1.0 - q1
        if min(q1, q2) < eps or max(q1, q2) > 1.0 - eps:
            continue
        mu1 = (mu1 + i * h[i]) / q1
        mu2 = (mu - q1 * mu1) / q2
        sigma = q1 * q2 * (mu1 - mu2) ** 2
        if sigma > best_sigma:
            best_sigma, best = sigma, i
    return best


def test_otsu_matches_opencv_and_loop():
    maps, masks = pairs(n=12, size=32, seed=2)
    maps = normalize_saliency(maps ** 3)  # skewed histograms
    u8 = to_uint8(maps)
    ours = otsu_threshold(u8)
    cv2 = pytest.importorskip("cv2")
    for i in range(len(maps)):
        assert ours[i].item() == loop_otsu(u8[i].numpy())
        t, binary = cv2.threshold(u8[i].numpy(), 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
        assert ours[i].item() == int(t)
        p, g = binary > 0, masks[i].numpy()
        dice, iou = otsu_dice_iou(maps[i:i + 1], masks[i:i + 1])
        assert dice.item() == pytest.approx(2 * (p & g).sum() / (p.sum() + g.sum()), abs=1e-12)
        assert iou.item() == pytest.approx((p & g).sum() / (p | g).sum(), abs=1e-12)
    assert otsu_threshold(torch.full((1, 4, 4), 7, dtype=torch.uint8)).item() == 0  # constant map


@pytest.mark.parametrize("levels", [None, 4])
def test_pixel_auroc_matches_pairwise_loop(levels):
    maps, masks = pairs(n=6, size=12, seed=3, levels=levels)
    auc = pixel_auroc(maps, masks, chunk=4)
    for i in range(len(maps)):
        m, g = maps[i].numpy().ravel(), masks[i].numpy().ravel()
        pos, neg = m[g], m[~g]
        expected = ((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (len(pos) * len(neg))
        assert auc[i].item() == pytest.approx(expected, abs=1e-12)
    whole = torch.ones_like(masks[:1])
    assert torch.isnan(pixel_auroc(maps[:1], whole)).all()


def test_dice_auc_is_the_trapezoid_of_the_curve():
    maps, masks = pairs(seed=4)
    thresholds = default_thresholds()
    dice, _ = dice_iou_curve(normalize_saliency(maps), masks, thresholds)
    area = dice_auc(dice, thresholds)
    t = thresholds.double().numpy()
    for i in range(len(maps)):
        d = dice[i].numpy()
        expected = sum((t[k + 1] - t[k]) * (d[k + 1] + d[k]) / 2 for k in range(len(t) - 1))
        assert area[i].item() == pytest.approx(expected, abs=1e-12)


def test_finding_specificity_and_map_similarity_match_loops():
    maps, masks = pairs(n=3, seed=5)
    spec = finding_specificity(maps, masks)
    for k in range(3):
        m = maps[k].numpy()
        own = loop_pointing(m, masks[k].numpy())
        other = np.mean([loop_pointing(m, masks[j].numpy()) for j in range(3) if j != k])
        assert spec[k].item() == pytest.approx(own - other, abs=1e-12)
    assert torch.isnan(finding_specificity(maps[:1], masks[:1])).all()
    saliency = torch.rand(2, 4, 6, 6, generator=torch.Generator().manual_seed(6))
    saliency[1, 2] = saliency[1, 0] * 3 + 1  # the same map, rescaled
    sim = map_similarity(saliency)
    for b in range(2):
        corr = np.corrcoef(saliency[b].flatten(1).double().numpy())
        for c in range(4):
            assert sim[b, c].item() == pytest.approx((corr[c].sum() - 1) / 3, abs=1e-9)
    assert map_similarity(torch.ones(1, 3, 4, 4)).tolist() == [[1.0, 1.0, 1.0]]  # one flat map for every finding


def test_bootstrap_matches_a_direct_resampling_loop():
    gen = torch.Generator().manual_seed(7)
    units = torch.tensor([5, 5, 9, 9, 9, 12, 20, 20, 31])  # sorted unit keys; pairs of 5 images
    cls = torch.tensor([0, 1, 0, 1, 2, 0, 1, 2, 0])
    raw = torch.rand(9, 2, generator=gen, dtype=torch.float64)
    defined = torch.ones(9, 2, dtype=torch.long)
    defined[3, 1] = 0
    out = bootstrap_intervals(units, cls, to_fixed(raw), defined, num_classes=3, resamples=50, seed=3)
    weights = bootstrap_weights(5, 50, 3)
    keys = [5, 9, 12, 20, 31]
    quantized = to_fixed(raw).double() / FIXED_POINT_SCALE
    for r in range(50):
        for c in range(3):
            for k in range(2):
                drawn = [quantized[p, k].item() for u, key in enumerate(keys) for _ in range(int(weights[r, u]))
                         for p in range(9) if units[p] == key and cls[p] == c and defined[p, k]]
                expected = np.mean(drawn) if drawn else np.nan
                np.testing.assert_allclose(out["replicates"][r, c, k].item(), expected, rtol=1e-12, equal_nan=True)
    reps = out["replicates"].numpy()
    np.testing.assert_allclose(out["classes"].numpy(), np.moveaxis(np.nanquantile(reps, [0.025, 0.975], axis=0), 0, -1), rtol=1e-12)
    np.testing.assert_allclose(out["mean"].numpy(), np.moveaxis(np.nanquantile(np.nanmean(reps, 1), [0.025, 0.975], axis=0), 0, -1), rtol=1e-12)


def test_size_strata_match_a_loop():
    area = torch.tensor([0.001, 0.5, 0.05, 0.01, 0.1, 0.0999], dtype=torch.float64)
    assert size_stratum(area, (0.01, 0.1)).tolist() == [0, 2, 1, 1, 2, 1]
    assert size_stratum(area_fraction(torch.ones(1, 10, 10).tril(-9).bool()), (0.01, 0.1)).tolist() == [1]  # 1 % exactly: medium
    cls = torch.tensor([0, 0, 1, 1, 0, 1])
    raw = torch.rand(6, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    stratum = [0, 2, 1, 1, 2, 1]
    out = strata_means(torch.tensor(stratum), cls, to_fixed(raw), torch.ones(6, 1, dtype=torch.long), 2)
    for s in range(3):
        for c in range(2):
            chosen = [raw[p, 0].item() for p in range(6) if stratum[p] == s and cls[p] == c]
            assert out["pairs"][s, c].item() == len(chosen)
            np.testing.assert_allclose(out["means"][s, c, 0].item(), np.mean(chosen) if chosen else np.nan, atol=1e-12)


def bench_inputs(n_images=10, classes=3, seed=9):
    """Per image, pairs for a random subset of findings; image keys from ids."""
    gen = torch.Generator().manual_seed(seed)
    maps, masks = pairs(n=n_images * classes, size=24, seed=seed)
    keep = torch.rand(n_images * classes, generator=gen) < 0.7
    image = torch.arange(n_images).repeat_interleave(classes)
    cls = torch.arange(classes).repeat(n_images)
    keys = torch.tensor([image_key(f"img{i}") for i in image.tolist()])
    scores = torch.rand(n_images, classes, generator=gen)
    labels = (torch.rand(n_images, classes, generator=gen) < 0.5).long()
    saliency = torch.rand(n_images, classes, 7, 7, generator=gen)
    return dict(maps=maps[keep], masks=masks[keep], cls=cls[keep], keys=keys[keep], image=image[keep],
                scores=scores, labels=labels, saliency=saliency)


def feed(bench, x, images):
    rows = torch.isin(x["image"], torch.tensor(images))
    bench.update(x["scores"][images], x["labels"][images], x["maps"][rows], x["masks"][rows], x["cls"][rows],
                 image_keys=x["keys"][rows], saliency=x["saliency"][images])


def merged(parts):
    first = parts[0]
    for other in parts[1:]:
        for name, metric in first.named_children():
            metric.merge_state(getattr(other, name))
    return first


def test_accumulation_is_bit_identical_for_the_new_keys_ci_and_strata():
    x = bench_inputs()
    kwargs = dict(bootstrap=200, tuned_thresholds={"A": 0.3, "C": 0.62}, tuning_source="tune.json")
    whole = BenchmarkMetrics(["A", "B", "C"], **kwargs)
    feed(whole, x, list(range(10)))
    parts = [BenchmarkMetrics(["A", "B", "C"], **kwargs) for _ in range(3)]
    order = torch.randperm(10, generator=torch.Generator().manual_seed(1)).tolist()
    feed(parts[0], x, order[:4]), feed(parts[1], x, order[4:5]), feed(parts[2], x, order[5:])
    a, b = whole.compute(), merged(parts).compute()
    assert json.dumps(a) == json.dumps(b)
    assert a["ci"]["mean"]["pointing_game"] is not None and set(a["by_size"]["mean"]) == {"small", "medium", "large"}
    assert all(k in a["mean"] for k in EXTRA_KEYS)


def test_table_values_match_direct_per_pair_means():
    x = bench_inputs(seed=11)
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=0, tuned_thresholds={"A": 0.3, "B": 0.5, "C": 0.62})
    feed(bench, x, list(range(10)))
    table = bench.compute()
    assert table["ci"] is None
    thresholds = default_thresholds()
    norm = normalize_saliency(x["maps"])
    dice, iou = dice_iou_curve(norm, x["masks"], thresholds)
    for c, name in enumerate("ABC"):
        rows = (x["cls"] == c).nonzero().flatten().tolist()
        row = table["classes"][name]
        tau = {"A": 0.3, "B": 0.5, "C": 0.62}[name]
        k = int(round(tau * 100))
        assert row["tau_tuned"] == pytest.approx(tau)
        assert row["dice_tuned"] == pytest.approx(np.mean([dice[p, k].item() for p in rows]), abs=1e-11)
        assert row["iou_tuned"] == pytest.approx(np.mean([iou[p, k].item() for p in rows]), abs=1e-11)
        assert row["energy_pg"] == pytest.approx(np.mean([energy_pointing(norm[p:p + 1], x["masks"][p:p + 1]).item() for p in rows]), abs=1e-11)
        assert row["pg_lift"] == pytest.approx(np.mean([pointing_lift(x["maps"][p:p + 1], x["masks"][p:p + 1]).item() for p in rows]), abs=1e-11)
        assert row["dice_otsu"] == pytest.approx(np.mean([otsu_dice_iou(norm[p:p + 1], x["masks"][p:p + 1])[0].item() for p in rows]), abs=1e-11)
        assert row["pixel_auroc"] == pytest.approx(np.mean([pixel_auroc(x["maps"][p:p + 1], x["masks"][p:p + 1]).item() for p in rows]), abs=1e-11)
        assert row["dice_auc"] == pytest.approx(np.mean([dice_auc(dice[p], default_thresholds(dtype=torch.float64)).item() for p in rows]), abs=1e-11)
        spec = []
        for p in rows:  # pairs whose image has 2+ regions, against that image's other regions
            same = (x["image"] == x["image"][p]).nonzero().flatten().tolist()
            if len(same) > 1:
                spec.append(finding_specificity(x["maps"][same], x["masks"][same])[same.index(p)].item())
        assert row["specificity"] == pytest.approx(np.mean(spec), abs=1e-11)
        assert row["map_similarity"] == pytest.approx(map_similarity(x["saliency"])[:, c].mean().item(), abs=1e-11)
        # size strata rows: the pair-level keys per stratum
        strata = size_stratum(area_fraction(x["masks"][rows]), (0.01, 0.1))
        for s, stratum in enumerate(("small", "medium", "large")):
            chosen = [p for p, st in zip(rows, strata.tolist()) if st == s]
            cell = table["by_size"]["classes"][name][stratum]
            assert cell["n_regions"] == len(chosen)
            if chosen:
                assert cell["dice@0.5"] == pytest.approx(np.mean([dice[p, 50].item() for p in chosen]), abs=1e-11)
    assert set(table["by_size"]["classes"]["A"]["small"]) == set(pair_keys()) | {"n_regions"}


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric .* was called before the ``update``")  # the refused one
def test_no_tuning_run_is_said_not_silently_replaced():
    x = bench_inputs(seed=12)
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=0)
    feed(bench, x, list(range(10)))
    table = bench.compute()
    assert table["mean"]["dice_tuned"] is None and table["mean"]["tau_tuned"] is None
    assert table["tuning"]["source"] is None and "no tuning run" in table["tuning"]["note"]
    with pytest.raises(ValueError, match="not on the threshold grid"):
        b = BenchmarkMetrics(["A"], bootstrap=0, tuned_thresholds={"A": 0.305}, tuning_source="t.json")
        b.compute()


def test_options_are_checked():
    with pytest.raises(ValueError, match="bootstrap"):
        BenchmarkMetrics(["A"], bootstrap=-1)
    with pytest.raises(ValueError, match="size bounds"):
        BenchmarkMetrics(["A"], size_bounds=(0.2, 0.1))


@pytest.mark.ddp_pair
def test_tuned_threshold_ci_and_strata_equal_on_one_and_two_ddp_processes(tmp_path):
    """A tuning run on some demo images gives tau per finding; applied to the others, 1 vs 2 DDP processes
    give the same metrics.json (new keys, bootstrap intervals, size strata, CheXlocalize's metrics through a
    cropping model's affine) byte for byte."""
    from test_cli import in_process, one_and_two_processes

    from xbench_pl.data.nih_bbox import DemoDataModule
    from xbench_pl.metrics.chexlocalize import CXL_KEYS

    ids = sorted(r.image_id for r in DemoDataModule().load_records())[:11]
    (tmp_path / "tune.csv").write_text("image_id\n" + "\n".join(ids[:5]) + "\n")
    (tmp_path / "test.csv").write_text("image_id\n" + "\n".join(ids[5:]) + "\n")
    common = ["test", "--model", "fixture_models.IntensityModel", "--data", "demo", "--data.batch_size", "2",
              "--trainer.accelerator", "cpu", "--model.bootstrap", "300"]
    tune = in_process(*common, "--data.split_file", str(tmp_path / "tune.csv"), "--out", str(tmp_path / "tune"))
    assert tune.returncode == 0, tune.stderr[-3000:]
    tuned = json.loads((tmp_path / "tune" / "metrics.json").read_text())["datasets"]["demo"]
    assert "no tuning run" in tuned["tuning"]["note"] and tuned["mean"]["dice_tuned"] is None
    test = [*common, "--data.split_file", str(tmp_path / "test.csv"), "--model.tune_from", str(tmp_path / "tune"),
            "--model.size_strata", "[0.02, 0.08]", "--model.negatives", "true", "--model.cxl", "true", "--model.groups", "sex,age,view"]
    a, b, _ = one_and_two_processes(tmp_path, *test)
    assert json.dumps(a) == json.dumps(b)
    demo = a["datasets"]["demo"]
    for name, row in demo["classes"].items():
        if row["n_regions"]:
            assert row["tau_tuned"] == tuned["classes"][name]["tau_best"]
    assert demo["tuning"]["source"] == str(tmp_path / "tune")
    assert demo["ci"]["resamples"] == 300 and demo["ci"]["mean"]["pointing_game"] is not None
    # the demo's images carry NIH patient ids: patients are resampled, and recognition keys get intervals too
    assert demo["ci"]["unit"] == "patient" and demo["ci"]["mean"]["auroc"] is not None and demo["ci"]["mean"]["dice_lift"] is not None
    assert demo["mean"]["neg_fp_rate"] is not None and demo["ci"]["mean"]["neg_mass"] is not None
    assert demo["ci"]["mean"]["cxl_hit_rate"] is not None and all(demo["mean"][k] is not None for k in CXL_KEYS)
    # the model papers' recognition protocol and the any-tie Pointing Game: exact over 2 processes too
    assert demo["mean"]["f1_max"] is not None and demo["ci"]["mean"]["acc_at_f1_max"] is not None
    assert demo["mean"]["pg_any_tie"] >= demo["mean"]["pointing_game"] and demo["ci"]["mean"]["pg_any_tie"] is not None
    assert demo["by_size"]["bounds"] == [0.02, 0.08]
    assert sum(demo["by_size"]["mean"][s]["n_regions"] for s in ("small", "medium", "large")) == demo["mean"]["n_regions"]
    # subgroups (issue 20): counts, per-group tables with intervals, and gaps, exact over 2 processes too
    groups = demo["by_group"]
    assert sum(groups["sex"]["n_images"].values()) == 6 and groups["sex"]["n_images"]["unknown"] == 0
    assert groups["view"]["n_images"] == {"PA": 6, "AP": 0, "unknown": 0}
    assert sum(groups["sex"][v]["mean"]["n_regions"] for v in ("F", "M")) == demo["mean"]["n_regions"]
    assert groups["sex"]["F"]["ci"]["mean"]["pointing_game"] is not None and groups["sex"]["gap"]["pointing_game"]["p"] is not None
    table = (tmp_path / "one" / "metrics.md").read_text()
    assert "bootstrap intervals" in table and "cxl_miou" in table
