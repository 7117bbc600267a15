"""Statistics over every counted pair (``grounding.PairRecords``) and image (``ImageRecords``):
bootstrap intervals and size strata.

Both are computed once, after the DDP sync, from per-pair and per-image values kept exactly (int64
fixed point, float64 scores) and sorted by image key: every rank holds the same records in the same
order, the resample weights come from a seeded generator and the resampled sums are int64, so 1 and N
processes give the same digits. Nothing here re-runs a model.

Bootstrap: the unit is the patient where the dataset records one (``unit_key``), else the image. The
units of a dataset are the sorted unique unit keys of its scored images and counted pairs; each of
``resamples`` replicates draws as many units as there are, with replacement (``bootstrap_weights``), and
every key of the table (pair means, image means, recognition) is recomputed on the same draws: a unit
drawn twice counts twice. A replicate's value of a mean is the weighted mean per class, and its macro
mean over the classes defined in that replicate. The interval is the 2.5 and 97.5 percentiles of the
replicates (linear interpolation).

Shared draws: the weights depend only on the number of units, ``resamples`` and ``seed``, and a unit is a
column by its rank among the sorted keys, so two runs over the same units (the same sorted unit keys)
with the same ``resamples`` and ``seed`` draw the same units in every replicate. A table's ``ci`` records
``draws`` (``draws_id``: a digest of exactly those three) and ``replicates`` (``kept_replicates``: each
class's replicate values of ``replicate_keys``), so a ratio of two runs' values (the report's % of a
reader) gets its interval from replicate-by-replicate ratios on the same draws, without re-running either.
"""

from __future__ import annotations

import hashlib
import math

import torch

from xbench_pl.metrics.functional import bootstrap_weights, percentile_interval
from xbench_pl.metrics.grounding import Records, from_fixed, to_fixed

#: Size strata by the region's share of the image: names and default bounds (small < 1 %, large >= 10 %).
SIZE_STRATA = ("small", "medium", "large")
DEFAULT_SIZE_BOUNDS = (0.01, 0.10)


def image_key(image_id: str) -> int:
    """A stable signed 64-bit key of an image id (BLAKE2b): orders images the same on every process."""
    return int.from_bytes(hashlib.blake2b(str(image_id).encode(), digest_size=8).digest(), "little", signed=True)


def unit_key(image_id: str, patient_id: str | None = None) -> int:
    """The bootstrap unit of an image: its patient where the dataset records one, else the image itself
    (``image_key``; a patient's key is hashed with a prefix, so it never equals an image's)."""
    return image_key(image_id) if patient_id is None else image_key(f"patient:{patient_id}")


def draws_id(universe: torch.Tensor, resamples: int, seed: int) -> str:
    """What fixes a table's bootstrap draws: a BLAKE2b digest of the sorted unit keys ``universe`` (int64), ``resamples``
    and ``seed``. Two tables with the same id were resampled on the same draws, replicate by replicate."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(universe.to("cpu", torch.long).contiguous().numpy().astype("<i8").tobytes())
    digest.update(f"{int(resamples)}:{int(seed)}".encode())
    return digest.hexdigest()


def kept_replicates(replicates: dict[str, torch.Tensor], classes: list[str], keys: tuple[str, ...]) -> dict[str, dict[str, list]]:
    """``{key: {class: [R values]}}`` of ``replicates`` (``{key: [R, C]}``) for those of ``keys`` it has, as JSON numbers
    (None where a replicate is undefined)."""
    return {k: {name: [None if v != v else v for v in replicates[k][:, i].double().tolist()] for i, name in enumerate(classes)}
            for k in keys if k in replicates}


def unit_name(image_keys: torch.Tensor, unit_keys: torch.Tensor) -> str:
    """What the bootstrap resampled, as the report says it: ``patient``, ``image``, or both where only some
    images have a patient id."""
    by_patient = image_keys != unit_keys
    if by_patient.numel() and bool(by_patient.all()):
        return "patient"
    return "patient where known, else image" if bool(by_patient.any()) else "image"


def resampled_means(index: torch.Tensor, cls: torch.Tensor, values: torch.Tensor, defined: torch.Tensor,
                    num_classes: int, weights: torch.Tensor) -> torch.Tensor:
    """Per replicate the weighted mean per (class, key) ``[R, C, K]`` (float64, NaN where no drawn pair
    is defined): ``index [P]`` each pair's unit (a column of ``weights [R, U]``), ``values [P, K]`` int64
    fixed point, ``defined [P, K]`` 0/1. Sums per unit first, then one int64 product with the weights."""
    k, n_units = values.shape[1], weights.shape[1]
    column = (cls[:, None] * k + torch.arange(k)[None, :]).flatten()
    row = index[:, None].expand(-1, k).flatten()
    sums = torch.zeros(n_units, num_classes * k, dtype=torch.long).index_put_((row, column), (values * defined).flatten(), accumulate=True)
    counts = torch.zeros(n_units, num_classes * k, dtype=torch.long).index_put_((row, column), defined.flatten(), accumulate=True)
    return from_fixed(weights @ sums, weights @ counts).view(weights.shape[0], num_classes, k)


def intervals(replicates: torch.Tensor, level: float = 0.95) -> dict[str, torch.Tensor]:
    """From replicates ``[R, C, K]``: ``classes [C, K, 2]`` and the macro mean's ``mean [K, 2]`` (the mean over
    the classes defined in each replicate)."""
    return {"classes": percentile_interval(replicates, level), "mean": percentile_interval(replicates.nanmean(1), level)}


def bootstrap_intervals(units: torch.Tensor, cls: torch.Tensor, values: torch.Tensor, defined: torch.Tensor,
                        num_classes: int, resamples: int = 1000, seed: int = 0, level: float = 0.95,
                        universe: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Percentile bootstrap intervals of per-class means and their macro mean.

    ``units [P]`` int64 (the resampling unit of each pair), ``cls [P]``, ``values [P, K]`` int64 fixed
    point, ``defined [P, K]`` 0/1; ``universe``: the sorted unit keys drawn from (default: those of the
    pairs). Returns ``classes [C, K, 2]`` and ``mean [K, 2]`` (float64, NaN where no replicate is defined)
    and ``replicates [R, C, K]``.
    """
    universe = torch.unique(units, sorted=True) if universe is None else universe
    weights = bootstrap_weights(universe.numel(), resamples, seed)
    per_class = resampled_means(torch.searchsorted(universe, units), cls, values, defined, num_classes, weights)
    return {**intervals(per_class, level), "replicates": per_class}


