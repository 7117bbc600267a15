"""Grounding metrics as torchmetrics classes, accumulated per class, exact under DDP.

Per-pair values in [0, 1] are accumulated as int64 fixed-point sums (``FIXED_POINT_SCALE``):
integer addition is associative, so the totals, and every number derived from them, are
bit-identical whether the pairs were seen by 1 process or split over N (float sums are not).
Each ``update`` takes pairs: ``maps [N, H, W]``, ``masks [N, H, W]`` bool, ``class_index [N]``;
pairs with an empty region are ignored. After an ``update``, a pair metric's ``last`` (a plain
attribute, not a state) holds that update's per-pair values for the pairs it counted, in input
order (``FindingSpecificity``: for every input pair), so ``BenchmarkMetrics`` keeps them per pair
without computing them twice. Dense ``[B, C, H, W]`` inputs become pairs with
``maps.flatten(0, 1), masks.flatten(0, 1), torch.arange(C).repeat(B)``.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from xbench_pl.metrics import kernels
from xbench_pl.metrics.functional import (
    best_threshold,
    default_thresholds,
    dice_iou_curve,
    CNR_CAP,
    contrast_to_noise,
    energy_pointing,
    finding_specificities,
    map_similarity,
    normalize_saliency,
    otsu_dice_iou,
    pixel_auroc,
    pointing_game,
    pointing_game_any_tie,
    pointing_lift,
)

FIXED_POINT_SCALE = 2**40  # resolution 1e-12 per pair; room for 2**23 pairs per class in int64

_shared: dict = {}


@contextlib.contextmanager
def shared_pass():
    """Inside the block, metrics updated with the very same ``maps`` and ``masks`` tensors share one fused
    pass over them (``shared_counts``); ``BenchmarkMetrics.update`` wraps its updates in it. Do not modify
    the maps in place inside the block."""
    _shared["active"] = _shared.get("active", 0) + 1
    try:
        yield
    finally:
        _shared["active"] -= 1
        if not _shared["active"]:
            _shared.pop("last", None)
            _shared.pop("regions", None)


def shared_counts(maps: torch.Tensor, masks: torch.Tensor, normalize: str | None = None,
                  thresholds: torch.Tensor | None = None) -> dict | None:
    """The fused pass (``kernels.grounding_counts``) over these tensors: inside ``shared_pass`` the last one is
    kept and reused for the same tensor objects when ``normalize``/``thresholds`` agree (None: any). None
    where the kernels do not apply (the metrics then run the torch reference)."""
    if not kernels.applies(maps, masks):
        return None
    entry = _shared.get("last")
    if (entry is not None and entry["maps"]() is maps and entry["masks"]() is masks
            and normalize in (None, entry["normalize"])
            and (thresholds is None or torch.equal(entry["thresholds"], thresholds.cpu()))):
        return entry
    normalize = normalize or "minmax"
    thresholds = default_thresholds(dtype=torch.float64) if thresholds is None else thresholds.cpu()
    entry = {"maps": weakref.ref(maps), "masks": weakref.ref(masks), "normalize": normalize, "thresholds": thresholds,
             "counts": kernels.grounding_counts(maps, masks, thresholds, normalize)}
    if _shared.get("active"):
        _shared["last"] = entry
    return entry


def has_region(masks: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool, whether each pair's region is non-empty; inside ``shared_pass`` computed once per ``masks``
    tensor, not once per metric."""
    entry = _shared.get("regions")
    if entry is not None and entry[0]() is masks:
        return entry[1]
    keep = masks.flatten(1).any(1)
    if _shared.get("active"):
        _shared["regions"] = (weakref.ref(masks), keep)
    return keep


