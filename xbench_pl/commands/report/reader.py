"""The section "Against a radiologist", where a reader run (``--model reader``, ``is_reader``) covers a dataset: the
reader's values and each other run's as a share of them (% of reader), macro means and per finding, with 95% intervals
from the same bootstrap draws where both runs were resampled over the same units (``against_reader`` in
``report.json``, ``share_interval``). Below ``READER_FLOOR`` of the reader's value no share is shown."""

from __future__ import annotations

from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import SHORT, cell, mean
from xbench_pl.outputs import replicate_keys

#: the least reader's value a share is taken of: below it the reader marked nearly nothing (a Dice of 0.03 is a few
#: pixels), and the ratio of two near-zero numbers, up to thousands of percent, says nothing of the model
READER_FLOOR = 0.05
#: marks a share not shown because the reader's value is below ``READER_FLOOR``; ``FLOOR_NOTE`` says why under the table
BELOW = "–†"
FLOOR_NOTE = (f"†: no share where the reader's value is below {READER_FLOOR} (the reader marked nearly nothing there: "
              "a ratio to it would be noise).")
READER_NOTE = ("Shares are model ÷ reader × 100 of the point estimates, where the reader's value is at least "
               f"{READER_FLOOR}. Their 95% intervals come from the same bootstrap "
               "draws: where a model's run and the reader's were resampled over the same units with the same resamples and "
               "seed (metrics.json's ci.draws), each replicate's share is the model's replicate ÷ the reader's, and the "
               "interval the 2.5 and 97.5 percentiles of those shares (replicates where the reader's value is 0 or either "
               "is undefined left out). Otherwise no interval is shown, and the section says why.")
#: the keys shown as a share of the reader's: those whose replicates a table keeps (``outputs.replicate_keys``); the
#: cxl keys too where the reader run has them (``--model.cxl``: CheXlocalize's human benchmark)
READER_KEYS = tuple(k for k in replicate_keys() if not k.startswith("cxl_"))
CXL_REPLICATES = tuple(k for k in replicate_keys() if k.startswith("cxl_"))


def is_reader(run: Run) -> bool:
    """A run of the reader ceiling (``--model reader``: ``metrics.json``'s ``model`` is ``reader``, or its class
    path / config file names ``ReaderModel`` / ``reader.yaml``)."""
    class_path = str(((run.metrics.get("config") or {}).get("model") or {}).get("class_path") or "")
    return (run.model == "reader" or Path(run.model).name == "reader.yaml"
            or any(s.endswith("reader.ReaderModel") for s in (run.model, class_path)))


def share(value, reference) -> float | None:
    """``value`` as a percentage of ``reference``; None where either is undefined or the reference is 0."""
    if value is None or reference is None or reference == 0:
        return None
    return 100.0 * value / reference


def share_interval(values: list, references: list, level: float = 0.95) -> list[float] | None:
    """The percentile interval (linear interpolation, as the runs' own) of the replicate-by-replicate ``share`` of
    ``values`` in ``references`` (two runs' replicates on the same draws), over the replicates where it is defined."""
    import numpy as np

    shares = [s for s in map(share, values, references) if s is not None]
    if not shares:
        return None
    tail = (1 - level) / 2
    return [float(q) for q in np.quantile(np.array(shares, dtype=np.float64), [tail, 1 - tail])]


def macro_replicates(by_class: dict[str, list]) -> list:
    """Per replicate the mean over the classes defined in it (None where none is), as a table's ``mean`` interval."""
    return [mean(list(column)) for column in zip(*by_class.values())]


def draws_problem(run_ci: dict | None, reader_ci: dict | None) -> str | None:
    """Why two runs' tables have no shared bootstrap draws (``ci.draws``, ``resampling.draws_id``); None where they do."""
    for ci, whose in ((reader_ci, "the reader run"), (run_ci, "this run")):
        if not ci or not ci.get("replicates") or not ci.get("draws"):
            return f"{whose} kept no bootstrap replicates (run with --model.bootstrap N > 0; metrics.json older than ci.draws)"
    if run_ci["draws"] == reader_ci["draws"]:
        return None
    if run_ci.get("units") != reader_ci.get("units"):
        return (f"not resampled over the same units ({run_ci.get('units')} {run_ci.get('unit', 'unit')}s here, "
                f"{reader_ci.get('units')} in the reader run): no shared draws")
    if (run_ci.get("resamples"), run_ci.get("seed")) != (reader_ci.get("resamples"), reader_ci.get("seed")):
        return (f"other draws (resamples {run_ci.get('resamples')}, seed {run_ci.get('seed')} here; "
                f"{reader_ci.get('resamples')}, {reader_ci.get('seed')} in the reader run)")
    return f"not resampled over the same units (as many, {run_ci.get('units')}, but other ones): no shared draws"


