"""The vectorised torch path of the grounding metrics (``device_kernels.py``, the path of CUDA maps) against the
numba kernels: the same integer counts and every statistic bit for bit, on CPU tensors under the switch
(``kernels.device_path()``) and, with a GPU, on CUDA maps (``pytest -m cuda``; skipped without one)."""

import contextlib
import json

import numpy as np
import pytest
import torch

from test_explainers_cli import assert_same_report
from test_metric_kernels import hard_pairs, same
from xbench_pl.metrics import BenchmarkMetrics, device_kernels, functional, kernels
from xbench_pl.metrics.functional import default_thresholds

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba not installed: nothing to compare with")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
GRIDS = {"uniform": default_thresholds(), "searched": torch.tensor([0.0, 0.1, 0.15, 0.5, 0.9, 1.0])}


def torch_path(device: str):
    """CPU tensors take the torch path under the switch; CUDA tensors take it as they are."""
    return kernels.device_path() if device == "cpu" else contextlib.nullcontext()


def on_torch_path(device: str, fn, *args, **kwargs):
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    with torch_path(device):
        return fn(*args, **kwargs)


def same_counts(a: dict, b: dict) -> bool:
    return (all(torch.equal(a[k], b[k]) for k in ("maximal", "curve", "levels", "region")) and a["pixels"] == b["pixels"]
            and np.array_equal(a["mass"], b["mass"]))


def statistics(counts: dict) -> tuple:
    return (kernels.pointing_from_counts(counts), kernels.any_tie_from_counts(counts), kernels.lift_from_counts(counts),
            *kernels.curve_from_counts(counts), *kernels.otsu_from_counts(counts), kernels.energy_from_counts(counts))


