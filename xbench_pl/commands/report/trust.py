"""The section "Is the map the model's?", where runs measured trust (``test ... --model.trust``; ``docs/trust.md``).

Per dataset, a row per run (model × explainer): its Pointing Game beside the randomization test (the SSIM of its maps
with those of the model whose weights were randomized stage by stage, at the last stage, against Arun et al.'s
random-pair baseline, and whether it passed), the deletion and insertion AUC and the random-target SSIM, each with its
bootstrap interval (``metrics.json``'s ``ci``). A run whose maps failed the randomization test has its Pointing Game
flagged: that number measures the explainer, not the model, however high it is. A figure per dataset draws the
cascade, each stage's SSIM (with its interval) against the run's baseline (``report.json``: ``trust``).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from xbench_pl.commands.report.figures import new_figure, save, wrapped
from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import cell

#: the trust keys of a ``metrics.json`` row (``--model.trust``), shown in this order after the Pointing Game
TRUST_KEYS = ("randomization_ssim", "randomization_baseline", "deletion_auc", "insertion_auc", "random_target_ssim")
#: every key ``--model.trust`` can add to a row: a table with any of them (or a ``trust`` block) measured trust
MEASURED_KEYS = (*TRUST_KEYS, "randomization_spearman")
HEADERS = {"randomization_ssim": "randomization SSIM (last stage)", "randomization_baseline": "random-pair baseline",
           "deletion_auc": "deletion AUC (lower: faithful)", "insertion_auc": "insertion AUC (higher: faithful)",
           "random_target_ssim": "random-target SSIM"}
#: the mark of a Pointing Game whose maps failed the randomization test
FLAG = "⚠"
FLAG_TEXT = (f"{FLAG} marks a Pointing Game whose maps failed the randomization test (they stay as similar to the "
             "randomized model's maps as two different images' maps are to each other), so it measures the explainer, "
             "not the model, however high it is.")


def measured(table: dict) -> bool:
    """Whether a dataset's table holds trust measures: a ``trust`` block or any trust key with a value."""
    return bool(table.get("trust")) or any(table.get("mean", {}).get(k) is not None for k in MEASURED_KEYS)


def with_interval(table: dict, key: str) -> str:
    """A mean and its bootstrap interval as one cell: ``0.412 [0.301, 0.520]`` (the mean alone without ``ci``)."""
    value = table.get("mean", {}).get(key)
    bounds = ((table.get("ci") or {}).get("mean") or {}).get(key)
    if value is None or not bounds or None in bounds:
        return cell(value)
    return f"{cell(value)} [{bounds[0]:.3f}, {bounds[1]:.3f}]"


def verdict(table: dict) -> bool | None:
    """The randomization test: True passed, False failed, None not run or undefined (the ``trust`` block's
    ``passes_randomization``)."""
    return (table.get("trust") or {}).get("passes_randomization")


def trust_rows(runs: list[Run], dataset: str) -> list[dict]:
    """The runs that measured trust on ``dataset``, as ``report.json`` holds them: ``run``, ``model``, ``explainer``,
    ``pointing_game``, the ``TRUST_KEYS`` means and ``intervals``, ``passes_randomization``, ``flagged`` and
    ``stages`` (the cascade)."""
    rows = []
    for run in runs:
        table = run.datasets.get(dataset)
        if table is None or not measured(table):
            continue
        mean, ci = table.get("mean", {}), (table.get("ci") or {}).get("mean") or {}
        passed = verdict(table)
        rows.append({"run": run.name, "model": run.setting_name, "explainer": run.explainer,
                     "pointing_game": mean.get("pointing_game"), **{k: mean.get(k) for k in TRUST_KEYS},
                     "intervals": {k: ci.get(k) for k in TRUST_KEYS if ci.get(k)}, "passes_randomization": passed,
                     "flagged": passed is False, "stages": (table.get("trust") or {}).get("stages") or []})
    return rows


