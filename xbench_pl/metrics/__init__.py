"""Recognition and grounding metrics: torchmetrics classes, each with a functional twin."""

from xbench_pl.metrics.benchmark import BenchmarkMetrics, metric_keys
from xbench_pl.metrics.functional import (
    best_threshold,
    default_thresholds,
    dice_iou_curve,
    normalize_saliency,
    pointing_game,
)
from xbench_pl.metrics.grounding import DiceIoU, PointingGame
from xbench_pl.metrics.recognition import Recognition

__all__ = [
    "BenchmarkMetrics", "DiceIoU", "PointingGame", "Recognition", "best_threshold", "default_thresholds",
    "dice_iou_curve", "metric_keys", "normalize_saliency", "pointing_game",
]