def on_cpu(values) -> tuple:
    return tuple(v.cpu() for v in (values if isinstance(values, tuple) else (values,)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("mode", ["minmax", "max", "none"])
@pytest.mark.parametrize("levels", [None, 5], ids=["continuous", "ties"])
def test_counts_and_statistics_equal_numba_bit_for_bit(device, grid, mode, levels):
    maps, masks = hard_pairs(levels=levels)  # constant, negative, -0/+0, on the grid, tiny, empty and full regions
    maps[7] = -maps[7]  # all negative: "max" zeroes it
    thresholds = GRIDS[grid]
    numba = kernels.grounding_counts(maps, masks, thresholds, mode)
    counts = on_torch_path(device, kernels.grounding_counts, maps, masks, thresholds, mode)
    assert counts["device"].type == device
    assert same_counts(counts, numba)
    vectorised = statistics(counts)
    assert all(v.device.type == device for v in vectorised)  # the statistics go to the maps' device
    assert same(on_cpu(vectorised), statistics(numba))
    assert same(on_cpu(on_torch_path(device, kernels.pixel_auroc, maps, masks)), kernels.pixel_auroc(maps, masks))


@pytest.mark.parametrize("device", DEVICES)
def test_functional_twins_and_specificity_equal_numba(device):
    maps, masks = hard_pairs(n=9, size=64, seed=2, levels=7)
    normal = functional.normalize_saliency(maps)
    thresholds = default_thresholds()
    for fn, args in ((functional.pointing_game, (maps, masks)), (functional.pointing_game_any_tie, (maps, masks)),
                     (functional.pointing_lift, (maps, masks)), (functional.dice_iou_curve, (normal, masks, thresholds)),
                     (functional.otsu_dice_iou, (normal, masks)), (functional.energy_pointing, (normal, masks)),
                     (functional.pixel_auroc, (maps, masks)), (functional.finding_specificity, (maps[:4], masks[:4]))):
        assert same(on_cpu(on_torch_path(device, fn, *args)), on_cpu(fn(*args))), fn.__name__
    groups = [torch.tensor([0, 2, 5]), torch.tensor([1, 3]), torch.tensor([4, 6, 7, 8])]
    vectorised = on_torch_path(device, functional.finding_specificities, maps, masks, groups)
    assert all(same(a, b) for a, b in zip(vectorised, functional.finding_specificities(maps, masks, groups)))


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_raise_the_same_error(device):
    maps, masks = hard_pairs(n=7)
    for value in (float("nan"), float("inf"), float("-inf")):
        bad = maps.clone()
        bad[2, 3, 3] = value
        for fn, args in ((kernels.grounding_counts, (bad, masks)), (kernels.pixel_auroc, (bad, masks)),
                         (kernels.maximal_overlaps, (bad, masks, [torch.arange(7)]))):
            with pytest.raises(ValueError) as numba_error:
                fn(*args)
            with pytest.raises(ValueError) as error:
                on_torch_path(device, fn, *args)
            assert str(error.value) == str(numba_error.value) == "saliency maps contain NaN or inf (maps at positions [2])"


def test_chunks_and_large_maps_give_the_same_counts(monkeypatch):
    """A few 512² maps in chunks of one map, and 64² maps in chunks of three (``CHUNK_PIXELS``)."""
    gen = torch.Generator().manual_seed(3)
    big = torch.nn.functional.interpolate(torch.randn(3, 1, 14, 14, generator=gen), size=512, mode="bilinear")[:, 0].contiguous()
    big_masks = torch.zeros(3, 512, 512, dtype=torch.bool)
    big_masks[:, 100:300, 150:350] = True
    small, small_masks = hard_pairs(n=8, size=64, seed=4)
    for maps, masks, chunk in ((big, big_masks, 512 * 512), (small, small_masks, 3 * 64 * 64)):
        monkeypatch.setattr(device_kernels, "CHUNK_PIXELS", chunk)
        with kernels.device_path():
            counts, auroc = kernels.grounding_counts(maps, masks), kernels.pixel_auroc(maps, masks)
        assert same_counts(counts, kernels.grounding_counts(maps, masks))
        assert same(auroc, kernels.pixel_auroc(maps, masks))


def test_the_switch_picks_the_path(monkeypatch):
    maps, masks = torch.rand(2, 8, 8), torch.rand(2, 8, 8) > 0.5
    assert kernels.path(maps, masks) == "numba"
    assert kernels.path(torch.empty(2, 8, 8, device="meta")) == "torch"  # any device but the CPU: the torch path
    assert kernels.path(maps.double(), masks) is None  # float64 maps: the reference, as before
    with kernels.device_path():
        assert kernels.path(maps, masks) == "torch" and not kernels.available()
        with kernels.disabled():
            assert kernels.path(maps, masks) is None
    monkeypatch.setenv(kernels.ENV, "torch")
    assert kernels.path(maps, masks) == "torch"
    monkeypatch.setenv(kernels.ENV, "0")
    assert kernels.path(maps, masks) is None and kernels.path(maps.to("meta")) is None
    monkeypatch.setattr(kernels, "numba", None)
    monkeypatch.delenv(kernels.ENV)
    assert kernels.path(maps, masks) is None and kernels.path(maps.to("meta")) == "torch"


def test_empty_batches():
    maps, masks = torch.zeros(0, 8, 8), torch.zeros(0, 8, 8, dtype=torch.bool)
    with kernels.device_path():
        counts = kernels.grounding_counts(maps, masks)
        auroc = kernels.pixel_auroc(maps, masks)
    assert same_counts(counts, kernels.grounding_counts(maps, masks)) and auroc.shape == (0,)


def benchmark_table(device: str, cast=lambda maps: maps) -> str:
    """A whole ``BenchmarkMetrics`` table (the compute output metrics.json holds), updated with maps on ``device``
    (``cast``: applied to the maps, the negatives' maps and the saliency)."""
    gen = torch.Generator().manual_seed(5)
    metrics = BenchmarkMetrics(["a", "b", "c"], bootstrap=50, negatives=True).to(device)
    for step in range(3):
        k = 6 if step == 0 else 5  # step 0 has an empty region (dropped, copied); then all share one pass
        maps, masks = (t[:k].to(device) for t in hard_pairs(n=7, size=20, seed=10 + step, levels=None if step else 6))
        cls = (torch.arange(k) % 3).to(device)
        scores = torch.rand(2, 3, generator=torch.Generator().manual_seed(step)).to(device)
        labels = (scores > 0.4).float()
        keys = torch.tensor([i // 3 for i in range(k)]) + 10 * step
        seen = torch.ones_like(masks)
        seen[:, :2] = False
        negatives = (cast(torch.rand(2, 20, 20, generator=gen).to(device)), torch.tensor([0, 2]), torch.tensor([0, 1]))
        metrics.update(scores, labels, cast(maps), masks, cls, image_keys=keys, seen=seen,
                       saliency=cast(torch.rand(2, 3, 4, 4, generator=gen).to(device)), negatives=negatives)
    return json.dumps(metrics.compute())


@pytest.mark.parametrize("device", DEVICES)
def test_benchmark_table_identical_on_the_torch_path(device):
    """On CPU tensors every key of the table, integer and float, is identical: the grounding statistics come from
    the same integer counts by the same host code, cnr from the same numpy sums. On CUDA the integer keys are
    exact and the floats within 1e-12: map_similarity and neg_mass are float64 torch reductions on the device,
    whose summation order differs from the CPU's."""
    with torch_path(device):
        vectorised = benchmark_table(device)
    expected = benchmark_table("cpu")
    if device == "cpu":
        assert vectorised == expected
    assert_same_report(json.loads(vectorised), json.loads(expected), 0.0 if device == "cpu" else 1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_maps_are_promoted_once(device, dtype):
    """bf16/fp16 maps give the table of their values in float32 (promoted where they enter the metrics)."""
    with torch_path(device):
        reduced = benchmark_table(device, lambda maps: maps.to(dtype))
    expected = benchmark_table("cpu", lambda maps: maps.to(dtype).float())
    assert_same_report(json.loads(reduced), json.loads(expected), 0.0 if device == "cpu" else 1e-12)
