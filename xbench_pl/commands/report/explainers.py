"""The section "Model × explainer", where the runs' maps differ in explainer (``metrics.json``'s ``explainer.name``,
none = ``native``) or any is not native: per dataset, tables of Pointing Game, Dice@0.5 and Dice best with models in
rows and explainers in columns, the spread across explainers against the spread across models, grouped bars of each
model's Pointing Game per explainer (``model_x_explainer`` in ``report.json``), and where each run's maps come from."""

from __future__ import annotations

import math
from pathlib import Path
from typing import get_args

from xbench_pl.commands.report.figures import new_figure, save, wrapped
from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import LONG, SHORT, cell, mean, spread
from xbench_pl.options import ExplainerName

#: the explainers in the order of ``xbench_pl.options.ExplainerName``; a name not listed here comes after them
EXPLAINERS = get_args(ExplainerName)
#: the keys of the model x explainer tables (per dataset, macro means over findings)
EXPLAINER_KEYS = ("pointing_game", "dice@0.5", "dice_best")
EXPLAINER_FIGURE = "pointing_game_by_explainer.png"


def _explainer_order(names) -> list[str]:
    names = list(dict.fromkeys(names))
    return [n for n in EXPLAINERS if n in names] + [n for n in names if n not in EXPLAINERS]


def explainer_grid(runs: list[Run]) -> dict:
    """The model x explainer tables, as ``report.json`` holds them (``model_x_explainer``).

    A row is a model in one setting (``Run.setting_name``: the run's label without its explainer), a column an
    explainer (``EXPLAINERS`` order). Runs of one model in several settings (a sweep over prompts and explainers)
    are kept apart: one row per setting, labelled by the model and the config keys in which its settings differ.
    Runs with the same model, setting and explainer on a dataset are repeats: their numbers are averaged and
    ``runs`` counts them (the most on any one dataset: a model's runs on other datasets are one row, not repeats).
    ``datasets[DATASET][KEY][ROW][EXPLAINER]`` is the run's macro mean over the dataset's findings (None where
    undefined or not run); ``spread[DATASET][KEY]``: ``across_explainers``, the mean over
    rows of (max − min over the row's explainers), against ``across_models``, the mean over explainers of
    (max − min over rows): the larger moves the number more, the map or the model."""
    explainers = _explainer_order(run.explainer for run in runs)
    rows: dict[str, dict] = {}
    cells: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        rows.setdefault(run.setting_name, {"label": run.setting_name, "model": run.model, "setting": run.shown})
        cells.setdefault((run.setting_name, run.explainer), []).append(run)
    tables = {dataset: {metric: {row: {e: mean([r.datasets.get(dataset, {}).get("mean", {}).get(metric) for r in cells.get((row, e), [])])
                                       for e in explainers}
                                 for row in rows}
                        for metric in EXPLAINER_KEYS}
              for dataset in datasets(runs)}
    spreads = {dataset: {metric: {"across_explainers": mean([spread(list(table[row].values())) for row in rows]),
                                  "across_models": mean([spread([table[row][e] for row in rows]) for e in explainers])}
                         for metric, table in by_metric.items()}
               for dataset, by_metric in tables.items()}
    return {"explainers": explainers, "rows": list(rows.values()), "keys": list(EXPLAINER_KEYS),
            "runs": {row: {e: max((sum(d in r.datasets for r in cells.get((row, e), [])) for d in tables), default=0)
                           for e in explainers} for row in rows},
            "datasets": tables, "spread": spreads}


def explainer_table(grid: dict, dataset: str, metric: str) -> tuple[list[str], list[list[str]]]:
    """One dataset's table of ``metric``: a row per model (setting), a column per explainer, then max − min over the
    row; a last row, max − min over the models. "–": undefined or not run; "(mean of n)": n repeats averaged."""
    table, counts = grid["datasets"][dataset][metric], grid["runs"]
    header = ["model", *grid["explainers"], "max − min"]
    rows = []
    for row in grid["rows"]:
        values, n = table[row["label"]], counts[row["label"]]
        rows.append([row["label"], *(cell(values[e]) + (f" (mean of {n[e]})" if n[e] > 1 else "") for e in grid["explainers"]),
                     cell(spread(list(values.values())))])
    rows.append(["max − min over models", *(cell(spread([table[row["label"]][e] for row in grid["rows"]])) for e in grid["explainers"]), ""])
    return header, rows


def spread_text(grid: dict, dataset: str, metric: str) -> str:
    spreads = grid["spread"][dataset][metric]
    return (f"{dataset}, {SHORT[metric]}: across explainers (per model) max − min is {cell(spreads['across_explainers'])} on "
            f"average, across models (per explainer) {cell(spreads['across_models'])}.")


