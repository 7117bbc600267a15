"""The section "Per finding": per dataset, one table per key of ``FINDING_KEYS`` with findings in rows and the runs
with that dataset in columns."""

from __future__ import annotations

from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import SHORT, cell

FINDING_KEYS = ("pointing_game", "dice@0.5", "iou@0.5", "auroc")


def finding_tables(runs: list[Run], dataset: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """The per-finding tables of one dataset: one per key of ``FINDING_KEYS`` (its title, header and rows)."""
    with_data = [r for r in runs if dataset in r.datasets]
    findings = list(dict.fromkeys(f for r in with_data for f in r.datasets[dataset].get("classes", {})))
    return [(SHORT[key], ["finding", *(r.name for r in with_data)],
             [[f, *(cell(r.datasets[dataset]["classes"].get(f, {}).get(key)) for r in with_data)] for f in findings])
            for key in FINDING_KEYS]


def section(runs: list[Run], figures: Path) -> Section:
    out = Section("Per finding")
    for dataset in datasets(runs):
        out.heading(dataset)
        for key, header, rows in finding_tables(runs, dataset):
            out.heading(f"{dataset}: {key}", 4)
            out.table(header, rows)
    return out