def _auroc(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    entry = shared_counts(maps, masks)
    if entry is None:
        return pixel_auroc(maps, masks)
    if "pixel_auroc" not in entry:
        entry["pixel_auroc"] = kernels.pixel_auroc(maps, masks)
    return entry["pixel_auroc"]


def promoted(maps: torch.Tensor) -> torch.Tensor:
    """Float16/bfloat16 maps (a reduced-precision forward) as float32, once where they enter the metrics: the
    metrics' own arithmetic never runs in reduced precision. Other dtypes unchanged (the same tensor)."""
    return maps.float() if maps.dtype in (torch.float16, torch.bfloat16) else maps


def to_fixed(values: torch.Tensor) -> torch.Tensor:
    return torch.round(values.double() * FIXED_POINT_SCALE).long()


def from_fixed(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Mean from a fixed-point sum; NaN where nothing was counted."""
    count = count.double()
    while count.dim() < total.dim():
        count = count.unsqueeze(-1)
    return torch.where(count > 0, total.double() / FIXED_POINT_SCALE / count.clamp_min(1), torch.full_like(count, float("nan")))


class _PairMetric(Metric):
    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.add_state("pairs", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def _select(self, maps: torch.Tensor, masks: torch.Tensor, class_index: torch.Tensor):
        if maps.shape != masks.shape or maps.dim() != 3 or class_index.shape != maps.shape[:1]:
            raise ValueError(f"expected maps/masks [N, H, W] and class_index [N], got {tuple(maps.shape)}, {tuple(masks.shape)}, {tuple(class_index.shape)}")
        maps, keep = promoted(maps), has_region(masks)
        cls = class_index[keep].long()
        # out-of-place updates: in-place ops on states double-count under some strategies
        self.pairs = self.pairs + torch.bincount(cls, minlength=self.num_classes)
        if bool(keep.all()):  # no copy: the metrics of one update then share one fused pass (shared_counts)
            return maps, masks.bool(), cls
        return maps[keep], masks[keep].bool(), cls


class PointingGame(_PairMetric):
    """Mean pointing-game hit per class (``functional.pointing_game``: ties in expectation)."""

    #: the per-pair hits from the maps, and from the fused kernel's counts when one pass serves every metric
    rule = staticmethod(pointing_game)
    rule_from_counts = staticmethod(kernels.pointing_from_counts)

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(num_classes, **kwargs)
        self.add_state("hits", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, maps: torch.Tensor, masks: torch.Tensor, class_index: torch.Tensor) -> None:
        maps, masks, cls = self._select(maps, masks, class_index)
        shared = shared_counts(maps, masks)
        hits = self.rule(maps, masks) if shared is None else self.rule_from_counts(shared["counts"])
        self.hits = self.hits.index_add(0, cls, to_fixed(hits))
        self.last = hits

    def compute(self) -> torch.Tensor:
        """``[C]`` hit rate per class (NaN for a class without regions)."""
        return from_fixed(self.hits, self.pairs)


class PointingAnyTie(PointingGame):
    """Mean pointing-game hit per class under the other tools' rule (``functional.pointing_game_any_tie``: a hit
    when any maximal pixel is in the region; Quantus, MedKLIP's RSNA script)."""

    plot_lower_bound, plot_upper_bound = 0.0, 1.0
    rule = staticmethod(pointing_game_any_tie)
    rule_from_counts = staticmethod(kernels.any_tie_from_counts)


class DiceIoU(_PairMetric):
    """Dice and IoU per class over a threshold grid, at a fixed threshold and at the best one.

    Maps are normalised per map (``normalize``), binarised as ``{m >= t}`` for every ``t`` in
    ``thresholds`` (default 0, 0.01, ..., 1). ``compute`` gives per class the mean curves,
    Dice/IoU at ``fixed_threshold``, the threshold maximising mean Dice (``tau_best``, lowest
    on ties; chosen on the evaluated data, i.e. an oracle), Dice/IoU there, and
    ``delta_dice = dice_best - dice_fixed``, and ``n_regions``, the pairs counted per class.
    """

    def __init__(self, num_classes: int, thresholds: torch.Tensor | None = None, fixed_threshold: float = 0.5, normalize: str = "minmax", **kwargs):
        super().__init__(num_classes, **kwargs)
        thresholds = default_thresholds(dtype=torch.float64) if thresholds is None else torch.as_tensor(thresholds, dtype=torch.float64)
        if thresholds.dim() != 1 or not bool((thresholds[1:] > thresholds[:-1]).all()):
            raise ValueError("thresholds must be a 1-D ascending grid")
        hits = torch.isclose(thresholds, torch.tensor(float(fixed_threshold), dtype=torch.float64), atol=1e-9).nonzero()
        if hits.numel() != 1:
            raise ValueError(f"fixed_threshold {fixed_threshold} must be on the threshold grid")
        self.fixed_index = int(hits[0])
        self.fixed_threshold, self.normalize = float(fixed_threshold), normalize
        self.register_buffer("thresholds", thresholds, persistent=False)
        t = thresholds.numel()
        self.add_state("dice", torch.zeros(num_classes, t, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("iou", torch.zeros(num_classes, t, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, maps: torch.Tensor, masks: torch.Tensor, class_index: torch.Tensor) -> None:
        maps, masks, cls = self._select(maps, masks, class_index)
        shared = shared_counts(maps, masks, self.normalize, self.thresholds)
        if shared is None:
            dice, iou = dice_iou_curve(normalize_saliency(maps, self.normalize), masks, self.thresholds)
        else:  # normalised in the same pass, no normalised copy of the maps
            dice, iou = kernels.curve_from_counts(shared["counts"])
        self.dice = self.dice.index_add(0, cls, to_fixed(dice))
        self.iou = self.iou.index_add(0, cls, to_fixed(iou))
        self.last = (dice, iou)

    def compute(self) -> dict[str, torch.Tensor]:
        dice, iou = from_fixed(self.dice, self.pairs), from_fixed(self.iou, self.pairs)
        best, tau = best_threshold(dice, self.thresholds)
        rows = torch.arange(self.num_classes, device=dice.device)
        defined = self.pairs > 0
        nan = torch.full_like(tau, float("nan"))
        dice_best = dice[rows, best]
        return {
            "n_regions": self.pairs.clone(),  # synced here only: torchmetrics restores local states after compute
            "dice_curve": dice,
            "iou_curve": iou,
            "dice_fixed": dice[:, self.fixed_index],
            "iou_fixed": iou[:, self.fixed_index],
            "tau_best": torch.where(defined, tau, nan),
            "dice_best": dice_best,
            "iou_best": iou[rows, best],
            "delta_dice": dice_best - dice[:, self.fixed_index],
        }


# -- beyond the paper -------------------------------------------------------------------------
class _DefinedPairMetric(_PairMetric):
    """A per-pair statistic that may be undefined (NaN) for some pairs with a region: sums and
    counts only the defined ones (``defined`` per class)."""

    plot_lower_bound, plot_upper_bound = 0.0, 1.0

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(num_classes, **kwargs)
        self.add_state("total", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("defined", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def _values(self, maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, maps: torch.Tensor, masks: torch.Tensor, class_index: torch.Tensor) -> None:
        maps, masks, cls = self._select(maps, masks, class_index)
        self._add(self._values(maps, masks), cls)

    def _add(self, values: torch.Tensor, cls: torch.Tensor) -> None:
        ok = ~torch.isnan(values)
        self.total = self.total.index_add(0, cls[ok], to_fixed(values[ok]))
        self.defined = self.defined + torch.bincount(cls[ok], minlength=self.num_classes)
        self.last = values

    def compute(self) -> torch.Tensor:
        """``[C]`` mean over the pairs where the value is defined (NaN for a class without any)."""
        return from_fixed(self.total, self.defined)


class EnergyPointing(_DefinedPairMetric):
    """Mean energy pointing game per class (``functional.energy_pointing`` of the ``normalize``d map)."""

    def __init__(self, num_classes: int, normalize: str = "minmax", **kwargs):
        super().__init__(num_classes, **kwargs)
        self.normalize = normalize

    def _values(self, maps, masks):
        shared = shared_counts(maps, masks, self.normalize)
        if shared is None:
            return energy_pointing(normalize_saliency(maps, self.normalize), masks)
        return kernels.energy_from_counts(shared["counts"])


class ContrastToNoise(_DefinedPairMetric):
    """Mean contrast-to-noise ratio per class (``functional.contrast_to_noise`` of the raw map over the pixels the
    model saw; undefined pairs left out)."""

    plot_upper_bound = CNR_CAP

    def update(self, maps: torch.Tensor, masks: torch.Tensor, class_index: torch.Tensor, seen: torch.Tensor | None = None) -> None:
        """``seen [N, H, W]`` bool (optional): the pixels of each map the model saw; the others are left out."""
        if seen is not None:
            seen = seen[has_region(masks).to(seen.device)]  # the pairs _select keeps
        maps, masks, cls = self._select(maps, masks, class_index)
        self._add(contrast_to_noise(maps, masks, seen).to(maps.device), cls)


class PointingLift(_DefinedPairMetric):
    """Mean chance-corrected pointing hit per class, ``pointing_game - area_fraction`` (``functional.pointing_lift``)."""

    plot_lower_bound = -1.0

    def _values(self, maps, masks):
        shared = shared_counts(maps, masks)
        if shared is None:
            return pointing_lift(maps, masks)
        return kernels.lift_from_counts(shared["counts"])  # the pass counted each region's pixels: no other pass


class PixelAUROC(_DefinedPairMetric):
    """Mean per-pair pixel AUROC of the raw map against the region (``functional.pixel_auroc``);
    pairs whose region covers the whole image are undefined and not counted."""

    def _values(self, maps, masks):
        return _auroc(maps, masks)


class OtsuDiceIoU(_PairMetric):
    """Mean Dice and IoU per class of each ``normalize``d map's Otsu mask (``functional.otsu_dice_iou``)."""

    plot_lower_bound, plot_upper_bound = 0.0, 1.0

    def __init__(self, num_classes: int, normalize: str = "minmax", **kwargs):
        super().__init__(num_classes, **kwargs)
        self.normalize = normalize
        self.add_state("dice", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("iou", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, maps: torch.Tensor, masks: torch.Tensor, class_index: torch.Tensor) -> None:
        maps, masks, cls = self._select(maps, masks, class_index)
        shared = shared_counts(maps, masks, self.normalize)
        if shared is None:
            dice, iou = otsu_dice_iou(normalize_saliency(maps, self.normalize), masks)
        else:
            dice, iou = kernels.otsu_from_counts(shared["counts"])
        self.dice = self.dice.index_add(0, cls, to_fixed(dice))
        self.iou = self.iou.index_add(0, cls, to_fixed(iou))
        self.last = (dice, iou)

    def compute(self) -> dict[str, torch.Tensor]:
        return {"dice_otsu": from_fixed(self.dice, self.pairs), "iou_otsu": from_fixed(self.iou, self.pairs)}


class _ClassMean(Metric):
    """Mean per class of fixed-point ``total`` over the ``defined`` values counted for it (NaN for none)."""

    full_state_update = False
    is_differentiable = False
    plot_lower_bound, plot_upper_bound = -1.0, 1.0

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.add_state("total", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("defined", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def compute(self) -> torch.Tensor:
        return from_fixed(self.total, self.defined)


class FindingSpecificity(_ClassMean):
    """Mean ``functional.finding_specificity`` per class over the pairs whose image has two or more
    regions: ``update`` also takes each pair's image (``sample_index [N]``, any ids unique per image
    within the call)."""

    higher_is_better = True

    def update(self, maps: torch.Tensor, masks: torch.Tensor, class_index: torch.Tensor, sample_index: torch.Tensor) -> None:
        maps = promoted(maps)
        keep, images = has_region(masks).cpu(), sample_index.cpu()  # the grouping is host bookkeeping on [N] ids
        values = torch.full((maps.shape[0],), float("nan"), dtype=torch.float64)
        distinct, regions = torch.unique(images[keep], return_counts=True)
        groups = [(keep & (images == image)).nonzero().flatten() for image in distinct[regions > 1].tolist()]  # one region: NaN
        for rows, value in zip(groups, finding_specificities(maps, masks, groups)):
            values[rows] = value.cpu()
        values = values.to(maps.device)
        ok = ~torch.isnan(values)
        cls = class_index[ok].long()
        self.total = self.total.index_add(0, cls, to_fixed(values[ok]))
        self.defined = self.defined + torch.bincount(cls, minlength=self.num_classes)
        self.last = values


class MapSimilarity(_ClassMean):
    """Mean ``functional.map_similarity`` per class over images: ``update(saliency [B, C, h, w])``,
    every finding's map of every image (native grid); NaN for fewer than 2 classes."""

    higher_is_better = False

    def update(self, saliency: torch.Tensor) -> None:
        if saliency.dim() != 4 or saliency.shape[1] != self.num_classes:
            raise ValueError(f"expected saliency [B, {self.num_classes}, h, w], got {tuple(saliency.shape)}")
        if self.num_classes < 2 or saliency.shape[0] == 0:  # nothing defined: compute stays NaN
            self.last = torch.full(saliency.shape[:2], float("nan"), dtype=torch.float64)
            return
        self.last = map_similarity(saliency)  # per image [B, C], for the bootstrap (BenchmarkMetrics)
        self.total = self.total + to_fixed(self.last).sum(0).to(self.total.device)
        self.defined = self.defined + saliency.shape[0]


class Records(Metric):
    """Per-sample records in ``"cat"`` list states, one per name of ``shapes()`` (``{name: (empty shape,
    dtype)}``); a subclass sets what ``shapes`` needs, then calls ``_add_records``."""

    full_state_update = False
    is_differentiable = False

    def shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        raise NotImplementedError

    def _add_records(self) -> None:
        for name in self.shapes():
            self.add_state(name, [], dist_reduce_fx="cat")
        self._prime()

    def _prime(self) -> None:
        """One empty batch of the right shapes: a DDP rank without records syncs like the others."""
        for name, (shape, dtype) in self.shapes().items():
            getattr(self, name).append(torch.zeros(shape, dtype=dtype, device=self.device))

    def reset(self) -> None:
        super().reset()
        self._prime()

    def _gathered(self) -> dict[str, torch.Tensor]:
        return {name: dim_zero_cat(getattr(self, name)).cpu() for name in self.shapes()}


class PairRecords(Records):
    """Every counted pair's values, for statistics that need each sample (bootstrap intervals, size
    strata): per pair its image's key (int64, ``image_key``), its bootstrap unit's key (``unit_key``), class, values of ``keys`` in fixed point
    with a defined flag, and its Dice and IoU curves in fixed point. ``compute`` returns them sorted by
    (image key, class): the same order on 1 or N processes."""

    def __init__(self, keys: tuple[str, ...], n_thresholds: int, **kwargs):
        super().__init__(**kwargs)
        self.keys, self.n_thresholds = tuple(keys), n_thresholds
        self._add_records()

    def shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        k, t = len(self.keys), self.n_thresholds
        return {name: (shape, torch.long) for name, shape in (("image", (0,)), ("unit", (0,)), ("cls", (0,)), ("values", (0, k)),
                                                               ("defined", (0, k)), ("dice", (0, t)), ("iou", (0, t)))}

    def update(self, image: torch.Tensor, cls: torch.Tensor, values: dict[str, torch.Tensor], dice: torch.Tensor, iou: torch.Tensor,
               unit: torch.Tensor | None = None) -> None:
        """``unit [N]``: each pair's bootstrap unit (default: its image)."""
        stacked = torch.stack([values[k].double().cpu() for k in self.keys], dim=1) if self.keys else torch.zeros(len(cls), 0, dtype=torch.float64)
        ok = ~torch.isnan(stacked)
        self.image.append(image.long().to(self.device))
        self.unit.append((image if unit is None else unit).long().to(self.device))
        self.cls.append(cls.long().to(self.device))
        self.values.append(to_fixed(torch.nan_to_num(stacked, nan=0.0)).to(self.device))
        self.defined.append(ok.long().to(self.device))
        self.dice.append(to_fixed(dice).to(self.device))
        self.iou.append(to_fixed(iou).to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        out = self._gathered()
        order = torch.argsort(out["cls"], stable=True)
        order = order[torch.argsort(out["image"][order], stable=True)]
        return {name: value[order] for name, value in out.items()}
