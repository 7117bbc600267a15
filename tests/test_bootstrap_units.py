"""Patient-level bootstrap, intervals of recognition and image-level keys, dice_lift and the full-set
(negatives) mode, each against a direct loop computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.functional import (
    area_fraction,
    auroc,
    average_precision,
    bootstrap_weights,
    default_thresholds,
    dice_iou_curve,
    expected_calibration_error,
    f1_accuracy,
    map_similarity,
    negative_map_stats,
    normalize_saliency,
)
from xbench_pl.metrics.recognition import RECOGNITION_KEYS, replicate_recognition
from xbench_pl.metrics.resampling import image_key, unit_key, unit_name


def expanded(weights_row: torch.Tensor) -> list[int]:
    """The images of one replicate, each repeated as often as it was drawn."""
    return [n for n, w in enumerate(weights_row.tolist()) for _ in range(w)]


def test_replicate_recognition_matches_recomputing_on_each_resample():
    gen = torch.Generator().manual_seed(3)
    n, c = 40, 3
    scores = (torch.rand(n, c, generator=gen) * 8).round() / 8  # ties, and exact 0.5 at the F1 threshold
    labels = (torch.rand(n, c, generator=gen) < 0.3).long()
    labels[:, 2] = 0  # a class without positives: AUROC and AUPRC undefined in every replicate
    weights = bootstrap_weights(n, 25, seed=5)
    out = replicate_recognition(scores, labels, weights)
    for r in range(25):
        rows = expanded(weights[r])
        s, y = scores[rows], labels[rows]
        f1, acc = f1_accuracy(s, y)
        for k in range(c):
            np.testing.assert_allclose(out["auroc"][r, k].item(), auroc(s[:, k], y[:, k]).item(), rtol=1e-12, equal_nan=True)
            np.testing.assert_allclose(out["auprc"][r, k].item(), average_precision(s[:, k], y[:, k]).item(), rtol=1e-12, equal_nan=True)
            assert out["f1"][r, k].item() == pytest.approx(f1[k].item(), abs=1e-15)
            assert out["hamming_acc"][r, k].item() == pytest.approx(acc[k].item(), abs=1e-15)
            assert out["ece"][r, k].item() == pytest.approx(expected_calibration_error(s[:, k], y[:, k]).item(), abs=1e-9)
    assert torch.isnan(out["auroc"][:, 2]).all() and set(out) == set(RECOGNITION_KEYS)


def test_unit_keys_say_patient_or_image():
    assert unit_key("a.png") == image_key("a.png") and unit_key("a.png", "17") != image_key("17")
    images = torch.tensor([image_key("a"), image_key("b")])
    assert unit_name(images, images) == "image"
    assert unit_name(images, torch.tensor([unit_key("a", "p"), unit_key("b", "p")])) == "patient"
    assert unit_name(images, torch.tensor([unit_key("a", "p"), image_key("b")])) == "patient where known, else image"


def patient_inputs(n_images=12, classes=3, seed=4):
    """Images of a few patients (two images without one), their pairs, scores, labels and maps."""
    gen = torch.Generator().manual_seed(seed)
    size = 16
    masks = torch.zeros(n_images * classes, size, size, dtype=torch.bool)
    for p in range(masks.shape[0]):
        y, x = torch.randint(0, size - 4, (2,), generator=gen).tolist()
        h, w = torch.randint(1, 6, (2,), generator=gen).tolist()
        masks[p, y:y + h, x:x + w] = True
    keep = torch.rand(n_images * classes, generator=gen) < 0.6
    maps = torch.rand(n_images * classes, size, size, generator=gen)
    patients = [f"P{i // 3}" if i < n_images - 2 else None for i in range(n_images)]  # 3 images per patient
    ids = [f"img{i}" for i in range(n_images)]
    image = torch.arange(n_images).repeat_interleave(classes)
    return dict(maps=maps[keep], masks=masks[keep], cls=torch.arange(classes).repeat(n_images)[keep], image=image[keep],
                scores=torch.rand(n_images, classes, generator=gen), labels=(torch.rand(n_images, classes, generator=gen) < 0.5).long(),
                saliency=torch.rand(n_images, classes, 5, 5, generator=gen), patients=patients, ids=ids)


def feed_keyed(bench, x, images):
    rows = torch.isin(x["image"], torch.tensor(images))
    keys = torch.tensor([image_key(x["ids"][i]) for i in range(len(x["ids"]))])
    units = torch.tensor([unit_key(x["ids"][i], x["patients"][i]) for i in range(len(x["ids"]))])
    pair_image = x["image"][rows]
    bench.update(x["scores"][images], x["labels"][images], x["maps"][rows], x["masks"][rows], x["cls"][rows],
                 image_keys=keys[pair_image], unit_keys=units[pair_image], sample_keys=keys[images], sample_units=units[images],
                 saliency=x["saliency"][images])


def test_patient_bootstrap_of_pair_image_and_recognition_keys_matches_a_loop():
    x = patient_inputs()
    n, c, resamples = len(x["ids"]), 3, 40
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=resamples, bootstrap_seed=2)
    feed_keyed(bench, x, list(range(n)))
    table = bench.compute()
    ci = table["ci"]
    assert ci["unit"] == "patient where known, else image"
    # the loop: units = the patients P0..P3 and the two patient-less images, sorted by key
    units = [unit_key(x["ids"][i], x["patients"][i]) for i in range(n)]
    universe = sorted(set(units))
    weights = bootstrap_weights(len(universe), resamples, seed=2)
    drawn = torch.stack([weights[:, universe.index(u)] for u in units], 1)  # [R, images]
    hits = (normalize_saliency(x["maps"]) >= 0.5)  # Dice at 0.5, per pair, straight from its definition
    dice = (2 * (hits & x["masks"]).flatten(1).sum(1) / (hits.flatten(1).sum(1) + x["masks"].flatten(1).sum(1))).double()
    uniform = 2 * area_fraction(x["masks"]) / (1 + area_fraction(x["masks"]))
    similarity = map_similarity(x["saliency"])
    per_key = {"dice@0.5": [], "auroc": [], "map_similarity": [], "dice_lift": []}
    best = torch.tensor([round(table["classes"][k]["tau_best"] * 100) for k in "ABC"])
    curve, _ = dice_iou_curve(normalize_saliency(x["maps"]), x["masks"], default_thresholds())
    for r in range(resamples):
        rows = expanded(drawn[r])
        pairs = [p for i in rows for p in (x["image"] == i).nonzero().flatten().tolist()]
        rep = {k: [] for k in per_key}
        for k in range(c):
            mine = [p for p in pairs if x["cls"][p] == k]
            rep["dice@0.5"].append(np.mean([dice[p].item() for p in mine]) if mine else np.nan)
            rep["dice_lift"].append(np.mean([curve[p, best[k]].item() - uniform[p].item() for p in mine]) if mine else np.nan)
            rep["auroc"].append(auroc(x["scores"][rows, k], x["labels"][rows, k]).item())
            rep["map_similarity"].append(similarity[rows, k].mean().item())
        for key in per_key:
            per_key[key].append(rep[key])
    for key, reps in per_key.items():
        reps = np.array(reps)
        for k, name in enumerate("ABC"):
            np.testing.assert_allclose(ci["classes"][name][key], np.nanquantile(reps[:, k], [0.025, 0.975]), atol=1e-9)
        np.testing.assert_allclose(ci["mean"][key], np.nanquantile(np.nanmean(reps, 1), [0.025, 0.975]), atol=1e-9)
    assert {"auprc", "f1", "hamming_acc", "ece"} <= set(ci["mean"])


def test_without_sample_keys_only_pair_keys_get_intervals():
    x = patient_inputs(seed=6)
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=20)
    keys = torch.tensor([image_key(f"img{i}") for i in x["image"].tolist()])
    bench.update(x["scores"], x["labels"], x["maps"], x["masks"], x["cls"], image_keys=keys)
    ci = bench.compute()["ci"]
    assert ci["unit"] == "image" and "auroc" not in ci["mean"] and ci["mean"]["dice_lift"] is not None


def test_dice_lift_is_dice_best_over_the_uniform_baseline_on_its_own_maps():
    """The uniform baseline's maps, through the benchmark's own test_step: its dice_best is 2a / (1 + a)
    averaged over the pairs (closed form), so its dice_lift is 0; another model's dice_lift is its
    dice_best minus that same mean."""
    from xbench_pl.data.nih_bbox import DemoDataModule
    from xbench_pl.models.baselines import CenterBaseline, UniformBaseline

    tables, fractions = {}, {}
    for model in (UniformBaseline(bootstrap=0), CenterBaseline(bootstrap=0)):
        dm = DemoDataModule(preprocess=model.preprocess, batch_size=4)
        dm.setup("test")
        for batch in dm.test_dataloader():
            for (b, k), mask in zip(batch.region_index.tolist(), batch.region_masks):
                fractions.setdefault(batch.classes[k], {})[(batch.image_ids[b], k)] = mask.double().mean().item()
            model.test_step(batch, 0)
        (name, metrics), = model.benchmark.items()
        tables[type(model).__name__] = metrics.compute()
    for finding, row in tables["UniformBaseline"]["classes"].items():
        if not row["n_regions"]:
            assert row["dice_lift"] is None
            continue
        closed = np.mean([2 * a / (1 + a) for a in fractions[finding].values()])
        assert row["dice_best"] == pytest.approx(closed, abs=1e-11) and row["tau_best"] == 0.0
        assert row["dice_lift"] == pytest.approx(0.0, abs=1e-11)
        other = tables["CenterBaseline"]["classes"][finding]
        assert other["dice_lift"] == pytest.approx(other["dice_best"] - closed, abs=1e-11)


def test_negatives_mode_scores_absent_findings_and_is_off_by_default():
    gen = torch.Generator().manual_seed(8)
    x = patient_inputs(seed=8)
    negatives = torch.rand(5, 16, 16, generator=gen)
    neg_cls, neg_row = torch.tensor([0, 1, 1, 2, 0]), torch.tensor([0, 0, 3, 5, 7])
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=0, negatives=True)
    keys = torch.tensor([image_key(f"img{i}") for i in x["image"].tolist()])
    bench.update(x["scores"], x["labels"], x["maps"], x["masks"], x["cls"], image_keys=keys, negatives=(negatives, neg_cls, neg_row))
    table = bench.compute()
    norm = normalize_saliency(negatives)
    for k, name in enumerate("ABC"):
        mine = (neg_cls == k).nonzero().flatten().tolist()
        fp = [(norm[m] >= 0.5).double().mean().item() for m in mine]
        mass = [norm[m].double().mean().item() for m in mine]
        assert table["classes"][name]["neg_fp_rate"] == pytest.approx(np.mean(fp), abs=1e-11)
        assert table["classes"][name]["neg_mass"] == pytest.approx(np.mean(mass), abs=1e-11)
    fp_rate, mass = negative_map_stats(norm, 0.5)
    assert table["mean"]["neg_fp_rate"] == pytest.approx(np.mean([fp_rate[neg_cls == k].mean() for k in range(3)]), abs=1e-11)
    plain = BenchmarkMetrics(["A", "B", "C"], bootstrap=0)
    plain.update(x["scores"], x["labels"], x["maps"], x["masks"], x["cls"], image_keys=keys)
    assert "neg_fp_rate" not in plain.compute()["mean"]
    with pytest.raises(ValueError, match="negatives=True"):
        plain.update(x["scores"], x["labels"], x["maps"], x["masks"], x["cls"], negatives=(negatives, neg_cls, neg_row))


def test_cxl_keys_get_intervals_from_the_same_draws():
    from xbench_pl.metrics.chexlocalize import CXL_KEYS, cxl_pair

    x = patient_inputs(seed=10)
    n, resamples = len(x["ids"]), 30
    gen = torch.Generator().manual_seed(10)
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=resamples, bootstrap_seed=1, cxl=True)
    feed_keyed(bench, x, list(range(n)))
    units = [unit_key(x["ids"][i], x["patients"][i]) for i in range(n)]
    fulls, regions = [], []
    for i in range(n):  # every finding of every image, as full_resolution_pairs yields them
        for k in range(3):
            fulls.append(torch.rand(20, 24, generator=gen) ** 3)
            region = np.zeros((20, 24), bool)
            if torch.rand(1, generator=gen).item() < 0.6:
                region[3:9, 5:15] = True
            regions.append(region if region.any() else None)
    bench.update_cxl(zip(fulls, regions, [k for _ in range(n) for k in range(3)]), [u for u in units for _ in range(3)])
    ci = bench.compute()["ci"]
    values = np.array([cxl_pair(m, r) for m, r in zip(fulls, regions)]).reshape(n, 3, len(CXL_KEYS))
    universe = sorted(set(units))
    drawn = torch.stack([bootstrap_weights(len(universe), resamples, 1)[:, universe.index(u)] for u in units], 1)
    for j, key in enumerate(CXL_KEYS):
        reps = np.array([[np.nanmean(values[expanded(drawn[r]), k, j]) if not np.isnan(values[expanded(drawn[r]), k, j]).all() else np.nan
                          for k in range(3)] for r in range(resamples)])
        for k, name in enumerate("ABC"):
            np.testing.assert_allclose(ci["classes"][name][key], np.nanquantile(reps[:, k], [0.025, 0.975]), atol=1e-9)
    # reset clears every metric, the cxl mode included: after it, half the images give a fresh metric's table
    half = n // 2

    def feed_half(metrics):
        feed_keyed(metrics, x, list(range(half)))
        metrics.update_cxl(zip(fulls[:3 * half], regions[:3 * half], [k for _ in range(half) for k in range(3)]),
                           [u for u in units[:half] for _ in range(3)])

    bench.reset()
    feed_half(bench)
    fresh = BenchmarkMetrics(["A", "B", "C"], bootstrap=resamples, bootstrap_seed=1, cxl=True)
    feed_half(fresh)
    assert bench.compute() == fresh.compute()


def test_grounding_only_tables_null_recognition_intervals_too():
    from xbench_pl.external_maps import grounding_only

    x = patient_inputs(seed=12)
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=20)
    feed_keyed(bench, x, list(range(len(x["ids"]))))
    table = grounding_only(bench.compute())
    for row in (table["mean"], table["ci"]["mean"], table["ci"]["classes"]["B"]):
        assert all(row[k] is None for k in RECOGNITION_KEYS)
    assert table["ci"]["mean"]["pointing_game"] is not None and table["ci"]["mean"]["map_similarity"] is not None


def test_one_image_one_finding_keeps_its_record_shapes():
    # torchmetrics squeezes one-element compute results to 0-d: a single image with a single region (a DDP
    # rank's share, a tiny split) must still give intervals, not a concatenation error
    x = patient_inputs(n_images=1, classes=1, seed=3)
    x["maps"], x["masks"], x["cls"], x["image"] = x["maps"][:1], x["masks"][:1], torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    x["masks"][0, 2:6, 2:6] = True
    bench = BenchmarkMetrics(["A"], bootstrap=10, cxl=False)
    feed_keyed(bench, x, [0])
    table = bench.compute()
    assert table["classes"]["A"]["n_regions"] == 1
    dice = table["classes"]["A"]["dice@0.5"]
    assert table["ci"]["classes"]["A"]["dice@0.5"] == [dice, dice]  # one unit: every replicate is the full set
