"""Every number of one dataset's benchmark table, from recognition and grounding metrics.

Keys per class and for the macro ``mean`` (the fixed-threshold keys carry its value):
``pointing_game, dice@0.5, iou@0.5, dice_best, iou_best, tau_best, delta_dice, auroc, auprc,
f1, hamming_acc, ece`` as fractions (None where undefined), and counts ``n_pos, n_neg, n_regions``
(``n_regions``: (image, finding) pairs with a non-empty region, the grounding denominator).
The macro mean averages the classes where a value is defined; counts are summed.
``compute`` also leaves the curves behind the table in ``curves`` (for plots, never in the table).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xbench_pl.metrics.grounding import DiceIoU, PointingGame
from xbench_pl.metrics.recognition import Recognition

COUNT_KEYS = ("n_pos", "n_neg", "n_regions")


def metric_keys(fixed_threshold: float = 0.5) -> tuple[str, ...]:
    t = f"{fixed_threshold:g}"
    return ("pointing_game", f"dice@{t}", f"iou@{t}", "dice_best", "iou_best", "tau_best", "delta_dice",
            "auroc", "auprc", "f1", "hamming_acc", "ece")


def _number(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _numbers(values: torch.Tensor) -> list:
    return [int(v) if isinstance(v, int) else _number(v) for v in values.cpu().tolist()]


class BenchmarkMetrics(nn.Module):
    """Recognition + grounding for one dataset's class list; ``compute()`` gives its table."""

    def __init__(self, classes: list[str], normalize: str = "minmax", fixed_threshold: float = 0.5, score_threshold: float = 0.5):
        super().__init__()
        self.classes = list(classes)
        c = len(self.classes)
        self.recognition = Recognition(c, threshold=score_threshold)
        self.pointing = PointingGame(c)
        self.dice_iou = DiceIoU(c, fixed_threshold=fixed_threshold, normalize=normalize)
        self.keys = metric_keys(fixed_threshold)
        self.curves: dict = {}

    def update(self, scores, labels, maps, masks, class_index) -> None:
        self.recognition.update(scores, labels)
        self.pointing.update(maps, masks, class_index)
        self.dice_iou.update(maps, masks, class_index)

    def compute(self) -> dict:
        rec, grounding = self.recognition.compute(), self.dice_iou.compute()
        columns = {
            self.keys[0]: self.pointing.compute(),
            self.keys[1]: grounding["dice_fixed"],
            self.keys[2]: grounding["iou_fixed"],
            **{k: grounding[k] for k in ("dice_best", "iou_best", "tau_best", "delta_dice")},
            **{k: rec[k] for k in ("auroc", "auprc", "f1", "hamming_acc", "ece")},
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
        counts = {"n_pos": rec["n_pos"], "n_neg": rec["n_neg"], "n_regions": grounding["n_regions"]}
        # torchmetrics squeezes one-element results; a one-class dataset still needs [C]
        columns = {k: v.reshape(len(self.classes)) for k, v in columns.items()}
        counts = {k: v.reshape(len(self.classes)) for k, v in counts.items()}
        classes = {}
        for i, name in enumerate(self.classes):
            row = {k: _number(float(columns[k][i])) for k in self.keys}
            row.update({k: int(counts[k][i]) for k in COUNT_KEYS})
            classes[name] = row
        mean = {}
        for k in self.keys:
            defined = [row[k] for row in classes.values() if row[k] is not None]
            mean[k] = sum(defined) / len(defined) if defined else None
        mean.update({k: sum(row[k] for row in classes.values()) for k in COUNT_KEYS})
        return {"classes": classes, "mean": mean}

    def reset(self) -> None:
        for metric in (self.recognition, self.pointing, self.dice_iou):
            metric.reset()
