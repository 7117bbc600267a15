"""The section "Grounding per dataset and model": the datasets x runs grid of Pointing Game, Dice@0.5 and IoU@0.5
macro means (Table 1 of the paper)."""

from __future__ import annotations

from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import SHORT, cell

TABLE1 = ("pointing_game", "dice@0.5", "iou@0.5")


def table1(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    names = datasets(runs)
    header = ["model", *(f"{d} {SHORT[k]}" for d in names for k in TABLE1)]
    rows = [[run.name, *(cell(run.datasets.get(d, {}).get("mean", {}).get(k)) for d in names for k in TABLE1)] for run in runs]
    return header, rows


def section(runs: list[Run], figures: Path) -> Section:
    out = Section("Grounding per dataset and model (macro means; Table 1)")
    out.table(*table1(runs), group=len(TABLE1))
    return out
