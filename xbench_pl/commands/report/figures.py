"""What every figure of the report shares: its size in inches at one resolution, a constrained layout, and labels
wrapped to a width. matplotlib is imported only when a figure is drawn (the command starts without it)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from xbench_pl.outputs import atomic_write, figure_png

#: characters per line of a wrapped tick label (a run's or a model's name)
LABEL_WIDTH = 32


def new_figure(width: float, height: float):
    """A matplotlib ``Figure`` (no pyplot: nothing global) of ``width`` x ``height`` inches."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def wrapped(text: str) -> str:
    """``text`` in lines of about ``LABEL_WIDTH`` characters, broken between words only (as the tables' headers)."""
    return textwrap.fill(text, LABEL_WIDTH, break_long_words=False, break_on_hyphens=False)


def save(fig, path: Path) -> None:
    """Write ``fig`` as a PNG at ``path``, whole or not at all (``outputs.atomic_write``)."""
    atomic_write(path, figure_png(fig))
