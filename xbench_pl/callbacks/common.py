"""What the visual callbacks share: where to write, the W&B logger, gathering to rank zero, figures."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from xbench_pl.outputs import OutputFolder


def output_dir(trainer, dirpath: str | None) -> Path:
    """``dirpath`` if given, else the trainer's ``default_root_dir`` (the CLI sets it to ``--out``)."""
    return Path(dirpath if dirpath is not None else trainer.default_root_dir)


def output_folder(trainer, dirpath: str | None) -> OutputFolder:
    """Where a callback writes: the run's ``OutputFolder`` (``trainer.output_folder``, set by the CLI: shared with
    ``metrics.json``, so that a late failure moves every file of the run together) when ``output_dir`` is its
    folder, else a new one (which the callback ``close``s)."""
    folder = output_dir(trainer, dirpath)
    run = getattr(trainer, "output_folder", None)
    if run is not None and os.path.abspath(run.root) == os.path.abspath(folder):
        return run
    return OutputFolder(folder)


def close_own(trainer, outputs: OutputFolder) -> None:
    """``close`` an ``OutputFolder`` that is not the run's (whose owner closes it after the last file)."""
    if outputs is not getattr(trainer, "output_folder", None):
        outputs.close()


def wandb_logger(trainer, required: bool = False):
    """The trainer's ``WandbLogger``, or None (an error if ``required``)."""
    from lightning.pytorch.loggers import WandbLogger

    found = next((logger for logger in trainer.loggers if isinstance(logger, WandbLogger)), None)
    if found is None and required:
        raise ValueError("this callback has require_wandb=true but the trainer has no WandbLogger "
                         "(--trainer.logger lightning.pytorch.loggers.WandbLogger, or --config callbacks/wandb.yaml)")
    return found


def gather_to_rank_zero(trainer, obj) -> list | None:
    """Every rank's ``obj`` on rank zero (a list in rank order), None elsewhere; ``[obj]`` without DDP."""
    if trainer.world_size == 1 or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return [obj]
    gathered = [None] * trainer.world_size if trainer.is_global_zero else None
    torch.distributed.gather_object(obj, gathered, dst=0)
    return gathered


def safe_name(text: str) -> str:
    """A file name for a finding or image id (letters, digits, ``._-``; the rest become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "_"


def model_name(pl_module) -> str:
    return getattr(pl_module, "model_name", None) or type(pl_module).__name__


def new_figure(width: float, height: float, margins: tuple[float, float, float, float]):
    """A matplotlib figure not tied to pyplot (no global state, no display): ``fig.savefig`` renders with Agg. Its
    subplots fill it less ``margins`` (left, bottom, right, top, in inches): fixed room for these figures' labels,
    whose size is fixed, instead of a layout engine, which draws each figure twice (once to measure it) and took
    60 % of the time of a run's heatmaps and calibration plots."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    left, bottom, right, top = margins
    fig.subplots_adjust(left=left / width, bottom=bottom / height, right=1 - right / width, top=1 - top / height)
    return fig
