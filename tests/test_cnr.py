"""``cnr``, BioViL's contrast-to-noise ratio (MS-CXR's phrase-grounding metric): against a direct computation per
pair, its undefined cases, its invariance to the normalisations, and bit-identical accumulation in any split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from xbench_pl.metrics import BenchmarkMetrics, ContrastToNoise
from xbench_pl.metrics.benchmark import EXTRA_KEYS, RECORD_KEYS, pair_keys
from xbench_pl.metrics.functional import CNR_CAP, contrast_to_noise, normalize_saliency


def direct_cnr(saliency: np.ndarray, region: np.ndarray) -> float:
    """The BioViL paper's definition, one pair: |mean_A - mean_notA| / sqrt(var_A + var_notA) (numpy's var, ddof=0)."""
    inside, outside = saliency[region].astype(np.float64), saliency[~region].astype(np.float64)
    return float(abs(inside.mean() - outside.mean()) / np.sqrt(inside.var() + outside.var()))


def random_pairs(seed: int, n: int = 12, size: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    maps = torch.randn(n, size, size, generator=gen) * 3 + 1
    masks = torch.zeros(n, size, size, dtype=torch.bool)
    for i in range(n):
        y, x = torch.randint(0, size - 6, (2,), generator=gen).tolist()
        h, w = torch.randint(2, 7, (2,), generator=gen).tolist()
        masks[i, y : y + h, x : x + w] = True
        maps[i, y : y + h, x : x + w] += float(i) / 4  # contrast growing with i
    return maps, masks


def test_cnr_equals_the_definition_per_pair():
    maps, masks = random_pairs(0)
    values = contrast_to_noise(maps, masks)
    assert values.dtype == torch.float64
    for i in range(len(maps)):
        assert values[i].item() == pytest.approx(direct_cnr(maps[i].numpy(), masks[i].numpy()), rel=1e-12)
    assert values[-1] > values[0]  # more contrast, larger ratio


def test_cnr_is_unchanged_by_the_normalisations_and_its_edge_cases_are_defined():
    maps, masks = random_pairs(1)
    raw = contrast_to_noise(maps, masks)
    for mode in ("minmax", "max"):
        assert torch.allclose(contrast_to_noise(normalize_saliency(maps.abs() + 1, mode), masks),
                              contrast_to_noise(maps.abs() + 1, masks), rtol=1e-5)
    assert torch.allclose(contrast_to_noise(-2 * maps + 7, masks), raw, rtol=1e-9)
    whole, empty, box = torch.ones(1, 8, 8, dtype=torch.bool), torch.zeros(1, 8, 8, dtype=torch.bool), masks[:1, :8, :8] | torch.eye(8, dtype=torch.bool)
    assert torch.isnan(contrast_to_noise(torch.randn(1, 8, 8), whole)).all()  # nothing outside
    assert torch.isnan(contrast_to_noise(torch.randn(1, 8, 8), empty)).all()  # nothing inside
    assert contrast_to_noise(torch.zeros(1, 8, 8), box).item() == 0.0  # no contrast (and no noise)
    assert contrast_to_noise(box.float(), box).item() == CNR_CAP  # the region exactly, no noise: the cap, not infinity
    nearly = box.float()
    nearly[0, 0, 0] += 1e-8  # noise of 1e-8: a ratio of about 1e8, past what int64 fixed point holds
    assert contrast_to_noise(nearly, box).item() == CNR_CAP
    metric = ContrastToNoise(1)
    metric.update(nearly, box, torch.zeros(1, dtype=torch.long))
    assert metric.compute().item() == CNR_CAP
    with pytest.raises(ValueError):
        contrast_to_noise(torch.full((1, 8, 8), float("nan")), masks[:1, :8, :8])


def test_cnr_counts_only_the_pixels_the_model_saw():
    """A centre crop's unseen columns hold the map's minimum after the warp: they are left out of both sides."""
    maps, masks = random_pairs(4, n=6, size=32)
    seen = torch.zeros_like(masks)
    seen[:, :, 4:28] = True
    cut = torch.where(seen, maps, maps.flatten(1).amin(1)[:, None, None])
    values = contrast_to_noise(cut, masks, seen)
    for i in range(len(maps)):
        m, r = maps[i][:, 4:28].numpy(), masks[i][:, 4:28].numpy()
        expected = direct_cnr(m, r) if r.any() else float("nan")
        assert values[i].item() == pytest.approx(expected, rel=1e-12, nan_ok=True)
    assert not torch.allclose(values, contrast_to_noise(cut, masks), equal_nan=True)


def test_cnr_of_a_map_alone_equals_it_in_a_batch():
    maps, masks = random_pairs(2, n=30, size=64)
    batch = contrast_to_noise(maps, masks)
    alone = torch.cat([contrast_to_noise(maps[i : i + 1], masks[i : i + 1]) for i in range(len(maps))])
    assert torch.equal(batch, alone)  # bit for bit: the fixed-point sums across ranks rely on it


def test_cnr_metric_and_table_key_accumulate_bit_identically_in_any_split():
    from test_metrics_beyond import bench_inputs, merged

    assert "cnr" in EXTRA_KEYS and "cnr" in RECORD_KEYS and "cnr" in pair_keys()
    maps, masks = random_pairs(3)
    cls = torch.arange(len(maps)) % 3
    whole = ContrastToNoise(3)
    whole.update(maps, masks, cls)
    parts = ContrastToNoise(3)
    for rows in torch.randperm(len(maps), generator=torch.Generator().manual_seed(0)).tensor_split(4):
        parts.update(maps[rows], masks[rows], cls[rows])
    assert torch.equal(whole.compute(), parts.compute())
    values = contrast_to_noise(maps, masks)
    for c in range(3):
        assert whole.compute()[c].item() == pytest.approx(values[cls == c].mean().item(), rel=1e-12)

    x = bench_inputs(seed=5)

    def feed(bench, images):
        rows = torch.isin(x["image"], torch.tensor(images))
        bench.update(x["scores"][images], x["labels"][images], x["maps"][rows], x["masks"][rows], x["cls"][rows],
                     image_keys=x["keys"][rows], saliency=x["saliency"][images])

    table = BenchmarkMetrics(["A", "B", "C"], bootstrap=50)
    feed(table, list(range(10)))
    split = [BenchmarkMetrics(["A", "B", "C"], bootstrap=50) for _ in range(2)]
    feed(split[0], [7, 1, 3]), feed(split[1], [0, 2, 4, 5, 6, 8, 9])
    a, b = table.compute(), merged(split).compute()
    assert json.dumps(a) == json.dumps(b)
    direct = contrast_to_noise(x["maps"], x["masks"])
    for c, name in enumerate("ABC"):
        defined = (x["cls"] == c) & ~torch.isnan(direct) & x["masks"].flatten(1).any(1)
        assert a["classes"][name]["cnr"] == pytest.approx(direct[defined].mean().item(), rel=1e-9)
    assert a["ci"]["mean"]["cnr"] is not None and "cnr" in a["by_size"]["mean"]["small"]


def test_test_step_passes_what_the_crop_cut_off_and_the_table_leaves_it_out():
    """``warped_and_seen``'s mask is exactly where ``warp_to_eval_grid`` put the map's minimum (a centre crop's cut-off
    sides), and BenchmarkMetrics' cnr, given it, is the mean of the per-pair values over the seen pixels."""
    from xbench_pl.geometry import Preprocess, warp_to_eval_grid, warped_and_seen

    preprocess = Preprocess("crop", 56)
    sizes = torch.tensor([[300, 200], [200, 300]])
    affine = torch.tensor([preprocess.plan(*s.tolist())[1] for s in sizes], dtype=torch.float64)
    maps = torch.rand(2, 7, 7, generator=torch.Generator().manual_seed(0)) + 1
    warped = warp_to_eval_grid(maps, affine, 56, sizes, 64)
    seen = warped_and_seen(maps, affine, 56, sizes, 64)[1]
    assert (~seen).any(1).any(1).all() and seen.any(1).any(1).all()  # both images lose a band to the crop
    assert torch.equal(warped[~seen], maps.flatten(1).amin(1)[:, None, None].expand_as(warped)[~seen])
    masks = torch.zeros(2, 64, 64, dtype=torch.bool)
    masks[:, 20:40, 24:44] = True
    table = BenchmarkMetrics(["A"], bootstrap=0)
    table.update(torch.rand(2, 1), torch.ones(2, 1), warped, masks, torch.zeros(2, dtype=torch.long), seen=seen)
    expected = contrast_to_noise(warped, masks, seen)
    assert table.compute()["classes"]["A"]["cnr"] == pytest.approx(expected.mean().item(), rel=1e-12)
    assert not torch.allclose(expected, contrast_to_noise(warped, masks))
