"""The trust measures' state per dataset (``--model.trust``): every measured pair's values, exact under DDP.

``TrustMode`` holds, per (image, finding) pair that ``models.trust_run.TrustRun`` measured, its image and bootstrap
unit keys, its class and its values in int64 fixed point with a defined flag (``TrustPairs``, ``"cat"`` states
sorted by (image key, class) after the sync, as ``grounding.PairRecords``): per randomization stage the SSIM and
the Spearman correlation with and without absolute values, then ``deletion_auc``, ``insertion_auc`` and
``random_target_ssim``. With randomization it also keeps each pair's trained map on the eval grid, normalised as the
benchmark normalises (float32), for Arun et al.'s randomization baseline, computed once after the sync
(``baseline_pairs``: the random pairs of ``trust.random_pair_baseline``, each kept as a row of its first map's finding
and unit), so the baseline is a mean over pairs like the others and gets its bootstrap interval on the same draws.
Nothing here runs a model; the means, intervals (``BenchmarkMetrics``' draws, ``resampling.resampled_means``) and the
``trust`` block come from the synced records only, so 1 and N processes give the same digits.

Memory: the trained maps are E x E float32 per measured pair (1 MiB at E = 512), gathered on every rank at the
end; a smaller ``--data.eval_size`` or ``trust_fraction`` bounds it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xbench_pl.metrics.grounding import Records, to_fixed
from xbench_pl.metrics.resampling import class_means, interval, intervals, resampled_means

#: the keys ``--model.trust`` adds to every row (per measure asked for), with intervals like every pair key
TRUST_KEYS = ("randomization_ssim", "randomization_spearman", "randomization_baseline", "deletion_auc", "insertion_auc",
              "random_target_ssim")
#: which measure gives each key
KEY_MEASURE = {"randomization_ssim": "randomization", "randomization_spearman": "randomization",
               "randomization_baseline": "randomization", "deletion_auc": "deletion", "insertion_auc": "insertion",
               "random_target_ssim": "random_target"}
#: the values of each randomization stage, in a stage's entry of the ``trust`` block
STAGE_VALUES = ("ssim", "spearman", "spearman_abs")


def trust_keys(measures: tuple[str, ...]) -> tuple[str, ...]:
    """The row keys the ``measures`` give, in ``TRUST_KEYS`` order."""
    return tuple(key for key in TRUST_KEYS if KEY_MEASURE[key] in measures)


def value_columns(n_stages: int) -> tuple[str, ...]:
    """The per-pair value columns ``TrustPairs`` keeps: ``stage{i}_{ssim,spearman,spearman_abs}`` per stage, then
    ``deletion_auc``, ``insertion_auc``, ``random_target_ssim`` (NaN where a measure was not asked for)."""
    return (*(f"stage{i}_{v}" for i in range(n_stages) for v in STAGE_VALUES), "deletion_auc", "insertion_auc",
            "random_target_ssim")


class TrustPairs(Records):
    """Every measured pair's ``image`` and ``unit`` keys, ``cls``, ``values [P, K]`` in fixed point with ``defined``
    flags, and (``with_maps``) its trained eval-grid map flattened into ``maps`` (``side`` ``[P]``: its grid's side)."""

    def __init__(self, n_values: int, with_maps: bool, **kwargs):
        super().__init__(**kwargs)
        self.n_values, self.with_maps = n_values, with_maps
        self._add_records()

    def shapes(self) -> dict:
        k = self.n_values
        shapes = {"image": ((0,), torch.long), "unit": ((0,), torch.long), "cls": ((0,), torch.long),
                  "values": ((0, k), torch.long), "defined": ((0, k), torch.long)}
        if self.with_maps:  # flat: the eval grid's side is the data's, not known when the metric is built
            shapes.update({"side": ((0,), torch.long), "maps": ((0,), torch.float32)})
        return shapes

    def update(self, image: torch.Tensor, unit: torch.Tensor, cls: torch.Tensor, values: torch.Tensor,
               maps: torch.Tensor | None) -> None:
        ok = ~torch.isnan(values)
        parts = {"image": image.long(), "unit": unit.long(), "cls": cls.long(),
                 "values": to_fixed(torch.nan_to_num(values.double(), nan=0.0)), "defined": ok.long()}
        if self.with_maps:
            parts.update({"side": torch.full((maps.shape[0],), maps.shape[-1], dtype=torch.long),
                          "maps": maps.float().flatten()})
        for name, value in parts.items():
            getattr(self, name).append(value.detach().to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        """The synced records sorted by (image key, class): the same order on 1 or N processes."""
        out = self._gathered()
        out["values"], out["defined"] = (out[k].reshape(-1, self.n_values) for k in ("values", "defined"))
        for key in ("image", "unit", "cls"):
            out[key] = out[key].reshape(-1)
        if self.with_maps:
            side = int(out["side"][0]) if out["side"].numel() else 1
            out["maps"] = out.pop("maps").reshape(-1, side, side)
            out.pop("side")
        order = torch.argsort(out["cls"], stable=True)
        order = order[torch.argsort(out["image"][order], stable=True)]
        return {name: value[order] for name, value in out.items()}


#: random pairs SSIM'd at once for the baseline (float64 temporaries of E x E per pair: bounded memory at E = 512)
BASELINE_CHUNK = 16


def baseline_pairs(maps: torch.Tensor, image: torch.Tensor, cls: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Arun et al.'s random pairs of the trained maps ``[P, E, E]`` (different images, same finding), exactly those
    ``trust.random_pair_baseline`` averages (``trust.random_pair_indices``): ``(first [Q], ssim [Q] float64)``, each
    pair's first map and its SSIM. Their mean is ``random_pair_baseline(maps, image, cls, seed)``; kept per pair, each
    counted for its first map's finding and bootstrap unit, they give the baseline its interval."""
    from xbench_pl.metrics.trust import random_pair_indices, ssim

    index = random_pair_indices(image.tolist(), cls.tolist(), int(seed))
    if not len(index):
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
    values = torch.cat([ssim(maps[index[s:s + BASELINE_CHUNK, 0]], maps[index[s:s + BASELINE_CHUNK, 1]]).cpu()
                        for s in range(0, len(index), BASELINE_CHUNK)])
    return index[:, 0], values


def macro(means: torch.Tensor) -> float | None:
    """The mean over the classes where ``means [C]`` is defined (the table's macro mean), None if none is."""
    defined = [float(v) for v in means if not math.isnan(float(v))]
    return sum(defined) / len(defined) if defined else None


class TrustMode(nn.Module):
    """The trust measures of one dataset: ``update`` with ``TrustRun.measure``'s pairs; ``state`` (synced, sorted,
    with the baseline column), ``columns`` (the row keys per class), ``replicates`` (per bootstrap replicate) and
    ``block`` (the ``trust`` block of metrics.json) from it. ``settings``: what ran (``TrustRun.settings``),
    recorded as is; its ``measures``, ``stages`` (names) and ``seed`` choose what is kept."""

    def __init__(self, num_classes: int, settings: dict):
        super().__init__()
        self.num_classes, self.settings = num_classes, dict(settings)
        self.measures, self.stages = tuple(settings["measures"]), list(settings["stages"])
        self.keys = trust_keys(self.measures)
        self.columns_kept = value_columns(len(self.stages))
        self.pairs = TrustPairs(len(self.columns_kept), with_maps="randomization" in self.measures)

    def reset(self) -> None:
        self.pairs.reset()

    def update(self, image: torch.Tensor, unit: torch.Tensor, cls: torch.Tensor, values: torch.Tensor,
               maps: torch.Tensor | None = None) -> None:
        """``values [P, K]`` float (NaN where undefined) in ``value_columns`` order; ``maps [P, E, E]``: the pairs'
        trained maps on the eval grid, normalised (needed with randomization)."""
        if values.shape != (cls.numel(), len(self.columns_kept)):
            raise ValueError(f"TrustMode.update: values {tuple(values.shape)} for {cls.numel()} pairs and "
                             f"{len(self.columns_kept)} columns")
        self.pairs.update(image, unit, cls, values, maps)

    def state(self) -> dict:
        """The synced records (``TrustPairs.compute``) and the rows of the row keys: ``key_unit``, ``key_cls`` and
        ``key_values``/``key_defined`` ``[R, len(keys)]`` in fixed point, one row per measured pair and, with
        randomization, one per random pair of the baseline (``baseline_pairs``: only its baseline defined); and the
        measured pairs' ``stage_values``/``stage_defined``."""
        records = self.pairs.compute()
        values, defined = records["values"], records["defined"]
        column = {name: i for i, name in enumerate(self.columns_kept)}
        p, last = records["cls"].numel(), len(self.stages) - 1
        nothing = torch.zeros(p, dtype=torch.long)
        per_key = {key: (nothing, nothing) for key in self.keys}
        for key, value in (("randomization_ssim", "ssim"), ("randomization_spearman", "spearman")):
            if key in self.keys and last >= 0:  # no stage (a model without weights): undefined
                per_key[key] = (values[:, column[f"stage{last}_{value}"]], defined[:, column[f"stage{last}_{value}"]])
        for key in ("deletion_auc", "insertion_auc", "random_target_ssim"):
            if key in self.keys:
                per_key[key] = (values[:, column[key]], defined[:, column[key]])
        rows_values = torch.stack([per_key[k][0] for k in self.keys], 1) if self.keys else torch.zeros(p, 0, dtype=torch.long)
        rows_defined = torch.stack([per_key[k][1] for k in self.keys], 1) if self.keys else torch.zeros(p, 0, dtype=torch.long)
        unit, cls = records["unit"], records["cls"]
        if "randomization_baseline" in self.keys:
            first, similarity = baseline_pairs(records["maps"], records["image"], cls, self.settings["seed"])
            extra_values = torch.zeros(first.numel(), len(self.keys), dtype=torch.long)
            extra_defined = torch.zeros_like(extra_values)
            b = self.keys.index("randomization_baseline")
            extra_values[:, b] = to_fixed(torch.nan_to_num(similarity, nan=0.0))
            extra_defined[:, b] = (~torch.isnan(similarity)).long()
            rows_values, rows_defined = torch.cat([rows_values, extra_values]), torch.cat([rows_defined, extra_defined])
            unit, cls = torch.cat([unit, unit[first]]), torch.cat([cls, cls[first]])
        stage_names = [f"stage{i}_{v}" for i in range(len(self.stages)) for v in STAGE_VALUES]
        index = torch.tensor([column[name] for name in stage_names], dtype=torch.long)
        return {**records, "key_unit": unit, "key_cls": cls, "key_values": rows_values, "key_defined": rows_defined,
                "stage_values": values[:, index], "stage_defined": defined[:, index]}

    def columns(self, state: dict) -> dict[str, torch.Tensor]:
        """``{key: [C]}`` float64 per class (NaN where no pair is defined)."""
        means = class_means(state["key_cls"], state["key_values"], state["key_defined"], self.num_classes)
        return {key: means[:, i] for i, key in enumerate(self.keys)}

    def replicates(self, state: dict, universe: torch.Tensor, weights: torch.Tensor,
                   stages: bool = False) -> dict[str, torch.Tensor]:
        """Each row key's (``stages``: each stage value's, ``stage{i}_{value}``) class means per bootstrap replicate
        ``{key: [R, C]}`` on the dataset's draws (``universe``, ``weights``, as ``BenchmarkMetrics.replicates``)."""
        names = ([f"stage{i}_{v}" for i in range(len(self.stages)) for v in STAGE_VALUES] if stages else list(self.keys))
        if stages:
            unit, cls, values, defined = state["unit"], state["cls"], state["stage_values"], state["stage_defined"]
        else:
            unit, cls, values, defined = state["key_unit"], state["key_cls"], state["key_values"], state["key_defined"]
        if not names:
            return {}
        per = resampled_means(torch.searchsorted(universe, unit), cls, values, defined, self.num_classes, weights)
        return {name: per[:, :, i] for i, name in enumerate(names)}

    def block(self, state: dict, columns: dict[str, torch.Tensor], draws: tuple | None) -> dict:
        """The ``trust`` block: ``stages`` (per stage its name and the macro means of SSIM, Spearman and Spearman of
        absolute values, each with its bootstrap interval), ``settings``, ``passes_randomization`` (whether the last
        stage's mean SSIM is below the baseline's mean; null where either is undefined or randomization not run)."""
        means = class_means(state["cls"], state["stage_values"], state["stage_defined"], self.num_classes)
        boot = None
        if draws is not None:
            universe, _, weights = draws
            reps = self.replicates(state, universe, weights, stages=True)
            boot = {name: intervals(rep[:, :, None])["mean"][0] for name, rep in reps.items()}
        stages = []
        for i, name in enumerate(self.stages):
            entry = {"stage": name}
            for j, value in enumerate(STAGE_VALUES):
                entry[value] = macro(means[:, i * len(STAGE_VALUES) + j])
                entry[f"{value}_interval"] = interval(boot[f"stage{i}_{value}"]) if boot else None
            stages.append(entry)
        passes = None
        if "randomization" in self.measures:
            from xbench_pl.metrics.trust import passes_randomization

            last, baseline = (macro(columns[key]) for key in ("randomization_ssim", "randomization_baseline"))
            passes = passes_randomization(math.nan if last is None else last, math.nan if baseline is None else baseline)
        settings = {**self.settings, "pairs_measured": int(state["cls"].numel()),
                    "images_measured": int(torch.unique(state["image"]).numel())}
        return {"stages": stages, "settings": settings, "passes_randomization": passes}