def trust_table(rows: list[dict], tables: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """A row per run: Pointing Game (flagged where the randomization test failed), the randomization SSIM, the
    baseline, pass/fail, deletion and insertion AUC and the random-target SSIM, each ``with_interval``; ``tables``:
    each run's table of the dataset."""
    header = ["run", "Pointing Game", *(HEADERS[k] for k in TRUST_KEYS[:2]), "randomization test",
              *(HEADERS[k] for k in TRUST_KEYS[2:])]
    body = []
    for row in rows:
        table = tables[row["run"]]
        test = {True: "pass", False: f"FAIL {FLAG}", None: "–"}[row["passes_randomization"]]
        pg = (f"{FLAG} " if row["flagged"] else "") + with_interval(table, "pointing_game")  # first: seen in a wrapped cell
        body.append([row["run"], pg, *(with_interval(table, k) for k in TRUST_KEYS[:2]), test,
                     *(with_interval(table, k) for k in TRUST_KEYS[2:])])
    return header, body


def flagged_text(rows: list[dict], dataset: str) -> str | None:
    """The runs whose Pointing Game is flagged, highest first (None where none is)."""
    flagged = sorted((r for r in rows if r["flagged"]), key=lambda r: -(r["pointing_game"] or 0.0))
    if not flagged:
        return None
    listed = ", ".join(f"{r['run']} (Pointing Game {cell(r['pointing_game'])})" for r in flagged)
    return f"{dataset}: failed the randomization test: {listed}. Their Pointing Game is not evidence about the model."


def figure_cascade(rows: list[dict], path: Path, dataset: str):
    """The randomization cascade of ``rows`` (``trust_rows``), returned: a panel per model (setting), its stages in
    order on x (top of the model first), each explainer's mean SSIM to the trained model's maps (a line, its
    interval a band) and its random-pair baseline (a dashed line of its colour). Below the baseline: passes."""
    from matplotlib import colormaps

    models = list(dict.fromkeys(r["model"] for r in rows if r["stages"]))
    explainers = list(dict.fromkeys(r["explainer"] for r in rows if r["stages"]))
    colours = colormaps["tab10" if len(explainers) <= 10 else "tab20"]
    columns = min(3, len(models))
    panels = math.ceil(len(models) / columns)
    stages = max(len(r["stages"]) for r in rows)
    width = 2.2 + 3.2 * columns
    fig = new_figure(width, 0.8 + panels * (2.2 + 0.08 * stages))
    axes = fig.subplots(panels, columns, squeeze=False).ravel()
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model and r["stages"]]
        drawn = []  # every value drawn: SSIM can be negative (the axis reaches it)
        for row in mine:
            colour = colours(explainers.index(row["explainer"]))
            xs = list(range(len(row["stages"])))
            ys = [math.nan if s.get("ssim") is None else s["ssim"] for s in row["stages"]]
            ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=row["explainer"])
            bands = [s.get("ssim_interval") or [math.nan, math.nan] for s in row["stages"]]
            ax.fill_between(xs, [math.nan if b[0] is None else b[0] for b in bands],
                            [math.nan if b[1] is None else b[1] for b in bands], color=colour, alpha=0.15, linewidth=0)
            if row["randomization_baseline"] is not None:
                ax.axhline(row["randomization_baseline"], color=colour, linestyle="--", linewidth=0.8)
            drawn += [v for v in ys + [b for band in bands for b in band] if v is not None and not math.isnan(v)]
        names = max((r["stages"] for r in mine), key=len)
        ax.set_xticks(range(len(names)), [wrapped(s["stage"]) for s in names], rotation=45, ha="right", fontsize=6)
        ax.set(ylim=(min(-0.05, *(v - 0.05 for v in drawn)), 1.05), ylabel="SSIM to the trained model's maps")
        ax.set_title(wrapped(model), fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    for ax in axes[len(models):]:
        ax.set_visible(False)
    title = f"{dataset}: randomization cascade (stages randomized cumulatively, left to right; dashed: random-pair baseline)"
    fig.suptitle(textwrap.fill(title, int(width * 13)), fontsize=8)  # about 13 characters per inch at 8 pt
    save(fig, path)
    return fig


def section(runs: list[Run], figures: Path) -> Section | None:
    """None where no run measured trust on any dataset."""
    names = [d for d in datasets(runs) if any(measured(r.datasets[d]) for r in runs if d in r.datasets)]
    if not names:
        return None
    out = Section("Is the map the model's? Sanity and faithfulness of each model × explainer", data={"trust": {}})
    out.text("Per run that measured trust (`--model.trust`): the Pointing Game beside the randomization test, the SSIM "
             "of its maps with those of the same model whose weights were randomized stage by stage (last stage), "
             "against Arun et al.'s baseline (the SSIM of the trained model's maps of two different images, same "
             "finding); the maps pass where they fall below it. Deletion and insertion AUC: the finding's score as "
             "the most relevant pixels are removed (lower is faithful) or inserted (higher is faithful). "
             "Random-target SSIM: the map of the finding against that of another finding on the same image. "
             "Macro means over findings, 95 % bootstrap intervals in brackets; – where not measured or undefined (a "
             "model without weights has nothing to randomize). Runs without `--model.trust` are not listed.")
    out.text(FLAG_TEXT)
    for i, dataset in enumerate(names):
        rows = trust_rows(runs, dataset)
        tables = {r.name: r.datasets[dataset] for r in runs if dataset in r.datasets}
        out.data["trust"][dataset] = rows
        out.heading(dataset)
        out.table(*trust_table(rows, tables))
        if text := flagged_text(rows, dataset):
            out.text(text, warn=True)
        if any(r["stages"] for r in rows):
            path = figures / f"trust_cascade_{i}.png"
            figure_cascade(rows, path, dataset)
            out.figure(path, f"{dataset}: SSIM of each explainer's maps to the trained model's as the model's stages are "
                             "randomized, per model; a line below its dashed baseline passes")
    return out
