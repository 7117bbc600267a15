"""Recognition metrics per class: torchmetrics' own AUROC, average precision, F1 and accuracy.

Scores are the model's probability that a finding is present, in [0, 1]. F1 and Hamming
accuracy binarise at ``threshold`` (default 0.5; ``score > threshold`` as torchmetrics does).
"""

from __future__ import annotations

import warnings

import torch
from torchmetrics import Metric, MetricCollection
from torchmetrics import classification as tmc


def _collection(num_classes: int, threshold: float) -> MetricCollection:
    if num_classes == 1:  # torchmetrics' multilabel metrics need at least two labels
        return MetricCollection({
            "auroc": tmc.BinaryAUROC(),
            "auprc": tmc.BinaryAveragePrecision(),
            "f1": tmc.BinaryF1Score(threshold=threshold, zero_division=0),
            "hamming_acc": tmc.BinaryAccuracy(threshold=threshold),
        })
    kw = {"num_labels": num_classes, "average": None}
    return MetricCollection({
        "auroc": tmc.MultilabelAUROC(**kw),
        "auprc": tmc.MultilabelAveragePrecision(**kw),
        "f1": tmc.MultilabelF1Score(threshold=threshold, zero_division=0, **kw),
        "hamming_acc": tmc.MultilabelAccuracy(threshold=threshold, **kw),
    })


class Recognition(Metric):
    """Per-class AUROC, AUPRC (average precision), F1 and Hamming accuracy, plus positive/negative counts.

    ``compute`` returns ``[C]`` tensors (``n_pos``, ``n_neg``: label counts); AUROC is NaN for a class lacking positives or
    negatives, AUPRC NaN for a class without positives (undefined, not 0).
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, num_classes: int, threshold: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.metrics = _collection(num_classes, threshold)
        self.add_state("positives", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("negatives", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self._prime()

    def _prime(self) -> None:
        """Give the torchmetrics curves one empty batch of the right dtype and shape: a DDP rank
        that sees no sample then syncs ``[0, C]`` like the others, not a bare 1-D placeholder."""
        scores, labels = torch.zeros(0, self.num_classes), torch.zeros(0, self.num_classes, dtype=torch.long)
        for name in ("auroc", "auprc"):  # the list-state metrics; F1 and accuracy keep sums
            self.metrics[name].update(*((scores[:, 0], labels[:, 0]) if self.num_classes == 1 else (scores, labels)))

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
        if self.num_classes == 1:
            self.metrics.update(scores[:, 0].float(), labels[:, 0])
        else:
            self.metrics.update(scores.float(), labels)

    def compute(self) -> dict[str, torch.Tensor]:
        with warnings.catch_warnings():  # "no positive samples" etc.: such classes become NaN below
            warnings.simplefilter("ignore", UserWarning)
            values = {name: value.reshape(self.num_classes).double() for name, value in self.metrics.compute().items()}
        nan = torch.full_like(values["auroc"], float("nan"))
        values["auroc"] = torch.where((self.positives > 0) & (self.negatives > 0), values["auroc"], nan)
        values["auprc"] = torch.where(self.positives > 0, values["auprc"], nan)
        # read inside compute: torchmetrics restores the local (unsynced) states afterwards
        return {**values, "n_pos": self.positives.clone(), "n_neg": self.negatives.clone()}

    def reset(self) -> None:
        super().reset()
        self.metrics.reset()
        self._prime()
