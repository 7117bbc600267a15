"""The section "Against the paper" (``report --against paper``): each of the runs' cells beside the value XBench
published (arXiv 2510.19599), in the paper's units (percent): ours, the paper's, the difference, our 95 % bootstrap
interval (``metrics.json``'s ``ci``) and whether the paper's value lies inside it. Table 1 (Pointing Game, Dice and
IoU at the best τ per dataset), the per-class Pointing Game of Tables 2-5 and Fig. 4's ΔDice per model.

The published values are data, ``paper_values.json``, keyed by the paper's names with the mapping onto our registry
names (models, datasets) and canonical finding names beside them. A run is the paper's model when its model is that
registry name (or a model config file of that name: ``sweeps/models/clip.yaml``); a dataset, when its ``metrics.json``
name is. A cell whose protocol differs knowingly is flagged with a numbered note: random weights, maps from an
explainer (the paper's are the models' own), another count of images (NIH: 880), scored pairs (COVID-19: 32) or classes than the
paper's, a per-class table whose means the paper's own Table 1 contradicts, ΔDice over fewer datasets than seven."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, image_count

VALUES = Path(__file__).with_name("paper_values.json")
HEADER = ["run", "", "ours", "paper", "ours − paper", "our 95 % CI", "paper inside", "notes"]
LABELS = {"pointing_game": "Pointing Game", "dice_best": "Dice best", "iou_best": "IoU best", "delta_dice": "ΔDice"}


@cache
def paper_values() -> dict:
    """The published values (``paper_values.json``)."""
    return json.loads(VALUES.read_text())


def model_name(run: Run) -> str:
    """The registry name a run's model goes by: its name, or its config file's stem."""
    return Path(run.model).stem if run.model.endswith((".yaml", ".yml")) else run.model


def paper_model(run: Run) -> str | None:
    """The paper's name of the run's model; None where the paper has no such model."""
    return {ours: theirs for theirs, ours in paper_values()["models"].items()}.get(model_name(run))


def inside(paper: float, ci: list[float] | None, precision: float) -> bool | None:
    """Whether the paper's value lies in our interval (percent), widened by half the paper's printed precision (its
    rounding); None without an interval."""
    return None if ci is None else ci[0] - precision / 2 <= paper <= ci[1] + precision / 2


@dataclass
class Cell:
    """One comparison: ``ours``, ``paper`` and ``ci`` in percent (None where undefined), ``flags`` the notes on its
    protocol, ``source`` the paper's table or figure."""
    run: str
    model: str
    dataset: str | None
    finding: str | None
    metric: str
    ours: float | None
    paper: float
    ci: list[float] | None
    precision: float
    source: str
    flags: list[str] = field(default_factory=list)

    @property
    def difference(self) -> float | None:
        return None if self.ours is None else self.ours - self.paper

    @property
    def inside(self) -> bool | None:
        return inside(self.paper, self.ci, self.precision)

    def json(self) -> dict:
        return {"run": self.run, "model": self.model, "dataset": self.dataset, "finding": self.finding, "metric": self.metric,
                "ours": self.ours, "paper": self.paper, "difference": self.difference, "ci": self.ci, "inside": self.inside,
                "source": self.source, "flags": self.flags}


def percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def run_flags(run: Run) -> list[str]:
    """What makes any of a run's cells another protocol than the paper's."""
    flags = ["random weights (--model.random_init): a smoke test, not a result"] if run.metrics.get("random_weights") else []
    if run.explainer != "native":
        flags.append(f"maps from the {run.explainer} explainer; the paper's are the models' own (native)")
    return flags


def count_flags(table: dict, dataset: str, mean: bool = True) -> list[str]:
    """Where a dataset's table counts other than the paper: images (known for NIH), scored pairs (COVID-19) and, for
    its ``mean``, classes with a region."""
    known = paper_values()["protocol"].get(dataset, {})
    rows = table.get("classes", {})
    counts = {"images": image_count(table), "pairs": sum(row.get("n_regions") or 0 for row in rows.values())}
    if mean:
        counts["classes"] = sum(1 for row in rows.values() if row.get("n_regions"))
    what = {"images": "images scored", "pairs": "(image, finding) pairs scored", "classes": "classes in the mean"}
    return [f"{dataset}, {what[key]}: the paper {known[key]}, this run {counts[key]}"
            for key in counts if key in known and counts[key] != known[key]]


