"""Console output a person can read: the printed table fits the terminal (100 columns in a log), plain
progress lines where the output is a pipe, no terminal codes, and the notes of a first run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from test_cli import cli

from xbench_pl.callbacks import wandb_defaults
from xbench_pl.commands import main
from xbench_pl.console import ProgressLines
from xbench_pl.data.synthetic import ensure_demo
from xbench_pl.metrics import kernels
from xbench_pl.metrics.benchmark import metric_keys
from xbench_pl.run_files import DEFAULT_COLUMNS, column_names, console_columns, console_table, parse_columns

ANSI = re.compile(r"\x1b\[")
PROGRESS = re.compile(r"^test demo: (\d+)/(\d+) batches \(\d+ %\), \d+:\d\d:\d\d elapsed", re.M)


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def full_row(seed: float) -> dict:
    return {key: (12 if key.startswith("n_") else round(seed + i / 1000, 3)) for i, key in enumerate(column_names())}


def piped_run(folder: Path) -> subprocess.CompletedProcess:
    """The background job of the test below: a run in a fresh process, its output in pipes, its imports profiled
    (``-X importtime``: what it imported, on stderr); out in ``folder``."""
    return cli("test", "--model", "location_prior", "--data", "demo", "--data.batch_size", "1", "--out", str(folder),
               PYTHONPROFILEIMPORTTIME="1")


@pytest.mark.background(job=piped_run)
def test_a_piped_run_prints_progress_lines_and_a_table_that_fits_100_columns(background):
    tmp_path, result = background
    assert result.returncode == 0, result.stderr[-3000:]
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\w+)", result.stderr, re.M))
    assert "lightning" in imported  # the run was profiled
    assert not imported & {"pytorch_grad_cam", "open_clip", "timm", "sklearn"}, imported  # native maps: no explainer library
    assert not ANSI.search(result.stdout + result.stderr)
    steps = [(int(a), int(b)) for a, b in PROGRESS.findall(result.stderr)]
    assert steps[-1] == (12, 12) and len(steps) > 2  # a line every few batches and a final one (12 images, batch 1)
    lines = table_lines(result.stdout)
    assert lines and max(map(len, lines)) <= 100
    headers = [h for line in lines if line.startswith("| dataset") for h in re.split(r"\s*\|\s*", line.strip("| "))[1:]]
    assert headers == list(DEFAULT_COLUMNS)  # in order, over as many tables as 100 columns take
    assert f"every column: {tmp_path / 'metrics.md'}" in " ".join(result.stdout.split())  # wrapped to the width


def test_columns_all_prints_every_key_within_the_terminal_width(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["test", "--model", "location_prior", "--data", "demo", "--columns", "all", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = table_lines(out)
    assert max(map(len, lines)) <= 80
    headers = [h for line in lines if line.startswith("| dataset") for h in re.split(r"\s*\|\s*", line.strip("| "))[1:]]
    assert headers == [*metric_keys(), "n_pos", "n_neg", "n_regions"]  # every key, in order, over several tables
    assert "columns; every column" not in out


def test_chosen_columns_and_unknown_keys(tmp_path, capsys):
    assert main(["test", "--model", "location_prior", "--data", "demo", "--columns", "auroc,n_regions",
                 "--trainer.enable_progress_bar", "false", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert table_lines(captured.out)[0].split() == ["|", "dataset", "|", "auroc", "|", "n_regions", "|"]
    assert "batches" not in captured.err  # the progress bar turned off stays off
    assert main(["test", "--model", "location_prior", "--data", "demo", "--columns", "auroc,dice@best"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --columns: unknown key 'dice@best'; give all or keys among: pointing_game, dice@0.5,")
    assert err.count("\n") == 1


@pytest.mark.parametrize("source", ["--predictions", "--maps"])
def test_score_refuses_an_unknown_column(tmp_path, capsys, source):
    (tmp_path / "manifest.json").write_text("{}")  # a store's (a folder without one is named first: it is no store)
    assert main(["score", source, str(tmp_path), "--data", "demo", "--columns", "pointing_game,pg"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --columns: unknown key 'pg'; give all or keys among: pointing_game,") and err.count("\n") == 1


def test_wandb_is_offline_and_quiet_unless_the_user_says_otherwise(monkeypatch):
    for name in ("WANDB_MODE", "WANDB_SWEEP_ID", "WANDB_SILENT", "WANDB_CONSOLE"):
        monkeypatch.delenv(name, raising=False)
    wandb_defaults()
    assert [os.environ[n] for n in ("WANDB_MODE", "WANDB_SILENT", "WANDB_CONSOLE")] == ["offline", "true", "off"]
    monkeypatch.setenv("WANDB_SILENT", "false")
    monkeypatch.setenv("WANDB_CONSOLE", "wrap")
    wandb_defaults()
    assert (os.environ["WANDB_SILENT"], os.environ["WANDB_CONSOLE"]) == ("false", "wrap")


def test_a_user_given_progress_bar_wins(tmp_path, capfd):
    assert main(["test", "--model", "location_prior", "--data", "demo", "--trainer.callbacks",
                 "lightning.pytorch.callbacks.TQDMProgressBar", "--out", str(tmp_path)]) == 0
    out, err = capfd.readouterr()
    assert "Testing DataLoader 0: 100%" in out and not PROGRESS.search(err)  # tqdm's bar, not ours


def test_the_table_splits_to_fit_and_never_cuts_a_value():
    rows = {"demo": full_row(0.1), "a_long_dataset_name": full_row(0.5)}
    for width in (120, 60, 20):
        text = console_table(rows, "dataset", "all", max_width=width)
        tables = text.split("\n\n")
        assert all(len(line) <= width for line in text.splitlines()) or width == 20  # 20: one column a table
        cells = {}
        for table in tables:
            head, _, *body = table.splitlines()
            keys = re.split(r"\s*\|\s*", head.strip("| "))
            assert keys[0] == "dataset"
            for line in body:
                values = re.split(r"\s*\|\s*", line.strip("| "))
                cells.update({(values[0], k): v for k, v in zip(keys[1:], values[1:])})
        expected = {(name, k): (str(v) if isinstance(v, int) else f"{v:.3f}") for name, row in rows.items() for k, v in row.items()}
        assert cells == expected
    assert len(console_table(rows, "dataset", "all", max_width=120).split("\n\n")) > 1


def test_default_columns_follow_the_runs_fixed_threshold():
    row = {"pointing_game": 0.5, "dice@0.3": 0.1, "iou@0.3": 0.2, "auroc": 0.7, "n_regions": 3}
    assert console_columns(row)[:3] == ["pointing_game", "dice@0.3", "iou@0.3"]
    assert console_columns(row, ["dice@0.5", "auroc"]) == ["dice@0.3", "auroc"]
    assert parse_columns("all") == "all" and parse_columns(None) is None
    assert parse_columns("dice@0.3, n_regions") == ["dice@0.3", "n_regions"]
    with pytest.raises(ValueError, match="unknown key 'bogus'"):
        parse_columns("auroc,bogus")


def test_progress_lines_every_tenth_and_at_the_end(capsys):
    progress = ProgressLines("score demo", 25, "images")
    for _ in range(25):
        progress.step()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].split()[0] for line in lines] == ["3/25", "6/25", "9/25", "12/25", "15/25", "18/25",
                                                                  "21/25", "24/25", "25/25"]
    assert lines[0].endswith("left") and "left" not in lines[-1]


def test_progress_lines_wait_for_a_long_loop(capsys, monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 5.0, 6.0])  # start, then one reading per line due
    monkeypatch.setattr("xbench_pl.console.time.monotonic", lambda: next(clock))
    progress = ProgressLines("report", 4, "runs", every=1, after=3.0)
    for _ in range(4):
        progress.step()
    assert [line.split(",")[0] for line in capsys.readouterr().err.splitlines()] == ["report: 3/4 runs (75 %)",
                                                                                  "report: 4/4 runs (100 %)"]


def test_the_kernels_say_once_that_they_compile(tmp_path, monkeypatch, capsys):
    module = tmp_path / "tiny_kernel.py"
    module.write_text("import numba\n\n@numba.njit(cache=True)\ndef plus_one(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import tiny_kernel

    assert not kernels.cached_on_disk([tiny_kernel.plus_one])  # never compiled: no cache index
    tiny_kernel.plus_one(1)
    assert kernels.cached_on_disk([tiny_kernel.plus_one])
    monkeypatch.setattr(kernels, "_COMPILE_NOTED", False)
    monkeypatch.setattr(kernels, "cached_on_disk", lambda dispatchers: False)
    kernels._threads(1)
    kernels._threads(1)
    assert capsys.readouterr().err.count("compiling the metric kernels") == 1


def test_the_first_run_says_it_draws_the_demo(tmp_path, capsys):
    ensure_demo(tmp_path / "demo")
    ensure_demo(tmp_path / "demo")
    err = capsys.readouterr().err  # one note, wrapped to the terminal's width
    assert " ".join(err.split()) == f"drawing the synthetic demo into {tmp_path / 'demo'} (first run only, a few seconds)"
