"""Every number of one dataset's benchmark table, from recognition and grounding metrics.

Keys per class and for the macro ``mean`` (the fixed-threshold keys carry its value):
``pointing_game, dice@0.5, iou@0.5, dice_best, iou_best, tau_best, delta_dice, auroc, auprc,
f1, hamming_acc, f1_max, acc_at_f1_max, ece`` as fractions (None where undefined), and counts ``n_pos, n_neg,
n_regions`` (``n_regions``: (image, finding) pairs with a non-empty region, the grounding denominator).
``f1_max, acc_at_f1_max`` are the model papers' recognition protocol beside ``f1, hamming_acc`` at the fixed
score threshold (``functional.max_f1``: the threshold is an oracle chosen on the evaluated images).
The macro mean averages the classes where a value is defined; counts are summed.
``compute`` also leaves the curves behind the table in ``curves`` (for plots, never in the table).

Beyond the paper (``EXTRA_KEYS``, after the paper's keys in every row): ``dice_tuned, iou_tuned,
tau_tuned`` (Dice/IoU at a tau chosen per finding on a tuning run, ``tuned_thresholds``; None without
one, and the table's ``tuning`` says so), ``dice_otsu, iou_otsu``, ``energy_pg``, ``specificity``,
``map_similarity``, ``pg_lift``, ``pg_any_tie`` (the Pointing Game under Quantus'/MedKLIP's any-tie
rule), ``dice_auc``, ``pixel_auroc``, ``dice_lift``, ``cnr`` (BioViL's contrast-to-noise ratio of the raw map;
definitions in ``functional.py``
and the README). Beside ``classes`` and ``mean`` the table has ``ci`` (bootstrap intervals of every
pair-level, image-level and recognition key, resampling patients where known, ``resampling.py``; None
when ``bootstrap=0``; with the ``draws`` id and the per-class ``replicates`` of ``replicate_keys`` for ratios between runs), ``by_size`` (the pair-level keys per region-size stratum) and ``tuning``.
With ``negatives=True`` every row also has ``neg_fp_rate, neg_mass`` over the (image, finding) pairs
where the finding is absent (``NEGATIVE_KEYS``), fed by ``update(negatives=...)``.
With ``cxl=True`` every row also has ``cxl_hit_rate, cxl_miou, cxl_miou_all``: CheXlocalize's hit rate and
mIoU at each image's full resolution (``chexlocalize.py``), fed by ``update_cxl``.
With ``groups`` (``("sex", "age", "view")``, any subset; ``xbench_pl.data.groups``) the table also has
``by_group``: per group, ``n_images`` per value (``unknown`` included), per known value the table of that
value's images alone (``classes``, ``mean``: the same metric code on the subset; ``ci``: on the dataset's
bootstrap draws), and ``gap`` per key (``group_gap``). The cxl keys are not reported per group.
With ``trust`` (the settings of ``--model.trust``, ``models.trust_run.TrustRun.settings``) every row also has the
``trust_mode.TRUST_KEYS`` of the measures asked for, fed by ``update_trust``, with intervals on the same draws, and
the table a ``trust`` block (``TrustMode.block``); they are not reported per group either.

Over 500 lines on purpose: ``BenchmarkMetrics`` is the one table every run writes; it composes the grounding,
recognition, group and trust states and gives every key its interval from the same bootstrap draws.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchmetrics import Metric

from xbench_pl.data.groups import GROUPS, UNKNOWN, parse_groups

from xbench_pl.metrics.boxes import BOX_KEYS, BoxMode
from xbench_pl.metrics.chexlocalize import CXL_KEYS, CheXlocalizeMode
from xbench_pl.outputs import replicate_keys
from xbench_pl.metrics.functional import (
    area_fraction,
    best_threshold,
    dice_auc,
    negative_map_stats,
    normalize_saliency,
    size_stratum,
    uniform_dice,
)
from xbench_pl.metrics.grounding import (
    FIXED_POINT_SCALE,
    ContrastToNoise,
    DiceIoU,
    EnergyPointing,
    FindingSpecificity,
    MapSimilarity,
    OtsuDiceIoU,
    PairRecords,
    PixelAUROC,
    PointingAnyTie,
    PointingGame,
    PointingLift,
    has_region,
    promoted,
    shared_pass,
    to_fixed,
)
from xbench_pl.metrics.functional import bootstrap_weights, percentile_interval
from xbench_pl.metrics.recognition import Recognition, replicate_recognition
from xbench_pl.metrics.trust_mode import TrustMode, trust_keys
from xbench_pl.metrics.resampling import (
    DEFAULT_SIZE_BOUNDS,
    SIZE_STRATA,
    ImageRecords,
    class_means,
    draws_id,
    interval,
    intervals,
    json_number,
    kept_replicates,
    resampled_means,
    strata_means,
    unit_name,
)

COUNT_KEYS = ("n_pos", "n_neg", "n_regions")

#: Keys beyond the paper's, appended to every row (the paper's keys and their values are unchanged).
EXTRA_KEYS = ("dice_tuned", "iou_tuned", "tau_tuned", "dice_otsu", "iou_otsu", "energy_pg", "specificity",
              "map_similarity", "pg_lift", "pg_any_tie", "dice_auc", "pixel_auroc", "dice_lift", "cnr")

#: Full-set mode (``negatives=True``): keys over the (image, finding) pairs where the finding is absent.
NEGATIVE_KEYS = ("neg_fp_rate", "neg_mass")

#: Per-pair values kept for every counted pair (``PairRecords``), besides the Dice/IoU curves.
RECORD_KEYS = ("pointing_game", "energy_pg", "pg_lift", "pg_any_tie", "dice_otsu", "iou_otsu", "pixel_auroc", "specificity",
               "size", "uniform_dice", "cnr")

#: Per-image values kept for every scored image and finding (``ImageRecords``), besides scores and labels.
IMAGE_KEYS = ("map_similarity",) + NEGATIVE_KEYS


def metric_keys(fixed_threshold: float = 0.5) -> tuple[str, ...]:
    t = f"{fixed_threshold:g}"
    return ("pointing_game", f"dice@{t}", f"iou@{t}", "dice_best", "iou_best", "tau_best", "delta_dice",
            "auroc", "auprc", "f1", "hamming_acc", "f1_max", "acc_at_f1_max", "ece") + EXTRA_KEYS


def pair_keys(fixed_threshold: float = 0.5) -> tuple[str, ...]:
    """The keys that are means over (image, finding) pairs: those with bootstrap intervals and size strata."""
    t = f"{fixed_threshold:g}"
    return ("pointing_game", f"dice@{t}", f"iou@{t}", "dice_best", "iou_best", "dice_tuned", "iou_tuned", "dice_otsu",
            "iou_otsu", "energy_pg", "specificity", "pg_lift", "pg_any_tie", "dice_auc", "pixel_auroc", "dice_lift", "cnr")


def read_tuned_thresholds(path: str) -> dict[str, dict[str, float]]:
    """Per dataset and finding, the tau to apply: ``tau_best`` of each finding in a tuning run's
    ``metrics.json`` (a run of the same model on the tuning split), or a JSON ``{DATASET: {FINDING: tau}}``."""
    import json
    from pathlib import Path

    file = Path(path)
    if file.is_dir():
        file = file / "metrics.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"tune_from: cannot read {file} ({error}); give the metrics.json of a run on the tuning split") from None
    if isinstance(data, dict) and "datasets" in data:
        return {name: {finding: row.get("tau_best") for finding, row in table.get("classes", {}).items()}
                for name, table in data["datasets"].items()}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"tune_from: {file} is neither a metrics.json nor {{DATASET: {{FINDING: tau}}}}")
    return data


def _numbers(values: torch.Tensor) -> list:
    return [int(v) if isinstance(v, int) else json_number(v) for v in values.cpu().tolist()]


def checked_size_bounds(size_bounds) -> tuple[float, float]:
    """The two area fractions separating small | medium | large regions (``by_size``); a ValueError unless
    0 < small < large < 1."""
    bounds = tuple(float(b) for b in size_bounds)
    if len(bounds) != 2 or not 0 < bounds[0] < bounds[1] < 1:
        raise ValueError(f"size bounds must be two area fractions 0 < small < large < 1, got {size_bounds}")
    return bounds


class GroupCounts(Metric):
    """Images per value of one subgroup (the last count: ``unknown``), summed over processes."""

    full_state_update = False
    is_differentiable = False

    def __init__(self, n_values: int, **kwargs):
        super().__init__(**kwargs)
        self.add_state("counts", torch.zeros(n_values, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, codes: torch.Tensor) -> None:
        self.counts += torch.bincount(codes.long().cpu(), minlength=self.counts.numel()).to(self.counts.device)

    def compute(self) -> torch.Tensor:
        return self.counts


def group_gap(means: dict[str, float | None], replicates: dict[str, torch.Tensor] | None, level: float = 0.95) -> dict | None:
    """The gap of one key between a group's values: ``means`` (each known value's macro mean, None where
    undefined) and ``replicates`` (each value's macro mean per bootstrap replicate ``[R]``, all on the same draws of
    the dataset's units; None without a bootstrap). ``high``/``low`` are the values with the largest/smallest mean
    (the first in table order on a tie), ``gap = mean[high] - mean[low]`` (>= 0); its replicates are
    ``mean_r[high] - mean_r[low]`` with the direction kept (paired: both on the same draw). ``ci``: their
    percentile interval; ``p``: the two-sided bootstrap test of no gap, ``min(1, 2 min(share(d_r <= 0),
    share(d_r >= 0)))`` over the replicates where both are defined. None with fewer than two defined values."""
    defined = [(value, mean) for value, mean in means.items() if mean is not None]
    if len(defined) < 2:
        return None
    high = max(defined, key=lambda item: item[1])[0]  # max/min keep the first of equals
    low = min(defined, key=lambda item: item[1])[0]
    out = {"gap": means[high] - means[low], "high": high, "low": low, "ci": None, "p": None}
    if replicates is not None and high in replicates and low in replicates:
        diff = replicates[high] - replicates[low]
        diff = diff[~torch.isnan(diff)]
        if diff.numel():
            out["ci"] = interval(percentile_interval(diff, level))
            share = min(float((diff <= 0).double().mean()), float((diff >= 0).double().mean()))
            out["p"] = min(1.0, 2 * share)
    return out


class BenchmarkMetrics(nn.Module):
    """Recognition + grounding for one dataset's class list; ``compute()`` gives its table."""

    def __init__(self, classes: list[str], normalize: str = "minmax", fixed_threshold: float = 0.5, score_threshold: float = 0.5,
                 bootstrap: int = 1000, bootstrap_seed: int = 0, size_bounds: tuple[float, float] = DEFAULT_SIZE_BOUNDS,
                 tuned_thresholds: dict[str, float] | None = None, tuning_source: str | None = None, cxl: bool = False,
                 negatives: bool = False, groups: tuple[str, ...] = (), trust: dict | None = None, boxes: bool = False):
        super().__init__()
        self.classes = list(classes)
        c = len(self.classes)
        self.recognition = Recognition(c, threshold=score_threshold)
        self.pointing = PointingGame(c)
        self.dice_iou = DiceIoU(c, fixed_threshold=fixed_threshold, normalize=normalize)
        self.keys = (metric_keys(fixed_threshold) + (CXL_KEYS if cxl else ()) + (NEGATIVE_KEYS if negatives else ())
                     + (trust_keys(tuple(trust["measures"])) if trust else ()) + (BOX_KEYS if boxes else ()))
        self.negatives = bool(negatives)
        # CheXlocalize-comparable mode (``chexlocalize.py``): fed by ``update_cxl`` at full resolution
        self.cxl = CheXlocalizeMode(c) if cxl else None
        # the trust measures (``--model.trust``): fed by ``update_trust`` with what ``models.trust_run`` measured
        self.trust = TrustMode(c, trust) if trust else None
        # the stated-box metrics (a model that states boxes: ``boxes.py``): fed by ``update_boxes``
        self.boxes = BoxMode(c) if boxes else None
        self.curves: dict = {}
        if bootstrap < 0:
            raise ValueError(f"bootstrap must be >= 0 resamples (0 = off), got {bootstrap}")
        self.bootstrap, self.bootstrap_seed, self.size_bounds = int(bootstrap), int(bootstrap_seed), checked_size_bounds(size_bounds)
        self.tuned_thresholds, self.tuning_source = tuned_thresholds, tuning_source
        self.energy = EnergyPointing(c, normalize=normalize)
        self.lift = PointingLift(c)
        self.any_tie = PointingAnyTie(c)
        self.otsu = OtsuDiceIoU(c, normalize=normalize)
        self.pixel_auroc = PixelAUROC(c)
        self.cnr = ContrastToNoise(c)
        self.specificity = FindingSpecificity(c)
        self.similarity = MapSimilarity(c)
        self.records = PairRecords(RECORD_KEYS, self.dice_iou.thresholds.numel())
        self.images = ImageRecords(c, IMAGE_KEYS)
        self.keyed = True  # every update gave image keys (bootstrap and specificity need them)
        self.images_keyed = True  # every update gave sample keys (intervals of image-level and recognition keys)
        # subgroups: per group the images per value, and per known value the same metrics on its images alone
        self.group_names = parse_groups(",".join(groups)) if groups else ()
        if not self.group_names:  # no submodules then: a table without groups holds exactly the metrics it had
            return
        self.group_counts = nn.ModuleDict({g: GroupCounts(len(GROUPS[g]) + 1) for g in self.group_names})
        self.group_metrics = nn.ModuleDict({
            f"{g}_{i}": BenchmarkMetrics(classes, normalize, fixed_threshold, score_threshold, bootstrap=0, size_bounds=size_bounds,
                                         tuned_thresholds=tuned_thresholds, tuning_source=tuning_source, negatives=negatives)
            for g in self.group_names for i in range(len(GROUPS[g]))})

    @shared_pass()  # the grounding metrics share one fused pass over the maps (kernels.py)
    def update(self, scores, labels, maps, masks, class_index, image_keys: torch.Tensor | None = None,
               saliency: torch.Tensor | None = None, unit_keys: torch.Tensor | None = None,
               sample_keys: torch.Tensor | None = None, sample_units: torch.Tensor | None = None,
               negatives: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
               groups: dict[str, list[str]] | None = None, pair_rows: torch.Tensor | None = None,
               seen: torch.Tensor | None = None) -> None:
        """``image_keys [N]`` int64: each pair's image (``resampling.image_key`` of its id), needed by
        ``specificity`` and the bootstrap; ``unit_keys [N]``: each pair's bootstrap unit (``resampling.unit_key``:
        its patient where known; default its image); ``sample_keys``, ``sample_units`` ``[B]``: the same per
        scored image (the intervals of recognition and image-level keys need them); ``saliency [B, C, h, w]``:
        every finding's map of the scored images (``map_similarity``). Any may be left out: what needs it
        is then not reported. ``negatives``: ``(maps [M, H, W], class [M], row [M])``, the eval-grid maps of
        (image, finding) pairs where the finding is absent, ``row`` indexing ``scores`` (``negatives=True``).
        ``groups``: per group name, each scored image's value (``Record.groups``; a missing name or None: all
        ``unknown``); ``pair_rows [N]``: each pair's row of ``scores`` (needed with ``groups``); ``seen [N, H, W]`` bool:
        the pixels of each pair's map the model saw (``geometry.warped_and_seen``; ``cnr`` leaves the others out;
        None: every pixel)."""
        maps, saliency = promoted(maps), None if saliency is None else promoted(saliency)  # once, for every metric
        if negatives is not None:
            negatives = (promoted(negatives[0]), *negatives[1:])
        if self.group_names:
            self._update_groups(groups, pair_rows, scores, labels, maps, masks, class_index,
                                dict(image_keys=image_keys, saliency=saliency, unit_keys=unit_keys, sample_keys=sample_keys,
                                     sample_units=sample_units, seen=seen), negatives)
        self.recognition.update(scores, labels)
        self.pointing.update(maps, masks, class_index)
        self.dice_iou.update(maps, masks, class_index)
        (hits, (dice, iou)) = self.pointing.last, self.dice_iou.last
        keep = has_region(masks)  # the one the metrics' updates computed (shared_pass)
        if image_keys is None:
            self.keyed = False
            image_keys = torch.zeros(maps.shape[0], dtype=torch.long)
        image_keys = torch.as_tensor(image_keys, dtype=torch.long)
        specificity = torch.full((maps.shape[0],), float("nan"), dtype=torch.float64)
        if self.keyed:
            self.specificity.update(maps, masks, class_index, image_keys.to(maps.device))
            specificity = self.specificity.last
        for metric in (self.energy, self.lift, self.any_tie, self.otsu, self.pixel_auroc):
            metric.update(maps, masks, class_index)
        self.cnr.update(maps, masks, class_index, seen)
        otsu_dice, otsu_iou = self.otsu.last
        regions, kept = masks[keep], keep.cpu()
        values = {"pointing_game": hits, "energy_pg": self.energy.last, "pg_lift": self.lift.last,
                  "pg_any_tie": self.any_tie.last, "dice_otsu": otsu_dice, "iou_otsu": otsu_iou, "pixel_auroc": self.pixel_auroc.last,
                  "specificity": specificity[keep.to(specificity.device)],
                  "size": size_stratum(area_fraction(regions), self.size_bounds).double(),  # stratum, exact in fixed point
                  "uniform_dice": uniform_dice(regions), "cnr": self.cnr.last}
        pair_units = image_keys if unit_keys is None else torch.as_tensor(unit_keys, dtype=torch.long)
        self.records.update(image_keys[kept], class_index[keep].cpu(), values, dice, iou, unit=pair_units[kept])
        b, c = scores.shape
        per_image = {k: torch.full((b, c), float("nan"), dtype=torch.float64) for k in IMAGE_KEYS}
        if saliency is not None:
            self.similarity.update(saliency)
            per_image["map_similarity"] = self.similarity.last.cpu()
        if negatives is not None:
            if not self.negatives:
                raise ValueError("update: negatives given to a BenchmarkMetrics built without negatives=True")
            self._negatives(per_image, *negatives)
        if sample_keys is None:
            self.images_keyed = False
            sample_keys = torch.zeros(b, dtype=torch.long)
        sample_keys = torch.as_tensor(sample_keys, dtype=torch.long)
        units = sample_keys if sample_units is None else torch.as_tensor(sample_units, dtype=torch.long)
        self.images.update(sample_keys, units, scores, labels, per_image)

    def _update_groups(self, groups, pair_rows, scores, labels, maps, masks, class_index, keys: dict, negatives) -> None:
        """Count each scored image's value of every group, and feed each known value's metrics its images and
        their pairs (every value's metrics are updated each time, with nothing where none is there, so every
        process syncs the same states)."""
        b = scores.shape[0]
        if maps.shape[0] and pair_rows is None and groups:
            raise ValueError("update: groups need pair_rows, each pair's row of scores")
        pair_rows = torch.zeros(0, dtype=torch.long) if pair_rows is None else torch.as_tensor(pair_rows, dtype=torch.long).cpu()
        for name in self.group_names:
            values = list((groups or {}).get(name) or [UNKNOWN] * b)
            if len(values) != b:
                raise ValueError(f"update: {len(values)} values of group {name!r} for {b} scored images")
            known = GROUPS[name]
            codes = torch.tensor([known.index(v) if v in known else len(known) for v in values], dtype=torch.long)
            self.group_counts[name].update(codes)
            for i in range(len(known)):
                rows = codes == i
                pairs = rows[pair_rows] if pair_rows.numel() else torch.zeros(maps.shape[0], dtype=torch.bool)
                position = torch.cumsum(rows.long(), 0) - 1  # a row's place among the value's rows
                subset = {k: (None if v is None else v[(pairs if k in ("image_keys", "unit_keys", "seen") else rows).to(v.device)])
                          for k, v in keys.items()}
                negative = None
                if negatives is not None:
                    n_maps, n_cls, n_row = negatives
                    keep = rows[n_row.long().cpu()]
                    negative = (n_maps[keep.to(n_maps.device)], n_cls[keep.to(n_cls.device)], position[n_row.long().cpu()[keep]])
                on_pairs = pairs.to(maps.device)
                self.group_metrics[f"{name}_{i}"].update(scores[rows.to(scores.device)], labels[rows.to(labels.device)], maps[on_pairs],
                                                         masks[pairs.to(masks.device)], class_index[pairs.to(class_index.device)],
                                                         negatives=negative, **subset)

    def _by_group(self, state: dict, draws: tuple | None) -> dict:
        """``by_group``: per group ``n_images`` per value, the table of each known value's images, and ``gap``
        per key (``group_gap``), intervals and gaps on the dataset's own bootstrap draws (paired)."""
        out = {}
        for name in self.group_names:
            counts = self.group_counts[name].compute().cpu().tolist()
            known = GROUPS[name]
            entry = {"n_images": {**{v: int(counts[i]) for i, v in enumerate(known)}, UNKNOWN: int(counts[-1])}}
            means, replicates = {}, {}
            for i, value in enumerate(known):
                metric = self.group_metrics[f"{name}_{i}"]
                table = metric.compute()
                row = {"n_images": int(counts[i]), "classes": table["classes"], "mean": table["mean"], "ci": None}
                sub = metric.sample_state()
                if draws is not None and counts[i] and sub["pairs"]["cls"].numel():
                    universe, unit, weights = draws
                    reps = metric.replicates(sub, universe, weights)
                    row["ci"] = self.interval_table(reps, unit)
                    replicates[value] = {k: v.nanmean(1) for k, v in reps.items()}
                means[value] = row["mean"] if counts[i] else None
                entry[value] = row
            entry["gap"] = {}
            for key in metric.keys:
                per_value = {v: (m[key] if m is not None else None) for v, m in means.items()}
                reps = {v: r[key] for v, r in replicates.items() if key in r} if draws is not None else None
                entry["gap"][key] = group_gap(per_value, reps)
            out[name] = entry
        return out

    def _negatives(self, per_image: dict, maps: torch.Tensor, cls: torch.Tensor, row: torch.Tensor) -> None:
        """Each negative pair's ``neg_fp_rate`` and ``neg_mass`` (``functional.negative_map_stats`` of the
        ``normalize``d map at the fixed threshold) into its image's row."""
        if maps.shape[0] == 0:
            return
        threshold = float(self.dice_iou.thresholds[self.dice_iou.fixed_index])
        fp_rate, mass = negative_map_stats(normalize_saliency(maps, self.dice_iou.normalize), threshold)
        row, cls = row.long().cpu(), cls.long().cpu()
        per_image["neg_fp_rate"][row, cls] = fp_rate.cpu()
        per_image["neg_mass"][row, cls] = mass.cpu()

    def update_cxl(self, pairs, units: list[int] | None = None, judged: bool = False) -> None:
        """Feed the CheXlocalize-comparable metrics: ``(full_map, region, class)`` per (image, finding),
        every finding of every counted image (``chexlocalize.full_resolution_pairs``); ``units``: each pair's
        bootstrap unit (``resampling.unit_key``), for the intervals of the cxl keys; ``judged``: pairs judged
        elsewhere, ``(values, class)`` (``CheXlocalizeMode.update``; the reader's)."""
        if self.cxl is None:
            raise ValueError("update_cxl: this BenchmarkMetrics was built without cxl=True")
        self.cxl.update(pairs, units, judged=judged)

    def update_trust(self, image: torch.Tensor, unit: torch.Tensor, cls: torch.Tensor, values: torch.Tensor,
                     maps: torch.Tensor | None = None) -> None:
        """Feed the trust measures (``TrustMode.update``): per measured pair its image and unit keys, class, values and
        (with randomization) its normalised trained map on the eval grid."""
        if self.trust is None:
            raise ValueError("update_trust: this BenchmarkMetrics was built without trust settings")
        self.trust.update(image, unit, cls, values, maps)

    def update_boxes(self, image: torch.Tensor, unit: torch.Tensor, cls: torch.Tensor, values: torch.Tensor, stated: dict,
                     truth: dict) -> None:
        """Feed the stated-box metrics (``BoxMode.update``): per scored pair its keys, class and values, and every
        stated and ground-truth box."""
        if self.boxes is None:
            raise ValueError("update_boxes: this BenchmarkMetrics was built without boxes=True")
        self.boxes.update(image, unit, cls, values, stated, truth)

    def sample_state(self) -> dict:
        """The synced records behind the bootstrap (the same on every rank): ``grounding`` (``DiceIoU.compute``),
        ``pairs`` (``PairRecords``, sorted by image and class), ``images`` (``ImageRecords``, sorted by image)."""
        t = self.records.n_thresholds
        records = _unsqueezed(self.records.compute(), {"values": (len(RECORD_KEYS),), "defined": (len(RECORD_KEYS),),
                                                       "dice": (t,), "iou": (t,)})
        images = _unsqueezed(self.images.compute(), {name: shape[1:] for name, (shape, _) in self.images.shapes().items()})
        cxl = (_unsqueezed(self.cxl.pairs.compute(), {"values": (len(CXL_KEYS),), "defined": (len(CXL_KEYS),)})
               if self.cxl is not None and self.cxl.keyed else None)
        return {"grounding": self.dice_iou.compute(), "pairs": records, "images": images, "cxl": cxl,
                "trust": self.trust.state() if self.trust is not None else None,
                "boxes": self.boxes.state() if self.boxes is not None else None}

    def compute(self) -> dict:
        state = self.sample_state()
        rec, grounding = self.recognition.compute(), state["grounding"]
        columns = {
            self.keys[0]: self.pointing.compute(),
            self.keys[1]: grounding["dice_fixed"],
            self.keys[2]: grounding["iou_fixed"],
            **{k: grounding[k] for k in ("dice_best", "iou_best", "tau_best", "delta_dice")},
            **{k: rec[k] for k in ("auroc", "auprc", "f1", "hamming_acc", "f1_max", "acc_at_f1_max", "ece")},
        }
        # the synced curves behind the table, for calibration plots (callbacks read them; not in metrics.json)
        self.curves = {
            "thresholds": self.dice_iou.thresholds.cpu().tolist(),
            "bin_edges": torch.linspace(0, 1, self.recognition.n_bins + 1, dtype=torch.float64).tolist(),
            "fixed_threshold": self.dice_iou.fixed_threshold,
            "classes": {name: {"dice": _numbers(grounding["dice_curve"][i]), "iou": _numbers(grounding["iou_curve"][i]),
                               "reliability": {"count": _numbers(rec["n_bin"][i]), "confidence": _numbers(rec["bin_confidence"][i]),
                                               "accuracy": _numbers(rec["bin_accuracy"][i])}}
                        for i, name in enumerate(self.classes)},
        }
        columns.update(self._extra_columns(grounding, state))
        if self.cxl is not None:
            columns.update(self.cxl.compute())
        if self.trust is not None:
            columns.update(self.trust.columns(state["trust"]))
        if self.boxes is not None:
            columns.update(self.boxes.columns(state["boxes"]))
        counts = {"n_pos": rec["n_pos"], "n_neg": rec["n_neg"], "n_regions": grounding["n_regions"]}
        # torchmetrics squeezes one-element results; a one-class dataset still needs [C]
        columns = {k: v.reshape(len(self.classes)) for k, v in columns.items()}
        counts = {k: v.reshape(len(self.classes)) for k, v in counts.items()}
        classes = {}
        for i, name in enumerate(self.classes):
            row = {k: json_number(float(columns[k][i])) for k in self.keys}
            row.update({k: int(counts[k][i]) for k in COUNT_KEYS})
            classes[name] = row
        mean = {}
        for k in self.keys:
            defined = [row[k] for row in classes.values() if row[k] is not None]
            mean[k] = sum(defined) / len(defined) if defined else None
        mean.update({k: sum(row[k] for row in classes.values()) for k in COUNT_KEYS})
        draws = self.draws(state)
        ci, by_size = self._resampled(state, draws)
        out = {"classes": classes, "mean": mean, "ci": ci, "by_size": by_size, "tuning": self._tuning_note()}
        if self.group_names:
            out["by_group"] = self._by_group(state, draws)
        if self.trust is not None:
            out["trust"] = self.trust.block(state["trust"], columns, draws)
        return out

    # -- beyond the paper ------------------------------------------------------------------------
    def _tuned_index(self) -> torch.Tensor:
        """Per class, the index of its tuned tau on the threshold grid (-1 where none is given)."""
        thresholds = self.dice_iou.thresholds.cpu()
        index = torch.full((len(self.classes),), -1, dtype=torch.long)
        for i, name in enumerate(self.classes):
            tau = (self.tuned_thresholds or {}).get(name)
            if tau is None:
                continue
            hit = torch.isclose(thresholds, torch.tensor(float(tau), dtype=torch.float64), atol=1e-9).nonzero()
            if hit.numel() != 1:
                raise ValueError(f"tuned tau {tau} of {name!r} ({self.tuning_source}) is not on the threshold grid")
            index[i] = int(hit[0])
        return index

    def _tuning_note(self) -> dict:
        if not self.tuned_thresholds:
            return {"source": None, "note": "no tuning run given (--model.tune_from): dice_tuned/iou_tuned/tau_tuned not reported; "
                                            "dice_best/iou_best/tau_best choose tau on the evaluated data (an oracle)"}
        missing = [name for name in self.classes if self.tuned_thresholds.get(name) is None]
        note = "tau_tuned: each finding's tau_best on the tuning run, applied unchanged here"
        if missing:
            note += f"; no tuned tau for {', '.join(missing)} (tuned keys null there)"
        return {"source": self.tuning_source, "note": note}

    def _extra_columns(self, grounding: dict, state: dict) -> dict[str, torch.Tensor]:
        c = len(self.classes)
        thresholds = self.dice_iou.thresholds.cpu()
        dice, iou = grounding["dice_curve"].cpu().reshape(c, -1), grounding["iou_curve"].cpu().reshape(c, -1)
        index = self._tuned_index()
        rows, tuned = torch.arange(c), index >= 0
        nan = torch.full((c,), float("nan"), dtype=torch.float64)
        otsu = self.otsu.compute()
        return {
            "dice_tuned": torch.where(tuned, dice[rows, index.clamp_min(0)], nan),
            "iou_tuned": torch.where(tuned, iou[rows, index.clamp_min(0)], nan),
            "tau_tuned": torch.where(tuned & (grounding["n_regions"].cpu().reshape(c) > 0), thresholds[index.clamp_min(0)], nan),
            "dice_otsu": otsu["dice_otsu"], "iou_otsu": otsu["iou_otsu"],
            "energy_pg": self.energy.compute(),
            "specificity": self.specificity.compute() if self.keyed else nan,
            "map_similarity": self.similarity.compute() if self.similarity.update_called else nan,
            "pg_lift": self.lift.compute(),
            "pg_any_tie": self.any_tie.compute(),
            "dice_auc": dice_auc(dice, thresholds),
            "pixel_auroc": self.pixel_auroc.compute(),
            "cnr": self.cnr.compute(),
            # Dice at tau_best over what the uniform map scores on the same pairs (its best: tau = 0)
            "dice_lift": grounding["dice_best"].cpu().reshape(c) - class_means(
                state["pairs"]["cls"], state["pairs"]["values"][:, RECORD_KEYS.index("uniform_dice")],
                state["pairs"]["defined"][:, RECORD_KEYS.index("uniform_dice")], c),
            **{key: class_means(torch.arange(c).repeat(state["images"]["image"].numel()),
                                state["images"]["values"][:, :, IMAGE_KEYS.index(key)].flatten(),
                                state["images"]["defined"][:, :, IMAGE_KEYS.index(key)].flatten(), c)
               for key in (NEGATIVE_KEYS if self.negatives else ())},
        }

    def _pair_values(self, grounding: dict, records: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Every pair's value of each ``pair_keys`` key in fixed point ``[P, K]`` and its defined flag."""
        cls, stored, defined = records["cls"], records["values"], records["defined"]
        column = {k: i for i, k in enumerate(RECORD_KEYS)}
        p, t = cls.numel(), self.dice_iou.fixed_index
        best, _ = best_threshold(grounding["dice_curve"].cpu().reshape(len(self.classes), -1), self.dice_iou.thresholds.cpu())
        tuned = self._tuned_index()
        pick = lambda curve, index: curve.gather(1, index[cls].clamp_min(0)[:, None])[:, 0]  # noqa: E731
        ones = torch.ones(p, dtype=torch.long)
        curve_auc = to_fixed(dice_auc(records["dice"].double() / FIXED_POINT_SCALE, self.dice_iou.thresholds.cpu()))
        from_curves = {
            self.keys[1]: (records["dice"][:, t], ones), self.keys[2]: (records["iou"][:, t], ones),
            "dice_best": (pick(records["dice"], best), ones), "iou_best": (pick(records["iou"], best), ones),
            "dice_tuned": (pick(records["dice"], tuned), (tuned[cls] >= 0).long()),
            "iou_tuned": (pick(records["iou"], tuned), (tuned[cls] >= 0).long()),
            "dice_auc": (curve_auc, ones),
            "dice_lift": (pick(records["dice"], best) - stored[:, column["uniform_dice"]], defined[:, column["uniform_dice"]]),
        }
        values, flags = [], []
        for key in pair_keys(self.dice_iou.fixed_threshold):
            if key in from_curves:
                v, d = from_curves[key]
            else:
                v, d = stored[:, column[key]], defined[:, column[key]]
                if key == "specificity" and not self.keyed:
                    d = torch.zeros_like(d)
            values.append(v)
            flags.append(d)
        return torch.stack(values, 1) if values else torch.zeros(p, 0, dtype=torch.long), torch.stack(flags, 1)

    def replicates(self, state: dict, universe: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every key with an interval, per bootstrap replicate and class ``{key: [R, C]}`` (float64, NaN where
        undefined in a replicate): ``state`` from ``sample_state``, ``universe`` the sorted unit keys, ``weights
        [R, U]`` how often each unit is drawn. The pair keys and, where every update gave sample keys, the
        image-level keys, the recognition keys (``recognition.replicate_recognition``) and the cxl keys on the same draws."""
        records, images, c = state["pairs"], state["images"], len(self.classes)
        values, defined = self._pair_values(state["grounding"], records)
        per_pair = resampled_means(torch.searchsorted(universe, records["unit"]), records["cls"], values, defined, c, weights)
        out = {k: per_pair[:, :, i] for i, k in enumerate(pair_keys(self.dice_iou.fixed_threshold))}
        if state["cxl"] is not None:
            cxl = state["cxl"]
            per_cxl = resampled_means(torch.searchsorted(universe, cxl["unit"]), cxl["cls"], cxl["values"], cxl["defined"], c, weights)
            out.update({k: per_cxl[:, :, i] for i, k in enumerate(CXL_KEYS)})
        if state.get("trust") is not None:
            out.update(self.trust.replicates(state["trust"], universe, weights))
        if state.get("boxes") is not None:
            out.update(self.boxes.replicates(state["boxes"], universe, weights))
        if not self.images_keyed:
            return out
        n, index = images["image"].numel(), torch.searchsorted(universe, images["unit"])
        per_image = resampled_means(index.repeat_interleave(c), torch.arange(c).repeat(n), images["values"].reshape(n * c, -1),
                                    images["defined"].reshape(n * c, -1), c, weights)
        reported = (("map_similarity",) if self.similarity.update_called else ()) + (NEGATIVE_KEYS if self.negatives else ())
        out.update({k: per_image[:, :, IMAGE_KEYS.index(k)] for k in reported})
        out.update(replicate_recognition(images["scores"], images["labels"], weights[:, index], self.recognition.threshold,
                                         self.recognition.n_bins))
        return out

    def units(self, state: dict) -> tuple[torch.Tensor, str]:
        """The sorted unit keys the bootstrap draws from (of every counted pair and scored image) and what
        they are (``resampling.unit_name``)."""
        pairs, images = state["pairs"], state["images"]
        if self.images_keyed:
            image, unit = torch.cat([pairs["image"], images["image"]]), torch.cat([pairs["unit"], images["unit"]])
        else:
            image, unit = pairs["image"], pairs["unit"]
        extra = state["cxl"]["unit"] if state["cxl"] is not None else unit[:0]  # cxl judges images without regions too
        measured = state["trust"]["unit"] if state.get("trust") is not None else unit[:0]  # trust_pairs=all: those too
        stated = state["boxes"]["pairs"]["unit"] if state.get("boxes") is not None else unit[:0]  # every scored pair
        return torch.unique(torch.cat([unit, extra, measured, stated]), sorted=True), unit_name(image, unit)

    def draws(self, state: dict) -> tuple[torch.Tensor, str, torch.Tensor] | None:
        """The bootstrap's ``(units, unit name, weights [R, U])`` (``units``, ``bootstrap_weights``), drawn once for the
        table's intervals and its subgroups' (paired); None without a bootstrap (``bootstrap=0``, no pairs, no keys)."""
        if self.bootstrap == 0 or state["pairs"]["cls"].numel() == 0 or not self.keyed:
            return None
        universe, unit = self.units(state)
        return universe, unit, bootstrap_weights(universe.numel(), self.bootstrap, self.bootstrap_seed)

    def interval_table(self, replicates: dict[str, torch.Tensor], unit: str) -> dict:
        """``ci``'s intervals of each key's replicates ``[R, C]``: ``{level, resamples, seed, unit, mean, classes}``."""
        boot = {k: intervals(v[:, :, None]) for k, v in replicates.items()}
        return {"level": 0.95, "resamples": self.bootstrap, "seed": self.bootstrap_seed, "unit": unit,
                "mean": {k: interval(b["mean"][0]) for k, b in boot.items()},
                "classes": {name: {k: interval(b["classes"][j, 0]) for k, b in boot.items()} for j, name in enumerate(self.classes)}}

    def _resampled(self, state: dict, draws: tuple | None) -> tuple[dict | None, dict]:
        records, grounding = state["pairs"], state["grounding"]  # synced and sorted by (image key, class) on every rank
        keys = pair_keys(self.dice_iou.fixed_threshold)
        c = len(self.classes)
        values, defined = self._pair_values(grounding, records)
        cls = records["cls"]
        stratum = torch.div(records["values"][:, RECORD_KEYS.index("size")], FIXED_POINT_SCALE, rounding_mode="floor")
        strata = strata_means(stratum, cls, values, defined, c)

        def row(means: torch.Tensor, pairs: torch.Tensor) -> dict:
            out = {k: json_number(float(means[i])) for i, k in enumerate(keys)}
            out["n_regions"] = int(pairs)
            return out

        by_size = {"bounds": list(self.size_bounds),
                   "classes": {name: {s: row(strata["means"][j, i], strata["pairs"][j, i]) for j, s in enumerate(SIZE_STRATA)}
                               for i, name in enumerate(self.classes)},
                   "mean": {}}
        for j, s in enumerate(SIZE_STRATA):
            macro = {}
            for i, k in enumerate(keys):
                defined_here = [float(v) for v in strata["means"][j, :, i] if not math.isnan(float(v))]
                macro[k] = sum(defined_here) / len(defined_here) if defined_here else None
            macro["n_regions"] = int(strata["pairs"][j].sum())
            by_size["mean"][s] = macro
        if draws is None:
            return None, by_size
        universe, unit, weights = draws
        replicates = self.replicates(state, universe, weights)
        ci = {**self.interval_table(replicates, unit),
              # for intervals of ratios between runs on the same draws (the report's % of reader; resampling.py)
              "units": int(universe.numel()), "draws": draws_id(universe, self.bootstrap, self.bootstrap_seed),
              "replicates": kept_replicates(replicates, self.classes, replicate_keys(self.dice_iou.fixed_threshold))}
        return ci, by_size

    def reset(self) -> None:
        for metric in self.children():  # every accumulating metric, the cxl mode and the subgroups' included
            for child in (metric.values() if isinstance(metric, nn.ModuleDict) else (metric,)):
                child.reset()
        self.keyed = self.images_keyed = True


def _unsqueezed(records: dict[str, torch.Tensor], widths: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """A records metric's ``compute`` as ``[N, *width]`` per name: torchmetrics' compute wrapper squeezes
    one-element results (one pair, one image) to 0-d, whatever the metric returned."""
    return {k: v.reshape(-1, *widths.get(k, ())) for k, v in records.items()}
