"""The report's "Model × explainer" section: tables of the runs' numbers (models in rows, explainers in columns), the
grouped-bar figure inlined in report.html, ``model_x_explainer`` in report.json; absent for native-only runs."""

import base64
import json
import re
from pathlib import Path
from typing import get_args

import pytest
from PIL import Image
from test_report_html import write_run

from xbench_pl.commands import main as cli_main
from xbench_pl.commands.report.explainers import EXPLAINER_FIGURE, EXPLAINERS, explainer_grid, figure_explainers
from xbench_pl.commands.report.runs import find_runs
from xbench_pl.commands.report.tables import COLUMNS_PER_TABLE

MODELS = ("clip", "biomedclip")
EXPLAINED = ("native", "gradcam", "chefer")


def explained_run(folder: Path, model: str, explainer: str, seed: int, config: dict | None = None) -> dict:
    """A fabricated ``test --out`` folder (``write_run``'s metrics.json) whose maps came from ``explainer``
    (native: no ``explainer`` key, as older runs)."""
    write_run(folder, model, seed)
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["random_weights"] = False
    metrics["config"] = config or {"model": {"class_path": "x.Model", "init_args": {"explainer": explainer}}, "data": {}}
    if explainer != "native":
        metrics["explainer"] = {"name": explainer, "target_layer": "image.layer3" if explainer == "gradcam" else "decoder",
                                "target": "scores", "library": "grad-cam" if explainer == "gradcam" else "xbench_pl",
                                "version": "1.5.5"}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return metrics


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    """2 models x 3 explainers: four run folders and a sweep folder (its runs with params.json) of the other two."""
    tmp = tmp_path_factory.mktemp("explained")
    metrics, folders = {}, []
    for i, (model, explainer) in enumerate((m, e) for m in MODELS for e in EXPLAINED):
        in_sweep = model == "biomedclip" and explainer != "native"
        folder = tmp / "sweep" / "runs" / f"h{i}" if in_sweep else tmp / f"{model}-{explainer}"
        metrics[(model, explainer)] = explained_run(folder, model, explainer, 20 + i)
        if in_sweep:
            (folder / "params.json").write_text(json.dumps({"model": model, "model.explainer": explainer}))
        elif str(folder) not in folders:
            folders.append(str(folder))
    assert cli_main(["report", *folders, str(tmp / "sweep"), "--out", str(tmp / "out")]) == 0
    return tmp, metrics


def _tables(text: str, title: str) -> list[list[list[str]]]:
    """The markdown tables under the heading ``title`` (up to the next heading) as rows of cells."""
    section = text.split(f"#### {title}\n", 1)[1].split("\n#", 1)[0]
    tables = []
    for block in re.findall(r"(?:^\|.*\|\n?)+", section, flags=re.M):
        lines = [line for line in block.strip().splitlines() if not line.startswith("|---")]
        tables.append([[c.strip() for c in line.strip("|").split("|")] for line in lines])
    return tables


@pytest.mark.parametrize("metric,short", [("pointing_game", "PG"), ("dice@0.5", "Dice"), ("dice_best", "Dice best")])
def test_table_cells_are_the_runs_numbers(explained, metric, short):
    tmp, metrics = explained
    md = (tmp / "out" / "report.md").read_text()
    assert "## Model × explainer" in md
    for dataset in ("demo", "demo_dicom"):
        (table,) = _tables(md, f"{dataset}: {short} by model and explainer")
        assert table[0] == ["model", *EXPLAINED, "max − min"]
        rows = {row[0]: row[1:] for row in table[1:]}
        assert list(rows) == [*MODELS, "max − min over models"]
        for model in MODELS:
            values = [metrics[(model, e)]["datasets"][dataset]["mean"][metric] for e in EXPLAINED]
            assert rows[model] == [f"{v:.3f}" for v in values] + [f"{max(values) - min(values):.3f}"]
        for j, explainer in enumerate(EXPLAINED):
            values = [metrics[(m, explainer)]["datasets"][dataset]["mean"][metric] for m in MODELS]
            assert rows["max − min over models"][j] == f"{max(values) - min(values):.3f}"


