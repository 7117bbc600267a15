"""The model contract: ``zero_shot(images, classes)`` -> scores and saliency; the rest is shared.

A model subclasses ``ZeroShotModel``, sets ``self.preprocess`` (its own input spec) and
implements ``zero_shot``. ``test_step`` maps each saliency map back to its original image
through the batch's affine and feeds the benchmark metrics; nothing model-specific there. It
returns a ``TestStepOutput`` (what callbacks receive as ``outputs``: they never recompute).
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from xbench_pl.data.base import Batch
from xbench_pl.geometry import Preprocess, warp_to_eval_grid
from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.benchmark import read_tuned_thresholds
from xbench_pl.metrics.chexlocalize import full_resolution_pairs
from xbench_pl.metrics.resampling import image_key


@dataclass
class ZeroShotOutput:
    """scores ``[B, C]``: the model's probability in [0, 1] that finding c is present in image b.
    saliency ``[B, C, h, w]``: where the model locates finding c, on its native grid, which
    spans the whole model input (``preprocess.size`` square); larger = more salient.
    logits ``[B, C]`` (optional): the model's raw score as its authors compute it, before any
    mapping to ``scores`` (a model whose authors score in [0, 1] may leave it ``None``); the
    benchmark metrics read ``scores`` only."""

    scores: torch.Tensor
    saliency: torch.Tensor
    logits: torch.Tensor | None = None


@dataclass
class TestStepOutput:
    """What ``test_step`` returns, i.e. what callbacks get as ``outputs`` in ``on_test_batch_end``.

    ``output``: the model's ``ZeroShotOutput`` for the whole batch (stand-in samples included).
    ``maps [K, E, E]``: the counted (image, finding) pairs' saliency warped to the eval grid, raw
    (the maps the benchmark judges); ``masks [K, E, E]``: their regions; ``pairs [K, 2]``: each
    pair's (sample, class) index into the batch. Only references to tensors the step computed
    anyway: a callback that keeps some must copy them.
    """

    output: ZeroShotOutput
    maps: torch.Tensor
    masks: torch.Tensor
    pairs: torch.Tensor


class ZeroShotModel(L.LightningModule):
    """Base of every benchmarked model.

    Args:
        normalize: per-map saliency normalisation before thresholding (``minmax``, ``max``, ``none``).
        fixed_threshold: the fixed Dice/IoU threshold (on the 0.01 grid).
        score_threshold: threshold on scores for F1 and Hamming accuracy.
        bootstrap: bootstrap resamples for the 95 % intervals in ``ci`` (0 = off), from per-pair values
            (``xbench_pl.metrics.resampling``); ``bootstrap_seed`` seeds them.
        size_strata: the area fractions separating small | medium | large regions in ``by_size``.
        tune_from: a tuning run's ``metrics.json`` (or its folder): each finding's ``tau_best`` there is
            applied unchanged (``dice_tuned``, ``iou_tuned``, ``tau_tuned``); None: not reported, and
            the report says so.
        cxl: also report CheXlocalize's hit rate and mIoU (``cxl_hit_rate``, ``cxl_miou``,
            ``cxl_miou_all``), judged as their evaluation code judges at each image's full resolution
            (``xbench_pl.metrics.chexlocalize``): every finding of every image, ~0.1 s each on a CPU.
    """

    preprocess: Preprocess

    def __init__(self, normalize: str = "minmax", fixed_threshold: float = 0.5, score_threshold: float = 0.5,
                 bootstrap: int = 1000, bootstrap_seed: int = 0, size_strata: tuple[float, float] = (0.01, 0.1),
                 tune_from: str | None = None, cxl: bool = False):
        super().__init__()
        self.normalize, self.fixed_threshold, self.score_threshold = normalize, fixed_threshold, score_threshold
        self.bootstrap, self.bootstrap_seed, self.size_strata = int(bootstrap), int(bootstrap_seed), tuple(size_strata)
        self.tune_from = tune_from
        self.tuned_thresholds = read_tuned_thresholds(tune_from) if tune_from else {}
        self.cxl = bool(cxl)
        # per dataset name, the XBenchDataset whose records give the full-resolution regions (cxl mode);
        # found on the trainer's datamodule when not set (a replay sets it)
        self.region_datasets: dict = {}
        self.benchmark = nn.ModuleDict()
        self.results: dict[str, dict] = {}
        self.curves: dict[str, dict] = {}  # per dataset: Dice/IoU against tau, reliability bins (BenchmarkMetrics.curves)
        self.random_weights = False  # set by warn_random_weights; reports say so
        # with fewer images than ranks some rank has nothing to test: fine, its metrics still sync
        self.allow_zero_length_dataloader_with_multiple_devices = True

    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        raise NotImplementedError

    def warn_random_weights(self) -> None:
        """Every model built with ``random_init=True`` and no checkpoint calls this: smoke runs only."""
        self.random_weights = True
        rank_zero_warn(f"{type(self).__name__} has RANDOM weights (random_init=True, no checkpoint): "
                       "its scores and maps are meaningless; use it only to smoke-test a set-up")

    # -- evaluation -------------------------------------------------------------------------
    def add_dataset(self, name: str, classes: list[str]) -> None:
        self.benchmark[name] = BenchmarkMetrics(classes, self.normalize, self.fixed_threshold, self.score_threshold,
                                                bootstrap=self.bootstrap, bootstrap_seed=self.bootstrap_seed, size_bounds=self.size_strata,
                                                tuned_thresholds=self.tuned_thresholds.get(name), tuning_source=self.tune_from, cxl=self.cxl).to(self.device)

    def on_test_start(self) -> None:
        self.benchmark = nn.ModuleDict()
        self.region_datasets = {}
        datamodule = getattr(self.trainer, "datamodule", None)
        # every rank must hold the same metrics, even for a dataset it gets no batch of
        for spec in getattr(datamodule, "dataset_specs", []):
            self.add_dataset(spec.name, spec.classes)

    def test_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> TestStepOutput:
        output = self.zero_shot(batch.images, batch.classes)
        b, c = batch.labels.shape
        if output.scores.shape != (b, c) or output.saliency.dim() != 4 or output.saliency.shape[:2] != (b, c):
            raise ValueError(f"{type(self).__name__}.zero_shot returned scores {tuple(output.scores.shape)} and saliency "
                             f"{tuple(output.saliency.shape)}; expected [{b}, {c}] and [{b}, {c}, h, w]")
        not_finite = ~torch.isfinite(output.saliency).flatten(2).all(2)
        if not_finite.any():
            b, c = not_finite.nonzero()[0].tolist()
            raise ValueError(f"{type(self).__name__} gave a saliency map with NaN or inf for image "
                             f"{batch.image_ids[b]!r} of {batch.dataset}, finding {batch.classes[c]!r}")
        if batch.dataset not in self.benchmark:
            self.add_dataset(batch.dataset, batch.classes)
        counted = batch.counted  # stand-in samples of an otherwise idle DDP rank are computed, never counted
        counted_pairs = counted[batch.region_index[:, 0]]
        sample, cls = batch.region_index[counted_pairs].unbind(1)
        # the native map spans the input the model was given: take its size from the batch itself
        maps = warp_to_eval_grid(output.saliency[sample, cls], batch.affine[sample], batch.images.shape[-1],
                                 batch.original_size[sample], batch.region_masks.shape[-1])
        masks = batch.region_masks[counted_pairs]
        keys = torch.tensor([image_key(batch.image_ids[i]) for i in sample.tolist()], dtype=torch.long)
        self.benchmark[batch.dataset].update(output.scores[counted], batch.labels[counted], maps, masks, cls,
                                             image_keys=keys, saliency=output.saliency[counted])
        if self.benchmark[batch.dataset].cxl is not None:
            self.update_cxl(batch, output.saliency)
        return TestStepOutput(output, maps, masks, torch.stack((sample, cls), dim=1))

    def update_cxl(self, batch: Batch, saliency: torch.Tensor) -> None:
        """The CheXlocalize-comparable metrics of every finding of the batch's counted images, at full
        resolution: regions from the dataset's records (original pixels), maps through the batch's affine."""
        dataset = self.region_datasets.get(batch.dataset)
        if dataset is None:
            datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
            children = {dm.name: dm.test_set for dm in getattr(datamodule, "datamodules", [])}
            dataset = children.get(batch.dataset)
            if dataset is None:
                raise ValueError(f"cxl=True needs the regions of {batch.dataset!r} at full resolution: run through an "
                                 "XBenchDataModule (the CLI's --data) or set model.region_datasets")
            self.region_datasets[batch.dataset] = dataset
        counted = batch.counted.nonzero().flatten().cpu()
        regions = [dataset.records[int(batch.index[i])].regions for i in counted.tolist()]
        pairs = full_resolution_pairs(saliency[counted.to(saliency.device)], batch.affine[counted.to(batch.affine.device)],
                                      batch.images.shape[-1], batch.original_size[counted.to(batch.original_size.device)].cpu(),
                                      regions, batch.classes)
        self.benchmark[batch.dataset].update_cxl(pairs)

    def on_test_epoch_end(self) -> None:
        self.results = {name: metrics.compute() for name, metrics in self.benchmark.items()}  # synced on every rank
        self.curves = {name: metrics.curves for name, metrics in self.benchmark.items()}  # for plots (callbacks)
        # straight to the loggers (W&B, CSV, ...), from rank zero, in float64: these numbers are already
        # synced, so Lightning's self.log (which would cast to float32 and ask for sync_dist) is not used
        means = {f"{name}/{key}": value for name, table in self.results.items()
                 for key, value in table["mean"].items() if value is not None}
        if self.trainer.is_global_zero and means:
            for logger in self.loggers:
                logger.log_metrics(means, step=self.global_step)
