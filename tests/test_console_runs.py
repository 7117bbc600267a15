"""What the console says of a run's features (explainer, subgroups, cnr on MS-CXR, --resume), lines within the
terminal's width, help that shows what a command takes, and commands that start without Lightning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cli import REPO, cli, in_process, warm_process
from test_console import full_row

from xbench_pl.callbacks.progress import ValidationSummary
from xbench_pl.commands.trainer import command_to_test
from xbench_pl.run_files import DEFAULT_COLUMNS, default_columns, group_summary, publish_report

CENTER = ["--model", "center", "--data", "demo", "--trainer.enable_progress_bar", "false"]


def imported(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime -m xbench_pl ARGS``: the run and the top-level packages it imported."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "xbench_pl", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    modules = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s+([\w.]+)$", run.stderr, re.M)}
    return run, modules


# -- start-up ------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["score"], ["score", "--maps", "DIR"], ["score", "--boxes", "FILE"], ["export"],
                                     ["compare"], ["report"], ["describe"]])
def test_help_of_the_commands_without_a_model_loads_neither_lightning_nor_torch(command):
    run, modules = imported(*command, "--help")
    assert run.returncode == 0 and "usage:" in run.stdout
    assert "jsonargparse" in modules or command == ["export"]  # the parse did run under -X importtime
    assert not modules & {"lightning", "pytorch_lightning", "torch", "torchmetrics", "albumentations"}


@pytest.mark.parametrize("args, says", [
    (["--model", "nope", "--data", "demo"], "error: --model: unknown model 'nope'; available: ["),
    (["--model", "center", "--data", "nope"], "error: --data: unknown dataset 'nope'; available: ["),
    (["--model", "center", "--data", "nih_bbox", "--data.root", "/no/such/folder"], "error: --data.root: /no/such/folder: no such folder"),
    (["--model", "center", "--data", "demo", "--out", "/proc/version/out"], "error: --out /proc/version/out: "),
    (["--model", "center", "--data", "demo", "--data.batch_size", "0"], "error: --data.batch_size: must be > 0, got 0"),
    (["--model", "clip", "--data", "demo", "--model.text_batch_size=x"], "error: --model.text_batch_size: expected an int, got 'x'"),
    # choices: an alias imported from a package whose __init__ loads torchmetrics, a Literal of the signature, a dataset's
    (["--model", "center", "--data", "demo", "--model.normalize", "foo"],
     "error: --model.normalize: expected one of 'minmax', 'max', 'none', got 'foo'"),
    (["--model", "kad", "--data", "demo", "--model.trust_pairs", "some"], "error: --model.trust_pairs: expected one of 'regions', 'all', got 'some'"),
    (["--model", "center", "--data", "demo", "--data.on_error", "1"], "error: --data.on_error: expected one of 'raise', 'skip', got '1'"),
])
def test_trainer_errors_that_need_no_model_come_before_lightning_loads(args, says):
    for command in ("test", "fit"):
        run, modules = imported(command, *args)
        errors = [line for line in run.stderr.splitlines() if not line.startswith("import time:")]
        assert run.returncode == 2 and len(errors) == 1 and errors[0].startswith(says), run.stderr[-2000:]
        assert not modules & {"lightning", "torch"}


def test_score_of_a_missing_store_ends_before_torch_loads():
    run, modules = imported("score", "--predictions", "/no/such/store")
    errors = [line for line in run.stderr.splitlines() if not line.startswith("import time:")]
    assert run.returncode == 2 and errors == ["error: --predictions /no/such/store: no such folder (a store written by "
                                              "python -m xbench_pl test --predictions DIR)"]
    assert not modules & {"lightning", "torch"}


# -- help ----------------------------------------------------------------------------------------
def test_score_help_has_no_placeholders():
    run = cli("score", "--help")
    assert run.returncode == 0 and "score --maps DIR --help" in run.stdout
    assert "MAPS_HELP" not in run.stdout and "BOXES_HELP" not in run.stdout


def test_test_help_lists_the_explainers_and_model_help_only_those_the_model_takes():
    run = in_process("test", "--help")
    assert run.returncode == 0
    text = " ".join(run.stdout.split())
    assert "Explainers of the maps (--model.explainer NAME): native, gradcam, gradcam++," in text and "rollout, chefer." in text
    center = in_process("test", "--model.help", "center")
    assert "--model.explainer {native}" in center.stdout and "gradcam" not in center.stdout
    tower = in_process("test", "--model.help", "chexzero")
    assert re.search(r"--model.explainer \{native,gradcam,.*,chefer\}", tower.stdout)
    refused = in_process("test", *CENTER, "--model.explainer", "gradcam")
    assert refused.returncode == 2 and "it takes 'native' only" in refused.stderr


def test_the_test_command_a_fit_prints_keeps_the_model_and_data_as_given():
    argv = ["--model", "open_clip", "--model.architecture", "/a b/c.json", "--model.lr=0.05", "--data", "demo",
            "--data.val_fraction", "0.25", "--trainer.max_epochs", "3", "--model.bootstrap", "-1", "--out", "x"]
    assert command_to_test(argv, "x/checkpoints/last.ckpt") == (
        "python -m xbench_pl test --model open_clip --model.architecture '/a b/c.json' --data demo --model.bootstrap -1 "
        "--ckpt_path x/checkpoints/last.ckpt")


def test_the_validation_line_of_the_last_epoch_is_left_to_the_closing_table(capsys):
    module = SimpleNamespace(val_history=[{"epoch": 0, "mean": {"demo": {"pointing_game": 0.25, "auroc": 0.5}}}])
    for max_epochs, printed in ((2, True), (1, False)):
        trainer = SimpleNamespace(sanity_checking=False, is_global_zero=True, current_epoch=0, max_epochs=max_epochs)
        ValidationSummary(["pointing_game", "auroc"]).on_validation_end(trainer, module)
        assert ("epoch 0 validation, demo: pointing_game 0.250 auroc 0.500" in capsys.readouterr().out) == printed


# -- what a run prints ---------------------------------------------------------------------------
def by_group(unknown_view: int) -> dict:
    row = {"pointing_game": 0.5, "auroc": 0.5, "n_regions": 3}
    table = {"n_images": 3, "classes": {}, "mean": row, "ci": {"level": 0.95}}
    gap = {"gap": 0.25, "high": "M", "low": "F", "ci": [0.05, 0.4], "p": 0.02}
    return {"sex": {"n_images": {"F": 3, "M": 3, "unknown": 1}, "F": table, "M": {**table, "mean": {**row, "pointing_game": 0.75}},
                    "gap": {"pointing_game": gap, "auroc": {"gap": 0.0, "high": "F", "low": "F", "ci": [0, 0], "p": 1.0}}},
            "view": {"n_images": {"PA": 0, "AP": 0, "unknown": unknown_view}, "PA": table, "AP": table,
                     "gap": {"pointing_game": None, "auroc": None}}}


def test_groups_print_a_table_per_group_and_the_gaps_and_a_group_unknown_everywhere_says_so():
    text = "\n".join(group_summary("demo", by_group(7), ["pointing_game", "auroc"]))
    assert "demo by sex (F: 3, M: 3, unknown: 1 images):" in text
    assert re.search(r"\| M \(3 images\) \|\s+0.750 \|\s+0.500 \|", text)
    assert re.search(r"\| pointing_game \|\s+0.250 \|\s+M − F \| \[0.050, 0.400\] \| 0.020 \|", text)
    assert re.search(r"\| auroc\s+\|\s+0.000 \|\s+tie \|", text)
    lines = [line for line in text.splitlines() if "view" in line]
    assert lines == ["demo by view: unknown for all 7 images (no view in the dataset's metadata); no per-view table"]


def test_ms_cxr_runs_show_cnr_by_default_and_the_explainer_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert "cnr" not in DEFAULT_COLUMNS and "cnr" not in default_columns(["demo"])
    assert default_columns(["ms_cxr_demo"])[-2:] == ["cnr", "n_regions"]
    row = full_row(0.1)
    explainer = {"name": "gradcam", "target_layer": "image.layer4", "target": "logits", "library": "pytorch-grad-cam",
                 "version": "1.5"}
    report = {"model": "m", "random_weights": False, "config": {}, "explainer": explainer,
              "datasets": {"ms_cxr": {"classes": {"Pneumonia": row}, "mean": row, "problems": []}}}
    publish_report(report, tmp_path)
    out = capsys.readouterr().out
    assert "maps: gradcam on image.layer4, target: logits (pytorch-grad-cam 1.5)" in out
    headers = [h for line in out.splitlines() if line.startswith("| dataset") for h in re.split(r"\s*\|\s*", line.strip("| "))[1:]]
    assert headers == default_columns(["ms_cxr"])
    assert max(map(len, out.splitlines())) <= 100


def grouped_then_resumed(folder: Path):
    """The background job of the test below, in the warm process: a grouped run storing its predictions
    (``folder/store``), then the run resumed after one shard (4 images) was lost."""
    store = folder / "store"
    first = warm_process("test", *CENTER, "--model.groups", "sex,view", "--model.bootstrap", "20", "--out", str(folder / "a"),
                         "--predictions", str(store), "--predictions_shard_images", "4", COLUMNS="80")
    if first.returncode == 0:
        sorted(store.rglob("*.safetensors"))[0].unlink()
    resumed = warm_process("test", *CENTER, "--model.groups", "sex,view", "--model.bootstrap", "20", "--out", str(folder / "b"),
                           "--predictions", str(store), "--resume", "true")
    return first, resumed


@pytest.mark.background(job=grouped_then_resumed)
def test_a_grouped_run_prints_its_groups_and_resume_says_what_came_from_the_store(background):
    folder, (first, resumed) = background
    store = folder / "store"
    assert first.returncode == 0, first.stderr[-3000:]
    assert "maps: native" in first.stdout and "demo by sex (F: 6, M: 6, unknown: 0 images):" in first.stdout
    assert "gap between the sex values" in first.stdout and "--resume" not in first.stderr
    ours = first.stdout.splitlines() + [line for line in first.stderr.splitlines() if not line.startswith("    ")]  # not a
    assert max(map(len, ours)) <= 80  # library's multi-line warning text as in_process shows it
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"--resume: 8 of 12 images from the prediction store {store}, 4 to compute" in " ".join(resumed.stderr.split())
