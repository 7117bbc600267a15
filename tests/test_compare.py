"""The paired comparison of two runs (``compare``): the paired bootstrap against a loop, end to end on
two prediction stores of the demo."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bootstrap_units import expanded, feed_keyed, patient_inputs
from test_cli import in_process, warm_process

from xbench_pl.commands.compare import bootstrap_p_value, paired_bootstrap
from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.functional import auroc, bootstrap_weights, pointing_game
from xbench_pl.metrics.resampling import unit_key


def test_bootstrap_p_value_counts_replicates_on_each_side_of_zero():
    d = torch.tensor([0.3, -0.1, 0.2, 0.0, 0.5, float("nan"), 0.4])
    # 6 defined: 2 at or below 0, 5 at or above 0
    assert bootstrap_p_value(d) == pytest.approx(2 * (1 + 2) / 7)
    assert bootstrap_p_value(torch.ones(99)) == pytest.approx(2 / 100)
    assert bootstrap_p_value(torch.zeros(5)) == 1.0 and bootstrap_p_value(torch.full((3,), float("nan"))) is None


def two_runs(seed=4):
    """The same images, regions and labels; run B has other maps and scores."""
    a = patient_inputs(seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    b = {**a, "maps": torch.rand(a["maps"].shape, generator=gen), "scores": torch.rand(a["scores"].shape, generator=gen),
         "saliency": torch.rand(a["saliency"].shape, generator=gen)}
    return a, b


def test_paired_bootstrap_matches_a_loop_with_shared_draws():
    a, b = two_runs()
    n, resamples = len(a["ids"]), 30
    metrics = []
    for x in (a, b):
        m = BenchmarkMetrics(["A", "B", "C"], bootstrap=0)
        feed_keyed(m, x, list(range(n)))
        metrics.append(m)
    out = paired_bootstrap(*metrics, resamples=resamples, seed=9)
    assert out["unit"] == "patient where known, else image" and out["units"] == 6
    units = [unit_key(a["ids"][i], a["patients"][i]) for i in range(n)]
    universe = sorted(set(units))
    drawn = torch.stack([bootstrap_weights(len(universe), resamples, 9)[:, universe.index(u)] for u in units], 1)
    hits = {name: pointing_game(x["maps"], x["masks"]) for name, x in (("a", a), ("b", b))}
    diffs = {"pointing_game": [], "auroc": []}
    for r in range(resamples):
        rows = expanded(drawn[r])
        pairs = [p for i in rows for p in (a["image"] == i).nonzero().flatten().tolist()]
        per_class = {"pointing_game": [], "auroc": []}
        for k in range(3):
            mine = [p for p in pairs if a["cls"][p] == k]
            per_class["pointing_game"].append(np.mean([hits["a"][p].item() - hits["b"][p].item() for p in mine]) if mine else np.nan)
            per_class["auroc"].append(auroc(a["scores"][rows, k], a["labels"][rows, k]).item()
                                      - auroc(b["scores"][rows, k], b["labels"][rows, k]).item())
        for key in diffs:
            diffs[key].append(per_class[key])
    tables = [m.compute() for m in metrics]
    for key, reps in diffs.items():
        reps = np.array(reps)
        for k, name in enumerate("ABC"):
            row = out["classes"][name][key]
            assert row["diff"] == pytest.approx(tables[0]["classes"][name][key] - tables[1]["classes"][name][key], abs=1e-12)
            np.testing.assert_allclose(row["ci"], np.nanquantile(reps[:, k], [0.025, 0.975]), atol=1e-9)
            assert row["p"] == pytest.approx(bootstrap_p_value(torch.tensor(reps[:, k])), abs=1e-12)
        # the macro difference per replicate: the classes defined in it, as ci's intervals (pairs: all classes here)
        np.testing.assert_allclose(out["mean"][key]["ci"], np.nanquantile(np.nanmean(reps, 1), [0.025, 0.975]), atol=1e-9)
    same = paired_bootstrap(metrics[0], metrics[0], resamples=resamples, seed=9)
    assert all(row["diff"] == 0 and row["ci"] == [0.0, 0.0] and row["p"] == 1.0 for row in same["mean"].values() if row["diff"] is not None)


def test_runs_on_other_images_are_refused():
    a, b = two_runs()
    metrics = [BenchmarkMetrics(["A", "B", "C"], bootstrap=0) for _ in range(2)]
    feed_keyed(metrics[0], a, list(range(12)))
    feed_keyed(metrics[1], b, list(range(11)))
    with pytest.raises(ValueError, match="same images"):
        paired_bootstrap(*metrics, resamples=5)


COMMON = ["--data", "demo", "--data.batch_size", "4", "--trainer.accelerator", "cpu", "--model.bootstrap", "0"]


def two_stored_runs(folder: Path) -> list:
    """The background job of the test below, in the warm process: runs of two models (``folder/run_a``, ``run_b``)
    with float32 prediction stores (``folder/store_a``, ``store_b``)."""
    return [warm_process("test", "--model", model, *COMMON, "--out", str(folder / f"run_{name}"),
                         "--predictions", str(folder / f"store_{name}"), "--predictions_dtype", "float32")
            for name, model in (("a", "fixture_models.IntensityModel"), ("b", "center"))]


@pytest.mark.background(job=two_stored_runs)
def test_compare_command_on_two_stores(background):
    folder, runs = background
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    result = in_process("compare", "--predictions", str(folder / "store_a"), str(folder / "store_b"), "--bootstrap", "200",
                        "--out", str(folder / "cmp"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((folder / "cmp" / "compare.json").read_text())
    demo = report["datasets"]["demo"]
    assert demo["unit"] == "patient" and report["resamples"] == 200
    ran = [json.loads((folder / f"run_{n}" / "metrics.json").read_text())["datasets"]["demo"]["mean"] for n in "ab"]
    for key in ("pointing_game", "dice_best", "auroc", "dice_lift"):
        row = demo["mean"][key]
        assert (row["a"], row["b"]) == (ran[0][key], ran[1][key])
        if row["diff"] is not None:
            assert row["diff"] == pytest.approx(ran[0][key] - ran[1][key]) and 0 < row["p"] <= 1
    assert "| pointing_game |" in (folder / "cmp" / "compare.md").read_text()
    # a store written before the judging had a class of its own records fit's options among its metric settings too
    manifest_path = folder / "store_b" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["metrics"].update(trainable=None, lr=1e-4, weight_decay=0.01)
    manifest_path.write_text(json.dumps(manifest))
    again = in_process("compare", "--predictions", str(folder / "store_a"), str(folder / "store_b"), "--bootstrap", "200",
                       "--out", str(folder / "cmp_old"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((folder / "cmp_old" / "compare.json").read_text())["datasets"] == report["datasets"]
    scored = in_process("score", "--predictions", str(folder / "store_b"), "--out", str(folder / "scored_b"))
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert json.loads((folder / "scored_b" / "metrics.json").read_text())["datasets"]["demo"]["mean"] == ran[1]
    resumed = in_process("test", "--model", "center", *COMMON, "--out", str(folder / "resumed_b"), "--predictions",
                         str(folder / "store_b"), "--predictions_dtype", "float32", "--resume", "true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    missing = in_process("compare", "--predictions", str(folder / "store_a"), str(folder / "nothing"))
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0 and "no prediction store" in missing.stderr
    alone = in_process("compare", "--predictions", str(folder / "store_a"))
    assert alone.returncode == 2 and "--predictions A B" in alone.stderr