def test_report_json_holds_the_grid_and_each_runs_explainer(explained):
    tmp, metrics = explained
    report = json.loads((tmp / "out" / "report.json").read_text())
    grid = report["model_x_explainer"]
    assert grid["explainers"] == list(EXPLAINED) and [r["label"] for r in grid["rows"]] == list(MODELS)
    for (model, explainer), m in metrics.items():
        for dataset, table in m["datasets"].items():
            for key in ("pointing_game", "dice@0.5", "dice_best"):
                assert grid["datasets"][dataset][key][model][explainer] == pytest.approx(table["mean"][key], rel=1e-12)
        assert grid["runs"][model][explainer] == 1
    pg = {(m, e): metrics[(m, e)]["datasets"]["demo"]["mean"]["pointing_game"] for m in MODELS for e in EXPLAINED}
    across_explainers = sum(max(pg[(m, e)] for e in EXPLAINED) - min(pg[(m, e)] for e in EXPLAINED) for m in MODELS) / 2
    across_models = sum(max(pg[(m, e)] for m in MODELS) - min(pg[(m, e)] for m in MODELS) for e in EXPLAINED) / 3
    assert grid["spread"]["demo"]["pointing_game"] == pytest.approx({"across_explainers": across_explainers,
                                                                     "across_models": across_models}, rel=1e-12)
    names = {(r["model"], r["explainer"]): r["name"] for r in report["runs"]}
    assert names == {(m, e): m if e == "native" else f"{m} [{e}]" for m in MODELS for e in EXPLAINED}


def test_run_labels_show_the_explainer_everywhere_runs_are_listed(explained):
    tmp, _ = explained
    md = (tmp / "out" / "report.md").read_text()
    table1 = md.split("## Grounding per dataset and model", 1)[1].split("\n## ", 1)[0]
    assert "| clip [gradcam] |" in table1 and "| biomedclip [chefer] |" in table1 and "| clip |" in table1
    assert "| clip [gradcam] | gradcam | image.layer3 | scores | grad-cam 1.5.5 |" in md
    assert "| clip | native | – | – | – |" in md


def test_figure_is_written_and_inlined(explained):
    tmp, _ = explained
    figure = tmp / "out" / "figures" / EXPLAINER_FIGURE
    assert figure.is_file() and Image.open(figure).format == "PNG"
    page = (tmp / "out" / "report.html").read_text()
    assert "<h2>Model × explainer: is it the model or the map?</h2>" in page
    embedded = "data:image/png;base64," + base64.b64encode(figure.read_bytes()).decode()
    assert embedded in page
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert f"](figures/{EXPLAINER_FIGURE})" in (tmp / "out" / "report.md").read_text()


def test_figure_has_a_group_per_model_and_a_bar_per_explainer(explained, tmp_path):
    tmp, metrics = explained
    alone = [("clip", e) for e in EXPLAINED] + [("biomedclip", "native")]
    runs = find_runs([str(tmp / f"{m}-{e}") for m, e in alone] + [str(tmp / "sweep")])
    figure = figure_explainers(explainer_grid(runs), tmp_path / "bars.png")
    assert len(figure.axes) == 2  # a panel per dataset
    ax = figure.axes[0]
    widths = sorted(round(p.get_width(), 9) for p in ax.patches)
    assert widths == sorted(round(metrics[(m, e)]["datasets"]["demo"]["mean"]["pointing_game"], 9) for m in MODELS for e in EXPLAINED)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(MODELS)
    assert [t.get_text() for t in figure.legends[0].get_texts()] == list(EXPLAINED)


def test_native_only_runs_have_no_explainer_section(tmp_path):
    write_run(tmp_path / "a", "clip", 1)
    write_run(tmp_path / "b", "biomedclip", 5)
    assert cli_main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 0
    md, page = (tmp_path / "out" / "report.md").read_text(), (tmp_path / "out" / "report.html").read_text()
    assert "Model × explainer" not in md and "Model × explainer" not in page
    assert not (tmp_path / "out" / "figures" / EXPLAINER_FIGURE).exists()
    assert "model_x_explainer" not in json.loads((tmp_path / "out" / "report.json").read_text())


