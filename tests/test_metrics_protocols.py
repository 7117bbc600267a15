"""Other tools' protocols beside ours: the model papers' ``f1_max``/``acc_at_f1_max`` (MedKLIP, KAD, MAVL:
against their scikit-learn formula, bit for bit) and the any-tie Pointing Game ``pg_any_tie`` (Quantus,
MedKLIP's RSNA script: against a direct loop, on both the kernel and the torch path)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, precision_recall_curve

from xbench_pl.metrics import BenchmarkMetrics, Recognition, kernels
from xbench_pl.metrics.benchmark import EXTRA_KEYS, metric_keys, pair_keys
from xbench_pl.metrics.functional import (
    area_fraction,
    bootstrap_weights,
    max_f1,
    pointing_game,
    pointing_game_any_tie,
)
from xbench_pl.metrics.grounding import PointingAnyTie
from xbench_pl.metrics.recognition import RECOGNITION_KEYS, replicate_recognition


def papers_max_f1(gt: np.ndarray, pred: np.ndarray) -> tuple[float, float, float]:
    """MedKLIP's / KAD's / MAVL's zero-shot test scripts, line for line."""
    precision, recall, thresholds = precision_recall_curve(gt, pred)
    numerator = 2 * recall * precision
    denom = recall + precision
    f1_scores = np.divide(numerator, denom, out=np.zeros_like(denom), where=(denom != 0))
    max_f1_value = np.max(f1_scores)
    max_f1_thresh = thresholds[np.argmax(f1_scores)]
    return float(max_f1_value), float(max_f1_thresh), float(accuracy_score(gt, pred > max_f1_thresh))


def ours(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float, float]:
    return tuple(v.item() for v in max_f1(torch.from_numpy(scores), torch.from_numpy(labels)))


@pytest.mark.parametrize("seed", range(8))
def test_max_f1_is_the_papers_formula_bit_for_bit(seed):
    """Random scores with many ties (coarse levels, so equal F1 at several thresholds happens too) and without."""
    gen = np.random.default_rng(seed)
    checked = 0
    for _ in range(150):
        n = int(gen.integers(1, 60))
        levels = int(gen.choice([2, 3, 5, 10, 1000]))
        scores = np.round(gen.random(n) * levels) / levels
        labels = (gen.random(n) < gen.random()).astype(np.int64)
        if labels.sum() == 0:
            continue
        assert ours(scores, labels) == papers_max_f1(labels, scores)
        checked += 1
    assert checked > 100


