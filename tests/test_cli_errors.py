"""The CLI speaks plainly: one ``error:`` line and exit 2 for user errors, quiet runs, reports that
say what they are (random weights, skipped inputs, provenance). What the process shows (exit status, its
whole stderr, Lightning's console chatter) is checked in subprocesses; the rest in this process (``main``),
which is fast."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import torch
from PIL import Image
from test_cli import cli, in_process

from xbench_pl.commands import COMMANDS, DEBUG_ENV, SUMMARIES, TRAINER_COMMANDS, main
from xbench_pl.data.errors import DataError
from xbench_pl.data.sources import data_dir


@pytest.fixture
def nih(tmp_path):
    return write_nih(tmp_path / "nih")


def write_nih(root: Path) -> Path:
    """A three-image NIH box-list layout: b.png is truncated (corrupt), c.png's box reaches outside."""
    (root / "images").mkdir(parents=True)
    for name in "abc":
        Image.fromarray(np.random.default_rng(ord(name)).integers(0, 255, (64, 64), np.uint8)).save(root / "images" / f"{name}.png")
    (root / "images" / "b.png").write_bytes((root / "images" / "b.png").read_bytes()[:100])
    (root / "BBox_List_2017.csv").write_text("Image Index,Finding Label,Bbox [x,y,w,h],,,\n"
                                            "a.png,Mass,5,5,20,20\nb.png,Nodule,10,10,8,8\nc.png,Mass,60,60,20,20\n")
    return root


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_user_errors_in_a_real_command_are_one_line_with_exit_2(tmp_path, monkeypatch):
    missing = in_process("test", "--model", "clip", "--model.checkpoint", str(tmp_path / "ViT-B-16.pt"), "--data", "demo")
    assert (missing.returncode, missing.stderr) == (2, f"error: --model.checkpoint: not found: {tmp_path / 'ViT-B-16.pt'}\n")
    bad_value = in_process("test", "--model", "center", "--model.sigma", "abc", "--data", "demo")
    assert (bad_value.returncode, bad_value.stderr) == (2, "error: --model.sigma: expected a float, got 'abc'\n")
    # --debug lets the error through instead, which Python prints as a traceback (exit status 1)
    monkeypatch.setenv(DEBUG_ENV, "")  # main sets it to 1 for DDP ranks; the fixture's undo removes it
    with pytest.raises(DataError, match=r"^--data.root: nih_bbox root not set: give the folder holding "
                                        r"BBox_List_2017.csv and the images\*/ folders of PNGs \(or `python -m xbench_pl data "
                                        r"pull nih_bbox` fills .*nih_bbox\)$"):
        main(["test", "--model", "center", "--data", "nih_bbox", "--debug"])
    assert os.environ[DEBUG_ENV] == "1"


@pytest.mark.parametrize("argv, line", [
    (["--model", "center", "--data", "nih_bbox"], "error: --data.root: nih_bbox root not set: give the folder holding "
     f"BBox_List_2017.csv and the images*/ folders of PNGs (or `python -m xbench_pl data pull nih_bbox` fills "
     f"{data_dir() / 'nih_bbox'})"),
    (["--model", "center", "--data", "demo", "--data.eval_size", "0"], "error: --data.eval_size: must be > 0, got 0"),
    (["--model", "center", "--data", "demo", "--data.on_error", "bogus"], "error: --data.on_error: expected one of 'raise', 'skip', got 'bogus'"),
    (["--model", "center", "--model.nope", "1", "--data", "demo"],
     "error: --model.nope: not an option of xbench_pl.models.baselines.CenterBaseline "
     "(its options: python -m xbench_pl test --model.help xbench_pl.models.baselines.CenterBaseline)"),
    (["--model", "no.such.Model", "--data", "demo"], "error: --model: cannot import no.such.Model: No module named 'no'"),
    (["--model", "center", "--data", "demo", "--trainer.devices", "x"],
     "error: --trainer.devices: `devices` selected with `CPUAccelerator` should be an int > 0."),
    (["--model", "center", "--data", "demo", "--bogus"], "error: unrecognized arguments: --bogus (see python -m xbench_pl test --help)"),
    (["--model", "center"], "error: the following arguments are required: --data"),
    (["--model", "center", "--data", "demo", "--data.split_file", "/no/ids.txt"], "error: /no/ids.txt: split file not found"),
])
def test_user_error_lines(capsys, argv, line):
    code, _, err = run(capsys, "test", *argv)
    assert (code, err.strip().splitlines()[-1]) == (2, line)
    assert "Traceback" not in err


