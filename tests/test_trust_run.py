"""``--model.trust`` end to end (issue 29): the option, the DDP-exact state, the metrics.json keys and ``trust`` block,
1 vs 2 processes, an input-only map failing the randomization test where a gradient map passes it."""

from __future__ import annotations

import gc
import inspect
import json
import math
import re
from pathlib import Path

import lightning as L
import pytest
import torch

from test_cli import in_process, one_and_two_processes, warm_process
from test_open_clip_models import TINY_CLIP, write_config
import xbench_pl
from xbench_pl.data.nih_bbox import DemoDataModule
from xbench_pl.models.base import ZeroShotModel
from xbench_pl.metrics.trust import PAIRS_PER_MAP, random_pair_baseline
from xbench_pl.metrics.trust_mode import TRUST_KEYS, TrustMode, baseline_pairs, value_columns
from xbench_pl.models.trust_run import other_finding, sampled
from xbench_pl.options import parse_trust

CPU = ["--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"]


def demo_split(tmp_path, n: int) -> str:
    """A split file of the first ``n`` demo images (by id) that have a region."""
    ids = sorted(r.image_id for r in DemoDataModule().load_records() if r.regions)[:n]
    path = tmp_path / "split.csv"
    path.write_text("image_id\n" + "\n".join(ids) + "\n")
    return str(path)


def test_the_measures_are_parsed_in_order_and_an_unknown_one_is_refused():
    assert parse_trust("insertion, randomization") == ("randomization", "insertion")
    with pytest.raises(ValueError, match="unknown trust measure 'randomisation'"):
        parse_trust("randomisation,deletion")
    result = in_process("test", "--model", "center", "--model.trust", "deletion,randomisation", "--data", "demo")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--model.trust" in errors[0] and "randomisation" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    reader = in_process("test", "--model", "reader", "--model.random_init", "true", "--model.trust", "deletion", "--data", "demo")
    assert reader.returncode == 2 and "trust" in reader.stderr and "Traceback" not in reader.stderr, reader.stderr[-2000:]
    shown = in_process("test", "--model.help", "center")
    trust_args = [name for name in inspect.signature(ZeroShotModel.__init__).parameters if name.startswith("trust")]
    assert shown.returncode == 0 and len(trust_args) == 8 and all(f"--model.{name}" in shown.stdout for name in trust_args), shown.stdout[-2000:]


def test_the_sample_and_the_other_finding_depend_on_the_seed_and_the_image_only():
    ids = [f"image{i}" for i in range(2000)]
    half = [i for i in ids if sampled(i, 3, 0.5)]
    assert 900 < len(half) < 1100 and half == [i for i in ids if sampled(i, 3, 0.5)]  # the same draw every time
    assert half != [i for i in ids if sampled(i, 4, 0.5)] and all(sampled(i, 3, 1.0) for i in ids)
    picks = [other_finding(i, 2, 5, 0) for i in ids[:200]]
    assert set(picks) == {0, 1, 3, 4}  # every other finding, never the finding itself
    assert other_finding("x", 0, 1, 0) == -1


def test_the_baseline_pairs_are_random_pair_baselines_pairs():
    """Kept pair by pair (for its interval), the baseline's mean is trust-core's ``random_pair_baseline`` of the same
    maps; every pair joins two images of one finding."""
    g = torch.Generator().manual_seed(2)
    image = torch.tensor([5, 5, 9, 9, 3, 7, 7])
    cls = torch.tensor([0, 1, 0, 1, 0, 1, 2])
    maps = torch.rand(7, 12, 12, generator=g)
    first, values = baseline_pairs(maps, image, cls, seed=4)
    assert values.numel() == PAIRS_PER_MAP * 6  # the finding seen on one image alone has no pair
    assert float(values.mean()) == pytest.approx(random_pair_baseline(maps, image.tolist(), cls.tolist(), 4), abs=1e-12)
    assert set(first.tolist()) <= set(range(6)) and 6 not in first.tolist()
    again = baseline_pairs(maps, image, cls, seed=4)
    assert torch.equal(again[0], first) and torch.equal(again[1], values)


def trust_state(settings: dict, parts: list[tuple]) -> dict:
    mode = TrustMode(3, settings)
    for part in parts:
        mode.update(*part)
    state = mode.state()
    columns = mode.columns(state)
    universe = torch.unique(state["unit"], sorted=True)
    weights = torch.randint(0, 3, (20, universe.numel()), generator=torch.Generator().manual_seed(0))
    draws = (universe, "image", weights)
    return {"columns": columns, "replicates": mode.replicates(state, universe, weights),
            "block": mode.block(state, columns, draws)}


