"""``PredictionWriter``: a trainer callback that saves every prediction of a ``test`` run to a store.

The CLI adds it for ``test --predictions DIR [--resume] [--predictions_dtype float32]``; any
trainer can add it itself (``trainer.callbacks``, or ``--trainer.callbacks`` in a config).
It reads what ``ZeroShotModel.test_step`` returns (``outputs``: its ``ZeroShotOutput``) and the
batch (image ids, affine, original sizes) in ``on_test_batch_end``: it never runs the model. Each
rank writes its own shards (``xbench_pl.prediction_store``), every ``shard_images`` images of a dataset
and at the end of the epoch (or when the run raises), so a crash loses at most the images since
the last shard.

``resume=True`` continues a store: the images of its intact shards are left out of the test
loader (``XBenchData.skip_ids``) and fed to the metrics from the store instead, through the
same warp and ``BenchmarkMetrics.update`` (``predictions.replay``), spread over the ranks; a
truncated or corrupt shard is set aside (``DIR/corrupt/``) and its images computed again. With a
float32 store (or a model whose maps are float16) ``metrics.json`` then equals an uninterrupted
run's byte for byte. A store written by another configuration (model, its config, data config,
precision, metric settings, dtype, xbench_pl version) is refused, and so is a non-empty store
without ``resume``.

A write into the store that fails (a full disk) stops the store, not the run: the files written so
far stay whole, nothing more is written (a manifest that could not be written stops every rank's
shards), and the run computes its metrics to the end. ``failure`` then says what failed, and
``stored_images`` what the store kept (``--resume`` stores the rest); at the end of the test a
warning says so (``warn_failure``), or the CLI, which reports it in its error line once
``metrics.json`` is written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from xbench_pl.console import note
from xbench_pl.outputs import write_failure
from xbench_pl.prediction_store import DTYPES, Store, StoreError, check_same_config, manifest
from xbench_pl.judging import StatedBoxes, judge_settings
from xbench_pl.predictions import replay
from xbench_pl.registry import qualified_name


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text) or "_"


class PredictionWriter(Callback):
    """Write every (image, finding)'s score and native-grid map of a test run to ``dirpath``.

    Args:
        dirpath: the store folder (created if missing).
        dtype: the maps' dtype in the store: ``float16`` (default, half the size), ``bfloat16``
            or ``float32`` (bit-identical re-scoring and resuming for float32 models).
        resume: continue the store in ``dirpath`` (skip the images it holds); without it, a
            store that already holds predictions is refused.
        shard_images: images of one dataset per shard (a crash loses at most these per rank).
        config: the run's ``{"model", "data", "precision"}`` config as ``metrics.json`` records it
            (the CLI passes it); by default the model's and datamodule's class paths, the
            datasets' names, classes and eval size, and the trainer's precision.
        model_name: the model's name in the report (the CLI's ``--model`` value).
        warn_failure: warn at the end of the test when a write into the store failed (``failure``); the CLI, which
            says so in its error line, turns it off.
    """

    def __init__(self, dirpath: str, dtype: str = "float16", resume: bool = False, shard_images: int = 64,
                 config: dict | None = None, model_name: str | None = None, warn_failure: bool = True):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if shard_images < 1:
            raise ValueError(f"shard_images must be positive, got {shard_images}")
        self.store = Store(dirpath)
        self.dtype, self.resume, self.shard_images = dtype, resume, shard_images
        self.config, self.model_name = config, model_name
        self.buffers: dict[str, list[dict]] = {}
        self.buffered: dict[str, int] = {}  # dataset -> images in its buffer, kept as batches arrive
        self.pending: list[dict] = []  # stored shards this rank replays into the metrics
        self.resumed: dict[str, set[str]] = {}  # dataset -> image ids taken from the store
        self.written = 0
        self.token = ""
        self.failure: str | None = None  # the write into the store that failed: nothing was written after it
        self.warn_failure = warn_failure

    # -- set-up: the manifest, the check, what to skip --------------------------------------
    def default_config(self, trainer, pl_module) -> dict:
        datamodule = trainer.datamodule
        return {
            "model": {"class_path": qualified_name(type(pl_module))},
            "data": {"class_path": qualified_name(type(datamodule)),
                     "datasets": {spec.name: list(spec.classes) for spec in getattr(datamodule, "dataset_specs", [])},
                     "eval_size": getattr(datamodule, "eval_size", None)},
            "precision": str(trainer.precision),
        }

    def wanted_manifest(self, trainer, pl_module) -> dict:
        return manifest(self.model_name, self.config or self.default_config(trainer, pl_module), judge_settings(pl_module), self.dtype,
                        bool(getattr(pl_module, "random_weights", False)), getattr(pl_module, "explainer_info", None))

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "test":
            return
        self.failure = None
        wanted = self.wanted_manifest(trainer, pl_module)
        stored = self.store.read_manifest()
        good, bad = self.store.load()  # every rank reads the same files before anyone writes
        if stored is None and (good or bad):
            raise StoreError(f"{self.store.shards_dir} holds shards but {self.store.manifest_path} is missing: "
                             "not a store this package wrote; use another --predictions folder")
        check_same_config(self.store, stored, wanted)
        if (good or bad) and not self.resume:
            raise StoreError(f"the prediction store {self.store} already holds {sum(len(s['image_ids']) for s in good)} "
                             "image(s); pass --resume to continue it, or choose an empty --predictions folder")
        children = {dm.name: dm for dm in getattr(trainer.datamodule, "datamodules", [])}
        done: dict[str, set[str]] = {}
        for shard in good:
            name = shard["dataset"]
            if name not in children:
                raise StoreError(f"{shard['path']}: dataset {name!r} is not evaluated by this run ({sorted(children)})")
            known = {record.image_id for record in children[name].test_set.records}
            unknown = [i for i in shard["image_ids"] if i not in known]
            if unknown:
                raise StoreError(f"{shard['path']}: image {unknown[0]!r} (and {len(unknown) - 1} more) is not in "
                                 f"{name}'s evaluated set; the store was written for another split")
            done.setdefault(name, set()).update(shard["image_ids"])
        for name, child in children.items():
            child.skip_ids = set(done.get(name, ()))
        self.resumed = done
        rank, world = trainer.global_rank, trainer.world_size
        self.pending = good[rank::world]  # each stored shard replayed by one rank: metrics sums are order-free
        trainer.strategy.barrier("prediction_store_read")
        if trainer.is_global_zero:
            if self.resume:
                taken, total = sum(map(len, done.values())), sum(len(c.test_set.records) for c in children.values())
                note(f"--resume: {taken} of {total} images from the prediction store {self.store.root}, "
                     f"{total - taken} to compute")
            if stored is None:
                self.write(lambda: self.store.write_manifest(wanted))
            if bad:
                rank_zero_warn(f"{len(bad)} unreadable shard(s) set aside in {self.store.root / 'corrupt'} and their images "
                               "computed again: " + "; ".join(str(b) for b in bad[:3]))
                self.store.set_aside(bad)
        trainer.strategy.barrier("prediction_store_ready")
        self.failure = trainer.strategy.broadcast(self.failure, src=0)  # without its manifest no rank writes a shard
        self.token = f"{time.time_ns():x}-{os.getpid()}"
        self.buffers, self.buffered, self.written = {}, {}, 0

    # -- resuming: stored images go into the metrics -----------------------------------------
    def on_test_epoch_start(self, trainer, pl_module) -> None:
        if not self.pending:
            return
        children = {dm.name: dm for dm in trainer.datamodule.datamodules}
        for name in {shard["dataset"] for shard in self.pending}:
            if name not in pl_module.benchmark:
                pl_module.add_dataset(name, children[name].classes)
        # the stored answers into the model's own metrics, judged by the model itself (a ZeroShotModel is a Judge)
        while self.pending:
            shard = self.pending.pop(0)
            replay(pl_module, children[shard["dataset"]].test_set, shard)

    # -- writing -------------------------------------------------------------------------------
    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        output = getattr(outputs, "output", outputs)  # TestStepOutput, or a bare ZeroShotOutput
        if not hasattr(output, "scores") or not hasattr(output, "saliency"):
            raise StoreError(f"{type(pl_module).__name__}.test_step returned {type(outputs).__name__}; the prediction store "
                             "needs its ZeroShotOutput (scores and saliency)")
        counted = batch.counted.cpu()
        if not counted.any():
            return
        keep = counted.nonzero().flatten()
        saliency = output.saliency.detach()[keep.to(output.saliency.device)]
        stored = saliency.to("cpu", DTYPES[self.dtype])
        if not torch.isfinite(stored).all():  # test_step already refused non-finite maps: the cast overflowed
            raise StoreError(f"{type(pl_module).__name__}'s maps exceed the range of {self.dtype} (max |value| "
                             f"{saliency.abs().max().item():.4g}): store them as float32 (--predictions_dtype float32)")
        self.buffers.setdefault(batch.dataset, []).append({
            "image_ids": [batch.image_ids[i] for i in keep.tolist()],
            "classes": list(batch.classes),
            "scores": output.scores.detach()[keep.to(output.scores.device)].to("cpu", torch.float64),
            "saliency": stored,
            "affine": batch.affine[keep.to(batch.affine.device)].to("cpu", torch.float64),
            "original_size": batch.original_size[keep.to(batch.original_size.device)].cpu().long(),
            "labels": batch.labels[keep.to(batch.labels.device)].cpu().to(torch.uint8),
            "input_size": int(batch.images.shape[-1]),
            "stated": None if output.stated is None else output.stated.rows(keep),
        })
        self.buffered[batch.dataset] = self.buffered.get(batch.dataset, 0) + len(keep)
        if self.buffered[batch.dataset] >= self.shard_images:
            self.flush(trainer, batch.dataset)

    def flush(self, trainer, dataset: str) -> None:
        parts = self.buffers.pop(dataset, [])
        self.buffered.pop(dataset, None)
        if not parts or self.failure is not None:  # a store that could not be written takes no more
            return
        sizes = {part["input_size"] for part in parts}
        grids = {tuple(part["saliency"].shape[-2:]) for part in parts}
        if len(sizes) > 1 or len(grids) > 1:
            raise StoreError(f"{dataset}: model input sizes {sorted(sizes)} / map grids {sorted(grids)} vary between batches")
        shard = {
            "dataset": dataset,
            "classes": parts[0]["classes"],
            "input_size": parts[0]["input_size"],
            "image_ids": [i for part in parts for i in part["image_ids"]],
            **{k: torch.cat([part[k] for part in parts]) for k in ("scores", "saliency", "affine", "original_size", "labels")},
        }
        if parts[0]["stated"] is not None:  # the boxes a model stated and its raw answers
            shard["stated"] = StatedBoxes.joined([part["stated"] for part in parts])
        name = f"{_safe(dataset)}-rank{trainer.global_rank}-{self.token}-{self.written:05d}"
        if self.write(lambda: self.store.write_shard(name, shard)):
            self.written += 1

    def write(self, write: Callable[[], object]) -> bool:
        """``write()`` into the store, unless a write failed before; whether it was written. A write that fails (disk
        full) is kept as ``failure`` and stops the store, not the run."""
        if self.failure is not None:
            return False
        try:
            write()
        except OSError as error:
            self.failure = write_failure(error, self.store.root)
            return False
        return True

    def stored_images(self) -> int:
        """The images in the store's shards that read back intact (every rank's, this run's and earlier ones)."""
        return sum(len(shard["image_ids"]) for shard in self.store.load()[0])

    def failure_message(self, total: int | None) -> str:
        """What failed and what the store kept of ``total`` images (None: unknown) and lost: one line."""
        kept = self.stored_images()
        lost = "" if total is None else f" of the {total} images, the other {total - kept} were computed but not stored"
        return f"{self.failure}; the store kept {kept}{lost}"

    def flush_all(self, trainer) -> None:
        for dataset in list(self.buffers):
            self.flush(trainer, dataset)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self.flush_all(trainer)
        failed = trainer.strategy.reduce_boolean_decision(self.failure is not None, all=False)
        if failed and self.failure is None:  # rank zero says it: another rank's store write failed
            self.failure = "a write into the store failed on another rank"

    def on_test_end(self, trainer, pl_module) -> None:
        if self.failure is not None and self.warn_failure and trainer.is_global_zero:
            children = getattr(trainer.datamodule, "datamodules", [])
            total = sum(len(child.test_set.records) for child in children) if children else None
            rank_zero_warn(f"prediction store {self.store}: {self.failure_message(total)}")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # the buffered batches are complete predictions: keep them for --resume
        if self.buffers and self.token:
            self.flush_all(trainer)