def _cells(keys, row: dict, reference: dict, mine: dict, theirs: dict, finding: str | None) -> dict:
    """Per key: the run's ``value``, its ``percent`` of the reader's (None below ``READER_FLOOR``: ``below_floor``) and
    that share's ``ci`` on the shared draws (``mine``/``theirs``: the two runs' replicates; empty where none)."""
    out = {}
    for k in keys:
        below = reference[k] is not None and reference[k] < READER_FLOOR
        ci = None
        if k in mine and k in theirs and not below:
            if finding is None:
                ci = share_interval(macro_replicates(mine[k]), macro_replicates(theirs[k]))
            elif finding in mine[k] and finding in theirs[k]:
                ci = share_interval(mine[k][finding], theirs[k][finding])
        out[k] = {"value": row.get(k), "percent": None if below else share(row.get(k), reference[k]), "ci": ci, "below_floor": below}
    return out


def against_reader(runs: list[Run]) -> dict:
    """``report.json``'s ``against_reader``: per dataset with a reader run (the first such run where there are
    several), the reader's own values (``mean``, ``classes`` per finding, ``keys``: ``READER_KEYS`` and the cxl keys the
    reader has) and per other run with that dataset each value, its ``percent`` of the reader's (``share``; None where
    the reader's value is below ``floor``) and that share's ``ci`` from the same bootstrap draws (``share_interval``;
    None where there are none: ``draws`` says why)."""
    out = {}
    for dataset in datasets(runs):
        readers = [r for r in runs if is_reader(r) and dataset in r.datasets]
        if not readers:
            continue
        reader = readers[0].datasets[dataset]
        keys = READER_KEYS + tuple(k for k in CXL_REPLICATES if reader.get("mean", {}).get(k) is not None)
        findings = list(reader.get("classes", {}))
        ref = {"mean": {k: reader.get("mean", {}).get(k) for k in keys},
               "classes": {f: {k: reader["classes"][f].get(k) for k in keys} for f in findings}}
        models = {}
        for run in runs:
            if is_reader(run) or dataset not in run.datasets:
                continue
            table = run.datasets[dataset]
            problem = draws_problem(table.get("ci"), reader.get("ci"))
            mine, theirs = ({}, {}) if problem else (table["ci"]["replicates"], reader["ci"]["replicates"])
            models[run.name] = {"draws": problem or "shared",
                                "mean": _cells(keys, table.get("mean", {}), ref["mean"], mine, theirs, None),
                                "classes": {f: _cells(keys, table.get("classes", {}).get(f, {}), ref["classes"][f], mine, theirs, f)
                                            for f in findings}}
        out[dataset] = {"reader": readers[0].name, "other_readers": [r.name for r in readers[1:]], "keys": list(keys),
                        "floor": READER_FLOOR, "reader_values": ref, "models": models, "note": READER_NOTE}
    return out


def _percent(c: dict) -> str:
    if c["below_floor"]:
        return BELOW
    if c["percent"] is None:
        return "–"
    return f"{c['percent']:.1f}%" if c["ci"] is None else f"{c['percent']:.1f}% [{c['ci'][0]:.1f}, {c['ci'][1]:.1f}]"


def reader_mean_table(entry: dict) -> tuple[list[str], list[list[str]]]:
    """Macro means: the reader's values, then per run its value and (its share of the reader's [interval])."""
    keys = entry["keys"]
    rows = [[entry["reader"], *(cell(entry["reader_values"]["mean"][k]) for k in keys)]]
    rows += [[name, *(f"{cell(c['value'])} ({_percent(c)})" for c in map(cells["mean"].get, keys))] for name, cells in entry["models"].items()]
    return ["run", *(SHORT[k] for k in keys)], rows


def reader_finding_table(entry: dict, key: str) -> tuple[list[str], list[list[str]]]:
    """One key per finding: the reader's value, then each run's share of it (% of reader [interval])."""
    header = ["finding", entry["reader"], *entry["models"]]
    rows = [[f, cell(values[key]), *(_percent(m["classes"][f][key]) for m in entry["models"].values())]
            for f, values in entry["reader_values"]["classes"].items()]
    return header, rows


def section(runs: list[Run], figures: Path) -> Section | None:
    table = against_reader(runs)
    if not table:
        return None
    out = Section("Against a radiologist: % of reader", data={"against_reader": table})
    out.text("Where a reader run (`--model reader`: another radiologist's annotations scored as a model) covers a dataset, "
             "each run's value beside its share of the reader's (% of reader), as macro means and per finding. " + READER_NOTE)
    for dataset, entry in table.items():
        out.heading(f"{dataset} (reader: {entry['reader']})")
        if entry["other_readers"]:
            out.text(f"Other reader runs, not used as the reference here: {', '.join(entry['other_readers'])}.")
        problems: dict[str, list[str]] = {}
        for name, cells in entry["models"].items():
            if cells["draws"] != "shared":
                problems.setdefault(cells["draws"], []).append(name)
        for problem, names in problems.items():
            out.text(f"No intervals for {', '.join(names)}: {problem}.")
        parts = [(f"{dataset}: macro means, the reader's and each run's value (% of reader [95% CI])", reader_mean_table(entry))]
        parts += [(f"{dataset}: {SHORT[k]} per finding, the reader's value and each run's % of it [95% CI]", reader_finding_table(entry, k))
                  for k in entry["keys"]]
        for part in parts:
            out.tables([part])
            if any(BELOW in c for row in part[1][1] for c in row):
                out.text(FLOOR_NOTE)
    return out
