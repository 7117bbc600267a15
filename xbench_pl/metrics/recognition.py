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

``f1_max`` and ``acc_at_f1_max`` are the model papers' protocol (MedKLIP, KAD, MAVL): per finding the best F1
over every threshold and the accuracy of ``score > that threshold`` (``functional.max_f1``), a threshold chosen
on the evaluated samples (an oracle, like ``dice_best``); ``f1``/``hamming_acc`` keep the fixed threshold.
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
    max_f1,
    max_f1_from_counts,
    reliability_bins,
)


#: ``compute`` keys of the reliability diagram -> ``reliability_bins`` keys
RELIABILITY = {"n_bin": "count", "bin_confidence": "confidence", "bin_accuracy": "accuracy"}


class Recognition(Metric):
    """Per-class AUROC, AUPRC (average precision), F1 and Hamming accuracy (at ``threshold`` and at the F1-maximising
    threshold), calibration error, plus positive/negative counts.

    ``compute`` returns float64 ``[C]`` tensors (``n_pos``, ``n_neg``: int64 label counts); AUROC
    is NaN for a class lacking positives or negatives, AUPRC NaN for a class without positives
    (undefined, not 0); ``f1_max``, ``acc_at_f1_max`` and ``f1_max_threshold`` (``functional.max_f1``) NaN for
    a class without positives. Scores and labels are kept (``"cat"`` states: the curves need every
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
        best = [max_f1(scores[:, c], labels[:, c]) for c in columns]  # (f1, threshold, accuracy) per class
        # read inside compute: torchmetrics restores the local (unsynced) states afterwards
        return {
            "auroc": torch.stack([auroc(scores[:, c], labels[:, c]) for c in columns]),
            "auprc": torch.stack([average_precision(scores[:, c], labels[:, c]) for c in columns]),
            "f1": f1,
            "hamming_acc": accuracy,
            "f1_max": torch.stack([b[0] for b in best]),
            "acc_at_f1_max": torch.stack([b[2] for b in best]),
            "f1_max_threshold": torch.stack([b[1] for b in best]),
            "ece": torch.stack([expected_calibration_error(scores[:, c], labels[:, c], self.n_bins) for c in columns]),
            # the reliability diagram per class [C, n_bins]: samples, mean score, fraction positive
            **{key: torch.stack([b[part] for b in bins]) for key, part in RELIABILITY.items()},
            "n_pos": self.positives.clone(),
            "n_neg": self.negatives.clone(),
        }

    def reset(self) -> None:
        super().reset()
        self._prime()


#: The recognition keys recomputed per bootstrap replicate (``replicate_recognition``).
RECOGNITION_KEYS = ("auroc", "auprc", "f1", "hamming_acc", "f1_max", "acc_at_f1_max", "ece")


def replicate_recognition(scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, threshold: float = 0.5,
                          n_bins: int = CALIBRATION_BINS) -> dict[str, torch.Tensor]:
    """Every ``RECOGNITION_KEYS`` value per bootstrap replicate and class ``{key: [R, C]}`` (float64), where
    replicate r counts image n ``weights[r, n]`` times (``scores [N, C]``, 0/1 ``labels [N, C]``, int64
    ``weights [R, N]``). With all weights 1 these are ``auroc``, ``average_precision``, ``f1_accuracy``, ``max_f1``
    and ``expected_calibration_error`` (the latter to 1e-12: scores enter its bin sums in int64 fixed point).

    Vectorised over replicates: per class one sort of the scores, then weighted cumulative counts at the
    end of each distinct score (int64, exact) give every replicate's ROC and precision-recall points (a score
    not drawn in a replicate is no threshold of it: ``max_f1_from_counts``'s ``present``);
    F1, accuracy and the calibration bins are weighted int64 counts. NaN where a replicate lacks what
    the key needs (AUROC: positives and negatives; AUPRC: positives).
    """
    from xbench_pl.metrics.grounding import FIXED_POINT_SCALE, to_fixed

    scores, labels, weights = scores.double(), labels.long(), weights.long()
    r, c = weights.shape[0], scores.shape[1]
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    out = {k: torch.full((r, c), float("nan"), dtype=torch.float64) for k in RECOGNITION_KEYS}
    if scores.shape[0] == 0:
        return out
    predicted, positive = (scores > threshold).long(), labels
    tp, fp = weights @ (predicted * positive), weights @ (predicted * (1 - positive))
    fn, tn = weights @ ((1 - predicted) * positive), weights @ ((1 - predicted) * (1 - positive))
    total = tp + fp + fn + tn
    out["f1"] = torch.where(2 * tp + fp + fn > 0, (2 * tp).double() / (2 * tp + fp + fn).clamp_min(1).double(), 0.0)
    out["hamming_acc"] = torch.where(total > 0, (tp + tn).double() / total.clamp_min(1).double(), nan)
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    fixed = to_fixed(scores)
    for k in range(c):
        order = torch.argsort(scores[:, k], descending=True, stable=True)
        ranked, y, w = scores[order, k], labels[order, k], weights[:, order]
        last = torch.cat([torch.nonzero(ranked[1:] != ranked[:-1]).flatten(), torch.tensor([ranked.numel() - 1])])
        tps, fps = (w * y).cumsum(1)[:, last], (w * (1 - y)).cumsum(1)[:, last]  # [R, distinct scores]
        p, n = tps[:, -1], fps[:, -1]
        zero = torch.zeros(r, 1, dtype=torch.long)
        tp0, fp0 = torch.cat([zero, tps], 1), torch.cat([zero, fps], 1)
        twice_area = ((fp0[:, 1:] - fp0[:, :-1]) * (tp0[:, 1:] + tp0[:, :-1])).sum(1)
        out["auroc"][:, k] = torch.where((p > 0) & (n > 0), twice_area.double() / (2 * p * n).clamp_min(1).double(), nan)
        gained = (tp0[:, 1:] - tp0[:, :-1]).double()
        precision = torch.where(tps + fps > 0, tps.double() / (tps + fps).clamp_min(1).double(), 0.0)
        out["auprc"][:, k] = torch.where(p > 0, (gained * precision).sum(1) / p.clamp_min(1).double(), nan)
        drawn_here = torch.diff(tps + fps, dim=1, prepend=zero) > 0
        f1_max, _, acc_max = max_f1_from_counts(tps, fps, ranked[last], drawn_here)
        out["f1_max"][:, k], out["acc_at_f1_max"][:, k] = f1_max, acc_max
        # calibration: per bin the weighted count, positives and score sum (fixed point), as reliability_bins bins
        bins = (torch.bucketize(scores[:, k].contiguous(), edges, right=True) - 1).clamp(0, n_bins - 1)
        count = torch.zeros(r, n_bins, dtype=torch.long).index_add_(1, bins, weights)
        hits = torch.zeros(r, n_bins, dtype=torch.long).index_add_(1, bins, weights * labels[:, k])
        mass = torch.zeros(r, n_bins, dtype=torch.long).index_add_(1, bins, weights * fixed[:, k])
        gap = (hits * FIXED_POINT_SCALE - mass).abs().sum(1)
        drawn = count.sum(1)
        out["ece"][:, k] = torch.where(drawn > 0, gap.double() / (drawn.double() * FIXED_POINT_SCALE), nan)
    return out
