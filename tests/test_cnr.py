"""``cnr``, BioViL's contrast-to-noise ratio (MS-CXR's phrase-grounding metric): against a direct computation per
pair, its undefined cases, its invariance to the normalisations, and bit-identical accumulation in any split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from xbench_pl.metrics import BenchmarkMetrics, ContrastToNoise
from xbench_pl.metrics.benchmark import EXTRA_KEYS, RECORD_KEYS, pair_keys
from xbench_pl.metrics.functional import contrast_to_noise, normalize_saliency


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


def test_cnr_is_unchanged_by_the_normalisations_and_undefined_where_the_definition_is():
    maps, masks = random_pairs(1)
    raw = contrast_to_noise(maps, masks)
    for mode in ("minmax", "max"):
        assert torch.allclose(contrast_to_noise(normalize_saliency(maps.abs() + 1, mode), masks),
                              contrast_to_noise(maps.abs() + 1, masks), rtol=1e-5)
    assert torch.allclose(contrast_to_noise(-2 * maps + 7, masks), raw, rtol=1e-9)
    whole, empty, flat = torch.ones(1, 8, 8, dtype=torch.bool), torch.zeros(1, 8, 8, dtype=torch.bool), torch.zeros(1, 8, 8)
    assert torch.isnan(contrast_to_noise(torch.randn(1, 8, 8), whole)).all()  # nothing outside
    assert torch.isnan(contrast_to_noise(torch.randn(1, 8, 8), empty)).all()  # nothing inside
    assert torch.isnan(contrast_to_noise(flat, masks[:1, :8, :8] | torch.eye(8, dtype=torch.bool))).all()  # no noise
    with pytest.raises(ValueError):
        contrast_to_noise(torch.full((1, 8, 8), float("nan")), masks[:1, :8, :8])


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
