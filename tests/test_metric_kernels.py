"""The fused metric kernels (numba) against the torch reference path and direct loops: bit for bit
(energy_pg: exact sums, within 1e-15 of the reference's float64 sums, exact against rationals)."""

import json
from fractions import Fraction

import numpy as np
import pytest
import torch

from xbench_pl.metrics import BenchmarkMetrics, device_kernels, functional, kernels
from xbench_pl.metrics.functional import (
    default_thresholds,
    dice_iou_curve,
    energy_pointing,
    finding_specificity,
    normalize_saliency,
    otsu_dice_iou,
    pixel_auroc,
    pointing_game,
)

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba not installed: only the torch path runs")


def hard_pairs(n=12, size=24, seed=0, levels=None):
    """Maps with the awkward cases: constant, negative, ties (coarse levels, -0 and +0), values on the
    threshold grid, NaN-free; masks empty, full and partial."""
    gen = torch.Generator().manual_seed(seed)
    maps = torch.rand(n, size, size, generator=gen)
    if levels:
        maps = (maps * levels).floor() / levels
    maps[0] = 0.25
    maps[1] = maps[1] * 3 - 1
    maps[2, :4] = -0.0
    maps[2, 4:8] = 0.0
    maps[3] = default_thresholds()[torch.randint(0, 101, (size, size), generator=gen)]  # exactly on the grid
    maps[4] = maps[4] * 1e-30  # tiny values: exact mass sums need the full exponent range
    masks = torch.rand(n, size, size, generator=gen) > 0.6
    masks[5] = False
    masks[6] = True
    return maps, masks


def reference(fn, *args, **kwargs):
    with kernels.disabled():
        return fn(*args, **kwargs)


def same(a, b) -> bool:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return all(torch.equal(x.nan_to_num(-7.0), y.nan_to_num(-7.0)) and torch.equal(x.isnan(), y.isnan()) for x, y in zip(a, b))


@pytest.mark.parametrize("levels", [None, 5], ids=["continuous", "ties"])
@pytest.mark.parametrize("mode", ["minmax", "max", "none"])
def test_kernels_equal_the_torch_reference_bit_for_bit(levels, mode):
    maps, masks = hard_pairs(levels=levels)
    normal = reference(normalize_saliency, maps, mode)
    for thresholds in (default_thresholds(), torch.tensor([0.0, 0.1, 0.15, 0.5, 0.9, 1.0])):  # uniform and not
        assert same(dice_iou_curve(normal, masks, thresholds), reference(dice_iou_curve, normal, masks, thresholds))
        assert same(kernels.dice_iou_curve(maps, masks, thresholds, mode), reference(dice_iou_curve, normal, masks, thresholds))
    assert same(pointing_game(maps, masks), reference(pointing_game, maps, masks))
    assert same(otsu_dice_iou(normal, masks), reference(otsu_dice_iou, normal, masks))
    assert same(kernels.otsu_dice_iou(maps, masks, mode), reference(otsu_dice_iou, normal, masks))
    assert same(pixel_auroc(maps, masks), reference(pixel_auroc, maps, masks))
    assert same(finding_specificity(maps[:5], masks[:5]), reference(finding_specificity, maps[:5], masks[:5]))
    assert same(functional.area_fraction(masks), reference(functional.area_fraction, masks))
    energy, expected = kernels.energy_pointing(maps, masks, mode), reference(energy_pointing, normal, masks)
    assert torch.equal(energy.isnan(), expected.isnan())
    assert torch.allclose(energy.nan_to_num(0), expected.nan_to_num(0), rtol=1e-15, atol=0)


def test_energy_sums_are_exact():
    maps, masks = hard_pairs(n=8, size=16, seed=3)
    normal = reference(normalize_saliency, maps, "minmax")
    energy = energy_pointing(normal, masks)
    for i in range(len(maps)):
        mass = [Fraction(float(v)) for v in normal[i].flatten().clamp_min(0).tolist()]
        inside = sum((m for m, g in zip(mass, masks[i].flatten().tolist()) if g), Fraction(0))
        total = sum(mass, Fraction(0))
        if not masks[i].any():
            assert energy[i].isnan()
        elif total == 0:
            assert energy[i].item() == masks[i].double().mean().item()
        else:
            assert energy[i].item() == float(inside / total)  # the correctly rounded ratio of the exact sums


