"""Statistics over every counted pair (``grounding.PairRecords``): bootstrap intervals and size strata.

Both are computed once, after the DDP sync, from per-pair values in int64 fixed point sorted by
(image key, class): every rank holds the same records in the same order, the resample weights
come from a seeded generator and the resampled sums are int64 matrix products, so 1 and N
processes give the same digits. Nothing here re-runs a model.

Bootstrap: the unit is the image (no dataset here carries patient ids; a patient-aware unit is
``units=`` per pair). Each of ``resamples`` replicates draws as many units as there are, with
replacement; a replicate's value of a key is the mean over the drawn pairs (a unit drawn twice
counts twice) per class, and its macro mean over the classes defined in that replicate. The
interval is the 2.5 and 97.5 percentiles of the replicates (linear interpolation).
"""

from __future__ import annotations

import hashlib

import torch

from xbench_pl.metrics.functional import bootstrap_weights, percentile_interval
from xbench_pl.metrics.grounding import from_fixed

#: Size strata by the region's share of the image: names and default bounds (small < 1 %, large >= 10 %).
SIZE_STRATA = ("small", "medium", "large")
DEFAULT_SIZE_BOUNDS = (0.01, 0.10)


def image_key(image_id: str) -> int:
    """A stable signed 64-bit key of an image id (BLAKE2b): orders images the same on every process."""
    return int.from_bytes(hashlib.blake2b(str(image_id).encode(), digest_size=8).digest(), "little", signed=True)


def _unit_sums(units: torch.Tensor, cls: torch.Tensor, values: torch.Tensor, defined: torch.Tensor, num_classes: int):
    """Per unit (sorted unique ``units``) and (class, key): fixed-point sums and defined counts ``[U, C*K]``."""
    _, inverse = torch.unique(units, sorted=True, return_inverse=True)
    n_units, k = int(inverse.max()) + 1 if units.numel() else 0, values.shape[1]
    column = (cls[:, None] * k + torch.arange(k)[None, :]).flatten()
    row = inverse[:, None].expand(-1, k).flatten()
    sums = torch.zeros(n_units, num_classes * k, dtype=torch.long).index_put_((row, column), (values * defined).flatten(), accumulate=True)
    counts = torch.zeros(n_units, num_classes * k, dtype=torch.long).index_put_((row, column), defined.flatten(), accumulate=True)
    return sums, counts


def bootstrap_intervals(units: torch.Tensor, cls: torch.Tensor, values: torch.Tensor, defined: torch.Tensor,
                        num_classes: int, resamples: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, torch.Tensor]:
    """Percentile bootstrap intervals of per-class means and their macro mean.

    ``units [P]`` int64 (the resampling unit of each pair), ``cls [P]``, ``values [P, K]`` int64 fixed
    point, ``defined [P, K]`` 0/1. Returns ``classes [C, K, 2]`` and ``mean [K, 2]`` (float64, NaN where
    no replicate is defined) and ``replicates [R, C, K]``.
    """
    k = values.shape[1]
    sums, counts = _unit_sums(units, cls, values, defined, num_classes)
    weights = bootstrap_weights(sums.shape[0], resamples, seed)
    per_class = from_fixed(weights @ sums, weights @ counts).view(resamples, num_classes, k)
    macro = per_class.nanmean(1)  # classes defined in the replicate; NaN if none
    return {"classes": percentile_interval(per_class, level), "mean": percentile_interval(macro, level), "replicates": per_class}


def strata_means(stratum: torch.Tensor, cls: torch.Tensor, values: torch.Tensor, defined: torch.Tensor,
                 num_classes: int) -> dict[str, torch.Tensor]:
    """Per size stratum (``stratum [P]``: 0 small, 1 medium, 2 large, ``functional.size_stratum`` of each
    pair's area fraction): ``means [S, C, K]`` (float64, NaN where undefined) and ``pairs [S, C]`` (int64)."""
    k = values.shape[1]
    means, pairs = [], []
    for s in range(len(SIZE_STRATA)):
        keep = stratum == s
        c = cls[keep]
        total = torch.zeros(num_classes, k, dtype=torch.long).index_add_(0, c, values[keep] * defined[keep])
        count = torch.zeros(num_classes, k, dtype=torch.long).index_add_(0, c, defined[keep])
        means.append(from_fixed(total, count))
        pairs.append(torch.bincount(c, minlength=num_classes))
    return {"means": torch.stack(means), "pairs": torch.stack(pairs)}
