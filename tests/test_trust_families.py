"""Every registered VLM runs the randomization and deletion tests with its native and its Grad-CAM maps on the demo:
tiny random (or seeded) copies of each family's architecture, two images, a 32-pixel eval grid, two deletion steps;
the native maps through every stage of the cascade, Grad-CAM's (a backward per finding and copy) through the last."""

from __future__ import annotations

import lightning as L
import pytest

import xbench_pl
from test_explainers_families import FAMILIES, builders  # noqa: F401  (fixture)
from test_newer_models import MODELS as NEWER
from test_trust_run import demo_split

TRUST = dict(trust="randomization,deletion", trust_steps=2, bootstrap=0)


def options(args: list[str]) -> tuple[str, dict]:
    """``["--model", NAME, "--model.KEY", VALUE, ...]`` (``test_newer_models``' helpers) as ``(NAME, {KEY: VALUE})``."""
    pairs = dict(zip(args[::2], args[1::2]))
    return pairs.pop("--model"), {key.removeprefix("--model."): value for key, value in pairs.items()}


def run_on_demo(model, tmp_path) -> dict:
    data = xbench_pl.create_datamodule("demo", split_file=demo_split(tmp_path, 2), eval_size=32, batch_size=2)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.test(model, datamodule=data, verbose=False)
    return model.results["demo"]


@pytest.mark.parametrize("explainer", ["native", "gradcam"])
@pytest.mark.parametrize("family", FAMILIES + list(NEWER))
def test_every_vlm_runs_randomization_and_deletion(family, explainer, builders, tmp_path):  # noqa: F811
    stages = "all" if explainer == "native" else "last"
    if family in NEWER:
        name, kwargs = options(NEWER[family](tmp_path))
        model = xbench_pl.create_model(name, explainer=explainer, trust_stages=stages, **kwargs, **TRUST)
    else:
        model = builders(family, explainer=explainer, trust_stages=stages, **TRUST)
    table = run_on_demo(model, tmp_path)
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