class ImageRecords(Records):
    """Every scored image's record, for the bootstrap of image-level keys: its image key and unit key
    (int64), scores ``[C]`` (float64) and labels ``[C]``, and per-class values of ``keys`` in fixed point
    with a defined flag ``[C, K]``. ``compute`` returns them sorted by image key: the same order on 1 or N
    processes."""

    def __init__(self, num_classes: int, keys: tuple[str, ...], **kwargs):
        super().__init__(**kwargs)
        self.num_classes, self.keys = num_classes, tuple(keys)
        self._add_records()

    def shapes(self) -> dict:
        c, k = self.num_classes, len(self.keys)
        return {"image": ((0,), torch.long), "unit": ((0,), torch.long), "scores": ((0, c), torch.float64),
                "labels": ((0, c), torch.long), "values": ((0, c, k), torch.long), "defined": ((0, c, k), torch.long)}

    def update(self, image: torch.Tensor, unit: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor,
               values: dict[str, torch.Tensor]) -> None:
        """``values``: per key ``[B, C]`` float (NaN where undefined)."""
        b = image.numel()
        stacked = (torch.stack([values[k].double().cpu() for k in self.keys], dim=2) if self.keys
                   else torch.zeros(b, self.num_classes, 0, dtype=torch.float64))
        ok = ~torch.isnan(stacked)
        for name, value in (("image", image.long()), ("unit", unit.long()), ("scores", scores.detach().double()),
                            ("labels", labels.long()), ("values", to_fixed(torch.nan_to_num(stacked, nan=0.0))),
                            ("defined", ok.long())):
            getattr(self, name).append(value.to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        shapes = self.shapes()
        out = {name: value.reshape(-1, *shapes[name][0][1:]) for name, value in self._gathered().items()}
        order = torch.argsort(out["image"], stable=True)
        return {name: value[order] for name, value in out.items()}


def class_means(cls: torch.Tensor, values: torch.Tensor, defined: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per class the mean of fixed-point ``values [P, ...]`` over the defined ones (``defined``, 0/1, same
    shape): ``[C, ...]`` float64, NaN where none is defined."""
    total = torch.zeros(num_classes, *values.shape[1:], dtype=torch.long).index_add_(0, cls, values * defined)
    count = torch.zeros(num_classes, *values.shape[1:], dtype=torch.long).index_add_(0, cls, defined)
    return from_fixed(total, count)


def strata_means(stratum: torch.Tensor, cls: torch.Tensor, values: torch.Tensor, defined: torch.Tensor,
                 num_classes: int) -> dict[str, torch.Tensor]:
    """Per size stratum (``stratum [P]``: 0 small, 1 medium, 2 large, ``functional.size_stratum`` of each
    pair's area fraction): ``means [S, C, K]`` (float64, NaN where undefined) and ``pairs [S, C]`` (int64)."""
    means, pairs = [], []
    for s in range(len(SIZE_STRATA)):
        keep = stratum == s
        means.append(class_means(cls[keep], values[keep], defined[keep], num_classes))
        pairs.append(torch.bincount(cls[keep], minlength=num_classes))
    return {"means": torch.stack(means), "pairs": torch.stack(pairs)}


def json_number(value: float) -> float | None:
    """A float as JSON: None for NaN (undefined)."""
    return None if math.isnan(value) else float(value)


def interval(pair: torch.Tensor) -> list | None:
    """A ``[2]`` percentile interval as JSON: ``[low, high]``, or None where undefined."""
    low, high = (json_number(float(v)) for v in pair)
    return None if low is None else [low, high]
