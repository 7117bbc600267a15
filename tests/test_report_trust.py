"""The report's "Is the map the model's?" section (runs with ``--model.trust`` keys: hand-built metrics.json as
run_files writes them) and the agreement matrix across models (``metrics.agreement``, from the prediction stores of
real tiny runs); both rendered in markdown and in headless Chromium."""

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_cli import in_process
from test_report_explainers import explained_run
from test_report_html import FINDINGS, _chromium

from xbench_pl.commands import main as cli_main
from xbench_pl.commands.report import trust as trust_section
from xbench_pl.commands.report.agreement import figure_agreement
from xbench_pl.commands.report.runs import find_runs
from xbench_pl.commands.report.trust import FLAG, FLAG_TEXT, TRUST_KEYS, figure_cascade, trust_rows
from xbench_pl.metrics.agreement import agreement, eval_grid_maps, matrix, stored_labels, stored_maps
from xbench_pl.metrics.trust import ssim

STAGES = ("decoder", "text", "image.block3", "image.block2")


def add_trust(folder: Path, seed: int, passes: bool | None, stages: int = len(STAGES)) -> dict:
    """Give a fabricated run (``explained_run``) the trust keys of ``--model.trust randomization,deletion,insertion,
    random_target`` as ``run_files`` writes them: per finding and in ``mean`` (macro mean), intervals under
    ``ci``, and the ``trust`` block with ``stages`` cascade stages; its maps pass the randomization test or not."""
    metrics = json.loads((folder / "metrics.json").read_text())
    gen = torch.Generator().manual_seed(seed)
    for table in metrics["datasets"].values():
        for row in table["classes"].values():
            baseline = 0.2 + 0.1 * float(torch.rand((), generator=gen))
            row.update(randomization_ssim=baseline + (-0.15 if passes else 0.5), randomization_spearman=0.3,
                       randomization_baseline=baseline, deletion_auc=float(torch.rand((), generator=gen)) * 0.5,
                       insertion_auc=0.5 + float(torch.rand((), generator=gen)) * 0.5, random_target_ssim=0.4)
        keys = (*TRUST_KEYS, "randomization_spearman")
        table["mean"].update({k: sum(r[k] for r in table["classes"].values()) / len(FINDINGS) for k in keys})
        table["ci"] = {"level": 0.95, "resamples": 1000, "seed": 0, "unit": "image",
                       "mean": {k: [table["mean"][k] - 0.05, table["mean"][k] + 0.04] for k in ("pointing_game", *keys)},
                       "classes": {f: {k: [r[k] - 0.1, r[k] + 0.1] for k in keys} for f, r in table["classes"].items()}}
        last = table["mean"]["randomization_ssim"]
        curve = [1.0 - (1.0 - last) * (i + 1) / stages for i in range(stages)]
        table["trust"] = {"stages": [{"stage": STAGES[i], "ssim": s, "ssim_interval": [s - 0.05, s + 0.05], "spearman": s,
                                      "spearman_abs": s} for i, s in enumerate(curve)],
                          "settings": {"measures": ["randomization", "deletion", "insertion", "random_target"], "seed": 0,
                                       "steps": 10, "baseline": "blur"},
                          "passes_randomization": passes}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return metrics


#: (model, explainer, passes the randomization test); a run of ``None`` measured no trust
TRUSTED = (("clip", "native", False), ("clip", "gradcam", True), ("biomedclip", "gradcam", True),
           ("biomedclip", "chefer", None))