def explainers_used(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """Where each run's maps come from (``metrics.json``'s ``explainer``): layer, target, library and version."""
    rows = []
    for run in runs:
        info = run.metrics.get("explainer") or {"name": "native"}
        library = " ".join(str(info[k]) for k in ("library", "version") if info.get(k))
        rows.append([run.name, run.explainer, info.get("target_layer") or "–", info.get("target") or "–", library or "–"])
    return ["run", "explainer", "target layer", "target", "library"], rows


def figure_explainers(grid: dict, path: Path, metric: str = "pointing_game"):
    """Each model's ``metric`` per explainer, returned: per dataset (a panel each, side by side, models shared) one
    group of horizontal bars per model (setting), one bar per explainer, colour by explainer, value at its end;
    where a bar is missing, a grey note says why (undefined, or no such run, e.g. a refused rollout)."""
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    names, rows, explainers = list(grid["datasets"]), grid["rows"], grid["explainers"]
    colours = colormaps["tab10" if len(explainers) <= 10 else "tab20"]
    bar = 0.8 / len(explainers)
    lines = max(wrapped(row["label"]).count("\n") + 1 for row in rows)
    group = max(0.14 * len(explainers) + 0.15, 0.14 * lines)  # inches per model: room for its bars and its label's lines
    columns = min(3, len(names))
    panels = math.ceil(len(names) / columns)
    fig = new_figure(7 if columns == 1 else 2.2 + 3.2 * columns, 1.0 + panels * (0.5 + group * len(rows)))
    axes = fig.subplots(panels, columns, sharey=True, squeeze=False).ravel()
    ys = list(range(len(rows)))
    for ax, dataset in zip(axes, names):
        table, counts = grid["datasets"][dataset][metric], grid["runs"]
        for j, explainer in enumerate(explainers):
            offset = -0.4 + bar * (j + 0.5)
            placed = [(y + offset, table[row["label"]][explainer], counts[row["label"]][explainer]) for y, row in zip(ys, rows)]
            shown = [(y, v) for y, v, n in placed if v is not None]
            ax.barh([y for y, _ in shown], [v for _, v in shown], height=bar * 0.9, color=colours(j))
            for y, v, n in placed:
                text = f"{v:.2f}" if v is not None else f"{explainer}: undefined" if n else f"{explainer}: no run"
                ax.annotate(text, (0.005 if v is None else v + 0.005, y), va="center", fontsize=5, color="black" if v is not None else "gray")
        ax.set(xlim=(0, 1.08), xlabel=f"{LONG[metric]} (mean over findings)")
        ax.set_title(dataset, fontsize=8)
        ax.grid(alpha=0.3, axis="x")
    for ax in axes[len(names):]:
        ax.set_visible(False)
    axes[0].set_yticks(ys, [wrapped(row["label"]) for row in rows], fontsize=7)
    axes[0].set_ylim(len(rows) - 0.5, -0.5)  # the first model on top, as in the tables
    fig.suptitle(f"Is it the model or the map? {LONG[metric]} per model and explainer", fontsize=9)
    handles = [Patch(color=colours(j), label=explainer) for j, explainer in enumerate(explainers)]
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=min(5, len(explainers)))
    save(fig, path)
    return fig


def section(runs: list[Run], figures: Path) -> Section | None:
    """Where the runs' explainers differ, or one is not native (explainers that differ include a non-native one)."""
    if all(run.explainer == "native" for run in runs):
        return None
    grid = explainer_grid(runs)
    out = Section("Model × explainer: is it the model or the map?", data={"model_x_explainer": grid})
    out.text("Macro means over findings, per dataset: a row per model (per setting where its runs differ in more than "
             "the explainer: the differing config keys follow its name), a column per explainer (`--model.explainer`; "
             "none recorded = native). Scores are the model's whatever the explainer, so only the maps differ along a row. "
             "Repeats (same model, setting and explainer) are averaged. If max − min along the rows (across explainers) "
             "exceeds that down the columns (across models), the map moves the number more than the model does.")
    for dataset in grid["datasets"]:
        out.heading(dataset)
        for metric in EXPLAINER_KEYS:
            out.tables([(f"{dataset}: {SHORT[metric]} by model and explainer", explainer_table(grid, dataset, metric))])
            out.text(spread_text(grid, dataset, metric))
    figure_explainers(grid, figures / EXPLAINER_FIGURE)
    out.figure(figures / EXPLAINER_FIGURE, "Pointing Game per model (a group of bars) and explainer (a bar), per dataset")
    out.heading("Where each run's maps come from")
    out.table(*explainers_used(runs))
    return out
