"""The benchmark on a CUDA GPU (``pytest -m cuda``; skipped where ``torch.cuda.is_available()`` is False, see
conftest): ``test`` for every registered model (tiny random configs, as the family tests build them) in
``32-true``, ``16-mixed`` and ``bf16-mixed``; ``fit`` with validation; ``score --predictions`` replayed on CUDA
equal to the CPU replay of the same store (integer keys exact, float keys within 1e-12); the explainers (Grad-CAM
and each family's native map); the callbacks; 1 vs 2 processes on CUDA (two "nodes" x 1 device sharing one GPU
over gloo; two GPUs over NCCL). The scenarios are those of ``test_precision.py``; the ones marked otherwise here
run on CPU too, so their logic is checked without a GPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch

import biovil_reference
import chexzero_reference
import radzero_reference
from test_cli import cli, in_process
from test_explainers_cli import assert_same_report
from test_explainers_families import builders  # noqa: F401  (a fixture: tiny random models of seven families)
from test_multinode import eleven_images, two_nodes
from test_precision import LINEAR, assert_promoted, assert_valid, fit_validation, recorded, report, run_and_replay, tiny_clip

import xbench_pl
from xbench_pl.data.nih_bbox import DemoDataModule
from xbench_pl.registry import available

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
#: registered models the GPU tests leave out, and why
NOT_ON_GPU = {"reader": "its maps are another reader's annotations (CheXlocalize/VinDr files): no forward to run"}
#: every other registered model -> the tiny random model of its family that stands for it (``tiny_models``)
FAMILY = {"clip": "clip", "open_clip": "clip", "chexzero": "chexzero", "biomedclip": "biomedclip", "kad": "kad",
          "kad_224": "kad", "kad_512": "kad", "kad_1024": "kad", "devide": "devide", "carzero": "carzero",
          "medklip": "medklip", "mavl": "mavl", "mavl_46": "mavl", "biovil": "biovil", "biovil_t": "biovil_t",
          "radzero": "radzero", "center": "center", "uniform": "uniform", "location_prior": "location_prior",
          "maira2": "maira2", "medgemma": "medgemma", "medgemma_1_5": "medgemma", "lingshu": "lingshu", "radvlm": "radvlm"}
#: the generative families (tiny random configurations; short answers)
GENERATIVE = ("maira2", "medgemma", "lingshu", "radvlm")
#: the native maps' families that an explainer can explain (the baselines have no network; Qwen2.5-VL's and
#: LLaVA-OneVision's towers no explainer reads: docs/models.md)
NETWORKS = sorted({family for family in FAMILY.values() if family not in ("center", "uniform", "location_prior", "lingshu", "radvlm")})


@pytest.fixture(scope="module")
def tiny_models(builders, tmp_path_factory):  # noqa: F811
    """family -> a function building its tiny random model (``explainer`` options passed on)."""
    root = tmp_path_factory.mktemp("cuda_models")
    biovil_text = str(biovil_reference.write_text_folder(root / "biovil_text", weights=False))
    radzero = root / "radzero.json"
    radzero.write_text(json.dumps(radzero_reference.tiny_architecture(radzero_reference.write_tower_folders(root / "towers"))))
    radzero_release = str(radzero_reference.write_tokenizer_folder(root / "RadZero"))
    chexzero = root / "chexzero.json"
    shipped = json.loads((Path(xbench_pl.__file__).parent / "models" / "configs" / "chexzero.json").read_text())
    chexzero.write_text(json.dumps({"model_cfg": chexzero_reference.model_cfg("tiny"), "preprocess_cfg": shipped["preprocess_cfg"]}))

    def build(family: str, **options):
        torch.manual_seed(0)
        if family in ("biovil", "biovil_t"):
            return xbench_pl.create_model(family, random_init=True, text=biovil_text, **options)
        if family == "radzero":
            return xbench_pl.create_model("radzero", architecture=str(radzero), random_init=True, text=radzero_release, **options)
        if family == "chexzero":
            return xbench_pl.create_model("chexzero", architecture=str(chexzero), random_init=True, **options)
        if family in ("center", "uniform", "location_prior"):
            return xbench_pl.create_model(family, **options)
        if family in GENERATIVE:
            return xbench_pl.create_model(family, random_init=True, max_new_tokens=8, **options)
        return builders(family, **options)

    return build


def cuda_test(model, precision: str, callbacks=(), accelerator: str = "gpu") -> dict:
    """``trainer.test`` of ``model`` on the demo on one GPU (or ``accelerator``) in ``precision``: its tables, every
    metric entry checked float32 outside autocast on that device."""
    trainer = L.Trainer(accelerator=accelerator, devices=1, precision=precision, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, callbacks=list(callbacks))
    model.bootstrap = 0
    with recorded() as (forwards, entries):
        trainer.test(model, datamodule=DemoDataModule(batch_size=4), verbose=False)
    assert_promoted(entries, "cpu" if accelerator == "cpu" else "cuda")
    assert forwards and all(f["autocast"] == (precision != "32-true") for f in forwards)
    return model.results


def replay_matches_cpu(tmp_path: Path, device: str) -> None:
    """A float16 store made on CPU, replayed by ``score --predictions --device DEVICE`` and on CPU: the same report."""
    store = tmp_path / "store"
    made = in_process("test", *LINEAR, "--data", "demo", "--trainer.accelerator", "cpu", "--predictions", str(store),
                      "--model.bootstrap", "20", "--out", str(tmp_path / "run"))
    assert made.returncode == 0, made.stderr[-3000:]
    for where in ("cpu", device):
        scored = in_process("score", "--predictions", str(store), "--device", where, "--out", str(tmp_path / where))
        assert scored.returncode == 0, scored.stderr[-3000:]
    assert_same_report(report(tmp_path / "cpu"), report(tmp_path / device))


# -- on CPU: the coverage and the comparisons themselves -----------------------------------------------------
def test_the_gpu_tests_cover_every_registered_model():
    assert set(FAMILY) | set(NOT_ON_GPU) == set(available("models")) and not set(FAMILY) & set(NOT_ON_GPU)


def test_replay_comparison_on_cpu(tmp_path):
    replay_matches_cpu(tmp_path, "cpu")


def test_the_report_comparison_tells_integers_from_floats():
    assert_same_report({"n": 3, "x": 0.5, "y": float("nan")}, {"n": 3, "x": 0.5 + 1e-13, "y": float("nan")})
    with pytest.raises(AssertionError):
        assert_same_report({"n": 3}, {"n": 4})
    with pytest.raises(AssertionError):
        assert_same_report({"x": 0.5}, {"x": 0.5 + 1e-9})


# -- on CUDA ------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", sorted(FAMILY))
def test_every_registered_model_tests_on_cuda(tiny_models, name, precision):
    results = cuda_test(tiny_models(FAMILY[name]), precision)
    mean = results["demo"]["mean"]
    assert mean["n_regions"] == 12 and all(math.isfinite(mean[k]) for k in ("pointing_game", "dice@0.5"))


@pytest.mark.cuda
@pytest.mark.parametrize("family", NETWORKS)
def test_gradcam_and_native_maps_on_cuda(tiny_models, family):
    for explainer in ("native", "gradcam"):
        results = cuda_test(tiny_models(family, explainer=explainer), "bf16-mixed")
        assert math.isfinite(results["demo"]["mean"]["pointing_game"]), explainer


@pytest.mark.cuda
@pytest.mark.parametrize("precision", PRECISIONS)
def test_cli_test_callbacks_store_and_replay_on_cuda(tmp_path, precision):
    tested, replayed, forwards = run_and_replay(tmp_path, tiny_clip(tmp_path), "gpu", precision, "cuda")
    assert_valid(tested)
    assert_same_report(replayed, tested)  # a float32 store of the promoted maps, judged outside autocast both times


@pytest.mark.cuda
@pytest.mark.parametrize("precision", PRECISIONS)
def test_fit_validates_on_cuda(tmp_path, precision):
    record, forwards, entries = fit_validation(tmp_path, LINEAR, "gpu", precision)
    assert_promoted(entries, "cuda")
    assert math.isfinite(record["validation"][-1]["mean"]["demo"]["pointing_game"])


@pytest.mark.cuda
def test_store_replay_on_cuda_equals_cpu(tmp_path):
    replay_matches_cpu(tmp_path, "cuda")


def without_provenance(folder: Path) -> dict:
    value = json.loads((folder / "metrics.json").read_text())
    assert value.pop("provenance")["world_size"] in (1, 2)
    return value


@pytest.mark.cuda
def test_two_nodes_sharing_one_gpu_over_gloo_equal_one_process(tmp_path):
    common = eleven_images(tmp_path, "gpu")
    gloo = tmp_path / "gloo.yaml"  # NCCL refuses two ranks on one GPU
    gloo.write_text("trainer:\n  strategy:\n    class_path: lightning.pytorch.strategies.DDPStrategy\n"
                    "    init_args:\n      process_group_backend: gloo\n")
    one = in_process(*common, "--trainer.devices", "1", "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    two_nodes([*common, "--config", str(gloo)], tmp_path)
    assert json.dumps(without_provenance(tmp_path / "one")) == json.dumps(without_provenance(tmp_path / "node0"))


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL across GPUs needs two of them")
def test_two_gpus_over_nccl_equal_one_process(tmp_path):
    common = eleven_images(tmp_path, "gpu")  # the one process on one GPU (devices would default to every GPU)
    one = in_process(*common, "--trainer.devices", "1", "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    two = cli(*common, "--trainer.devices", "2", "--trainer.strategy", "ddp", "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    assert json.dumps(without_provenance(tmp_path / "one")) == json.dumps(without_provenance(tmp_path / "two"))
