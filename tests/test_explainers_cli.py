"""``--model.explainer`` on the command line: identical metrics on 1 and 2 DDP processes, the explainer
recorded in metrics.json, the prediction store's manifest and the loggers' config, and a store made with one
explainer refused to another."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from test_cli import in_process, one_and_two_processes
from test_devide import tiny_devide_architecture
from test_kad import tokenizer_dir, write_json  # noqa: F401  (fixture)
from test_open_clip_models import TINY_CLIP, write_config

DEMO = ["--data", "demo", "--data.batch_size", "3", "--trainer.accelerator", "cpu"]


def leaves(tree, path=""):
    """``(path, value)`` of every number, string and null in a report."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaves(value, f"{path}/{key}")
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from leaves(value, f"{path}/{index}")
    else:
        yield path, tree


def assert_same_report(a: dict, b: dict, tolerance: float = 1e-12) -> None:
    """Integer (and string, null) leaves exact; float leaves equal or within ``tolerance`` (NaN matches NaN)."""
    left, right = dict(leaves(a)), dict(leaves(b))
    assert left.keys() == right.keys()
    for path, x in left.items():
        y = right[path]
        if isinstance(x, float) and isinstance(y, float):
            assert (math.isnan(x) and math.isnan(y)) or abs(x - y) <= tolerance, (path, x, y)
        else:
            assert type(x) is type(y) and x == y, (path, x, y)


@pytest.mark.ddp_pair
@pytest.mark.parametrize("explainer", ["gradcam", "chefer"])
def test_one_and_two_ddp_processes_give_identical_metrics(explainer, tokenizer_dir, tmp_path):
    """DeViDe's ViT tower and query decoder: a CAM batched over findings, and relevance through both.

    Gradient explainers' maps move by float32 round-off between process layouts (a rank batches other images:
    Chefer's measured at most 4.7e-10 on maps of 5e-3; with the packages of 2026-11-27 Grad-CAM's too, where it
    was byte-identical before), which can reorder near-tied pixels: their metrics agree to 1e-6 relative (cnr: 1e-6
    absolute) and every integer key exactly (docs/explainers.md)."""
    architecture = write_json(tmp_path / "tiny_devide.json", tiny_devide_architecture())
    a, b, _ = one_and_two_processes(tmp_path, "test", "--model", "devide", "--model.architecture", architecture,
                                    "--model.text", tokenizer_dir, "--model.random_init", "true",
                                    "--model.explainer", explainer, *DEMO)
    one, two = dict(leaves(a)), dict(leaves(b))
    assert one.keys() == two.keys()
    for key, value in one.items():
        if isinstance(value, float) and isinstance(two[key], float):
            # cnr divides by the background's spread: a near-zero cnr moves by 5e-8 (measured)
            assert two[key] == pytest.approx(value, rel=1e-6, abs=1e-6 if key.endswith("cnr") or "/cnr/" in key else 1e-9), key
        else:
            assert two[key] == value, key
    assert a["explainer"]["name"] == explainer and a["config"]["model"]["init_args"]["explainer"] == explainer
    assert a["datasets"]["demo"]["mean"]["n_regions"] > 0


def test_the_store_and_the_loggers_record_the_explainer_and_a_store_refuses_another(tmp_path):
    architecture = write_config(tmp_path / "tiny_clip.json", TINY_CLIP)
    model = ["--model", "clip", "--model.architecture", architecture, "--model.random_init", "true"]
    store = tmp_path / "store"
    first = in_process("test", *model, "--model.explainer", "layercam", *DEMO, "--out", str(tmp_path / "run"),
                       "--predictions", str(store), "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path / "logs"))
    assert first.returncode == 0, first.stderr[-3000:]
    info = json.loads((tmp_path / "run" / "metrics.json").read_text())["explainer"]
    assert info["name"] == "layercam" and info["target_layer"] == "model.visual.transformer.resblocks.1.ln_1"
    assert info["target"] == "scores" and info["library"] == "pytorch-grad-cam"
    assert json.loads((store / "manifest.json").read_text())["explainer"] == info
    rescored = in_process("score", "--predictions", str(store), "--out", str(tmp_path / "rescored"))
    assert rescored.returncode == 0, rescored.stderr[-3000:]
    assert json.loads((tmp_path / "rescored" / "metrics.json").read_text())["explainer"] == info
    hparams = yaml.safe_load(next((tmp_path / "logs").rglob("hparams.yaml")).read_text())
    assert hparams["explainer"] == info
    markdown = (tmp_path / "run" / "metrics.md").read_text()
    assert "Maps: layercam on `model.visual.transformer.resblocks.1.ln_1`, target: scores" in markdown

    other = in_process("test", *model, "--model.explainer", "gradcam", *DEMO, "--out", str(tmp_path / "other"),
                       "--predictions", str(store), "--resume", "true")
    assert other.returncode == 2 and "written by another configuration" in other.stderr
    assert "explainer.name: 'layercam' -> 'gradcam'" in other.stderr