def test_one_non_native_explainer_is_enough(tmp_path):
    explained_run(tmp_path / "a", "clip", "gradcam", 1)
    assert cli_main(["report", str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 0
    grid = json.loads((tmp_path / "out" / "report.json").read_text())["model_x_explainer"]
    assert grid["explainers"] == ["gradcam"] and (tmp_path / "out" / "figures" / EXPLAINER_FIGURE).is_file()


def test_settings_are_kept_apart_and_repeats_averaged(tmp_path):
    """A sweep over prompts x explainers: one row per prompt (named by the config key that differs); the same
    configuration twice is one cell, their mean."""
    values = {}
    for i, (prompt, explainer) in enumerate((p, e) for p in ("{}", "There is {}") for e in ("native", "gradcam")):
        config = {"model": {"class_path": "x.Model", "init_args": {"positive": prompt, "explainer": explainer}}, "data": {"k": 1}}
        metrics = explained_run(tmp_path / "sweep" / "runs" / f"r{i}", "clip", explainer, 40 + i, config)
        values[(prompt, explainer)] = metrics["datasets"]["demo"]["mean"]["pointing_game"]
    config = {"model": {"class_path": "x.Model", "init_args": {"positive": "{}", "explainer": "gradcam"}}, "data": {"k": 1}}
    again = explained_run(tmp_path / "again", "clip", "gradcam", 50, config)["datasets"]["demo"]["mean"]["pointing_game"]
    grid = explainer_grid(find_runs([str(tmp_path / "sweep"), str(tmp_path / "again")]))
    assert [r["label"] for r in grid["rows"]] == ["clip (model.positive={})", "clip (model.positive=There is {})"]
    assert grid["rows"][1]["setting"] == {"model.positive": "There is {}"}
    table = grid["datasets"]["demo"]["pointing_game"]
    assert table["clip (model.positive=There is {})"] == {e: values[("There is {}", e)] for e in ("native", "gradcam")}
    assert table["clip (model.positive={})"]["gradcam"] == pytest.approx((values[("{}", "gradcam")] + again) / 2, rel=1e-12)
    assert grid["runs"]["clip (model.positive={})"] == {"native": 1, "gradcam": 2}


def test_wide_tables_are_split_and_explainers_keep_their_order(tmp_path):
    for i, explainer in enumerate(reversed(EXPLAINERS)):
        explained_run(tmp_path / f"r{i}", "clip", explainer, 60 + i)
    assert cli_main(["report", *(str(tmp_path / f"r{i}") for i in range(len(EXPLAINERS))), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    tables = _tables(md, "demo: PG by model and explainer")
    assert [t[0][1:] for t in tables] == [list(EXPLAINERS[:COLUMNS_PER_TABLE]), [*EXPLAINERS[COLUMNS_PER_TABLE:], "max − min"]]
    page = (tmp_path / "out" / "report.html").read_text()
    widths = [len(re.findall(r"<th>", t)) for t in re.findall(r"<thead>.*?</thead>", page)]
    assert max(widths) <= COLUMNS_PER_TABLE + 1


def test_explainer_order_is_the_options():
    from xbench_pl.options import ExplainerName

    assert EXPLAINERS == get_args(ExplainerName)


def test_a_missing_run_is_a_dash_and_a_note_in_the_figure(tmp_path):
    """MedKLIP refuses rollout (a ResNet tower): its sweep has no such run; the table says "–", the figure why."""
    for i, (model, explainer) in enumerate((("clip", "native"), ("clip", "rollout"), ("medklip", "native"))):
        explained_run(tmp_path / f"r{i}", model, explainer, 70 + i)
    runs = find_runs([str(tmp_path / f"r{i}") for i in range(3)])
    grid = explainer_grid(runs)
    assert grid["datasets"]["demo"]["pointing_game"]["medklip"]["rollout"] is None and grid["runs"]["medklip"]["rollout"] == 0
    figure = figure_explainers(grid, tmp_path / "bars.png")
    assert "rollout: no run" in [t.get_text() for t in figure.axes[0].texts]
    assert len(figure.axes[0].patches) == 3
