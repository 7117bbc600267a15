"""The section "Grounding per dataset and model": the datasets x runs grid of Pointing Game, Dice@0.5 and IoU@0.5
macro means (Table 1 of the paper): a row per label (a model's runs on other datasets share one, ``runs.label_runs``),
a column group per dataset; the paper's models and datasets first, in the paper's order, the others after them as the
runs came."""

from __future__ import annotations

from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.paper import model_name, paper_values
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import SHORT, cell

TABLE1 = ("pointing_game", "dice@0.5", "iou@0.5")


def paper_order(names: list[str], of, order) -> list[str]:
    """``names`` with those whose ``of(name)`` is among ``order`` (the paper's) first, in its order; the rest after,
    as they came (the sort is stable)."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(names, key=lambda name: rank.get(of(name), len(rank)))


def table1(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    names = paper_order(datasets(runs), lambda name: name, paper_values()["datasets"].values())
    header = ["model", *(f"{d} {SHORT[k]}" for d in names for k in TABLE1)]
    tables: dict[str, dict] = {}
    models: dict[str, str] = {}
    for run in runs:
        tables.setdefault(run.name, {}).update(run.datasets)
        models[run.name] = model_name(run)
    rows = [[name, *(cell(tables[name].get(d, {}).get("mean", {}).get(k)) for d in names for k in TABLE1)]
            for name in paper_order(list(tables), models.get, paper_values()["models"].values())]
    return header, rows


def section(runs: list[Run], figures: Path) -> Section:
    out = Section("Grounding per dataset and model (macro means; Table 1)")
    out.table(*table1(runs), group=len(TABLE1))
    return out
