"""Grounding metrics as torchmetrics classes, accumulated per class, exact under DDP.

Per-pair values in [0, 1] are accumulated as int64 fixed-point sums (``FIXED_POINT_SCALE``):
integer addition is associative, so the totals, and every number derived from them, are
bit-identical whether the pairs were seen by 1 process or split over N (float sums are not).
Each ``update`` takes pairs: ``maps [N, H, W]``, ``masks [N, H, W]`` bool, ``class_index [N]``;
pairs with an empty region are ignored. Dense ``[B, C, H, W]`` inputs become pairs with
``maps.flatten(0, 1), masks.flatten(0, 1), torch.arange(C).repeat(B)``.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric

from xbench_pl.metrics.functional import (
    best_threshold,
    default_thresholds,
    dice_iou_curve,
    normalize_saliency,
    pointing_game,
)

FIXED_POINT_SCALE = 2**40  # resolution 1e-12 per pair; room for 2**23 pairs per class in int64


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
        keep = masks.flatten(1).any(1)
        cls = class_index[keep].long()
        # out-of-place updates: in-place ops on states double-count under some strategies
        self.pairs = self.pairs + torch.bincount(cls, minlength=self.num_classes)
        return maps[keep], masks[keep].bool(), cls


class PointingGame(_PairMetric):
    """Mean pointing-game hit per class (``functional.pointing_game``: ties in expectation)."""

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(num_classes, **kwargs)
        self.add_state("hits", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, maps: torch.Tensor, masks: torch.Tensor, class_index: torch.Tensor) -> None:
        maps, masks, cls = self._select(maps, masks, class_index)
        self.hits = self.hits.index_add(0, cls, to_fixed(pointing_game(maps, masks)))

    def compute(self) -> torch.Tensor:
        """``[C]`` hit rate per class (NaN for a class without regions)."""
        return from_fixed(self.hits, self.pairs)


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
        dice, iou = dice_iou_curve(normalize_saliency(maps, self.normalize), masks, self.thresholds)
        self.dice = self.dice.index_add(0, cls, to_fixed(dice))
        self.iou = self.iou.index_add(0, cls, to_fixed(iou))

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