def test_curve_and_auroc_equal_direct_loops():
    maps, masks = hard_pairs(n=8, size=12, seed=4, levels=9)
    thresholds = default_thresholds()
    normal = reference(normalize_saliency, maps, "minmax")
    dice, iou = dice_iou_curve(normal, masks, thresholds)
    auc = pixel_auroc(maps, masks)
    for i in range(len(maps)):
        m, g = normal[i].flatten(), masks[i].flatten()
        for k, t in enumerate(thresholds.tolist()):
            b = m >= t
            inter, p, truth = int((b & g).sum()), int(b.sum()), int(g.sum())
            if truth:
                assert dice[i, k].item() == 2 * inter / (p + truth) and iou[i, k].item() == inter / (p + truth - inter)
        raw, pos, neg = maps[i].flatten().tolist(), [], []
        for v, inside in zip(raw, g.tolist()):
            (pos if inside else neg).append(v)
        if pos and neg:
            twice = sum(2 * (a > b) + (a == b) for a in pos for b in neg)
            assert auc[i].item() == twice / (2 * len(pos) * len(neg))
        else:
            assert auc[i].isnan()


def test_errors_and_layouts_as_the_reference():
    maps, masks = hard_pairs(n=7)
    bad = maps.clone()
    bad[2, 3, 3] = float("nan")
    for fn in (pointing_game, pixel_auroc, otsu_dice_iou, energy_pointing):
        with pytest.raises(ValueError, match=r"NaN or inf \(maps at positions \[2\]\)"):
            fn(bad, masks)
    strided = maps.transpose(1, 2)  # not contiguous
    assert same(pointing_game(strided, masks), reference(pointing_game, strided, masks))
    assert same(pixel_auroc(maps.double(), masks), reference(pixel_auroc, maps.double(), masks))  # float64: torch path
    assert not kernels.applies(maps.double(), masks)


def test_benchmark_metrics_identical_with_and_without_kernels():
    gen = torch.Generator().manual_seed(5)
    classes = ["a", "b", "c"]

    def run():
        metrics = BenchmarkMetrics(classes, bootstrap=50)
        for step in range(3):
            k = 6 if step == 0 else 5  # step 0 has an empty region (dropped, copied); then all share one pass
            maps, masks = (t[:k] for t in hard_pairs(n=7, size=20, seed=10 + step))
            cls = torch.arange(k) % 3
            scores = torch.rand(2, 3, generator=torch.Generator().manual_seed(step))
            labels = (scores > 0.4).float()
            keys = torch.tensor([i // 3 for i in range(k)]) + 10 * step
            metrics.update(scores, labels, maps, masks, cls, image_keys=keys, saliency=torch.rand(2, 3, 4, 4, generator=gen))
        return json.dumps(metrics.compute())

    fast = run()
    gen.manual_seed(5)
    with kernels.disabled():
        slow = run()
    assert fast == slow


def test_torch_path_without_numba(monkeypatch):
    maps, masks = hard_pairs(n=7)
    monkeypatch.setattr(kernels, "numba", None)
    assert not kernels.applies(maps, masks)
    assert same(pointing_game(maps, masks), reference(pointing_game, maps, masks))


def test_tolerance_constant_is_shared():
    assert device_kernels.RELATIVE_TOLERANCE == functional.RELATIVE_TOLERANCE


@pytest.mark.parametrize("t", [2, 11, 101, 201])
def test_threshold_counts_at_the_grid_values_equal_comparisons(t):
    """The uniform-grid count (floor(m (T - 1)) + 1, corrected once) at every threshold and its float32 neighbours,
    beyond [0, 1] (normalize="none") and across a block boundary (kernels.BLOCK pixels)."""
    thresholds = default_thresholds(1 / (t - 1))
    grid = thresholds.numpy()
    values = np.concatenate([grid, np.nextafter(grid, np.float32(-2)), np.nextafter(grid, np.float32(2)),
                             np.float32([-0.0, -1e-30, -3.0, 1.5, 7.0, 3e38, -3e38])]).astype(np.float32)
    values = np.resize(values, kernels.BLOCK + 37)  # two blocks, the second partial
    maps = torch.from_numpy(values).view(1, 1, -1)
    masks = torch.from_numpy(np.arange(values.size) % 3 == 0).view(1, 1, -1)
    assert kernels._uniform(thresholds)
    curve = kernels.grounding_counts(maps, masks, thresholds, "none", want=0)["curve"][0]
    reached = (maps.flatten()[:, None] >= thresholds[None, :]).sum(1)
    inside = masks.flatten()
    for g in (0, 1):
        assert torch.equal(curve[g], torch.bincount(reached[inside == bool(g)], minlength=t + 1))


def test_statistics_across_blocks_equal_the_reference():
    maps, masks = hard_pairs(n=7, size=40, seed=6)  # 1,600 pixels: a full block and a partial one
    for mode in ("minmax", "max"):
        normal = reference(normalize_saliency, maps, mode)
        assert same(kernels.dice_iou_curve(maps, masks, default_thresholds(), mode), reference(dice_iou_curve, normal, masks, default_thresholds()))
        assert same(kernels.otsu_dice_iou(maps, masks, mode), reference(otsu_dice_iou, normal, masks))
    assert same(pointing_game(maps, masks), reference(pointing_game, maps, masks))
