"""Local sweeps (``python -m xbench_pl sweep``): expansion as the W&B YAML says, dry run, a real run that resumes;
and ``--model.image_size`` for open_clip ViTs (the resolution sweeps)."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml

from test_cli import cli, run_sweep_in_process
from test_open_clip_models import TINY_CLIP, write_config
from xbench_pl.commands import sweep
from xbench_pl.models.open_clip_model import OpenCLIPModel, build_open_clip, read_architecture
from xbench_pl.registry import available

REPO = Path(__file__).resolve().parents[1]
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=[p.name for p in SWEEPS])
def test_every_sweep_file_is_a_wandb_sweep_that_expands(path):
    spec = sweep.read_sweep(path)
    assert spec["method"] in ("grid", "random") and spec["metric"]["name"] and "${args}" in spec["command"]
    assert spec["command"][spec["command"].index("xbench_pl") + 1] == "test"
    configs = sweep.expand(spec, count=3 if spec["method"] == "random" else None)
    if spec["method"] == "grid":
        assert len(configs) == math.prod(len(p["values"]) if "values" in p else 1 for p in spec["parameters"].values())
    assert all(list(c) == list(spec["parameters"]) for c in configs)


def test_grid_expansion_and_commands(tmp_path):
    spec = sweep.read_sweep(REPO / "sweeps" / "prompts_x_models.yaml")
    runs = sweep.plan(spec, tmp_path)
    assert len(runs) == 2 * 3 * 3 and len({r.run_id for r in runs}) == 18
    first = runs[0].command
    assert first[:4] == [sys.executable, "-m", "xbench_pl", "test"]
    assert "--model=sweeps/models/clip.yaml" in first and "--model.positive={}" in first
    assert first.index("--model=sweeps/models/clip.yaml") < first.index("--model.positive={}")
    assert first[-4:] == ["--out", str(runs[0].folder), "--trainer.logger.init_args.save_dir", str(runs[0].folder)]


def test_trust_sweep_runs_every_model_and_explainer_with_the_trust_measures(tmp_path):
    spec = sweep.read_sweep(REPO / "sweeps" / "trust_x_explainers.yaml")
    runs = sweep.plan(spec, tmp_path)
    models, explainers = spec["parameters"]["model"]["values"], spec["parameters"]["model.explainer"]["values"]
    assert len(runs) == len(models) * len(explainers) == 6 * 9 and "rollout" not in explainers
    assert all((REPO / model).is_file() for model in models)
    for run in runs:
        options = [a for a in run.command if a.startswith("--model")]
        assert options[0].startswith("--model=sweeps/models/") and options[1].startswith("--model.explainer=")
        assert options[2] == "--model.trust=randomization,deletion,insertion,random_target"
    assert spec["metric"] == {"name": "demo/randomization_ssim", "goal": "minimize"}


def test_random_expansion_is_seeded_and_follows_the_distributions():
    spec = sweep.read_sweep(REPO / "sweeps" / "center_sigma_random.yaml")
    a, b = sweep.expand(spec, count=20, seed=3), sweep.expand(spec, count=20, seed=3)
    assert a == b and len(a) == 20 and a != sweep.expand(spec, count=20, seed=4)
    assert all(0.05 <= c["model.sigma"] <= 0.5 and c["data.eval_size"] in (256, 512) for c in a)
    assert len(sweep.expand(spec)) == spec["run_cap"]  # no --count: run_cap
    shapes = {"int_uniform": {"min": 1, "max": 3}, "q_uniform": {"min": 0, "max": 1, "q": 0.25},
              "normal": {"mu": 0, "sigma": 1}, "constant": {"value": 7}, "categorical": {"values": ["a", "b"]}}
    params = {name: {"distribution": name, **spec_} for name, spec_ in shapes.items()}
    drawn = sweep.expand({"method": "random", "parameters": params}, count=50, seed=0)
    assert {c["int_uniform"] for c in drawn} == {1, 2, 3} and {c["constant"] for c in drawn} == {7}
    assert all(c["q_uniform"] in (0, 0.25, 0.5, 0.75, 1.0) for c in drawn)


def test_bad_sweep_files_are_refused(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    for content, words in [({"method": "bayes", "parameters": {"a": {"values": [1]}}}, "bayes"),
                           ({"method": "grid", "parameters": {"a": {"distribution": "uniform", "min": 0, "max": 1}}}, "grid search"),
                           ({"method": "random", "parameters": {"a": {"values": [1]}}}, "--count"),
                           ({"method": "grid"}, "parameters")]:
        bad.write_text(yaml.safe_dump(content))
        assert sweep.main([str(bad), "--out", str(tmp_path / "out")]) == 2
        assert words in capsys.readouterr().err
    assert sweep.main([str(tmp_path / "missing.yaml")]) == 2


@pytest.mark.parametrize("count", ["-1", "0"])
def test_a_count_below_one_is_refused_not_sliced(tmp_path, capsys, count):
    """``--count -1`` once ran 5 of a grid's 6 runs (a Python slice): refused in one line, nothing planned."""
    assert sweep.main([str(REPO / "sweeps" / "center_sigma.yaml"), "--dry-run", "--count", count, "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("error:") == 1 and f"--count {count}" in captured.err and not captured.out


def test_dry_run_prints_one_full_command_per_run(tmp_path, capsys):
    """The commands on stdout; the unedited checkpoint path that would stop all 9 runs, once, on stderr (exit 2)."""
    assert sweep.main([str(REPO / "sweeps" / "clip_prompts.yaml"), "--dry-run", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 9 and all(line.startswith(sys.executable) and "--model.checkpoint /path/to/ViT-B-16.pt" in line
                                   for line in lines)
    assert captured.err == ("error: --model.checkpoint /path/to/ViT-B-16.pt: a placeholder, no such checkpoint; edit it in "
                            "the sweep file (all 9 runs)\n")
    assert not (tmp_path / "runs").exists()


def write_sweep(path: Path, parameters: dict, data: tuple[str, ...] = ("--data", "pooled")) -> Path:
    path.write_text(yaml.safe_dump({"method": "grid", "metric": {"name": "pointing_game"}, "parameters": parameters,
                                    "command": ["${env}", "python", "-m", "xbench_pl", "test", *data, "${args}"]}, sort_keys=False))
    return path


def test_dry_run_checks_data_folders_models_and_weights_and_runs_nothing(tmp_path, capsys, monkeypatch):
    """Without running anything: a dataset's folder missing from --data.root, a model not registered, a model whose
    release the weights cache lacks (``weights pull``), a model file's checkpoint that is not there; each problem one
    line naming the runs it stops, exit 2. A model whose files the cache holds, one that needs none (center), a
    checkpoint that exists and the demo data pass: exit 0, no line."""
    cache = tmp_path / "cache"
    (cache / "openai_clip_b16").mkdir(parents=True)
    (cache / "openai_clip_b16" / "open_clip_pytorch_model.bin").write_bytes(b"")
    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(cache))
    root = tmp_path / "datasets"
    (root / "nih_bbox").mkdir(parents=True)
    model_file = tmp_path / "clip.yaml"
    model_file.write_text(yaml.safe_dump({"class_path": "xbench_pl.models.open_clip_model.OpenCLIPModel",
                                          "init_args": {"checkpoint": str(tmp_path / "absent.pt")}}))
    models = ["clip", "chexzero", "nomodel", str(model_file)]
    file = write_sweep(tmp_path / "bad.yaml", {"model": {"values": models}, "data.root": {"value": str(root)},
                                               "data.datasets": {"values": ["[nih_bbox]", "[vindr_cxr]"]}})
    runs = sweep.plan(sweep.read_sweep(file), tmp_path / "out")
    ids = {model: [r.run_id for r in runs if r.params["model"] == model] for model in models}
    assert sweep.main([str(file), "--dry-run", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 8
    vindr = ", ".join(r.run_id for r in runs if r.params["data.datasets"] == "[vindr_cxr]")
    assert captured.err.splitlines() == [
        f"error: --data.root {root}: no folder vindr_cxr/ in it (the vindr_cxr dataset as it unpacks from its source) "
        f"(4 runs: {vindr})",
        f"error: --model chexzero: its released files are not in the weights cache {cache} (1 missing, e.g. "
        "chexzero/best_64_5e-05_original_22000_0.864.pt): run `python -m xbench_pl weights pull chexzero` (same "
        f"$XBENCH_WEIGHTS_DIR), or give --model.checkpoint PATH (2 runs: {', '.join(ids['chexzero'])})",
        f"error: --model nomodel: unknown model 'nomodel'; available: {available('models')} (2 runs: "
        f"{', '.join(ids['nomodel'])})",
        f"error: --model {model_file}: checkpoint {tmp_path / 'absent.pt'}: no such checkpoint (2 runs: "
        f"{', '.join(ids[str(model_file)])})"]
    (tmp_path / "absent.pt").write_bytes(b"")
    good = write_sweep(tmp_path / "good.yaml", {"model": {"values": ["clip", "center", str(model_file)]}}, ("--data", "demo"))
    assert sweep.main([str(good), "--dry-run", "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == "" and not (tmp_path / "out").exists()


def test_dry_run_names_each_placeholder_of_a_shipped_sweep_and_its_model_files(tmp_path, capsys, monkeypatch):
    """The phrase sweep as shipped: its two data roots and every path its model files leave to edit (a checkpoint, a
    text encoder's folder), each once, in the file where it is to be edited."""
    monkeypatch.chdir(REPO)  # the model files' paths are the repository's
    assert sweep.main(["sweeps/phrases_x_models.yaml", "--dry-run", "--out", str(tmp_path)]) == 2
    problems = capsys.readouterr().err.splitlines()
    assert problems[:2] == [f"error: --data.{key} /path/to/{folder}: a placeholder, no such folder; edit it in the sweep file "
                            "(all 16 runs)" for key, folder in (("root", "ms-cxr"), ("image_root", "mimic-cxr-jpg"))]
    biovil = [p for p in problems if p.startswith("error: --model sweeps/models/biovil.yaml: ")]
    assert [p.split(": ")[2].split()[0] for p in biovil] == ["checkpoint", "text"]
    assert biovil[1].startswith("error: --model sweeps/models/biovil.yaml: text /path/to/BiomedVLP-CXR-BERT-specialized: a "
                                "placeholder, no such file; edit it in sweeps/models/biovil.yaml (2 runs: ")
    assert len(problems) == 2 + 12  # 8 model files, 4 of them with a text encoder's path too


def failing_runs(reasons: dict[float, str]):
    """A stand-in for ``subprocess`` in ``sweep``: each run of ``model.sigma`` S logs ``reasons[S]`` (its last line
    wrapped, as a terminal-wide ``error:`` line is in no log but may be in a pasted one) and exits 2."""
    def run(command, stdout, stderr, env):
        sigma = float(next(a for a in command if a.startswith("--model.sigma=")).partition("=")[2])
        stdout.write("warning: chatter\n" + reasons[sigma] + "\n")
        return subprocess.CompletedProcess(command, 2)

    return mock.Mock(run=run, STDOUT=subprocess.STDOUT)


def test_each_failed_runs_error_line_is_shown_once_with_its_runs(tmp_path, capsys, monkeypatch):
    """A failed run's reason is its log's ``error:`` line: printed as the run fails (a later run failing alike names
    the first), then once at the end with the count of runs it ended, or, where reasons differ, each with its runs."""
    placeholder = "error: --data.root /path/to/xbench_datasets: no such folder (give the dataset's folder as it unpacks)"
    file = write_sweep(tmp_path / "s.yaml", {"model.sigma": {"values": [0.1, 0.2, 0.3]}}, ("--data", "demo"))
    runs = sweep.plan(sweep.read_sweep(file), tmp_path / "out")
    monkeypatch.setattr(sweep, "subprocess", failing_runs(dict.fromkeys((0.1, 0.2, 0.3), placeholder)))
    assert sweep.main([str(file), "--out", str(tmp_path / "out")]) == 1
    out = " ".join(capsys.readouterr().out.split())  # wrapped to the console
    assert out.count(placeholder) == 2 and out.count(f"failed (exit 2): as run {runs[0].run_id} (log: ") == 2
    assert out.endswith(f"3 of 3 runs failed, all with: {placeholder}")

    other = "error: --model.sigma: must be > 0, got 0.3 (see the\n  model's help)"
    monkeypatch.setattr(sweep, "subprocess", failing_runs({0.1: placeholder, 0.2: placeholder, 0.3: other}))
    assert sweep.main([str(file), "--out", str(tmp_path / "again")]) == 1
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("3 of 3 runs failed:")
    assert " ".join(" ".join(lines[at + 1:]).split()) == (f"2 runs: {runs[0].run_id}, {runs[1].run_id}: {placeholder} "
                                                           f"run {runs[2].run_id}: error: --model.sigma: must be > 0, got 0.3 "
                                                           "(see the model's help)")


def sigma_sweep(folder: Path) -> tuple[dict, subprocess.CompletedProcess]:
    """The background job of the test below: ``sweep`` of the center_sigma file (without the W&B logger, for speed)
    over one good sigma and one that fails, out in ``folder/out``, as a user runs it: the sweep and each of its runs
    in a process of its own; (the sweep's spec, the sweep)."""
    spec = yaml.safe_load((REPO / "sweeps" / "center_sigma.yaml").read_text())
    at = spec["command"].index("--trainer.logger")
    del spec["command"][at : at + 2]
    spec["parameters"]["model.sigma"]["values"] = [0.1, -1.0]
    file = folder / "sigma.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec, cli("sweep", str(file), "--out", str(folder / "out"))


@pytest.mark.background(job=sigma_sweep)
def test_local_sweep_on_the_demo_runs_records_failures_and_resumes(background, capsys, monkeypatch):
    """The sweep of ``sigma_sweep``; then, as after an interruption, the grid grown by a configuration whose run left
    its folder but no metrics.json: the restart runs only that one (and the failed one). What the restart decides is
    the sweep's own: its runs go through ``run_sweep_in_process``, without a start-up each."""
    folder, (spec, swept) = background
    file, out = folder / "sigma.yaml", folder / "out"
    assert swept.returncode == 1, swept.stderr[-3000:]  # one run failed, the others went on
    reason = "error: --model.sigma: must be > 0, got -1.0"
    printed = " ".join(swept.stdout.split())
    assert f"failed (exit 2): {reason} (log: " in printed and f"1 of 2 runs failed (run {sweep.run_id({'model.sigma': -1.0})}): {reason}" in printed
    monkeypatch.chdir(REPO)  # where a user's sweep runs
    with (out / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["done", "failed (exit 2)"]
    assert "error: --model.sigma: must be > 0, got -1.0" in (Path(rows[1]["folder"]) / "log.txt").read_text()
    kept = (Path(rows[0]["folder"]) / "metrics.json").stat().st_mtime_ns
    # interrupted: the run of sigma 0.3 started (its folder, params and log) and never wrote its metrics.json
    spec["parameters"]["model.sigma"]["values"] = [0.1, 0.3, -1.0]
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    lost = out / "runs" / sweep.run_id({"model.sigma": 0.3})
    lost.mkdir(parents=True)
    (lost / "params.json").write_text(json.dumps({"model.sigma": 0.3}))
    (lost / "log.txt").write_text("killed\n")
    capsys.readouterr()
    assert run_sweep_in_process(file, out) == 1
    with (out / "summary.csv").open() as f:
        again = list(csv.DictReader(f))
    assert {r["run"]: r["status"] for r in again} == {rows[0]["run"]: "skipped (done)", lost.name: "done",
                                                      rows[1]["run"]: "failed (exit 2)"}
    assert (lost / "metrics.json").is_file() and (Path(rows[0]["folder"]) / "metrics.json").stat().st_mtime_ns == kept
    dice = [json.loads((Path(r["folder"]) / "metrics.json").read_text())["datasets"]["demo"]["mean"]["dice_best"] for r in again[:2]]
    assert [float(r["demo/dice_best"]) for r in again[:2]] == dice and dice[0] >= dice[1]  # sorted, maximize
    assert "| model.sigma |" in (out / "summary.md").read_text()


# -- --model.image_size ----------------------------------------------------------------------------
def test_open_clip_image_size_interpolates_position_embeddings(tmp_path):
    config = write_config(tmp_path / "tiny.json", TINY_CLIP)
    torch.manual_seed(0)
    weights = build_open_clip(read_architecture(config)[0]).state_dict()
    torch.save(weights, tmp_path / "w.bin")
    same = OpenCLIPModel(config, checkpoint=str(tmp_path / "w.bin"), image_size=32)
    assert torch.equal(same.model.visual.positional_embedding, weights["visual.positional_embedding"])
    larger = OpenCLIPModel(config, checkpoint=str(tmp_path / "w.bin"), image_size=64)
    assert larger.preprocess.size == 64 and larger.model.visual.positional_embedding.shape == (1 + 8 * 8, 64)
    assert torch.equal(larger.model.visual.positional_embedding[0], weights["visual.positional_embedding"][0])  # class token
    out = larger.zero_shot(torch.randn(2, 3, 64, 64), ["Nodule", "Mass"])
    assert out.saliency.shape == (2, 2, 8, 8) and out.scores.shape == (2, 2)
    with pytest.raises(ValueError, match="multiple of its patch size"):
        OpenCLIPModel(config, random_init=True, image_size=60)