def test_max_f1_edge_cases():
    # all positive: F1 1 at the lowest score; "score > threshold" then calls the lowest-scored samples negative
    s, y = np.array([0.2, 0.2, 0.7, 0.9]), np.ones(4, dtype=np.int64)
    assert ours(s, y) == papers_max_f1(y, s) == (1.0, 0.2, 0.5)
    # one distinct score: the one threshold; nothing is above it, so the accuracy is the share of negatives
    s, y = np.full(5, 0.4), np.array([1, 0, 1, 0, 0])
    assert ours(s, y) == papers_max_f1(y, s) == pytest.approx((2 * 2 / (2 + 5), 0.4, 3 / 5), abs=1e-15)  # their float formula
    # one sample
    assert ours(np.array([0.3]), np.array([1])) == papers_max_f1(np.array([1]), np.array([0.3])) == (1.0, 0.3, 0.0)
    # a perfect ranking: the threshold is the lowest positive score, which ">" then misses
    s, y = np.array([0.1, 0.3, 0.6, 0.8]), np.array([0, 0, 1, 1])
    assert ours(s, y) == papers_max_f1(y, s) == (1.0, 0.6, 0.75)
    # without positives scikit-learn sets recall to 1 and their F1 is 0 at its lowest threshold: undefined here
    s, y = np.array([0.1, 0.5, 0.9]), np.zeros(3, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert papers_max_f1(y, s)[0] == 0.0
    assert all(np.isnan(ours(s, y)))
    assert all(np.isnan(ours(np.zeros(0), np.zeros(0, dtype=np.int64))))


def test_max_f1_does_not_depend_on_order_or_split():
    gen = torch.Generator().manual_seed(4)
    scores = (torch.rand(301, 3, generator=gen, dtype=torch.float64) * 20).round() / 20
    labels = (torch.rand(301, 3, generator=gen, dtype=torch.float64) < scores).long()
    labels[:, 2] = 0  # a class without positives
    whole = Recognition(3)
    whole.update(scores, labels)
    split = Recognition(3)
    for part in torch.randperm(301, generator=gen).split(37):
        split.update(scores[part], labels[part])
    a, b = whole.compute(), split.compute()
    for key in ("f1_max", "acc_at_f1_max", "f1_max_threshold"):
        assert torch.equal(a[key].nan_to_num(-1), b[key].nan_to_num(-1)), key  # bit for bit
        assert torch.isnan(a[key][2])
    for c in range(2):
        expected = papers_max_f1(labels[:, c].numpy(), scores[:, c].numpy())
        assert (a["f1_max"][c].item(), a["f1_max_threshold"][c].item(), a["acc_at_f1_max"][c].item()) == expected


def test_replicates_of_f1_max_equal_recomputing_on_each_resample():
    """A score not drawn in a replicate is no threshold of it (else its F1, equal to the next higher score's,
    would be picked as the lower threshold, and the accuracy would change)."""
    gen = torch.Generator().manual_seed(6)
    n, c = 30, 3
    scores = (torch.rand(n, c, generator=gen) * 6).round().double() / 6
    labels = (torch.rand(n, c, generator=gen) < 0.4).long()
    labels[:, 2] = 0
    weights = bootstrap_weights(n, 40, seed=2)
    out = replicate_recognition(scores, labels, weights)
    assert {"f1_max", "acc_at_f1_max"} <= set(out) == set(RECOGNITION_KEYS)
    for r in range(40):
        rows = [i for i, w in enumerate(weights[r].tolist()) for _ in range(w)]
        for k in range(c):
            f1, _, acc = max_f1(scores[rows, k], labels[rows, k])
            assert torch.equal(out["f1_max"][r, k].nan_to_num(-1), f1.nan_to_num(-1))
            assert torch.equal(out["acc_at_f1_max"][r, k].nan_to_num(-1), acc.nan_to_num(-1))
    assert torch.isnan(out["f1_max"][:, 2]).all()
    everything = replicate_recognition(scores, labels, torch.ones(1, n, dtype=torch.long))
    for k in range(2):
        f1, _, acc = max_f1(scores[:, k], labels[:, k])
        assert everything["f1_max"][0, k].item() == f1.item() and everything["acc_at_f1_max"][0, k].item() == acc.item()


# -- the any-tie Pointing Game ---------------------------------------------------------------------
def tied_pairs(n=16, size=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    maps = (torch.rand(n, size, size, generator=gen) * 3).floor()  # levels 0, 1, 2: many maximal pixels
    maps[0] = 0.7  # constant
    maps[1] = torch.rand(size, size, generator=gen)  # one maximum
    masks = torch.rand(n, size, size, generator=gen) > 0.85
    masks[2] = False  # empty region
    masks[3] = True
    return maps, masks


def any_tie_loop(m: torch.Tensor, g: torch.Tensor) -> float:
    """A hit when any pixel with the map's maximal value lies in the region (exact ties: the maps are levels)."""
    if not g.any():
        return float("nan")
    top = m.max()
    return float(any(bool(g[i, j]) for i in range(m.shape[0]) for j in range(m.shape[1]) if m[i, j] == top))


@pytest.mark.parametrize("path", ["kernels", "torch"])
def test_pg_any_tie_matches_a_direct_loop(path):
    if path == "kernels" and not kernels.available():
        pytest.skip("numba not installed")
    maps, masks = tied_pairs()
    if path == "torch":
        with kernels.disabled():
            values = pointing_game_any_tie(maps, masks)
    else:
        assert kernels.applies(maps, masks)
        values = pointing_game_any_tie(maps, masks)
    expected = torch.tensor([any_tie_loop(m, g) for m, g in zip(maps, masks)], dtype=torch.float64)
    assert torch.equal(values.nan_to_num(-1), expected.nan_to_num(-1))
    # never below the tie-aware rule, equal to it where a single pixel is maximal
    tie_aware = pointing_game(maps, masks)
    ok = ~tie_aware.isnan()
    assert bool((values[ok] >= tie_aware[ok]).all()) and values[1] == tie_aware[1]


def test_pg_any_tie_kernel_and_torch_paths_agree_on_float_ties():
    """Near-ties within the tolerance (bilinear rounding) count as maximal on both paths alike."""
    if not kernels.available():
        pytest.skip("numba not installed")
    gen = torch.Generator().manual_seed(3)
    maps = torch.rand(20, 16, 16, generator=gen)
    top = maps.flatten(1).amax(1)[:, None, None]
    near = torch.rand(20, 16, 16, generator=gen) < 0.05
    maps = torch.where(near, top * (1 - 1e-7 * torch.rand(20, 16, 16, generator=gen)), maps)
    masks = torch.rand(20, 16, 16, generator=gen) > 0.7
    fast = pointing_game_any_tie(maps, masks)
    with kernels.disabled():
        slow = pointing_game_any_tie(maps, masks)
    assert torch.equal(fast, slow)


def test_constant_map_shows_why_the_two_rules_differ():
    """Every pixel of a constant map is maximal: any non-empty region holds one (pg_any_tie 1), while the
    tie-aware rule counts the share of maximal pixels inside, the region's area fraction (chance)."""
    masks = torch.zeros(1, 10, 10, dtype=torch.bool)
    masks[0, :, :3] = True  # 30 % of the image
    constant = torch.full((1, 10, 10), 0.7)
    for context in (kernels.disabled, None):
        if context is None:
            any_tie, tie_aware = pointing_game_any_tie(constant, masks), pointing_game(constant, masks)
        else:
            with context():
                any_tie, tie_aware = pointing_game_any_tie(constant, masks), pointing_game(constant, masks)
        assert any_tie.item() == 1.0
        assert tie_aware.item() == pytest.approx(0.3) == area_fraction(masks).item()


def test_pointing_any_tie_metric_accumulates_bit_identically():
    maps, masks = tied_pairs(n=30, seed=5)
    cls = torch.arange(30) % 4
    whole = PointingAnyTie(4)
    whole.update(maps, masks, cls)
    parts = [PointingAnyTie(4) for _ in range(3)]
    for metric, rows in zip(parts, torch.randperm(30, generator=torch.Generator().manual_seed(0)).tensor_split(3)):
        metric.update(maps[rows], masks[rows], cls[rows])
    for other in parts[1:]:
        parts[0].merge_state(other)
    a, b = whole.compute(), parts[0].compute()
    assert torch.equal(a, b)
    values = pointing_game_any_tie(maps, masks)
    for c in range(4):
        chosen = values[(cls == c) & ~values.isnan()]
        assert a[c].item() == pytest.approx(chosen.mean().item(), abs=1e-12)


# -- in the table ------------------------------------------------------------------------------------
def test_new_keys_are_in_the_table_with_intervals_and_strata_and_accumulate_bit_identically():
    from test_metrics_beyond import bench_inputs, merged

    from xbench_pl.metrics.resampling import image_key

    def feed(bench, x, images):  # with sample keys: the recognition keys get intervals
        rows = torch.isin(x["image"], torch.tensor(images))
        bench.update(x["scores"][images], x["labels"][images], x["maps"][rows], x["masks"][rows], x["cls"][rows],
                     image_keys=x["keys"][rows], saliency=x["saliency"][images],
                     sample_keys=torch.tensor([image_key(f"img{i}") for i in images]))

    assert {"f1_max", "acc_at_f1_max", "pg_any_tie"} <= set(metric_keys())
    assert "pg_any_tie" in EXTRA_KEYS and "pg_any_tie" in pair_keys()
    x = bench_inputs(seed=21)
    whole = BenchmarkMetrics(["A", "B", "C"], bootstrap=100)
    feed(whole, x, list(range(10)))
    parts = [BenchmarkMetrics(["A", "B", "C"], bootstrap=100) for _ in range(3)]
    order = torch.randperm(10, generator=torch.Generator().manual_seed(2)).tolist()
    feed(parts[0], x, order[:3]), feed(parts[1], x, order[3:4]), feed(parts[2], x, order[4:])
    a, b = whole.compute(), merged(parts).compute()
    assert json.dumps(a) == json.dumps(b)
    values = pointing_game_any_tie(x["maps"], x["masks"])
    for c, name in enumerate("ABC"):
        row = a["classes"][name]
        f1, _, acc = max_f1(x["scores"][:, c], x["labels"][:, c])
        assert row["f1_max"] == f1.item() and row["acc_at_f1_max"] == acc.item()
        assert row["pg_any_tie"] == pytest.approx(values[x["cls"] == c].mean().item(), abs=1e-12)
    for key in ("f1_max", "acc_at_f1_max", "pg_any_tie"):
        assert a["ci"]["mean"][key] is not None
    assert "pg_any_tie" in a["by_size"]["mean"]["small"]
