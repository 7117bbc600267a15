"""The newer models (CheXzero, BioViL, RadZero; tiny seeded copies of the real architectures) through the rest of
the suite on MS-CXR's phrases: ``fit`` trains their ``TRAINABLE`` parameters, and a run's prediction store re-scores
to its own metrics."""

from __future__ import annotations

import json
from pathlib import Path

import biovil_reference
import chexzero_reference
import pytest
import radzero_reference
import torch
from safetensors.torch import save_file
from test_cli import run_sweep_in_process, warm_process

import xbench_pl
from xbench_pl.data.ms_cxr import ensure_ms_cxr_demo

CONFIGS = Path(xbench_pl.__file__).parent / "models" / "configs"


def chexzero_args(root: Path) -> list[str]:
    shipped = json.loads((CONFIGS / "chexzero.json").read_text())
    architecture = root / "chexzero_tiny.json"
    architecture.write_text(json.dumps({"model_cfg": chexzero_reference.model_cfg("tiny"), "preprocess_cfg": shipped["preprocess_cfg"]}))
    torch.save(chexzero_reference.state_dict("tiny", seed=0), root / "best_tiny.pt")
    return ["--model", "chexzero", "--model.architecture", str(architecture), "--model.checkpoint", str(root / "best_tiny.pt")]


def biovil_args(root: Path) -> list[str]:
    architecture = json.loads((CONFIGS / "biovil.json").read_text())
    architecture["preprocess"] = {**architecture["preprocess"], "canvas": 72, "size": 64}  # fast: the layout is tested elsewhere
    (root / "biovil-64.json").write_text(json.dumps(architecture))
    image = biovil_reference.write_image_checkpoint(root / biovil_reference.IMAGE_WEIGHTS["biovil"], "biovil")
    text = biovil_reference.write_text_folder(root / "text")
    return ["--model", "biovil", "--model.architecture", str(root / "biovil-64.json"), "--model.checkpoint", str(image),
            "--model.text", str(text)]


def radzero_args(root: Path) -> list[str]:
    architecture = root / "radzero-tiny.json"
    architecture.write_text(json.dumps(radzero_reference.tiny_architecture(radzero_reference.write_tower_folders(root / "towers"))))
    release = radzero_reference.write_tokenizer_folder(root / "RadZero")
    save_file(radzero_reference.state_dict(seed=0), str(release / "model.safetensors"))
    return ["--model", "radzero", "--model.architecture", str(architecture), "--model.checkpoint", str(release)]


MODELS = {"chexzero": chexzero_args, "biovil": biovil_args, "radzero": radzero_args}
COMMON = ["--data", "ms_cxr_demo", "--data.batch_size", "4", "--trainer.accelerator", "cpu",
          "--trainer.enable_progress_bar", "false"]


def fit_test_and_score(folder: Path) -> dict:
    """The background job of the test below, in the warm process: for each model (``folder/NAME``), ``fit``, then
    ``test`` with a float32 prediction store, then ``score`` of the store."""
    runs = {}
    for name, write_args in MODELS.items():
        root = folder / name
        root.mkdir()
        model = write_args(root)
        runs[name] = (
            warm_process("fit", *model, *COMMON, "--model.bootstrap", "0", "--data.val_fraction", "0.3",
                         "--trainer.max_epochs", "1", "--trainer.enable_model_summary", "false", "--out", str(root / "fit")),
            warm_process("test", *model, *COMMON, "--model.bootstrap", "20", "--predictions", str(root / "store"),
                         "--predictions_dtype", "float32", "--out", str(root / "run")),
            warm_process("score", "--predictions", str(root / "store"), "--out", str(root / "score")))
    return runs


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.background(job=fit_test_and_score)
def test_fit_and_the_prediction_store_on_phrases(name, background):
    folder, runs = background
    (fitted, ran, scored), root = runs[name], folder / name
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    record = json.loads((root / "fit" / "fit.json").read_text())
    assert record["trained_parameters"] and [e["epoch"] for e in record["validation"]] == [0]
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert scored.returncode == 0, scored.stderr[-3000:]
    run, score = (json.loads((root / d / "metrics.json").read_text())["datasets"]["ms_cxr_demo"] for d in ("run", "score"))
    assert score["classes"] == run["classes"] and score["mean"] == run["mean"]
    assert run["mean"]["n_regions"] == 13 and run["mean"]["cnr"] is not None


def test_the_phrases_sweep_runs_offline_on_the_synthetic_ms_cxr(tmp_path, monkeypatch):
    """sweeps/phrases_x_models.yaml as shipped, its data and models pointed at the synthetic MS-CXR and tiny seeded
    CheXzero and RadZero (W&B logger off, runs in this process, for speed): every run finishes, and phrases ground otherwise than names."""
    import csv

    import yaml

    repo = Path(__file__).resolve().parents[1]
    spec = yaml.safe_load((repo / "sweeps" / "phrases_x_models.yaml").read_text())
    command = spec["command"]
    del command[command.index("--trainer.logger") : command.index("--trainer.logger") + 2]
    demo = ensure_ms_cxr_demo()  # the folder --data ms_cxr_demo reads (drawn on first use)
    for option in ("--data.root", "--data.image_root"):
        command[command.index(option) + 1] = str(demo)
    command[command.index("ms_cxr")] = "ms_cxr_demo"
    assert spec["metric"]["name"] == "ms_cxr/cnr"
    spec["metric"]["name"] = "ms_cxr_demo/cnr"
    models = []
    for name in ("chexzero", "radzero"):
        args = MODELS[name](tmp_path)
        config = {"class_path": xbench_pl.registry.class_path("models", name),
                  "init_args": {k.removeprefix("--model."): v for k, v in zip(args[2::2], args[3::2])}}
        models.append(str(tmp_path / f"{name}.yaml"))
        Path(models[-1]).write_text(yaml.safe_dump(config))
    spec["parameters"]["model"]["values"] = models
    assert spec["parameters"]["data.queries"]["values"] == ["phrases", "names"]
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.chdir(repo)
    assert run_sweep_in_process(tmp_path / "sweep.yaml", tmp_path / "out") == 0
    with (tmp_path / "out" / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"done"}
    cnr = {(Path(r["model"]).stem, r["data.queries"]): float(r["ms_cxr_demo/cnr"]) for r in rows}
    assert cnr[("chexzero", "phrases")] != cnr[("chexzero", "names")] and cnr[("radzero", "phrases")] != cnr[("radzero", "names")]
