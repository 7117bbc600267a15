"""The model contract: ``zero_shot(images, classes)`` -> scores and saliency; the rest is shared.

A model subclasses ``ZeroShotModel``, sets ``self.preprocess`` (its own input spec) and
implements ``zero_shot``. ``test_step`` judges the answer with ``xbench_pl.judging.Judge`` (a base class shared with
the replay of stored predictions, which needs no Lightning): each saliency map is mapped back to its original image
through the batch's affine and feeds the benchmark metrics; nothing model-specific there. It
returns a ``TestStepOutput`` (what callbacks receive as ``outputs``: they never recompute). Under
``--trainer.precision 16-mixed|bf16-mixed`` the forward runs under autocast; its scores and maps are promoted
to float32 once (``ZeroShotOutput.promoted``) and everything after it (warp, metrics, callbacks, the prediction
store) runs outside autocast, so no metric arithmetic runs in bf16/fp16.

Fine-tuning (``python -m xbench_pl fit``) is shared too: ``training_step`` (binary cross-entropy of
the model's logits against the labels), ``validation_step`` (``test_step``'s own path into separate
metrics, computed, logged and reset every epoch) and ``configure_optimizers`` (AdamW over the
parameters that ``trainable``, else the family's ``TRAINABLE``, selects; the rest is frozen). A
checkpoint keeps only what fit changes, with a fingerprint of the frozen base weights that the
model's own options rebuild (``on_save_checkpoint``, ``on_load_checkpoint``).
"""

from __future__ import annotations

import inspect
import re
from contextlib import contextmanager
from typing import Literal, get_args

import lightning as L
import torch
import torch.nn.functional as F
from jsonargparse.typing import ClosedUnitInterval, NonNegativeFloat, NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from xbench_pl.data.base import Batch
from xbench_pl.geometry import Preprocess
from xbench_pl.judging import Judge, StatedBoxes, TestStepOutput, ZeroShotOutput, batch_units
from xbench_pl.metrics.functional import NormalizeMode
from xbench_pl.models.stand_ins import stand_in_tokenizer
from xbench_pl.metrics.resampling import image_key
from xbench_pl.models.checkpoints import FIT_RECORD, CheckpointError, fit_checkpoint_name, weights_fingerprint
from xbench_pl.models.prompts import EmbeddingCache
from xbench_pl.options import ExplainerName, GridThreshold, GroupNames, TrustMeasures
from xbench_pl.registry import qualified_name

#: the clamp of scores before their logit in the training loss (``ZeroShotModel.training_logits``)
SCORE_EPS = 1e-6


