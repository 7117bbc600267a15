"""Recognition and grounding metrics: torchmetrics classes, each with a functional twin."""

from xbench_pl.metrics.benchmark import BenchmarkMetrics, metric_keys
from xbench_pl.metrics.functional import (
    best_threshold,
    contrast_to_noise,
    default_thresholds,
    dice_iou_curve,
    max_f1,
    normalize_saliency,
    pointing_game,
    pointing_game_any_tie,
)
from xbench_pl.metrics.grounding import ContrastToNoise, DiceIoU, PointingAnyTie, PointingGame
from xbench_pl.metrics.recognition import Recognition

__all__ = [
    "BenchmarkMetrics", "ContrastToNoise", "DiceIoU", "PointingAnyTie", "PointingGame", "Recognition", "best_threshold", "contrast_to_noise",
    "default_thresholds", "dice_iou_curve", "max_f1", "metric_keys", "normalize_saliency", "pointing_game", "pointing_game_any_tie",
]
