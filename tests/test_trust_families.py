"""Every registered VLM runs the randomization and deletion tests with its native and its Grad-CAM maps on the demo:
tiny random (or seeded) copies of each family's architecture, two images, a 32-pixel eval grid, two deletion steps;
the native maps through every stage of the cascade, Grad-CAM's (a backward per finding and copy) through the last. The
runs are the background lane's, in its warm process; the tests read their tables."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest

import xbench_pl
from test_cli import warm_call
from test_explainers_families import FAMILIES, builders_in
from test_newer_models import MODELS as NEWER
from test_trust_run import demo_split

TRUST = dict(trust="randomization,deletion", trust_steps=2, bootstrap=0)
RUNS = [(family, explainer) for family in FAMILIES + list(NEWER) for explainer in ("native", "gradcam")]


def options(args: list[str]) -> tuple[str, dict]:
    """``["--model", NAME, "--model.KEY", VALUE, ...]`` (``test_newer_models``' helpers) as ``(NAME, {KEY: VALUE})``."""
    pairs = dict(zip(args[::2], args[1::2]))
    return pairs.pop("--model"), {key.removeprefix("--model."): value for key, value in pairs.items()}


def run_on_demo(model, tmp_path) -> dict:
    data = xbench_pl.create_datamodule("demo", split_file=demo_split(tmp_path, 2), eval_size=32, batch_size=2)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.test(model, datamodule=data, verbose=False)
    return model.results["demo"]


def measured_on_demo(family: str, explainer: str, root: str) -> dict:
    """The family's table on two demo images with both measures: the native maps through every stage of the cascade,
    Grad-CAM's through the last (in the warm process: ``measured_tables``)."""
    folder = Path(root) / f"{family}-{explainer}"
    folder.mkdir()
    stages = "all" if explainer == "native" else "last"
    if family in NEWER:
        name, kwargs = options(NEWER[family](folder))
        model = xbench_pl.create_model(name, explainer=explainer, trust_stages=stages, **kwargs, **TRUST)
    else:
        model = builders_in(root)(family, explainer=explainer, trust_stages=stages, **TRUST)
    return run_on_demo(model, folder)


def measured_tables(folder: Path) -> dict:
    """The background job of the test below: every family's ``measured_on_demo`` in the warm process."""
    return {run: warm_call(measured_on_demo, *run, str(folder)) for run in RUNS}


@pytest.mark.parametrize("family, explainer", RUNS)
@pytest.mark.background(job=measured_tables)
def test_every_vlm_runs_randomization_and_deletion(family, explainer, background):
    result = background[1][family, explainer]
    assert result.returncode == 0, result.stderr[-3000:]
    table, stages = json.loads(result.stdout), "all" if explainer == "native" else "last"
    trust = table["trust"]
    assert trust["settings"]["measures"] == ["randomization", "deletion"]
    assert len(trust["stages"]) >= 2 if stages == "all" else len(trust["stages"]) == 1, trust["stages"]
    assert all(stage["ssim"] is not None for stage in trust["stages"]), trust["stages"]
    # Spearman may be undefined: a fully randomized model's Grad-CAM can be all zeros after its ReLU (KAD's: a constant map)
    for key in ("randomization_ssim", "randomization_baseline", "deletion_auc"):
        assert table["mean"][key] is not None, key
    assert "randomization_spearman" in table["mean"]
    assert "insertion_auc" not in table["mean"] and "random_target_ssim" not in table["mean"]
    assert trust["settings"]["pairs_measured"] == table["mean"]["n_regions"] > 0
