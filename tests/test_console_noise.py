"""What a run prints beside its results: a long ``error:`` line wrapped on a terminal (whole in a log, which programs
read); one ``warning:`` line where bf16 mixed precision runs on a CPU (slower than float32 there); none of W&B's own
lines in a run that logs to W&B, whose end still says where the run is."""

import io
import sys

from jsonargparse import Namespace
from test_cli import cli

from xbench_pl.commands import print_error
from xbench_pl.commands.trainer import slow_precision

SLOW = ("warning: --trainer.precision bf16-mixed on a CPU: bfloat16 autocast runs about 2.6 times slower than float32 "
        "there; leave the option out on a CPU")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_error_line_is_wrapped_on_a_terminal_and_whole_in_a_log(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    message = "--data.root /path/to/xbench_datasets: no such folder (give the dataset's folder as it unpacks from its source)"
    monkeypatch.setattr(sys, "stderr", Terminal())
    print_error(message)
    lines = sys.stderr.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= 60 for line in lines) and all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == f"error: {message}"
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log, a pipe
    print_error(message)
    assert sys.stderr.getvalue() == f"error: {message}\n"


def test_bf16_mixed_precision_is_said_to_be_slow_on_a_cpu_only():
    on_cpu = dict(accelerator="cpu", devices=1)
    assert slow_precision(Namespace(precision="bf16-mixed", **on_cpu)) == SLOW
    assert "--trainer.precision 16-mixed on a CPU" in slow_precision(Namespace(precision="16-mixed", **on_cpu))  # bf16 there
    assert all(slow_precision(Namespace(precision=p, **on_cpu)) is None for p in (None, "32-true", "64-true", "bf16-true"))


def test_a_wandb_run_on_a_cpu_in_bf16_prints_our_lines_not_wandbs(tmp_path):
    """As a user runs it (a process of its own: W&B keeps state per process): bf16-mixed on the CPU, logging to W&B
    offline. One warning line of ours; no ``wandb:`` line (W&B warned of Lightning's ``anonymous`` argument before
    it read ``WANDB_SILENT``); the closing line says where the W&B run is."""
    result = cli("test", "--model", "center", "--model.bootstrap", "0", "--data", "demo", "--trainer.accelerator", "cpu",
                 "--trainer.precision", "bf16-mixed", "--trainer.logger", "lightning.pytorch.loggers.WandbLogger",
                 "--trainer.enable_progress_bar", "false", "--out", str(tmp_path), COLUMNS="300")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = (result.stdout + result.stderr).splitlines()
    assert [line for line in printed if line.startswith("wandb:")] == []
    assert [line for line in result.stderr.splitlines() if line.startswith("warning:")] == [SLOW]
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert f"W&B run saved offline in {run} (upload: wandb sync {run})" in printed