def test_the_state_gives_the_same_digits_however_the_pairs_are_split():
    """As a DDP sync would: the same pairs in one update or in three, in another order, give bit-identical keys,
    replicates and trust block (fixed-point sums, records sorted by image and class)."""
    settings = {"measures": ["randomization", "deletion", "insertion", "random_target"], "seed": 0, "stages": ["text", "image"]}
    g = torch.Generator().manual_seed(1)
    p, k = 12, len(value_columns(2))
    image, cls = torch.arange(p) // 2, torch.arange(p) % 3
    values = torch.rand(p, k, generator=g, dtype=torch.float64) * 2 - 1
    values[3, 0] = float("nan")
    maps = torch.rand(p, 16, 16, generator=g)
    pairs = (image, image + 100, cls, values, maps)
    whole = trust_state(settings, [pairs])
    order = torch.randperm(p, generator=g)
    split = [tuple(t[order[rows]] for t in pairs) for rows in (slice(0, 5), slice(5, 6), slice(6, None))]
    parts = trust_state(settings, split)
    assert json.dumps(whole["block"]) == json.dumps(parts["block"])
    for key in TRUST_KEYS:
        assert torch.equal(whole["columns"][key].nan_to_num(7), parts["columns"][key].nan_to_num(7)), key
        assert torch.equal(whole["replicates"][key].nan_to_num(7), parts["replicates"][key].nan_to_num(7)), key
    # the row keys are the means of their columns; the last stage is the one reported
    last = value_columns(2).index("stage1_ssim")
    for c in range(3):
        rows = (cls == c) & ~values[:, last].isnan()
        assert whole["columns"]["randomization_ssim"][c] == pytest.approx(float(values[rows, last].mean()), abs=1e-11)
    assert [s["stage"] for s in whole["block"]["stages"]] == ["text", "image"]
    assert whole["block"]["settings"]["pairs_measured"] == p and whole["block"]["settings"]["images_measured"] == 6


@pytest.mark.ddp_pair
def test_one_and_two_ddp_processes_give_identical_metrics_with_every_measure(tmp_path):
    args = ["test", "--model", "fixture_trust.TrustedLinearIntensityModel", "--model.trust",
            "randomization,deletion,insertion,random_target", "--model.trust_steps", "3", "--model.bootstrap", "50",
            "--data", "demo", "--data.split_file", demo_split(tmp_path, 5), "--data.eval_size", "48",
            "--data.batch_size", "2", *CPU]
    a, b, _ = one_and_two_processes(tmp_path, *args)
    assert json.dumps(a) == json.dumps(b)  # every number, byte for byte
    demo = a["datasets"]["demo"]
    assert set(TRUST_KEYS) <= set(demo["mean"]) and all(set(TRUST_KEYS) <= set(row) for row in demo["classes"].values())
    assert all(demo["mean"][key] is not None and demo["ci"]["mean"][key] is not None for key in TRUST_KEYS)
    trust = demo["trust"]
    assert set(trust) == {"stages", "settings", "passes_randomization"} and trust["stages"]
    assert set(trust["stages"][0]) == {"stage", "ssim", "ssim_interval", "spearman", "spearman_interval", "spearman_abs",
                                       "spearman_abs_interval"}
    assert trust["settings"]["steps"] == 3 and trust["settings"]["baseline"] == "blur"
    assert trust["settings"]["pairs_measured"] == demo["mean"]["n_regions"]
    assert trust["stages"][-1]["ssim"] == demo["mean"]["randomization_ssim"]
    assert isinstance(trust["passes_randomization"], bool)


def edges_and_gradcam_runs(folder: Path) -> dict:
    """The background job of the test below, in the warm process: the two runs (``folder/edges``, ``folder/gradcam``)
    and the report of both (``folder/report``)."""
    architecture = write_config(folder / "tiny_clip.json", TINY_CLIP)
    common = ["--model.architecture", architecture, "--model.random_init", "true", "--model.trust", "randomization",
              "--model.bootstrap", "0", "--data", "demo", "--data.split_file", demo_split(folder, 6),
              "--data.eval_size", "48", *CPU]
    results = {name: warm_process("test", *model, *common, "--out", str(folder / name))
               for name, model in (("edges", ["--model", "fixture_trust.EdgeExplainedCLIP"]),
                                   ("gradcam", ["--model", "clip", "--model.explainer", "gradcam"]))}
    results["report"] = warm_process("report", str(folder / "edges"), str(folder / "gradcam"), "--out", str(folder / "report"))
    return results


