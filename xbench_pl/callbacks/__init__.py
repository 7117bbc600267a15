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

__all__ = ["CalibrationPlots", "SaliencySamples", "wandb_offline_by_default"]

_LAZY = {"SaliencySamples": "xbench_pl.callbacks.heatmaps", "CalibrationPlots": "xbench_pl.callbacks.calibration"}


def wandb_offline_by_default() -> None:
    """W&B runs offline unless the user chose a mode (``WANDB_MODE``) or a ``wandb agent`` launched us
    (``WANDB_SWEEP_ID``: the agent needs the run online). An offline run syncs later with ``wandb sync``."""
    if not os.environ.get("WANDB_MODE") and not os.environ.get("WANDB_SWEEP_ID"):
        os.environ["WANDB_MODE"] = "offline"


def __getattr__(name: str):  # matplotlib is imported only when a callback is used
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
