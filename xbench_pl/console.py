"""What a run tells a person while it works: one-off notes and progress lines.

Both go to stderr (stdout keeps the results: tables and the files written), from rank zero only,
as plain lines without terminal codes, so a log file (SLURM, CI) reads like the terminal.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import textwrap
import time
from datetime import timedelta

#: the console width where stdout is no terminal and ``COLUMNS`` is unset (logs, pipes)
DEFAULT_WIDTH = 100
#: a command's loops (score, compare, report) say nothing before this: short inputs need no progress
QUIET_SECONDS = 3.0


def is_rank_zero() -> bool:
    return all(int(os.environ.get(v, "0") or 0) == 0 for v in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def interactive() -> bool:
    """Whether a person watches both streams live (a live progress bar makes sense), rather than a log or a pipe."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def width() -> int:
    """The terminal's width: ``COLUMNS`` if set, else the terminal's, else ``DEFAULT_WIDTH``."""
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def wrap(text: str) -> str:
    """``text`` wrapped at word boundaries to the terminal's ``width``, continuation lines indented; a word longer
    than a line (a path) stays whole."""
    return textwrap.fill(text, width(), subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def say(text: str = "", file=None) -> None:
    """Print ``text`` (stdout by default), each of its lines wrapped to the terminal (``wrap``) but table lines (``|``
    first: ``report.console_table`` fits them already)."""
    lines = text.split("\n")
    print("\n".join(line if not line or line.startswith("|") else wrap(line) for line in lines), file=file or sys.stdout,
          flush=True)


def note(message: str) -> None:
    """One line on stderr from rank zero: what the run is doing that a person would otherwise wonder about
    (wrapped to the terminal's width)."""
    if is_rank_zero():
        say(message, file=sys.stderr)


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class ProgressLines:
    """``LABEL: DONE/TOTAL UNIT (P %), ELAPSED elapsed, ~LEFT left`` every ``every`` steps and when the loop
    ends (``note``). ``every`` (default): a tenth of the loop, at most 50 steps, so a long run still shows
    a line every few minutes; 50 where the total is unknown. No line before ``after`` seconds: a loop that
    ends sooner says nothing."""

    def __init__(self, label: str, total: float | None, unit: str = "batches", every: int | None = None,
                 after: float = 0.0):
        self.label, self.unit, self.after = label, unit, after
        self.total = int(total) if total is not None and math.isfinite(total) else None
        self.every = every or (max(1, min(50, math.ceil(self.total / 10))) if self.total else 50)
        self.done = 0
        self.started = time.monotonic()

    def step(self, count: int = 1, extra: str = "") -> None:
        """``count`` more steps done; ``extra`` (e.g. the loss) ends the line."""
        before, self.done = self.done, self.done + count
        if self.done // self.every == before // self.every and self.done != self.total:
            return
        elapsed = time.monotonic() - self.started
        if elapsed < self.after:
            return
        if self.total:
            line = f"{self.label}: {self.done}/{self.total} {self.unit} ({100 * self.done // self.total} %), {_clock(elapsed)} elapsed"
            if self.done < self.total:
                line += f", ~{_clock(elapsed / self.done * (self.total - self.done))} left"
        else:
            line = f"{self.label}: {self.done} {self.unit}, {_clock(elapsed)} elapsed"
        note(line + (f", {extra}" if extra else ""))