def _ci(table: dict, metric: str, finding: str | None) -> list[float] | None:
    ci = table.get("ci") or {}
    bounds = (ci.get("mean") if finding is None else ci.get("classes", {}).get(finding)) or {}
    return [percent(b) for b in bounds[metric]] if bounds.get(metric) else None


def table1_cells(run: Run, model: str, dataset: str, table: dict) -> list[Cell]:
    spec = paper_values()["table1"]
    flags = run_flags(run) + count_flags(table, dataset)
    return [Cell(run.name, model, dataset, None, key, percent(table.get("mean", {}).get(key)),
                 spec["values"][model][dataset][column], _ci(table, key, None), spec["precision"], "Table 1", list(flags))
            for column, key in spec["metrics"].items()]


def class_cells(run: Run, model: str, dataset: str, table: dict) -> list[Cell]:
    """The run's per-class cells of the paper's per-class table of ``dataset`` (classes both have)."""
    cells = []
    for spec in (s for s in paper_values()["per_class"] if s["dataset"] == dataset and model in s["values"]):
        flags = run_flags(run) + count_flags(table, dataset, mean=False)
        published = paper_values()["table1"]["values"][model][dataset]["Point"]
        if abs(spec["mean"][model] - published) > spec["precision"] / 2:
            flags.append(f"{spec['table']} gives {model} a mean of {spec['mean'][model]:.2f}, Table 1 {published:.2f}: the paper's "
                         "per-class cells come from another image set or aggregation")
        for theirs, value in spec["values"][model].items():
            ours = spec["classes"][theirs]
            if ours is None or ours not in table.get("classes", {}):
                continue
            label = ours if ours == theirs else f"{ours} ({theirs})"
            cells.append(Cell(run.name, model, dataset, label, spec["metric"], percent(table["classes"][ours].get(spec["metric"])),
                              value, _ci(table, spec["metric"], ours), spec["precision"], spec["table"], list(flags)))
    return cells


def delta_dice_cells(runs: list[tuple[Run, str]]) -> list[Cell]:
    """Fig. 4's ΔDice per model: ours the mean of ``delta_dice`` over the paper's datasets that the model's runs (with
    one explainer) scored, each dataset once (its runs averaged)."""
    spec = paper_values()["delta_dice"]
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run, model in runs:
        for dataset, table in paper_tables(run).items():
            if (value := table.get("mean", {}).get(spec["metric"])) is not None:
                groups.setdefault((model, run.explainer), {}).setdefault(dataset, []).append(value)
    cells = []
    for (model, explainer), by_dataset in groups.items():
        name = paper_values()["models"][model] + ("" if explainer == "native" else f" [{explainer}]")
        members = [run for run, m in runs if m == model and run.explainer == explainer]
        flags = list(dict.fromkeys(f for run in members for f in run_flags(run)))
        if len(by_dataset) < len(paper_values()["datasets"]):
            flags.append(f"ΔDice over {len(by_dataset)} of the paper's {len(paper_values()['datasets'])} datasets")
        ours = sum(sum(v) / len(v) for v in by_dataset.values()) / len(by_dataset)
        cells.append(Cell(name, model, None, None, spec["metric"], percent(ours), spec["values"][model], None,
                          spec["precision"], "Fig. 4 (text)", flags))
    return cells


def paper_tables(run: Run) -> dict[str, dict]:
    """The run's tables of the paper's datasets, by the paper's name."""
    return {theirs: run.metrics["datasets"][ours] for theirs, ours in paper_values()["datasets"].items()
            if ours in run.metrics["datasets"]}