@pytest.fixture(scope="module")
def trusted(tmp_path_factory):
    """Four fabricated runs: three measured trust (clip native fails the randomization test), one did not."""
    tmp = tmp_path_factory.mktemp("trusted")
    metrics = {}
    for i, (model, explainer, passes) in enumerate(TRUSTED):
        folder = tmp / f"{model}-{explainer}"
        metrics[(model, explainer)] = explained_run(folder, model, explainer, 40 + i)
        if passes is not None:
            metrics[(model, explainer)] = add_trust(folder, i, passes)
    # the failing run has the highest Pointing Game: the case the section is there to show
    failing = metrics[("clip", "native")]
    failing["datasets"]["demo"]["mean"]["pointing_game"] = 0.93
    (tmp / "clip-native" / "metrics.json").write_text(json.dumps(failing))
    return tmp, metrics


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _rows(text: str) -> dict[str, list[str]]:
    """The first markdown table of ``text``: its rows by first cell."""
    block = re.search(r"(?:^\|.*\|\n?)+", text, flags=re.M).group(0)
    lines = [line for line in block.strip().splitlines() if not line.startswith("|---")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def test_pointing_game_beside_the_sanity_checks_and_the_failed_one_flagged(trusted, tmp_path):
    tmp, metrics = trusted
    folders = [str(tmp / f"{m}-{e}") for m, e, _ in TRUSTED]
    assert cli_main(["report", *folders, "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    section = _section(md, "Is the map the model's?")
    assert FLAG_TEXT in section and "Do the maps agree" not in md  # no run saved its maps
    for dataset in ("demo", "demo_dicom"):
        rows = _rows(section.split(f"### {dataset}\n", 1)[1])
        assert list(rows) == ["run", "clip", "clip [gradcam]", "biomedclip [gradcam]"]  # chefer measured no trust
        assert rows["run"][:4] == ["Pointing Game", "randomization SSIM (last stage)", "random-pair baseline", "randomization test"]
        for model, explainer, passes in TRUSTED[:3]:
            table = metrics[(model, explainer)]["datasets"][dataset]
            row = rows[model if explainer == "native" else f"{model} [{explainer}]"]
            low, high = table["ci"]["mean"]["pointing_game"]
            pg = f"{table['mean']['pointing_game']:.3f} [{low:.3f}, {high:.3f}]"
            assert row[0] == (f"{FLAG} {pg}" if not passes else pg)
            assert row[3] == ("pass" if passes else f"FAIL {FLAG}")
            for cell, key in zip(row[1:3] + row[4:], TRUST_KEYS):
                low, high = table["ci"]["mean"][key]
                assert cell == f"{table['mean'][key]:.3f} [{low:.3f}, {high:.3f}]"
    warning = re.search(r"> \*\*demo: failed the randomization test: (.*)\*\*", section).group(1)
    assert warning.startswith("clip (Pointing Game 0.930)")
    data = json.loads((tmp_path / "out" / "report.json").read_text())["trust"]["demo"]
    assert [(r["run"], r["flagged"], r["passes_randomization"]) for r in data] == [
        ("clip", True, False), ("clip [gradcam]", False, True), ("biomedclip [gradcam]", False, True)]
    assert data[1]["stages"] == metrics[("clip", "gradcam")]["datasets"]["demo"]["trust"]["stages"]


def test_cascade_figure_draws_each_stage_against_the_baseline(trusted, tmp_path):
    tmp, metrics = trusted
    runs = find_runs([str(tmp / f"{m}-{e}") for m, e, _ in TRUSTED])
    figure = figure_cascade(trust_rows(runs, "demo"), tmp_path / "cascade.png", "demo")
    assert Image.open(tmp_path / "cascade.png").format == "PNG"
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["clip", "biomedclip"]  # a panel per model
    assert [t.get_text() for t in visible[0].get_xticklabels()] == list(STAGES)
    lines = {line.get_label(): line for line in visible[0].get_lines() if not line.get_label().startswith("_")}
    for explainer in ("native", "gradcam"):
        stages = metrics[("clip", explainer)]["datasets"]["demo"]["trust"]["stages"]
        assert list(lines[explainer].get_ydata()) == pytest.approx([s["ssim"] for s in stages], rel=1e-12)
    baselines = sorted(line.get_ydata()[0] for line in visible[0].get_lines() if line.get_linestyle() == "--")
    assert baselines == pytest.approx(sorted(metrics[("clip", e)]["datasets"]["demo"]["mean"]["randomization_baseline"]
                                             for e in ("native", "gradcam")), rel=1e-12)
    rows = trust_rows(runs, "demo")
    rows[0]["stages"][-1].update(ssim=-0.42, ssim_interval=[-0.5, -0.4])  # SSIM can be negative: the axis reaches it
    low, high = figure_cascade(rows, tmp_path / "negative.png", "demo").axes[0].get_ylim()
    assert low < -0.5 and high > 1


def test_no_section_without_trust_keys(trusted):
    tmp, _ = trusted
    assert trust_section.section(find_runs([str(tmp / "biomedclip-chefer")]), tmp / "unused") is None


# -- agreement across models, from real runs' prediction stores -------------------------------------------------
COMMON = ["--data", "demo", "--data.eval_size", "48", "--data.batch_size", "6", "--trainer.accelerator", "cpu",
          "--predictions_dtype", "float32", "--predictions_shard_images", "4", "--model.bootstrap", "0"]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Three tiny runs that saved their maps (``--predictions RUN/store``): the ``center`` baseline, the image's
    brightness (``IntensityModel``), and the brightness again on more images (``--data.negatives 2``)."""
    tmp = tmp_path_factory.mktemp("stored")
    for name, model, extra in (("center", ["--model", "center"], []), ("intensity", ["--model", "fixture_models.IntensityModel"], []),
                               ("more", ["--model", "fixture_models.IntensityModel"], ["--data.negatives", "2"])):
        result = in_process("test", *model, *COMMON, *extra, "--out", str(tmp / name), "--predictions", str(tmp / name / "store"))
        assert result.returncode == 0, result.stderr[-3000:]
    return tmp


def test_a_run_agrees_with_itself_and_two_models_less(stored):
    stores = {"center": stored / "center" / "store", "intensity": stored / "intensity" / "store",
              "intensity again": stored / "intensity" / "store"}
    result = agreement(stores, eval_size=48)["demo"]
    assert result.names == list(stores) and result.mismatches == []
    classes = json.loads((stored / "center" / "metrics.json").read_text())["datasets"]["demo"]["classes"]
    positives = sum(row["n_pos"] for row in classes.values())
    assert all(n == positives for row in result.pairs for n in row) and positives == 12
    for i in range(3):
        assert result.ssim[i][i] == pytest.approx(1.0, abs=1e-12)
    assert result.ssim[1][2] == pytest.approx(1.0, abs=1e-12)  # the same maps under two names
    different = result.ssim[0][1]
    assert different < 0.9 and result.ssim[1][0] == different
    low, high = result.interval[0][1]
    assert low <= different <= high < 1
    # the mean over the 12 (image, finding) pairs, each compared on the eval grid as the benchmark normalises
    center, intensity = stored_maps(stores["center"])["demo"], stored_maps(stores["intensity"])["demo"]
    ids = sorted(center.rows)
    labels = stored_labels(center, ids)
    assert torch.equal(labels, stored_labels(intensity, ids)) and int(labels.sum()) == 12
    a, b = eval_grid_maps(center, ids, labels, 48), eval_grid_maps(intensity, ids, labels, 48)
    assert a.shape == b.shape == (12, 48, 48) and a.amin() == 0 and a.flatten(1).amax(1).eq(1).all()  # minmax, per map
    assert different == pytest.approx(float(ssim(a, b).mean()), rel=1e-12)


def test_runs_on_different_images_are_named_not_compared(stored, tmp_path):
    result = agreement({"intensity": stored / "intensity" / "store", "more": stored / "more" / "store"}, eval_size=48)["demo"]
    assert result.ssim[0][1] is None and result.ssim[1][0] is None and result.pairs[0][1] == 0
    assert result.ssim[1][1] == pytest.approx(1.0, abs=1e-12)  # each run still agrees with itself
    assert result.mismatches == ["demo: intensity and more saw different images (12 and 14 images, 12 in common): not compared"]
    held = stored_maps(stored / "intensity" / "store")["demo"]
    fewer = dataclasses.replace(held, classes=held.classes[1:])  # the same images, another finding list
    other = matrix({"all": held, "fewer": fewer}, "demo", eval_size=48)
    assert other.ssim[0][1] is None and other.ssim[0][0] == pytest.approx(1.0, abs=1e-12)
    assert other.mismatches == [f"demo: all and fewer hold different findings ({', '.join(held.classes)} vs "
                                f"{', '.join(held.classes[1:])}): not compared"]
    figure = figure_agreement(result, tmp_path / "agreement.png", "demo")
    assert Image.open(tmp_path / "agreement.png").format == "PNG"
    assert [t.get_text() for t in figure.axes[0].texts] == [f"{result.ssim[0][0]:.2f}", "–", "–", f"{result.ssim[1][1]:.2f}"]


def test_report_renders_both_sections_in_markdown_and_chromium(trusted, stored, tmp_path):
    tmp, _ = trusted
    folders = [*(str(tmp / f"{m}-{e}") for m, e, _ in TRUSTED), *(str(stored / n) for n in ("center", "intensity", "more"))]
    assert cli_main(["report", *folders, "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    matrix = _section(md, "Do the maps agree across models?")
    rows = _rows(matrix.split("### demo\n", 1)[1])
    names = ["center", "fixture_models.IntensityModel (data.negatives=0)", "fixture_models.IntensityModel (data.negatives=2)"]
    assert list(rows) == ["run", *names] and rows["run"] == names
    both = agreement({"center": stored / "center" / "store", "intensity": stored / "intensity" / "store"}, eval_size=48)["demo"]
    low, high = both.interval[0][1]
    assert rows["center"] == ["1.000 [1.00, 1.00] (n=12)", f"{both.ssim[0][1]:.3f} [{low:.2f}, {high:.2f}] (n=12)", "–"]
    assert rows[names[1]][0] == rows["center"][1] and rows[names[2]] == ["–", "–", "1.000 [1.00, 1.00] (n=12)"]
    assert "saw different images (12 and 14 images, 12 in common): not compared" in matrix
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["agreement"]["eval_size"] == 48 and len(report["agreement"]["datasets"]["demo"]["runs"]) == 3
    chromium = _chromium()
    page = (tmp_path / "out" / "report.html").resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,2200"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=True).stdout
    loaded = re.search(r'data-images="(\d+)/(\d+)"', dom)
    assert loaded and loaded.group(1) == loaded.group(2) and int(loaded.group(2)) >= 2  # every figure decoded, cascades too
    assert int(re.search(r'data-width="(\d+)"', dom).group(1)) <= 1400  # no horizontal scrolling
    assert "Is the map the model's?" in dom and f"FAIL {FLAG}" in dom and "Do the maps agree across models?" in dom


def test_a_damaged_or_ambiguous_store_ends_the_report_with_one_line(stored, tmp_path, capsys):
    shutil.copytree(stored / "intensity", tmp_path / "damaged")
    shard = sorted((tmp_path / "damaged" / "store" / "shards").iterdir())[0]
    shard.write_bytes(shard.read_bytes()[:-8])
    folders = [str(stored / "center"), str(tmp_path / "damaged")]
    assert cli_main(["report", *folders, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: 1 shard(s) of ") and "--resume" in err[0]
    shutil.copytree(stored / "center" / "store", tmp_path / "damaged" / "second")
    shutil.rmtree(tmp_path / "damaged" / "store")
    shutil.copytree(stored / "intensity" / "store", tmp_path / "damaged" / "store")
    assert cli_main(["report", *folders, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'damaged'} holds 2 prediction stores (second, store): keep the one its run wrote"]