@pytest.mark.background(job=edges_and_gradcam_runs)
def test_an_input_only_map_fails_randomization_and_a_gradient_map_passes(background):
    """Through the CLI on a tiny random CLIP: the edges of the image (an explainer that reads the input alone) stay as
    they are when the weights are randomized (SSIM 1, above the baseline of random image pairs); Grad-CAM's maps follow
    the weights and fall below it."""
    folder, results = background
    runs = {}
    for name in ("edges", "gradcam"):
        result = results[name]
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = json.loads((folder / name / "metrics.json").read_text())["datasets"]["demo"]
        assert ("passes" if name == "gradcam" else "FAILS") in result.stderr + result.stdout
    edges, gradcam = runs["edges"], runs["gradcam"]
    assert all(s["ssim"] == pytest.approx(1.0) and s["spearman"] == pytest.approx(1.0) for s in edges["trust"]["stages"])
    assert edges["trust"]["passes_randomization"] is False
    assert gradcam["trust"]["passes_randomization"] is True
    assert gradcam["mean"]["randomization_ssim"] < gradcam["mean"]["randomization_baseline"]
    assert not math.isclose(gradcam["mean"]["randomization_ssim"], 1.0)
    # the report's "Is the map the model's?" section reads these real runs: the edges fail, Grad-CAM passes
    assert results["report"].returncode == 0, results["report"].stderr[-3000:]
    section = (folder / "report" / "report.md").read_text().split("Is the map the model's?")[1].split("\n## ")[0]
    rows = {line.split(" | ")[0]: line.split(" | ") for line in section.splitlines()
            if line.startswith(("| fixture_trust.EdgeExplainedCLIP |", "| clip [gradcam] |"))}
    assert rows["| fixture_trust.EdgeExplainedCLIP"][4] == "FAIL ⚠" and rows["| clip [gradcam]"][4] == "pass"


def test_a_run_resumed_from_a_store_refuses_the_trust_measures(tmp_path):
    """The stored images are replayed without the model: they cannot be measured, so the run stops in one line."""
    common = ["test", "--model", "location_prior", "--data", "demo", "--data.split_file", demo_split(tmp_path, 2),
              "--data.eval_size", "32", "--model.bootstrap", "0", "--model.trust", "deletion", "--model.trust_steps", "2",
              "--predictions", str(tmp_path / "store"), *CPU]
    first = in_process(*common, "--out", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = in_process(*common, "--resume", "true", "--out", str(tmp_path / "second"))
    assert resumed.returncode != 0 and "Traceback" not in resumed.stderr
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--model.trust" in errors[0] and "--predictions" in errors[0], resumed.stderr[-2000:]


def parameter_copies(model) -> float:
    """The parameters held by ``model`` and every live copy of it (a module carrying its ``probe`` mark), in units of
    the model's own: the distinct storages' bytes over the model's."""
    def held(modules) -> int:
        return sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for m in modules for p in m.parameters()}.values())

    copies = [obj for obj in gc.get_objects() if type(obj) is type(model) and getattr(obj, "probe", None) == model.probe]
    return held(copies) / held([model])


def test_randomization_holds_two_copies_of_the_weights_however_many_stages_and_says_its_cost(tmp_path, capsys):
    """A tiny CLIP of ViT-B/16's depth (15 stages) measured through every stage on two batches: at each batch's last
    stage the model and its copies hold two models' parameters (a copy per stage held 16); after the first batch one line
    says what randomization costs per batch and in all."""
    architecture = write_config(tmp_path / "clip12.json", {**TINY_CLIP, "vision_cfg": {**TINY_CLIP["vision_cfg"], "layers": 12}})
    model = xbench_pl.create_model("clip", architecture=architecture, random_init=True, trust="randomization", bootstrap=0)
    model.probe = f"probe-{id(model)}"  # deep copies keep it (a string is copied by reference)
    stages, visual, held, passes = len(model.trust_run.stage_names(model)), model.model.visual, [], []

    def count(module, inputs, output):
        if module is not visual:  # a randomized copy's pass (the trained model's own is the native map)
            passes.append(1)
            if len(passes) % stages == 0:
                held.append(parameter_copies(model))

    visual.register_forward_hook(count)
    data = xbench_pl.create_datamodule("demo", split_file=demo_split(tmp_path, 2), eval_size=32, batch_size=1)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.test(model, datamodule=data, verbose=False)
    assert stages == 15 and len(passes) == 2 * stages
    assert len(held) == 2 and max(held) <= 2, held
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trust randomization:")]
    assert len(lines) == 1 and re.fullmatch(r"trust randomization: 15 stages, ~\d+\.\d s per batch, ~\d+\.\d min in all "
                                            r"\(2 batches\)", lines[0]), lines
    assert model.trust_run.walk is None  # the working copy is dropped at the end of the run