class ZeroShotModel(Judge, L.LightningModule):
    """Base of every benchmarked model.

    Args:
        normalize: per-map saliency normalisation before thresholding (``minmax``, ``max``, ``none``).
        fixed_threshold: the fixed Dice/IoU threshold (on the 0.01 grid).
        score_threshold: threshold on scores for F1 and Hamming accuracy.
        bootstrap: bootstrap resamples for the 95 % intervals in ``ci`` (0 = off), from per-pair values
            (``xbench_pl.metrics.resampling``), resampling patients where the dataset records them
            (``Batch.patient_ids``), else images.
        bootstrap_seed: the seed of the bootstrap resamples.
        size_strata: the area fractions separating small | medium | large regions in ``by_size``.
        tune_from: a tuning run's ``metrics.json`` (or its folder): each finding's ``tau_best`` there is
            applied unchanged (``dice_tuned``, ``iou_tuned``, ``tau_tuned``); None: not reported, and
            the report says so.
        cxl: also report CheXlocalize's hit rate and mIoU (``cxl_hit_rate``, ``cxl_miou``,
            ``cxl_miou_all``), judged as their evaluation code judges at each image's full resolution
            (``xbench_pl.metrics.chexlocalize``): every finding of every image, ~0.1 s each on a CPU.
        negatives: full-set mode: also judge the maps of (image, finding) pairs where the finding is absent
            on the eval grid (``neg_fp_rate``, ``neg_mass``; off by default: the paper's keys are unchanged).
        trainable: regexes (``re.search``) of the parameter names ``fit`` trains; every other parameter is
            frozen (``requires_grad=False``) and modules without a trained parameter stay in eval mode.
            None: the family's ``TRAINABLE`` (see docs/fit.md).
        lr: AdamW's learning rate for ``fit``.
        weight_decay: AdamW's weight decay for ``fit`` (none on biases, norms and scalars such as
            ``logit_scale``: parameters of fewer than 2 dimensions).
        explainer: where the maps come from (``xbench_pl.explainers``): ``native`` (the authors' map),
            a pytorch-grad-cam CAM (``gradcam``, ``gradcam++``, ``hirescam``, ``layercam``, ``xgradcam``,
            ``eigencam``, ``scorecam``) of the model's target for each finding, ``rollout`` or ``chefer``.
            Scores are the native forward's (a CAM's own forward, equal to float32 round-off).
        explainer_layer: the CAMs' target layer, a module path (``model.get_submodule``); None: the family's
            default (the image tower's last ResNet stage, or its last ViT block's first norm).
        groups: subgroups to report per dataset in ``by_group`` (``sex,age,view``, any subset, comma-separated;
            ``xbench_pl.data.groups``): each group value's table, its images counted, and the gap between
            values with a paired bootstrap interval and p-value (docs/metrics.md). None: off.
        trust: is the map the model's? (``randomization,deletion,insertion,random_target``, any subset,
            comma-separated; ``xbench_pl.models.trust_run``, docs/trust.md): the keys ``randomization_ssim``,
            ``randomization_spearman``, ``randomization_baseline``, ``deletion_auc``, ``insertion_auc``,
            ``random_target_ssim`` with intervals and a ``trust`` block per dataset. None: off.
        trust_seed: the seed of the randomized weights, the baseline's random pairs, random_target's other
            finding and the image sample.
        trust_steps: deletion/insertion steps K (each a forward of the perturbed inputs).
        trust_baseline: what deleted pixels become: ``blur`` (the image blurred, ``trust_blur_sigma``) or ``mean``
            (the model's normalisation mean, i.e. 0 in model-input space).
        trust_blur_sigma: the Gaussian blur's sigma in model-input pixels (``trust_baseline=blur``).
        trust_stages: the randomization stages measured: ``all`` (the curve) or ``last`` (the full cascade only:
            one explainer pass per batch instead of one per stage; either way one working copy of the weights).
        trust_pairs: ``regions`` (each finding with a region) or ``all`` (every finding of every image).
        trust_fraction: the share of the images measured, a seeded sample by image id (``trust_run.sampled``).
    """

    preprocess: Preprocess
    #: regexes of the parameter names ``fit`` trains by default; each family sets its own (none: nothing to fit)
    TRAINABLE: tuple[str, ...] = ()
    #: the module path of the image tower that explainers explain (None: a model without one, which explains nothing)
    IMAGE_TOWER: str | None = None
    #: whether the cached text/query embeddings (``embedding_caches``) come from the model's own weights, so that loading
    #: others clears them (MedKLIP's come from its separate text encoder: they stay valid)
    CACHES_FOLLOW_WEIGHTS = True
    #: what explainers explain for each finding: ``"logits"`` where ``zero_shot`` gives them, else ``"scores"``
    EXPLAINER_TARGET = "scores"

    def __init__(self, normalize: NormalizeMode = "minmax", fixed_threshold: GridThreshold = 0.5,
                 score_threshold: ClosedUnitInterval = 0.5, bootstrap: NonNegativeInt = 1000, bootstrap_seed: int = 0,
                 size_strata: tuple[OpenUnitInterval, OpenUnitInterval] = (0.01, 0.1), tune_from: str | None = None,
                 cxl: bool = False, negatives: bool = False, trainable: list[str] | None = None, lr: PositiveFloat = 1e-4,
                 weight_decay: NonNegativeFloat = 0.01, explainer: ExplainerName = "native", explainer_layer: str | None = None,
                 groups: GroupNames | None = None, trust: TrustMeasures | None = None, trust_seed: int = 0,
                 trust_steps: PositiveInt = 10, trust_baseline: Literal["blur", "mean"] = "blur",
                 trust_blur_sigma: PositiveFloat = 10.0, trust_stages: Literal["all", "last"] = "all",
                 trust_pairs: Literal["regions", "all"] = "regions", trust_fraction: ClosedUnitInterval = 1.0):
        super().__init__(normalize=normalize, fixed_threshold=fixed_threshold, score_threshold=score_threshold,  # Judge's
                         bootstrap=bootstrap, bootstrap_seed=bootstrap_seed, size_strata=size_strata, tune_from=tune_from,
                         cxl=cxl, negatives=negatives, groups=groups)
        if explainer not in self.explainers():
            raise ValueError(f"explainer {explainer!r}: {type(self).__name__} has no network to explain; it takes 'native' only")
        if explainer_layer is not None and explainer == "native":
            raise ValueError(f"explainer_layer {explainer_layer!r} needs an explainer (e.g. explainer='gradcam'); native maps have no layer")
        self.explainer, self.explainer_layer = explainer, explainer_layer
        self.trust, self.trust_seed, self.trust_steps, self.trust_baseline = trust, trust_seed, trust_steps, trust_baseline
        self.trust_blur_sigma, self.trust_stages, self.trust_pairs, self.trust_fraction = (trust_blur_sigma, trust_stages,
                                                                                           trust_pairs, trust_fraction)
        self.trust_run = None
        if trust:
            from xbench_pl.models.trust_run import TrustRun

            self.trust_run = TrustRun(trust, trust_seed, trust_steps, trust_baseline, trust_blur_sigma, trust_stages,
                                      trust_pairs, trust_fraction)
        self.explainer_method = None  # built by attach_explainer once the family has built its modules
        for pattern in trainable or ():
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"trainable: {pattern!r} is not a regular expression ({error})") from error
        if lr <= 0 or weight_decay < 0:
            raise ValueError(f"lr must be positive and weight_decay >= 0, got lr={lr}, weight_decay={weight_decay}")
        self.trainable = None if trainable is None else list(trainable)
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.frozen_modules: list[str] = []  # set by select_trainable: kept in eval mode while fitting
        self.gradients_checked = False
        self.val_benchmark = nn.ModuleDict()  # the validation metrics, fresh every epoch
        self.val_region_datasets: dict = {}
        self.val_results: dict[str, dict] = {}  # the last validation's tables
        self.val_history: list[dict] = []  # per validation epoch: epoch, step and each dataset's mean row
        self.results: dict[str, dict] = {}
        self.curves: dict[str, dict] = {}  # per dataset: Dice/IoU against tau, reliability bins (BenchmarkMetrics.curves)
        self.random_weights = False  # set by warn_random_weights; reports say so
        self.stand_ins: list[str] = []  # what a random_init model made up for missing files (stand_in)
        # with fewer images than ranks some rank has nothing to test: fine, its metrics still sync
        self.allow_zero_length_dataloader_with_multiple_devices = True

    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        raise NotImplementedError

    # -- explainers --------------------------------------------------------------------------
    @classmethod
    def explainers(cls) -> tuple[str, ...]:
        """The ``explainer`` values the class takes (what ``--model.help`` lists): ``native`` alone without an
        ``IMAGE_TOWER``, a network to explain."""
        return get_args(ExplainerName) if cls.IMAGE_TOWER is not None else ("native",)

    def attach_explainer(self) -> None:
        """Build the ``explainer`` (each family calls this once its modules are built): a layer the model lacks,
        or a method its architecture has nothing for, fails here, before any data is read."""
        if self.explainer != "native":
            from xbench_pl.explainers import build_explainer  # pytorch-grad-cam loads only where a model explains

            self.explainer_method = build_explainer(self, self.explainer, self.explainer_layer)

    @property
    def explainer_info(self) -> dict:
        """``{"name", "target_layer", "target", "library", "version"}`` of this model's maps."""
        from xbench_pl.explainers import explainer_info

        return explainer_info(self.explainer, self.explainer_method, self.EXPLAINER_TARGET)

    def explainer_forward(self, images: torch.Tensor, classes: list[str], grad: bool = True) -> tuple[ZeroShotOutput, torch.Tensor]:
        """``zero_shot`` (with autograd unless ``grad`` is false) and what explainers explain in it, ``[B, C]``: its
        logits or its scores (``EXPLAINER_TARGET``)."""
        output = self.zero_shot_with_grad(images, classes) if grad else self.zero_shot(images, classes)
        return output, output.logits if self.EXPLAINER_TARGET == "logits" else output.scores

    def embedding_caches(self) -> list[EmbeddingCache]:
        """Every ``EmbeddingCache`` the model holds (its cached text and query embeddings)."""
        return [value for value in vars(self).values() if isinstance(value, EmbeddingCache)]

    def thaw_caches(self) -> None:
        """Make the cached embeddings made in inference mode readable by autograd (explainers), keeping them."""
        for cache in self.embedding_caches():
            cache.thaw()

    def explained(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        """``zero_shot``, its maps replaced by the explainer's. Scores and logits are the native forward's: a CAM's own
        forward is that forward (the same operations, with autograd from its layer on), so is rollout's (it observes
        it); after an explainer that changes the forward (Chefer's explicit attention), the native forward runs again."""
        if self.explainer_method is None:
            return self.zero_shot(images, classes)
        from xbench_pl.explainers import explain

        maps, output = explain(self.explainer_method, self, images, classes)
        if output is None:
            output = self.zero_shot(images, classes)
        return ZeroShotOutput(scores=output.scores, saliency=maps.to(output.scores.device), logits=output.logits)

    def batch_output(self, batch: Batch) -> ZeroShotOutput:
        """What ``test_step`` scores for ``batch``: ``explained`` on its images and texts (``grounded``). A model that
        reads more of the batch than its images (the ``reader``: each image's id and size) overrides this."""
        return self.grounded(batch, self.explained)

    def map_output(self, batch: Batch) -> ZeroShotOutput:
        """Scores and maps of ``batch`` for what compares maps only (the trust measures' randomized copies):
        ``batch_output``; a model that does more work no map needs (a generative model's stated boxes) leaves it out."""
        return self.batch_output(batch)

    @staticmethod
    def grounded(batch: Batch, forward) -> ZeroShotOutput:
        """``forward(images, texts)`` (``zero_shot`` or a variant) over the batch, each sample with its own texts
        (``Batch.query_texts``): one call per distinct text list, its rows put back in batch order. A class-name
        batch is one call with the class names, so phrase grounding is the same path, not a second one."""
        groups = batch.query_texts()
        if len(groups) <= 1:  # one text list (or an empty batch): one call
            return forward(batch.images, list(groups[0][0]) if groups else batch.classes)
        parts = [(samples, forward(batch.images[samples.to(batch.images.device)], list(texts))) for texts, samples in groups]
        order = torch.cat([samples for samples, _ in parts]).argsort().to(parts[0][1].scores.device)

        def joined(field: str) -> torch.Tensor | None:
            values = [getattr(output, field) for _, output in parts]
            return None if values[0] is None else torch.cat(values)[order]

        stated = [output.stated for _, output in parts]
        return ZeroShotOutput(scores=joined("scores"), saliency=joined("saliency"), logits=joined("logits"),
                              stated=None if stated[0] is None else StatedBoxes.joined(stated, order))

    def stand_in(self, what: str, value):
        """``value``, made up in place of a missing file (``what``: "tokenizer", ...) by a model without a checkpoint;
        the random-weights warning names it."""
        self.stand_ins.append(what)
        return value

    def tokenizer_or_stand_in(self, text, weights, load, layout: str, **options):
        """The text folder's tokenizer (``load()``); without a text folder and weights (``random_init``) a stand-in
        of ``layout``'s vocabulary and special ids (``stand_ins.stand_in_tokenizer(layout, **options)``)."""
        if text is None and weights is None:
            return self.stand_in("tokenizer", stand_in_tokenizer(layout, **options))
        return load()

    def warn_random_weights(self) -> None:
        """Every model built with ``random_init=True`` and no checkpoint calls this: smoke runs only."""
        self.random_weights = True
        made_up = f" and a stand-in {' and '.join(self.stand_ins)} (no files)" if self.stand_ins else ""
        rank_zero_warn(f"{type(self).__name__} has RANDOM weights (random_init=True, no checkpoint){made_up}: "
                       "its scores and maps are meaningless; use it only to smoke-test a set-up")

    # -- evaluation -------------------------------------------------------------------------
    def add_dataset(self, name: str, classes: list[str]) -> None:
        # the trust measures run in tests only, never in fit's validation
        trust = self.trust_run.settings(self) if self.trust_run is not None and self.benchmark is not self.val_benchmark else None
        super().add_dataset(name, classes, trust)

    def on_test_start(self) -> None:
        # a resumed store's images are replayed from their maps, without the model: they would go unmeasured
        if self.trust_run is not None and any(getattr(callback, "resumed", None) for callback in self.trainer.callbacks):
            raise ValueError("--model.trust measures the model itself, which a run resumed from a prediction store does not "
                             "run on the stored images: use an empty --predictions folder")
        self.benchmark = nn.ModuleDict()
        self.region_datasets = {}
        datamodule = getattr(self.trainer, "datamodule", None)
        # every rank must hold the same metrics, even for a dataset it gets no batch of
        for spec in getattr(datamodule, "dataset_specs", []):
            self.add_dataset(spec.name, spec.classes)

    def test_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> TestStepOutput:
        judged = self.update_metrics(batch, self.batch_output(batch))
        if self.benchmark[batch.dataset].trust is not None:  # its forwards as the native one: under the trainer's precision
            self.update_trust(batch, judged.output)
        return judged

    def update_trust(self, batch: Batch, output: ZeroShotOutput) -> None:
        """The trust measures of ``batch``'s pairs (``trust_run.TrustRun.measure``) into its dataset's metrics."""
        measured = self.trust_run.measure(self, batch, output, self.normalize)
        if measured is None:
            return
        sample = measured["sample"]
        keys = torch.tensor([image_key(batch.image_ids[i]) for i in sample.tolist()], dtype=torch.long)
        self.benchmark[batch.dataset].update_trust(keys, batch_units(batch)[sample], measured["cls"], measured["values"],
                                                   measured["maps"])

    def found_region_dataset(self, name: str):
        """The trainer's datamodule's evaluated set of dataset ``name`` (cxl mode), if any."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        return {dm.name: dm.test_set for dm in getattr(datamodule, "datamodules", [])}.get(name)

    def on_test_epoch_end(self) -> None:
        self.results = {name: metrics.compute() for name, metrics in self.benchmark.items()}  # synced on every rank
        if self.trust_run is not None:
            self.trust_run.release()  # the randomized working copy is for this run's batches only
        self.curves = {name: metrics.curves for name, metrics in self.benchmark.items()}  # for plots (callbacks)
        # straight to the loggers (W&B, CSV, ...), from rank zero, in float64: these numbers are already
        # synced, so Lightning's self.log (which would cast to float32 and ask for sync_dist) is not used
        means = {f"{name}/{key}": value for name, table in self.results.items()
                 for key, value in table["mean"].items() if value is not None}
        if self.trainer.is_global_zero and means:
            for logger in self.loggers:
                logger.log_metrics(means, step=self.global_step)

    # -- fine-tuning (python -m xbench_pl fit) -------------------------------------------------------
    def setup(self, stage: str) -> None:
        if stage == "fit":  # before the strategy wraps the model (DDP registers the trainable parameters)
            self.select_trainable()

    def select_trainable(self) -> list[str]:
        """Train the parameters ``trainable`` (else ``TRAINABLE``) selects and freeze the rest; the
        largest modules without a trained parameter are kept in eval mode while fitting, so frozen
        BatchNorm statistics and dropout behave as at test time. Returns the trained names."""
        patterns = list(self.TRAINABLE if self.trainable is None else self.trainable)
        names = [name for name, _ in self.named_parameters()]
        chosen = {name for name in names if any(re.search(p, name) for p in patterns)}
        if not chosen:
            example = f" (e.g. {', '.join(names[:3])}; set --model.trainable)" if names else ""
            raise ValueError(f"{type(self).__name__} has nothing to fit: trainable {patterns} matches none of its "
                             f"{len(names)} parameters{example}")
        for name, parameter in self.named_parameters():
            parameter.requires_grad_(name in chosen)
        self.frozen_modules = []
        for name, module in self.named_modules():
            inside = any(name.startswith(f"{f}.") for f in self.frozen_modules)
            state = any(True for _ in module.parameters()) or any(True for _ in module.buffers())
            if name and not inside and state and not any(p.requires_grad for p in module.parameters()):
                self.frozen_modules.append(name)
        self.gradients_checked = False
        self.train()  # Lightning keeps a module's mode: the families build theirs in eval mode
        return [name for name in names if name in chosen]

    def train(self, mode: bool = True):
        super().train(mode)
        if mode:
            for name in getattr(self, "frozen_modules", ()):  # none before __init__ has set them
                self.get_submodule(name).eval()
        return self

    def load_state_dict(self, *args, **kwargs):
        if self.CACHES_FOLLOW_WEIGHTS:
            self.clear_caches()  # the cached embeddings belong to the old weights
        return super().load_state_dict(*args, **kwargs)

    def clear_caches(self) -> None:
        """Drop the model's cached text and query embeddings (every ``EmbeddingCache`` it holds). While
        fitting the weights change every step, and a cache filled under validation's inference mode
        cannot take part in autograd."""
        for cache in self.embedding_caches():
            cache.clear()

    def zero_shot_with_grad(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        """``zero_shot`` with autograd on: the families decorate it ``@torch.no_grad()`` for inference, and
        torch's decorator keeps the plain function as ``__wrapped__``, which runs here."""
        with torch.enable_grad():
            return inspect.unwrap(type(self).zero_shot)(self, images, classes)

    @staticmethod
    def training_logits(output: ZeroShotOutput) -> torch.Tensor:
        """``[B, C]`` logits for the loss: ``output.logits`` where the model gives them (CARZero's raw
        score), else ``logit(scores)`` with the scores clamped to [1e-6, 1 - 1e-6] (exact for the
        softmax-of-two scores of CLIP-style models and the query decoders: the logit difference; a score
        saturated beyond the clamp gives no gradient)."""
        if output.logits is not None:
            return output.logits.float()
        return torch.logit(output.scores.float(), eps=SCORE_EPS)

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        self.clear_caches()  # embeddings of the previous step's weights (or of validation) are stale

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """Binary cross-entropy of ``training_logits`` against ``batch.labels``, mean over (image, finding)."""
        output = self.grounded(batch, self.zero_shot_with_grad)
        logits = self.training_logits(output)
        counted = batch.counted.to(logits.device)
        loss = F.binary_cross_entropy_with_logits(logits[counted], batch.labels[counted].to(logits))
        self.log("train/loss", loss, prog_bar=True, batch_size=int(counted.sum()))
        return loss

    def on_after_backward(self) -> None:
        if self.gradients_checked:
            return
        self.gradients_checked = True
        idle = [name for name, p in self.named_parameters() if p.requires_grad and p.grad is None]
        if idle:
            raise ValueError(f"trainable: {len(idle)} selected parameter(s) get no gradient through zero_shot (first: "
                             f"{', '.join(idle[:3])}); the query decoders embed their texts without gradients and cache "
                             "them (KAD, DeViDe and CARZero text towers): leave those out of --model.trainable")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep only what fit changes: the trained parameters and the buffers outside frozen modules. The rest,
        the base weights the model's options (its ``checkpoint``, architecture ...) build, is recorded in
        ``FIT_RECORD`` by class, name and fingerprint: ``on_load_checkpoint`` puts it back."""
        frozen = tuple(f"{name}." for name in self.frozen_modules)
        changed = ({name for name, p in self.named_parameters() if p.requires_grad}
                   | {name for name, _ in self.named_buffers() if not name.startswith(frozen)})
        state = checkpoint["state_dict"]
        checkpoint[FIT_RECORD] = {"model": qualified_name(type(self)), "name": getattr(self, "model_name", None),
                                  "base_weights": weights_fingerprint({k: v for k, v in state.items() if k not in changed})}
        checkpoint["state_dict"] = {k: v for k, v in state.items() if k in changed}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A ``fit`` checkpoint's trained tensors over this model's own base weights, which must be those it
        was fitted on (a checkpoint without ``FIT_RECORD`` holds every tensor and loads as it is)."""
        record = checkpoint.get(FIT_RECORD)
        if record is None:
            return
        base = {k: v for k, v in self.state_dict().items() if k not in checkpoint["state_dict"]}
        if record["model"] != qualified_name(type(self)) or record["base_weights"] != weights_fingerprint(base):
            raise CheckpointError(f"--ckpt_path: the checkpoint was fitted on {fit_checkpoint_name(record)} with other "
                                  f"base weights than this {type(self).__name__} has: test it with the --model options "
                                  "fit had (its fit.json records them)")
        checkpoint["state_dict"] = {**base, **checkpoint["state_dict"]}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        trained = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in trained if p.ndim >= 2], "weight_decay": self.weight_decay},
                  {"params": [p for p in trained if p.ndim < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=self.lr)

    @contextmanager
    def metrics_target(self, benchmark: nn.ModuleDict, region_datasets: dict):
        """``test_step`` (and ``add_dataset``) feeding ``benchmark`` instead of the test metrics."""
        saved = self.benchmark, self.region_datasets
        self.benchmark, self.region_datasets = benchmark, region_datasets
        try:
            yield
        finally:
            self.benchmark, self.region_datasets = saved

    def on_validation_epoch_start(self) -> None:
        self.clear_caches()  # filled by training steps with the weights before their update
        datamodule = getattr(self.trainer, "datamodule", None)
        self.val_benchmark = nn.ModuleDict()  # fresh metrics every epoch: nothing accumulates across epochs
        self.val_region_datasets = {dm.name: dm.val_set for dm in getattr(datamodule, "datamodules", [])
                                    if getattr(dm, "val_set", None) is not None}
        with self.metrics_target(self.val_benchmark, self.val_region_datasets):
            for spec in getattr(datamodule, "dataset_specs", []):  # every rank holds the same metrics
                self.add_dataset(spec.name, spec.classes)

    def validation_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> TestStepOutput:
        """``test_step`` itself (checks, warp to the eval grid, metric update) into the validation metrics."""
        with self.metrics_target(self.val_benchmark, self.val_region_datasets):
            return self.test_step(batch, batch_idx, dataloader_idx)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:  # a few batches to fail early, not a validation: nothing computed
            for metrics in self.val_benchmark.values():
                metrics.reset()
            return
        self.val_results = {name: metrics.compute() for name, metrics in self.val_benchmark.items()}  # synced
        for metrics in self.val_benchmark.values():
            metrics.reset()  # the next epoch starts from zero
        self.val_history.append({"epoch": self.current_epoch, "step": self.global_step,
                                 "mean": {name: table["mean"] for name, table in self.val_results.items()}})
        means = {f"val/{name}/{key}": value for name, table in self.val_results.items()
                 for key, value in table["mean"].items() if value is not None}
        if self.trainer.is_global_zero and means:  # as on_test_epoch_end: the loggers get the float64 values
            for logger in self.loggers:
                logger.log_metrics(means, step=self.global_step)
        if means:  # and callbacks (ModelCheckpoint(monitor=...), EarlyStopping) see them; equal on every rank
            self.log_dict({key: float(value) for key, value in means.items()}, logger=False, sync_dist=True)
