"""Recognition metrics per class: AUROC, average precision, F1, Hamming accuracy and calibration error, in float64.

Scores are the model's probability that a finding is present, in [0, 1]. F1 and Hamming
accuracy binarise at ``threshold`` (default 0.5; ``score > threshold`` as torchmetrics does).
The definitions are torchmetrics' (``MultilabelAUROC``, ``MultilabelAveragePrecision``,
``MultilabelF1Score(zero_division=0)``, ``MultilabelAccuracy``, ``average=None``), computed by
the functional twins in ``functional.py`` from exact integer counts in float64: torchmetrics
divides its counts in float32, which would put artefacts such as 0.1666666716 into
``metrics.json``. ``ece`` is torchmetrics' ``binary_calibration_error`` (15 equal-width bins, L1)
of each finding's scores, in float64 on the samples sorted by (score, label), so 1 or N processes
give the same digits; ``n_bin``, ``bin_confidence``, ``bin_accuracy`` ``[C, bins]`` are the reliability
diagram behind it (``functional.reliability_bins``).
"""

from __future__ import annotations

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from xbench_pl.metrics.functional import (
    CALIBRATION_BINS,
    auroc,
    average_precision,
    expected_calibration_error,
    f1_accuracy,
    reliability_bins,
)


#: ``compute`` keys of the reliability diagram -> ``reliability_bins`` keys
RELIABILITY = {"n_bin": "count", "bin_confidence": "confidence", "bin_accuracy": "accuracy"}


class Recognition(Metric):
    """Per-class AUROC, AUPRC (average precision), F1 and Hamming accuracy, plus positive/negative counts.

    ``compute`` returns float64 ``[C]`` tensors (``n_pos``, ``n_neg``: int64 label counts); AUROC
    is NaN for a class lacking positives or negatives, AUPRC NaN for a class without positives
    (undefined, not 0). Scores and labels are kept (``"cat"`` states: the curves need every
    sample); the curves count samples per distinct score, so sample order and the split over
    DDP ranks cannot change a digit.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, num_classes: int, threshold: float = 0.5, n_bins: int = CALIBRATION_BINS, **kwargs):
        super().__init__(**kwargs)
        self.num_classes, self.threshold, self.n_bins = num_classes, threshold, n_bins
        self.add_state("positives", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("negatives", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("scores", [], dist_reduce_fx="cat")
        self.add_state("labels", [], dist_reduce_fx="cat")
        self._prime()

    def _prime(self) -> None:
        """One empty batch of the right dtype and shape: a DDP rank that sees no sample then syncs
        ``[0, C]`` like the others, not an empty list."""
        self.scores.append(torch.zeros(0, self.num_classes, dtype=torch.float64, device=self.device))
        self.labels.append(torch.zeros(0, self.num_classes, dtype=torch.long, device=self.device))

    def update(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        if scores.shape != labels.shape or scores.dim() != 2 or scores.shape[1] != self.num_classes:
            raise ValueError(f"expected scores and labels [B, {self.num_classes}], got {tuple(scores.shape)} and {tuple(labels.shape)}")
        if not ((scores >= 0) & (scores <= 1)).all():  # NaN fails both comparisons
            raise ValueError("recognition scores must be finite probabilities in [0, 1]")
        if scores.shape[0] == 0:
            return
        labels = labels.long()
        self.positives = self.positives + labels.sum(0)
        self.negatives = self.negatives + (1 - labels).sum(0)
        self.scores.append(scores.detach().double())
        self.labels.append(labels)

    def compute(self) -> dict[str, torch.Tensor]:
        scores, labels = dim_zero_cat(self.scores).cpu(), dim_zero_cat(self.labels).cpu()
        columns = range(self.num_classes)
        f1, accuracy = f1_accuracy(scores, labels, self.threshold)
        bins = [reliability_bins(scores[:, c], labels[:, c], self.n_bins) for c in columns]
        # read inside compute: torchmetrics restores the local (unsynced) states afterwards
        return {
            "auroc": torch.stack([auroc(scores[:, c], labels[:, c]) for c in columns]),
            "auprc": torch.stack([average_precision(scores[:, c], labels[:, c]) for c in columns]),
            "f1": f1,
            "hamming_acc": accuracy,
            "ece": torch.stack([expected_calibration_error(scores[:, c], labels[:, c], self.n_bins) for c in columns]),
            # the reliability diagram per class [C, n_bins]: samples, mean score, fraction positive
            **{key: torch.stack([b[part] for b in bins]) for key, part in RELIABILITY.items()},
            "n_pos": self.positives.clone(),
            "n_neg": self.negatives.clone(),
        }

    def reset(self) -> None:
        super().reset()
        self._prime()
