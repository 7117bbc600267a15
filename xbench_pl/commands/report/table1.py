"""The section "Grounding per dataset and model": the datasets x runs grid of Pointing Game, Dice@0.5 and IoU@0.5
macro means (Table 1 of the paper): a row per label (a model's runs on other datasets share one, ``runs.label_runs``),
a column group per dataset."""

from __future__ import annotations

from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import SHORT, cell

TABLE1 = ("pointing_game", "dice@0.5", "iou@0.5")


def table1(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    names = datasets(runs)
    header = ["model", *(f"{d} {SHORT[k]}" for d in names for k in TABLE1)]
    tables: dict[str, dict] = {}
    for run in runs:
        tables.setdefault(run.name, {}).update(run.datasets)
    rows = [[name, *(cell(mine.get(d, {}).get("mean", {}).get(k)) for d in names for k in TABLE1)]
            for name, mine in tables.items()]
    return header, rows


def section(runs: list[Run], figures: Path) -> Section:
    out = Section("Grounding per dataset and model (macro means; Table 1)")
    out.table(*table1(runs), group=len(TABLE1))
    return out
