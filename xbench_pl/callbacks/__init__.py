"""Trainer callbacks that make a run visible: heatmap samples and calibration plots.

``SaliencySamples`` (``heatmaps.py``) and ``CalibrationPlots`` (``calibration.py``) read what
``ZeroShotModel.test_step`` returns and what the metrics computed; they never run the model or
change a metric. They log to a ``WandbLogger`` when the trainer has one and always write PNG,
CSV and JSON files under the run's ``--out`` folder. Presets: ``callbacks/wandb.yaml`` (W&B
logger + both callbacks) and ``callbacks/png.yaml`` (both callbacks, files only).
"""

from __future__ import annotations

import importlib
import os

__all__ = ["CalibrationPlots", "SaliencySamples", "wandb_defaults"]

_LAZY = {"SaliencySamples": "xbench_pl.callbacks.heatmaps", "CalibrationPlots": "xbench_pl.callbacks.calibration"}


def wandb_defaults() -> None:
    """W&B runs offline unless the user chose a mode (``WANDB_MODE``) or a ``wandb agent`` launched us
    (``WANDB_SWEEP_ID``: the agent needs the run online). An offline run syncs later with ``wandb sync``.
    Unless the user set them, W&B prints nothing (``WANDB_SILENT``; the run's end says where it is,
    ``wandb_summary``) and leaves the console alone (``WANDB_CONSOLE=off``: it would re-print our output
    with terminal codes)."""
    if not os.environ.get("WANDB_MODE") and not os.environ.get("WANDB_SWEEP_ID"):
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_CONSOLE", "off")


def wandb_summary(trainer) -> str | None:
    """Where the trainer's W&B run is (its URL, or its folder and how to sync it when offline); None without one."""
    from xbench_pl.callbacks.common import wandb_logger

    logger = wandb_logger(trainer)
    if logger is None:
        return None
    run = logger.experiment
    if run.settings.mode == "offline":
        return f"W&B run saved offline in {run.settings.sync_dir} (upload: wandb sync {run.settings.sync_dir})"
    return f"W&B run: {run.url}"


def __getattr__(name: str):  # matplotlib is imported only when a callback is used
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
