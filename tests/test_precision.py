"""Reduced precision: under ``--trainer.precision bf16-mixed`` (``16-mixed`` on CUDA) the forward runs in
bf16/fp16, and its scores and maps enter the metrics once promoted to float32, outside autocast, in ``test``,
``fit``'s validation and ``score --predictions``. The scenarios take the accelerator and the replay device, so
``test_cuda.py`` runs the same bodies on a GPU."""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
import torch
from test_cli import REPO, in_process
from test_open_clip_models import TINY_CLIP, write_config

from xbench_pl.data.synthetic import NIH_CASES
from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.models.base import ZeroShotModel

REDUCED = (torch.float16, torch.bfloat16)


@contextmanager
def recorded():
    """``(forwards, entries)``: per forward (``batch_output``) the dtypes of its scores and maps and whether autocast
    was on; per metric update (the test,
    validation and replay metrics alike) the dtypes of the maps, scores and native maps that entered, and whether
    autocast was on."""
    forwards, entries = [], []
    update, batch_output = BenchmarkMetrics.update, ZeroShotModel.batch_output

    def record_update(self, scores, labels, maps, masks, class_index, **kwargs):
        saliency = kwargs.get("saliency")
        entries.append({"maps": maps.dtype, "scores": scores.dtype, "saliency": None if saliency is None else saliency.dtype,
                        "autocast": torch.is_autocast_enabled(maps.device.type), "device": maps.device.type})
        return update(self, scores, labels, maps, masks, class_index, **kwargs)

    def record_forward(self, batch):
        output = batch_output(self, batch)
        forwards.append({"scores": output.scores.dtype, "maps": output.saliency.dtype,
                         "autocast": torch.is_autocast_enabled(output.saliency.device.type)})
        return output

    with mock.patch.object(BenchmarkMetrics, "update", record_update), mock.patch.object(ZeroShotModel, "batch_output", record_forward):
        yield forwards, entries


def assert_promoted(entries: list[dict], device: str) -> None:
    """Every metric update took float32 maps (float32 or float64 scores) outside autocast, on ``device``."""
    assert entries
    for entry in entries:
        assert entry["maps"] == torch.float32 and entry["scores"] not in REDUCED and entry["saliency"] not in REDUCED, entry
        assert not entry["autocast"] and entry["device"] == device, entry


def report(folder: Path) -> dict:
    """metrics.json without provenance (times, world size, host)."""
    value = json.loads((folder / "metrics.json").read_text())
    value.pop("provenance")
    return value


#: ``run_and_replay``'s findings: every kind of file the callbacks write, a quarter of the figures
FINDINGS = ["Nodule", "Mass"]


def assert_valid(value: dict) -> None:
    """A metrics.json whose demo table holds finite numbers for every region pair (of ``FINDINGS``)."""
    mean = value["datasets"]["demo"]["mean"]
    assert mean["n_regions"] == sum(finding in FINDINGS for finding, _ in NIH_CASES)
    for key in ("auroc", "pointing_game", "dice@0.5", "iou_best"):
        assert isinstance(mean[key], float) and math.isfinite(mean[key]), (key, mean[key])


#: a model whose scores and maps come out of autocast in bf16/fp16 (a 1 x 1 linear map: fit trains it)
LINEAR = ["--model", "fixture_models.LinearIntensityModel", "--model.bootstrap", "0"]


def tiny_clip(folder: Path) -> list[str]:
    """``--model`` options of a tiny random CLIP (OpenAI layout: linear layers, so autocast runs it in bf16/fp16)."""
    return ["--model", "clip", "--model.architecture", write_config(folder / "tiny_clip.json", TINY_CLIP),
            "--model.random_init", "true", "--model.bootstrap", "0"]


