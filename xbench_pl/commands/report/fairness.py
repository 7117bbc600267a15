"""The section "Fairness: subgroups", where runs have ``by_group`` (``--model.groups``): per dataset and group the
images per value, Pointing Game, Dice best and AUROC per value with intervals, and the gap with its interval and p
(``fairness`` in ``report.json``)."""

from __future__ import annotations

from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import SHORT, cell
from xbench_pl.data.groups import UNKNOWN

#: the keys of the fairness tables, per group value
FAIRNESS_KEYS = ("pointing_game", "dice_best", "auroc")


def fairness(runs: list[Run]) -> dict:
    """``report.json``'s ``fairness``: per dataset and group (``metrics.json``'s ``by_group``, ``--model.groups``) the
    group's ``values`` (known ones, in the runs' order) and per run with that group: ``n_images`` per value
    (``unknown`` included), per known value and key of ``FAIRNESS_KEYS`` its macro ``mean`` and ``ci`` (None where
    not run with a bootstrap), and per key the ``gap`` (``gap``, ``high``, ``low``, ``ci``, ``p``; None where undefined)."""
    out: dict = {}
    for dataset in datasets(runs):
        for run in runs:
            for group, entry in (run.datasets.get(dataset, {}).get("by_group") or {}).items():
                values = [v for v in entry.get("n_images", {}) if v != UNKNOWN]
                place = out.setdefault(dataset, {}).setdefault(group, {"values": [], "runs": {}})
                place["values"] += [v for v in values if v not in place["values"]]
                rows = {}
                for value in values:
                    row = entry.get(value) or {}
                    ci = (row.get("ci") or {}).get("mean") or {}
                    rows[value] = {k: {"mean": (row.get("mean") or {}).get(k) if row.get("n_images") else None, "ci": ci.get(k)}
                                   for k in FAIRNESS_KEYS}
                place["runs"][run.name] = {"n_images": dict(entry.get("n_images", {})), "values": rows,
                                           "gap": {k: (entry.get("gap") or {}).get(k) for k in FAIRNESS_KEYS}}
    return out


def _with_ci(value, ci) -> str:
    return cell(value) + (f" [{cell(ci[0])}, {cell(ci[1])}]" if ci and value is not None else "")


def fairness_count_table(entry: dict) -> tuple[list[str], list[list[str]]]:
    values = [*entry["values"], UNKNOWN]
    return ["run", *(f"n {v}" for v in values)], [[name, *(str(r["n_images"].get(v, "–")) for v in values)] for name, r in entry["runs"].items()]


def gap_text(gap: dict, means: dict) -> str:
    """The gap as the table shows it: ``0.120 (F − M)``; where every defined value's mean is equal (the metrics name
    the first value as both ``high`` and ``low``), a tie: ``0.000 (tie: F = M)``."""
    if gap["high"] != gap["low"]:
        return f"{cell(gap['gap'])} ({gap['high']} − {gap['low']})"
    return f"{cell(gap['gap'])} (tie: {' = '.join(v for v, m in means.items() if m is not None)})"


def fairness_table(entry: dict, key: str) -> tuple[list[str], list[list[str]]]:
    """One key: a row per run, its value [95% CI] per group value, then the gap (high − low) [CI] and its p."""
    header = ["run", *entry["values"], "gap (high − low)", "gap 95% CI", "p"]
    rows = []
    for name, r in entry["runs"].items():
        means = {v: r["values"].get(v, {}).get(key, {}).get("mean") for v in entry["values"]}
        cells = [_with_ci(means[v], r["values"].get(v, {}).get(key, {}).get("ci")) for v in entry["values"]]
        gap = r["gap"][key]
        if gap is None:
            cells += ["–", "–", "–"]
        else:
            ci = gap.get("ci")
            cells += [gap_text(gap, means), f"[{cell(ci[0])}, {cell(ci[1])}]" if ci else "–", cell(gap.get("p"))]
        rows.append([name, *cells])
    return header, rows


def section(runs: list[Run], figures: Path) -> Section | None:
    table = fairness(runs)
    if not table:
        return None
    out = Section("Fairness: subgroups", data={"fairness": table})
    out.text("Per dataset and group (`--model.groups`), each run's macro means on each group value's images alone with their "
             "95% bootstrap intervals (on the dataset's draws), the images per value (unknown: no metadata, left out of the "
             "values' tables), and the gap between the best and the worst value with its paired-bootstrap interval and "
             "two-sided p-value (docs/metrics.md, Subgroups); a tie where every value's mean is equal. "
             "\"–\": undefined, no images, or no bootstrap.")
    for dataset, groups in table.items():
        for group, entry in groups.items():
            out.heading(f"{dataset}: {group}")
            out.tables([(f"{dataset}, {group}: images per value", fairness_count_table(entry))]
                       + [(f"{dataset}, {group}: {SHORT[k]}", fairness_table(entry, k)) for k in FAIRNESS_KEYS])
    return out