def against_paper(runs: list[Run]) -> dict:
    """``report.json``'s ``against_paper``: every cell (``Cell.json``), the runs and datasets not compared, a summary."""
    compared = [(run, model) for run in runs if (model := paper_model(run)) is not None]
    cells = []
    for run, model in compared:
        for dataset, table in paper_tables(run).items():
            cells += table1_cells(run, model, dataset, table) + class_cells(run, model, dataset, table)
    cells += delta_dice_cells(compared)
    judged = [c for c in cells if c.inside is not None]
    known = set(paper_values()["datasets"].values())
    return {"source": paper_values()["_source"], "units": paper_values()["units"], "cells": [c.json() for c in cells],
            "not_compared": {"runs": [r.name for r in runs if paper_model(r) is None],
                             "datasets": sorted({d for r in runs for d in r.metrics["datasets"] if d not in known})},
            "summary": {"cells": len(cells), "with_interval": len(judged), "inside": sum(c.inside for c in judged),
                        "flagged": sum(bool(c.flags) for c in cells)}}


def _number(value: float | None, sign: str = "") -> str:
    return "–" if value is None else f"{value:{sign}.2f}"


def rows(cells: list[dict], first: str, notes: dict[str, int]) -> list[list[str]]:
    """Table rows of ``cells`` (``first``: the cell key of the second column); each flag becomes its note's number."""
    out = []
    for c in cells:
        ci = "–" if c["ci"] is None else f"[{c['ci'][0]:.2f}, {c['ci'][1]:.2f}]"
        flagged = ", ".join(str(notes.setdefault(f, len(notes) + 1)) for f in c["flags"])
        shown = {None: "–", True: "yes", False: "no"}[c["inside"]]
        out.append([c["run"], LABELS.get(c[first], c[first]), _number(c["ours"]), _number(c["paper"]),
                    _number(c["difference"], "+"), ci, shown, flagged])
    return out


def section(runs: list[Run], figures: Path) -> Section:
    data = against_paper(runs)
    values = paper_values()
    out = Section("Against the paper (XBench, arXiv 2510.19599)", data={"against_paper": data})
    s = data["summary"]
    out.text(f"Each of our cells beside the value the paper published, in percent. {s['cells']} cell(s); "
             f"{s['with_interval']} with our 95 % bootstrap interval, of which {s['inside']} hold the paper's value "
             "(the interval widened by half the paper's printed precision); "
             f"{s['flagged']} flagged (numbers: the notes below) where the protocol knowingly differs.")
    if data["not_compared"]["runs"]:
        out.text("Not the paper's models (not compared): " + ", ".join(data["not_compared"]["runs"]) + ".")
    if data["not_compared"]["datasets"]:
        out.text("Not the paper's datasets (not compared): " + ", ".join(data["not_compared"]["datasets"]) + ".")
    notes: dict[str, int] = {}
    cells = data["cells"]
    for dataset, ours in values["datasets"].items():
        mine = [c for c in cells if c["dataset"] == dataset and c["source"] == "Table 1"]
        if mine:
            out.heading(f"Table 1 · {dataset} (`{ours}`)")
            out.table(["run", "metric", *HEADER[2:]], rows(mine, "metric", notes))
            out.text(values["protocol"][dataset]["note"])
    for spec in values["per_class"]:
        mine = [c for c in cells if c["source"] == spec["table"]]
        if mine:
            out.heading(f"{spec['table']} · {spec['dataset']}: {LABELS[spec['metric']]} per class")
            out.table(["run", "class", *HEADER[2:]], rows(mine, "finding", notes))
            missing = [theirs for theirs, ours in spec["classes"].items() if ours is None]
            if missing:
                out.text(f"No counterpart here (not compared): {', '.join(missing)}.")
    mine = [c for c in cells if c["metric"] == "delta_dice"]
    if mine:
        out.heading("Fig. 4 · ΔDice (Dice at the best τ minus Dice at 0.5) per model")
        out.table(["run", "metric", *HEADER[2:]], rows(mine, "metric", notes))
        out.text(values["delta_dice"]["note"])
    if notes:
        out.heading("Notes", 4)
        for note, number in notes.items():
            out.text(f"{number}. {note}")
    if not cells:
        out.text("No run of the paper's models on the paper's datasets: nothing to compare.", warn=True)
    return out