def run_and_replay(tmp_path: Path, model: list[str], accelerator: str, precision: str, device: str) -> tuple[dict, dict, list]:
    """``test`` of ``FINDINGS`` (with the callbacks' PNG preset and a float32 store) in ``precision`` on
    ``accelerator``, then ``score --predictions`` of its store on ``device``: (test's report, the replay's report,
    forwards' dtypes), each run's metric entries checked promoted."""  # forwards: test's only (the replay's are the stored maps)
    store, callbacks = tmp_path / "store", tmp_path / "png.yaml"  # callbacks/png.yaml, one heatmap a finding
    callbacks.write_text((REPO / "callbacks" / "png.yaml").read_text().replace("per_finding: 4", "per_finding: 1"))
    with recorded() as (forwards, entries):
        run = in_process("test", *model, "--data", "demo", "--data.classes", f"[{', '.join(FINDINGS)}]",
                         "--data.batch_size", "4", "--trainer.accelerator", accelerator,
                         "--trainer.precision", precision, "--config", str(callbacks), "--predictions", str(store),
                         "--predictions_dtype", "float32", "--out", str(tmp_path / "test"))
        assert run.returncode == 0, run.stderr[-3000:]
        assert_promoted(entries, "cpu" if accelerator == "cpu" else "cuda")
        tested = list(forwards)
        entries.clear()
        scored = in_process("score", "--predictions", str(store), "--device", device, "--out", str(tmp_path / "score"))
        assert scored.returncode == 0, scored.stderr[-3000:]
        assert_promoted(entries, torch.device(device).type)
    assert list((tmp_path / "test").glob("**/*.png"))  # the callbacks ran on the promoted outputs
    return report(tmp_path / "test"), report(tmp_path / "score"), tested


def fit_validation(tmp_path: Path, model: list[str], accelerator: str, precision: str) -> tuple[dict, list, list]:
    """One epoch of ``fit`` (two training batches) with validation in ``precision``: (fit.json, forwards' dtypes, entries)."""
    with recorded() as (forwards, entries):
        run = in_process("fit", *model, "--model.lr", "0.01", "--data", "demo", "--data.val_fraction", "0.5",
                         "--data.batch_size", "2", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                         "--trainer.num_sanity_val_steps", "0", "--trainer.enable_model_summary", "false",
                         "--trainer.accelerator", accelerator, "--trainer.precision", precision, "--out", str(tmp_path / "fit"))
        assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((tmp_path / "fit" / "fit.json").read_text()), forwards, entries


def test_bf16_mixed_test_and_replay_enter_the_metrics_in_float32(tmp_path):
    tested, replayed, forwards = run_and_replay(tmp_path, LINEAR, "cpu", "bf16-mixed", "cpu")
    # the forward ran under autocast and gave bf16 scores and maps: the promotion had something to do
    assert forwards and all(f == {"scores": torch.bfloat16, "maps": torch.bfloat16, "autocast": True} for f in forwards)
    assert_valid(tested)
    assert tested["config"]["precision"] == "bf16-mixed"
    # the float32 store holds the promoted maps: its replay (no autocast) judges exactly what the run judged
    assert replayed == tested


def test_bf16_mixed_fit_validates_in_float32(tmp_path):
    record, forwards, entries = fit_validation(tmp_path, LINEAR, "cpu", "bf16-mixed")
    assert forwards and all(f == {"scores": torch.bfloat16, "maps": torch.bfloat16, "autocast": True} for f in forwards)
    assert_promoted(entries, "cpu")
    mean = record["validation"][-1]["mean"]["demo"]
    assert math.isfinite(mean["auroc"]) and math.isfinite(mean["pointing_game"])
    assert record["trained_parameters"] == ["mix.weight", "mix.bias"]


def test_a_real_family_under_bf16_mixed(tmp_path):
    """A tiny random CLIP (its linear layers run in bf16; its outputs are normalised back to float32)."""
    tested, replayed, forwards = run_and_replay(tmp_path, tiny_clip(tmp_path), "cpu", "bf16-mixed", "cpu")
    assert forwards and all(f["autocast"] for f in forwards)
    assert_valid(tested)
    assert replayed == tested


def test_the_replay_device_must_be_there():
    from xbench_pl.commands.score import UsageProblem, checked_device

    assert checked_device("cpu") == torch.device("cpu")
    with pytest.raises(UsageProblem, match="^--device: "):
        checked_device("nowhere")
    if not torch.cuda.is_available():
        with pytest.raises(UsageProblem, match="^--device: no cuda device"):
            checked_device("cuda")