def test_a_config_file_that_is_not_yaml_is_named_with_its_line(capsys, tmp_path):
    """jsonargparse says only "while parsing a flow sequence": the one line names the file, the line and the column."""
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  class_path: center\ndata: [unclosed\n  eval_size: 64\n")
    code, _, err = run(capsys, "test", "--config", str(config), "--data", "demo")
    assert code == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert f"--config {config}: not valid YAML" in " ".join(err.split()) and "line 4" in err


@pytest.mark.parametrize("model", ["devide", "clip", "maira2"])
def test_a_model_without_its_checkpoint_says_how_to_run_it_without_one(capsys, model, tmp_path, monkeypatch):
    """No checkpoint and none pulled (DeViDe has no release at all): the one line names the smoke-test switch too."""
    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(tmp_path / "empty_cache"))
    code, _, err = run(capsys, "test", "--model", model, "--data", "demo", "--out", str(tmp_path / "out"))
    assert code == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert "--model.random_init true" in " ".join(err.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU that is not there")
def test_a_gpu_that_is_not_there_is_one_line_before_the_model_loads(capsys):
    """The README's GPU command on a machine without one: one line, exit 2, before the model (a missing checkpoint
    here) or the data (no root) is touched."""
    code, _, err = run(capsys, "test", "--model", "clip", "--model.checkpoint", "/no/ViT-B-16.pt", "--data", "nih_bbox",
                       "--trainer.accelerator", "gpu", "--trainer.devices", "8", "--trainer.strategy", "ddp")
    assert (code, err) == (2, "error: --trainer.accelerator: no gpu device on this machine (available here: cpu)\n")


@pytest.mark.parametrize("option, value, says", [
    ("accelerator", "cuda", "no cuda device on this machine"),
    ("accelerator", "tpu", "torch_xla"),
    ("accelerator", "bogus", "invalid accelerator name"),
    ("devices", "-2", "should be an int > 0"),
    ("num_nodes", "0", "must be a positive integer"),
    ("strategy", "bogus", "invalid strategy name"),
    ("strategy", "fsdp", "requires a GPU accelerator"),
    ("precision", "transformer-engine", "transformer_engine"),
])
def test_trainer_configuration_errors_name_the_option_before_model_or_data(capsys, option, value, says):
    if option == "accelerator" and value == "cuda" and torch.cuda.is_available():
        pytest.skip("asks for a GPU that is not there")
    code, _, err = run(capsys, "test", "--model", "clip", "--model.checkpoint", "/no/ViT-B-16.pt", "--data", "nih_bbox",
                       f"--trainer.{option}", value)
    lines = err.strip().splitlines()
    assert code == 2 and lines[-1].startswith(f"error: --trainer.{option}: ") and says in lines[-1], err
    assert "Traceback" not in err and "checkpoint not found" not in err and "root not set" not in err


@pytest.mark.parametrize("value", ["13", "bf17"])
def test_a_bad_precision_lists_every_value_lightning_accepts(capsys, value):
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    code, _, err = run(capsys, "test", "--model", "center", "--data", "demo", "--trainer.precision", value)
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("error: --trainer.precision: expected one of ") and line.endswith(f"got '{value}'")
    accepted = re.findall(r"[\w-]+", line.partition("expected one of ")[2].rpartition(", got")[0])
    assert {"bf16-mixed", "16-mixed", "32-true", "bf16-true", "64-true"} <= set(accepted)
    assert set(accepted) - {"or"} == set(get_args(_PRECISION_INPUT_STR)) | set(get_args(_PRECISION_INPUT_STR_ALIAS))


def test_corrupt_image_and_missing_pooled_folder(capsys, nih, tmp_path):
    code, _, err = run(capsys, "test", "--model", "center", "--data", "nih_bbox", "--data.root", str(nih), "--out", str(tmp_path / "r"))
    assert (code, err.strip().splitlines()[-1]) == (2, f"error: {nih / 'images' / 'b.png'}: cannot decode image (image file is truncated)")
    datasets = json.dumps(["nih_bbox", "rsna_pneumonia"])
    code, _, err = run(capsys, "test", "--model", "center", "--data", "pooled", "--data.root", str(tmp_path), "--data.datasets", datasets)
    # nih_bbox is found as tmp_path/nih? no: the folder must be named as the dataset
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'nih_bbox'}: dataset folder not found (the pooled --data.root {tmp_path} needs one folder per "
        "dataset, named as the dataset; or give nih_bbox its own root in --data.datasets)")


def test_help_lists_every_command(capsys):
    code, out, _ = run(capsys, "--help")
    commands = re.findall(r"^  (\w+)  +(\S.*)$", out.split("commands:")[1].split("options:")[0], re.M)
    assert code == 0 and [c for c, _ in commands] == list(SUMMARIES) and all(summary for _, summary in commands)
    assert set(SUMMARIES) == {*TRAINER_COMMANDS, *COMMANDS} and {"describe", "score"} <= set(COMMANDS)  # each command has its line
    code, _, err = run(capsys, "frobnicate")
    assert (code, err) == (2, f"error: unknown command 'frobnicate'; commands: {', '.join(SUMMARIES)} (see python -m xbench_pl --help)\n")


def quiet_run(folder: Path) -> subprocess.CompletedProcess:
    """The background job of the test below: a run in a fresh process on ``write_nih``'s layout, two of whose three
    split lines are a corrupt image and a box outside; out in ``folder/out``."""
    split = folder / "ids.txt"
    split.write_text("a.png\nb.png\nc.png\n")  # no header: a.png must not be taken for one
    return cli("test", "--model", "fixture_models.RandomIntensityModel", "--model.random_init", "true", "--data", "nih_bbox",
               "--data.root", str(write_nih(folder / "nih")), "--data.on_error", "skip", "--data.split_file", str(split),
               "--out", str(folder / "out"))


@pytest.mark.background(job=quiet_run)
def test_quiet_run_reports_skips_random_weights_and_provenance(background):
    folder, result = background
    out = folder / "out"
    assert result.returncode == 0, result.stderr[-3000:]
    console = result.stdout + result.stderr
    for noise in ("Seed set", "No seed found", "GPU available", "TPU available", "💡", "Test metric", "LeafSpec"):
        assert noise not in console, noise
    assert "test nih_bbox: 1/1 batches (100 %)" in result.stderr  # progress stays: plain lines in a pipe
    assert console.count("has RANDOM weights") == 2  # the warning at build, and the note under the table
    assert "NOTE: fixture_models.RandomIntensityModel has RANDOM weights" in result.stdout
    assert (f"nih_bbox: 1 image(s)/row(s) skipped and 1 corrected (clipped 1); listed in {out / 'metrics.json'} "
            f"(datasets.nih_bbox.problems) and {out / 'metrics.md'}") in " ".join(result.stdout.split())  # wrapped
    report = json.loads((out / "metrics.json").read_text())
    assert list(report) == ["model", "random_weights", "datasets", "config", "explainer", "provenance"]
    assert report["explainer"]["name"] == "native"  # where the maps come from (docs/explainers.md)
    assert report["model"] == "fixture_models.RandomIntensityModel" and report["random_weights"] is True
    problems = report["datasets"]["nih_bbox"]["problems"]
    assert [(p["file"].rsplit("/", 1)[-1], p["row"], p["action"]) for p in problems] == [
        ("b.png", "3", "skipped"), ("BBox_List_2017.csv", "4", "clipped")]
    assert "RANDOM weights" in (out / "metrics.md").read_text().splitlines()[0]
    assert set(report["provenance"]) == {"xbench_pl", "git_commit", "git_dirty", "python", "torch", "lightning", "torchmetrics",
                                         "device", "accelerator", "world_size", "num_nodes", "started", "wall_time_s"}
    assert report["provenance"]["device"] == "cpu" and report["provenance"]["world_size"] == 1
    rows = report["datasets"]["nih_bbox"]["classes"]
    for row in rows.values():  # float64 from exact counts: k / n exactly, never a float32 value like 0.1666666716
        n = row["n_pos"] + row["n_neg"]
        assert n == 2  # a.png (the split's first line) and c.png
        assert row["hamming_acc"] in (0.0, 0.5, 1.0) and row["auprc"] in (None, 0.5, 1.0)


def test_saved_print_config_keeps_the_registered_name(nih, tmp_path):
    shown = in_process("test", "--model", "center", "--data", "nih_bbox", "--data.root", str(nih), "--data.on_error", "skip", "--print_config")
    assert shown.returncode == 0 and "model_name: center" in shown.stdout
    (tmp_path / "run.yaml").write_text(shown.stdout)
    rerun = in_process("test", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "out"))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["model"] == "center"
