"""``python -m xbench_pl report RUN_DIR... --out DIR``: ``report.md`` and a self-contained ``report.html``.

A RUN_DIR is a ``test --out`` folder (its ``metrics.json``, and the ``heatmaps/`` and
``calibration/`` files the visual callbacks wrote, if any) or a ``sweep --out`` folder (every
``runs/*/metrics.json``). The report holds:

- the datasets x models grid of Pointing Game / Dice@0.5 / IoU@0.5 (Table 1 of the paper);
- per dataset, the per-finding Pointing Game, Dice, IoU and AUROC of every model;
- AUROC against Pointing Game over every (model, dataset, finding) with both defined, with the
  least-squares line and its R² (the paper's Fig. 3), and Pearson's r, R² = r² and the number of
  points per model and overall as a table and in ``report.json`` (``correlation_stats``);
- Dice at τ = 0.5 against Dice at ``tau_best`` per model and dataset (Fig. 4: the calibration gap);
- where the runs' maps differ in explainer (``metrics.json``'s ``explainer.name``, none = ``native``) or any is
  not native, "Model × explainer": per dataset, tables of Pointing Game, Dice@0.5 and Dice best with models
  in rows and explainers in columns, the spread across explainers against the spread across models, and
  grouped bars of each model's Pointing Game per explainer (``model_x_explainer`` in ``report.json``);
- where a reader run (``--model reader``, ``is_reader``) covers a dataset, "Against a radiologist": the reader's values
  and each model's as a share of them (% of reader), macro means and per finding, with 95% intervals from the same
  bootstrap draws where both runs were resampled over the same units (``against_reader``, ``share_interval``);
- where runs have ``by_group`` (``--model.groups``), "Fairness: subgroups": per dataset and group the images per
  value, Pointing Game, Dice best and AUROC per value with intervals, and the gap with its interval and p (``fairness``);
- the calibration plots and heatmap samples the runs saved.

A run is labelled by its model, with its explainer in brackets where it is not native (``clip [gradcam]``).
Figures are drawn with matplotlib into ``OUT/figures/`` (``report.md`` links them and the runs'
own PNGs); ``report.html`` inlines every image as a data URI, so it opens from a file, offline.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from jsonargparse import ArgumentParser

from xbench_pl.commands.parsing import PARSER_KWARGS
from xbench_pl.outputs import atomic_write, check_writable, figure_png, read_metrics, replicate_keys, write_whole
from xbench_pl.console import QUIET_SECONDS, ProgressLines

TABLE1 = ("pointing_game", "dice@0.5", "iou@0.5")
FINDING_KEYS = ("pointing_game", "dice@0.5", "iou@0.5", "auroc")
SHORT = {"pointing_game": "PG", "dice@0.5": "Dice", "iou@0.5": "IoU", "auroc": "AUROC", "dice_best": "Dice best",
         "cxl_hit_rate": "CXL hit rate", "cxl_miou": "CXL mIoU"}
LONG = {**SHORT, "pointing_game": "Pointing Game", "dice@0.5": "Dice at τ = 0.5", "dice_best": "Dice at tau_best"}
#: data columns per HTML/markdown table (after the row names): at the page's 1,200 px, each column keeps ~100 px
COLUMNS_PER_TABLE = 9
#: the explainers in the order of ``xbench_pl.options.ExplainerName`` (not imported: the report runs without torch);
#: a name not listed here comes after them
EXPLAINERS = ("native", "gradcam", "gradcam++", "hirescam", "layercam", "xgradcam", "eigencam", "scorecam", "rollout", "chefer")
#: the keys of the model x explainer tables (per dataset, macro means over findings)
EXPLAINER_KEYS = ("pointing_game", "dice@0.5", "dice_best")


def explainer_name(metrics: dict) -> str:
    """The explainer of a run's maps: ``metrics.json``'s ``explainer.name``; ``native`` where absent (older runs)."""
    return (metrics.get("explainer") or {}).get("name") or "native"


@dataclass
class Run:
    name: str
    folder: Path
    metrics: dict

    @property
    def model(self) -> str:
        return self.metrics["model"]

    @property
    def explainer(self) -> str:
        return explainer_name(self.metrics)


def run_label(metrics: dict) -> str:
    """A run's name in the report: its model, and its explainer in brackets where not native (``clip [gradcam]``)."""
    name = explainer_name(metrics)
    return metrics["model"] if name == "native" else f"{metrics['model']} [{name}]"


def parameter_order(params: dict) -> tuple:
    """A sort key for a sweep run's parameters: numbers by value, then text, then anything else, in the
    parameters' own order."""
    def key(value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (0, value, "")
        return (1, 0, value) if isinstance(value, str) else (2, 0, json.dumps(value, sort_keys=True))

    return tuple(key(v) for v in params.values())


def sweep_runs(folder: Path) -> list[Path]:
    """A sweep's run folders (``runs/*/`` with a ``metrics.json``) ordered by their parameters (``params.json``;
    folders without one last, by name): the folder names are hashes."""
    found = [p.parent for p in folder.glob("runs/*/metrics.json")]
    params = {f: json.loads((f / "params.json").read_text()) if (f / "params.json").is_file() else None for f in found}
    return sorted(found, key=lambda f: (params[f] is None, parameter_order(params[f] or {}), f.name))


def find_runs(folders: list[str]) -> list[Run]:
    """Every run under the given folders (a run folder, or a sweep folder with ``runs/*/``, ``sweep_runs``), named
    by ``run_label`` (with the parameters, but ``model.explainer`` which the label shows, or the folder name where two
    runs share a label)."""
    found = []
    for folder in map(Path, folders):
        if (folder / "metrics.json").is_file():
            found.append(folder)
        elif runs := sweep_runs(folder):
            found += runs
        else:
            raise FileNotFoundError(f"{folder}: no metrics.json (nor runs/*/metrics.json of a sweep); "
                                    "give folders written by test --out or sweep --out")
    metrics = [read_metrics(f) for f in found]
    runs = [Run(run_label(m), f, m) for f, m in zip(found, metrics)]
    names = [r.name for r in runs]
    for run in runs:
        if names.count(run.name) > 1:
            params = run.folder / "params.json"
            shown = {k: v for k, v in json.loads(params.read_text()).items() if k != "model.explainer"} if params.is_file() else {}
            suffix = ", ".join(f"{k}={v}" for k, v in shown.items()) or run.folder.name
            run.name = f"{run.name} ({suffix})"
    return runs


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float] | None:
    """Least-squares ``y = a x + b`` and its R² (``1 - SS_res / SS_tot``); None for fewer than 2 distinct x."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return slope, intercept, (1 - ss_res / ss_tot) if ss_tot > 0 else float("nan")


def r2_text(r2: float | None) -> str:
    """R² as printed: undefined when every AUROC is equal (e.g. weight-free baselines, all 0.5)."""
    if r2 is None:
        return "–"
    return "undefined (AUROC constant)" if math.isnan(r2) else f"{r2:.3f}"


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's correlation coefficient; None for fewer than 2 points or where either side is constant."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(sxx * syy)


def correlation_stats(points: list[tuple[str, str, str, float, float]]) -> dict:
    """AUROC against Pointing Game (``auroc_pg_points``) as statistics: ``overall`` and per model in ``models``
    the number of points ``n``, Pearson's ``r`` and ``r2`` = r² (None where undefined); ``overall`` also the
    least-squares ``slope`` and ``intercept`` of the figure's line."""
    def stats(chosen: list) -> dict:
        r = pearson([p[3] for p in chosen], [p[4] for p in chosen])
        return {"n": len(chosen), "r": r, "r2": None if r is None else r * r}

    fit = fit_line([p[3] for p in points], [p[4] for p in points])
    models = list(dict.fromkeys(p[0] for p in points))
    return {"overall": {**stats(points), "slope": fit and fit[0], "intercept": fit and fit[1]},
            "models": {m: stats([p for p in points if p[0] == m]) for m in models}}


def correlation_table(stats: dict) -> tuple[list[str], list[list[str]]]:
    rows = [[name, str(s["n"]), _cell(s["r"]), _cell(s["r2"])] for name, s in [*stats["models"].items(), ("all models", stats["overall"])]]
    return ["model", "points", "Pearson r", "R²"], rows


def auroc_pg_points(runs: list[Run]) -> list[tuple[str, str, str, float, float]]:
    """(model, dataset, finding, pointing_game, auroc) for every finding with both defined."""
    points = []
    for run in runs:
        for dataset, table in run.metrics["datasets"].items():
            for finding, row in table["classes"].items():
                if row.get("pointing_game") is not None and row.get("auroc") is not None:
                    points.append((run.name, dataset, finding, row["pointing_game"], row["auroc"]))
    return points


def _cell(value) -> str:
    return "–" if value is None else (str(value) if isinstance(value, int) else f"{value:.3f}")


def _datasets(runs: list[Run]) -> list[str]:
    names = []
    for run in runs:
        names += [d for d in run.metrics["datasets"] if d not in names]
    return names


def table1(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    datasets = _datasets(runs)
    header = ["model", *(f"{d} {SHORT[k]}" for d in datasets for k in TABLE1)]
    rows = [[run.name, *(_cell(run.metrics["datasets"].get(d, {}).get("mean", {}).get(k)) for d in datasets for k in TABLE1)]
            for run in runs]
    return header, rows


def finding_tables(runs: list[Run], dataset: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """The per-finding tables of one dataset: one per key of ``FINDING_KEYS`` (its title, header and rows), findings
    in rows and the runs with this dataset in columns."""
    findings = []
    for run in runs:
        findings += [f for f in run.metrics["datasets"].get(dataset, {}).get("classes", {}) if f not in findings]
    with_data = [r for r in runs if dataset in r.metrics["datasets"]]
    return [(SHORT[key], ["finding", *(r.name for r in with_data)],
             [[f, *(_cell(r.metrics["datasets"][dataset]["classes"].get(f, {}).get(key)) for r in with_data)] for f in findings])
            for key in FINDING_KEYS]


def split_columns(header: list[str], rows: list[list[str]], per_table: int, group: int = 1) -> list[tuple[list[str], list[list[str]]]]:
    """A table as several with at most ``per_table`` columns after the first (which each repeats), cut only between
    groups of ``group`` columns (Table 1's three keys of a dataset stay together): the page fits without
    horizontal scrolling however many runs or datasets it has."""
    size = max(group, per_table // group * group)
    return [([header[0], *header[1 + start:1 + start + size]], [[row[0], *row[1 + start:1 + start + size]] for row in rows])
            for start in range(0, len(header) - 1, size)]


# -- model x explainer -----------------------------------------------------------------------------
def has_explainers(runs: list[Run]) -> bool:
    """Whether the report gets its "Model × explainer" section: the runs' explainers differ, or one is not native."""
    return any(run.explainer != "native" for run in runs)  # explainers that differ include a non-native one


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: value} if prefix else {}


def setting(run: Run) -> dict:
    """What a run was apart from its maps: its ``config`` (``metrics.json``: model, data, precision) as dotted keys,
    ``init_args`` left out (``model.positive``), without ``model.explainer``."""
    flat = {key.replace(".init_args.", ".", 1): value for key, value in _flatten(run.metrics.get("config") or {}).items()}
    flat.pop("model.explainer", None)
    return flat


def _explainer_order(names) -> list[str]:
    names = list(dict.fromkeys(names))
    return [n for n in EXPLAINERS if n in names] + [n for n in names if n not in EXPLAINERS]


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _spread(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) - min(values) if len(values) > 1 else None


def explainer_grid(runs: list[Run]) -> dict:
    """The model x explainer tables, as ``report.json`` holds them (``model_x_explainer``).

    A row is a model in one setting (``setting``: the run's config but its explainer), a column an explainer
    (``EXPLAINERS`` order). Runs of one model in several settings (a sweep over prompts and explainers) are
    kept apart: one row per setting, labelled by the model and the config keys in which its settings differ.
    Runs with the same model, setting and explainer are repeats: their numbers are averaged and ``runs``
    counts them. ``datasets[DATASET][KEY][ROW][EXPLAINER]`` is the run's macro mean over the dataset's
    findings (None where undefined or not run); ``spread[DATASET][KEY]``: ``across_explainers``, the mean over
    rows of (max − min over the row's explainers), against ``across_models``, the mean over explainers of
    (max − min over rows): the larger moves the number more, the map or the model."""
    explainers = _explainer_order(run.explainer for run in runs)
    settings: dict[str, list[str]] = {}  # model -> its settings (canonical JSON), first seen first
    keyed = []
    for run in runs:
        key = json.dumps(setting(run), sort_keys=True, default=str)
        settings.setdefault(run.model, [])
        if key not in settings[run.model]:
            settings[run.model].append(key)
        keyed.append((run, key))
    rows, labels = [], {}
    for model, keys in settings.items():
        parsed = [json.loads(k) for k in keys]
        union = list(dict.fromkeys(k for p in parsed for k in p))
        differ = [k for k in union if len({json.dumps(p.get(k), sort_keys=True) for p in parsed}) > 1]
        for key, values in zip(keys, parsed):
            label = model if len(keys) == 1 else f"{model} ({', '.join(f'{k}={values.get(k)}' for k in differ)})"
            while label in labels.values():  # two models' labels that collide (not expected): kept apart
                label += "'"
            labels[(model, key)] = label
            rows.append({"label": label, "model": model, "setting": {k: values.get(k) for k in differ}})
    cells: dict[tuple[str, str], list[Run]] = {}
    for run, key in keyed:
        cells.setdefault((labels[(run.model, key)], run.explainer), []).append(run)
    datasets = _datasets(runs)
    tables = {dataset: {metric: {row["label"]: {e: _mean([r.metrics["datasets"].get(dataset, {}).get("mean", {}).get(metric)
                                                          for r in cells.get((row["label"], e), [])])
                                                for e in explainers}
                                 for row in rows}
                        for metric in EXPLAINER_KEYS}
              for dataset in datasets}
    spread = {dataset: {metric: {"across_explainers": _mean([_spread(list(table[row["label"]].values())) for row in rows]),
                                 "across_models": _mean([_spread([table[row["label"]][e] for row in rows]) for e in explainers])}
                        for metric, table in by_metric.items()}
              for dataset, by_metric in tables.items()}
    return {"explainers": explainers, "rows": rows, "keys": list(EXPLAINER_KEYS),
            "runs": {row["label"]: {e: len(cells.get((row["label"], e), [])) for e in explainers} for row in rows},
            "datasets": tables, "spread": spread}


def explainer_table(grid: dict, dataset: str, metric: str) -> tuple[list[str], list[list[str]]]:
    """One dataset's table of ``metric``: a row per model (setting), a column per explainer, then max − min over the
    row; a last row, max − min over the models. "–": undefined or not run; "(mean of n)": n repeats averaged."""
    table, counts = grid["datasets"][dataset][metric], grid["runs"]
    header = ["model", *grid["explainers"], "max − min"]
    rows = []
    for row in grid["rows"]:
        values = table[row["label"]]
        rows.append([row["label"], *(_cell(values[e]) + (f" (mean of {counts[row['label']][e]})" if counts[row["label"]][e] > 1 else "")
                                     for e in grid["explainers"]), _cell(_spread(list(values.values())))])
    rows.append(["max − min over models", *(_cell(_spread([table[row["label"]][e] for row in grid["rows"]])) for e in grid["explainers"]), ""])
    return header, rows


def spread_text(grid: dict, dataset: str, metric: str) -> str:
    spread = grid["spread"][dataset][metric]
    return (f"{dataset}, {SHORT[metric]}: across explainers (per model) max − min is {_cell(spread['across_explainers'])} on "
            f"average, across models (per explainer) {_cell(spread['across_models'])}.")


def explainers_used(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """Where each run's maps come from (``metrics.json``'s ``explainer``): layer, target, library and version."""
    rows = []
    for run in runs:
        info = run.metrics.get("explainer") or {"name": "native"}
        library = " ".join(str(info[k]) for k in ("library", "version") if info.get(k))
        rows.append([run.name, run.explainer, info.get("target_layer") or "–", info.get("target") or "–", library or "–"])
    return ["run", "explainer", "target layer", "target", "library"], rows


# -- against a radiologist (the reader ceiling) ----------------------------------------------------
#: the keys of the "Against a radiologist" tables: each model's value as a share of the reader's; the cxl keys too
#: where the reader run has them (``--model.cxl``: CheXlocalize's human benchmark)
READER_NOTE = ("Shares are model ÷ reader × 100 of the point estimates. Their 95% intervals come from the same bootstrap "
               "draws: where a model's run and the reader's were resampled over the same units with the same resamples and "
               "seed (metrics.json's ci.draws), each replicate's share is the model's replicate ÷ the reader's, and the "
               "interval the 2.5 and 97.5 percentiles of those shares (replicates where the reader's value is 0 or either "
               "is undefined left out). Otherwise no interval is shown, and the section says why.")


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
    return [_mean(list(column)) for column in zip(*by_class.values())]


#: the keys shown as a share of the reader's: those whose replicates a table keeps (``outputs.replicate_keys``)
READER_KEYS = tuple(k for k in replicate_keys() if not k.startswith("cxl_"))
CXL_REPLICATES = tuple(k for k in replicate_keys() if k.startswith("cxl_"))


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


def against_reader(runs: list[Run]) -> dict:
    """``report.json``'s ``against_reader``: per dataset with a reader run (the first such run where there are
    several), the reader's own values (``mean``, ``classes`` per finding, ``keys``: ``READER_KEYS`` and the cxl keys the
    reader has) and per other run with that dataset each value, its ``percent`` of the reader's (``share``) and that
    share's ``ci`` from the same bootstrap draws (``share_interval``; None where there are none: ``draws`` says why)."""
    out = {}
    for dataset in _datasets(runs):
        readers = [r for r in runs if is_reader(r) and dataset in r.metrics["datasets"]]
        if not readers:
            continue
        reader = readers[0].metrics["datasets"][dataset]
        keys = READER_KEYS + tuple(k for k in CXL_REPLICATES if reader.get("mean", {}).get(k) is not None)
        findings = list(reader.get("classes", {}))
        ref = {"mean": {k: reader.get("mean", {}).get(k) for k in keys},
               "classes": {f: {k: reader["classes"][f].get(k) for k in keys} for f in findings}}
        reader_ci = reader.get("ci")
        models = {}
        for run in runs:
            if is_reader(run) or dataset not in run.metrics["datasets"]:
                continue
            table = run.metrics["datasets"][dataset]
            problem = draws_problem(table.get("ci"), reader_ci)
            mine, theirs = ({}, {}) if problem else (table["ci"]["replicates"], reader_ci["replicates"])

            def cells(row: dict, reference: dict, finding: str | None) -> dict:
                out = {}
                for k in keys:
                    ci = None
                    if k in mine and k in theirs:
                        if finding is None:
                            ci = share_interval(macro_replicates(mine[k]), macro_replicates(theirs[k]))
                        elif finding in mine[k] and finding in theirs[k]:
                            ci = share_interval(mine[k][finding], theirs[k][finding])
                    out[k] = {"value": row.get(k), "percent": share(row.get(k), reference[k]), "ci": ci}
                return out

            models[run.name] = {"draws": problem or "shared", "mean": cells(table.get("mean", {}), ref["mean"], None),
                                "classes": {f: cells(table.get("classes", {}).get(f, {}), ref["classes"][f], f) for f in findings}}
        out[dataset] = {"reader": readers[0].name, "other_readers": [r.name for r in readers[1:]], "keys": list(keys),
                        "reader_values": ref, "models": models, "note": READER_NOTE}
    return out


def _percent(value, ci=None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}%" if ci is None else f"{value:.1f}% [{ci[0]:.1f}, {ci[1]:.1f}]"


def reader_mean_table(entry: dict) -> tuple[list[str], list[list[str]]]:
    """Macro means: the reader's values, then per model its value and (its share of the reader's [interval])."""
    keys = entry["keys"]
    header = ["model", *(SHORT[k] for k in keys)]
    rows = [[f"{entry['reader']} (reader)", *(_cell(entry["reader_values"]["mean"][k]) for k in keys)]]
    for name, cells in entry["models"].items():
        rows.append([name, *(f"{_cell(c['value'])} ({_percent(c['percent'], c['ci'])})" for c in map(cells["mean"].get, keys))])
    return header, rows


def reader_finding_table(entry: dict, key: str) -> tuple[list[str], list[list[str]]]:
    """One key per finding: the reader's value, then each model's share of it (% of reader [interval])."""
    header = ["finding", f"{entry['reader']} (reader)", *(f"{name} % of reader" for name in entry["models"])]
    rows = [[f, _cell(values[key]), *(_percent(c["percent"], c["ci"]) for c in (m["classes"][f][key] for m in entry["models"].values()))]
            for f, values in entry["reader_values"]["classes"].items()]
    return header, rows


def reader_section(table: dict) -> tuple[list[str], list[str]]:
    """The "Against a radiologist" section (markdown lines, HTML parts)."""
    title = "Against a radiologist: % of reader"
    intro = ("Where a reader run (`--model reader`: another radiologist's annotations scored as a model) covers a dataset, "
             "each model's value beside its share of the reader's (% of reader), as macro means and per finding. " + READER_NOTE)
    md, doc = ["", f"## {title}", "", intro], [f"<h2>{html.escape(title)}</h2>", f"<p>{html.escape(intro.replace('`', ''))}</p>"]
    for dataset, entry in table.items():
        heading = f"{dataset} (reader: {entry['reader']})"
        md += ["", f"### {heading}"]
        doc.append(f"<h3>{html.escape(heading)}</h3>")
        notes = [f"Other reader runs, not used as the reference here: {', '.join(entry['other_readers'])}."] if entry["other_readers"] else []
        notes += [f"No intervals for {name}: {cells['draws']}." for name, cells in entry["models"].items() if cells["draws"] != "shared"]
        for note in notes:
            md += ["", note]
            doc.append(f"<p>{html.escape(note)}</p>")
        parts = [(f"{dataset}: macro means, value (% of reader [95% CI])", reader_mean_table(entry))]
        parts += [(f"{dataset}: {SHORT[k]} per finding, % of reader [95% CI]", reader_finding_table(entry, k)) for k in entry["keys"]]
        add_tables(md, doc, parts)
    return md, doc


def add_tables(md: list[str], doc: list[str], parts: list[tuple[str, tuple[list, list]]]) -> None:
    """Each ``(subtitle, (header, rows))`` as a level-4 heading and its table, split at ``COLUMNS_PER_TABLE``."""
    for subtitle, (header, rows) in parts:
        md += ["", f"#### {subtitle}"]
        doc.append(f"<h4>{html.escape(subtitle)}</h4>")
        for h, r in split_columns(header, rows, COLUMNS_PER_TABLE):
            md += ["", _md_table(h, r)]
            doc.append(_html_table(h, r))


# -- fairness (subgroups) --------------------------------------------------------------------------
#: the keys of the fairness tables, per group value
FAIRNESS_KEYS = ("pointing_game", "dice_best", "auroc")


def fairness(runs: list[Run]) -> dict:
    """``report.json``'s ``fairness``: per dataset and group (``metrics.json``'s ``by_group``, ``--model.groups``) the
    group's ``values`` (known ones, in the runs' order) and per run with that group: ``n_images`` per value
    (``unknown`` included), per known value and key of ``FAIRNESS_KEYS`` its macro ``mean`` and ``ci`` (None where
    not run with a bootstrap), and per key the ``gap`` (``gap``, ``high``, ``low``, ``ci``, ``p``; None where undefined)."""
    out: dict = {}
    for dataset in _datasets(runs):
        for run in runs:
            for group, entry in (run.metrics["datasets"].get(dataset, {}).get("by_group") or {}).items():
                values = [v for v in entry.get("n_images", {}) if v != "unknown"]
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
    return _cell(value) + (f" [{_cell(ci[0])}, {_cell(ci[1])}]" if ci and value is not None else "")


def fairness_count_table(entry: dict) -> tuple[list[str], list[list[str]]]:
    values = [*entry["values"], "unknown"]
    return ["run", *(f"n {v}" for v in values)], [[name, *(str(r["n_images"].get(v, "–")) for v in values)] for name, r in entry["runs"].items()]


def fairness_table(entry: dict, key: str) -> tuple[list[str], list[list[str]]]:
    """One key: a row per run, its value [95% CI] per group value, then the gap (high − low) [CI] and its p."""
    header = ["run", *entry["values"], "gap (high − low)", "gap 95% CI", "p"]
    rows = []
    for name, r in entry["runs"].items():
        cells = [_with_ci(r["values"].get(v, {}).get(key, {}).get("mean"), r["values"].get(v, {}).get(key, {}).get("ci")) for v in entry["values"]]
        gap = r["gap"][key]
        if gap is None:
            cells += ["–", "–", "–"]
        else:
            ci = gap.get("ci")
            cells += [f"{_cell(gap['gap'])} ({gap['high']} − {gap['low']})", f"[{_cell(ci[0])}, {_cell(ci[1])}]" if ci else "–", _cell(gap.get("p"))]
        rows.append([name, *cells])
    return header, rows


def fairness_section(table: dict) -> tuple[list[str], list[str]]:
    """The "Fairness: subgroups" section (markdown lines, HTML parts)."""
    title = "Fairness: subgroups"
    intro = ("Per dataset and group (`--model.groups`), each run's macro means on each group value's images alone with their "
             "95% bootstrap intervals (on the dataset's draws), the images per value (unknown: no metadata, left out of the "
             "values' tables), and the gap between the best and the worst value with its paired-bootstrap interval and "
             "two-sided p-value (docs/metrics.md, Subgroups). \"–\": undefined, no images, or no bootstrap.")
    md, doc = ["", f"## {title}", "", intro], [f"<h2>{html.escape(title)}</h2>", f"<p>{html.escape(intro.replace('`', ''))}</p>"]
    for dataset, groups in table.items():
        for group, entry in groups.items():
            md += ["", f"### {dataset}: {group}"]
            doc.append(f"<h3>{html.escape(dataset)}: {html.escape(group)}</h3>")
            parts = [(f"{dataset}, {group}: images per value", fairness_count_table(entry))]
            parts += [(f"{dataset}, {group}: {SHORT[k]}", fairness_table(entry, k)) for k in FAIRNESS_KEYS]
            add_tables(md, doc, parts)
    return md, doc


# -- figures ---------------------------------------------------------------------------------------
def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def stacked(xs: list[float], ys: list[float]) -> list[tuple[float, float, int]]:
    """Points as (x, y, how many) with those equal to 3 decimals (as printed) merged: a marker per place."""
    counts: dict[tuple[float, float], int] = {}
    for x, y in zip(xs, ys):
        place = (round(x, 3), round(y, 3))
        counts[place] = counts.get(place, 0) + 1
    return [(x, y, n) for (x, y), n in counts.items()]


MARKER_AREA = 28  # points², of a marker for one point; k points on one place get k times the area


def figure_auroc_pg(runs: list[Run], path: Path):
    """Fig. 3: returns the figure and the fit's numbers (``points``, ``slope``, ``intercept``, ``r2``). Markers are
    not cut at the axes, and points on one place are one marker whose area counts them (``stacked``)."""
    points = auroc_pg_points(runs)
    fit = fit_line([p[3] for p in points], [p[4] for p in points])
    columns = 2 if max(len(run.name) for run in runs) <= 40 else 1  # the legend's: as wide as the figure at most
    fig = _figure(6, 4.4 + 0.16 * math.ceil((len(runs) + 1) / columns))  # room for the legend's rows
    ax = fig.add_subplot()
    placed = {run.name: stacked([p[3] for p in points if p[0] == run.name], [p[4] for p in points if p[0] == run.name])
              for run in runs}
    for name, mine in placed.items():
        if mine:
            ax.scatter([x for x, _, _ in mine], [y for _, y, _ in mine], s=[MARKER_AREA * n for *_, n in mine], alpha=0.6,
                       edgecolors="black", linewidths=0.4, clip_on=False, label=name)
    if fit is not None:
        slope, intercept, r2 = fit
        ax.plot([0, 1], [intercept, slope + intercept], "k--", linewidth=1,
                label=f"fit: AUROC = {slope:.2f} PG + {intercept:.2f}, R² = {r2_text(r2)}")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="Pointing Game (per finding)", ylabel="AUROC (per finding)")
    merged = any(n > 1 for mine in placed.values() for *_, n in mine)
    ax.set_title(f"Recognition against grounding: {len(points)} (model, dataset, finding) points"
                 + ("\n(a larger marker: several points on one place)" if merged else ""), fontsize=9)
    ax.grid(alpha=0.3)
    if points:  # below the axes: over them it would hide points
        fig.legend(fontsize=7, loc="outside lower center", ncols=columns, markerscale=0.8)
    atomic_write(path, figure_png(fig))
    return fig, {"points": len(points), "slope": fit and fit[0], "intercept": fit and fit[1], "r2": fit and fit[2]}


def figure_dice_gap(runs: list[Run], path: Path):
    """Fig. 4, returned: a pair of horizontal bars per (model, dataset), labelled on the left by its model and
    dataset, each wrapped, one row per pair however many there are (labels never overlap)."""
    import textwrap

    labels, fixed, best = [], [], []
    for run in runs:
        for dataset, table in run.metrics["datasets"].items():
            labels.append("\n".join(textwrap.fill(part, 32) for part in (run.name, dataset)))
            fixed.append(table["mean"].get("dice@0.5") or 0.0)
            best.append(table["mean"].get("dice_best") or 0.0)
    lines = max(label.count("\n") + 1 for label in labels) if labels else 1
    fig = _figure(7, 1.4 + len(labels) * max(0.3, 0.13 * lines))  # every row room for the longest label's lines
    ax = fig.add_subplot()
    ys = list(range(len(labels)))
    ax.barh([y - 0.2 for y in ys], fixed, height=0.4, label="Dice at τ = 0.5", color="tab:gray")
    ax.barh([y + 0.2 for y in ys], best, height=0.4, label="Dice at tau_best (oracle)", color="tab:green")
    for y, a, b in zip(ys, fixed, best):
        ax.annotate(f"Δ {b - a:+.3f}", (max(a, b) + 0.01, y), va="center", fontsize=7)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.margins(y=0.01)
    ax.invert_yaxis()  # the first run on top, as in the tables
    ax.set(xlim=(0, 1), xlabel="mean Dice over findings")
    ax.set_title("Calibration gap: Dice at the fixed threshold vs at the best one", fontsize=9)
    fig.legend(fontsize=7, loc="outside lower center", ncols=2)
    ax.grid(alpha=0.3, axis="x")
    atomic_write(path, figure_png(fig))
    return fig


def figure_explainers(grid: dict, path: Path, metric: str = "pointing_game"):
    """Each model's ``metric`` per explainer, returned: per dataset (a panel each, side by side, models shared) one
    group of horizontal bars per model (setting), one bar per explainer, colour by explainer, value at its end;
    where a bar is missing, a grey note says why (undefined, or no such run, e.g. a refused rollout)."""
    import textwrap

    from matplotlib import colormaps
    from matplotlib.patches import Patch

    datasets, rows, explainers = list(grid["datasets"]), grid["rows"], grid["explainers"]
    colours = colormaps["tab10" if len(explainers) <= 10 else "tab20"]
    bar = 0.8 / len(explainers)
    lines = max(textwrap.fill(row["label"], 32).count("\n") + 1 for row in rows)
    group = max(0.14 * len(explainers) + 0.15, 0.14 * lines)  # inches per model: room for its bars and its label's lines
    columns = min(3, len(datasets))
    panels = math.ceil(len(datasets) / columns)
    fig = _figure(7 if columns == 1 else 2.2 + 3.2 * columns, 1.0 + panels * (0.5 + group * len(rows)))
    axes = fig.subplots(panels, columns, sharey=True, squeeze=False).ravel()
    ys = list(range(len(rows)))
    for ax, dataset in zip(axes, datasets):
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
    for ax in axes[len(datasets):]:
        ax.set_visible(False)
    axes[0].set_yticks(ys, [textwrap.fill(row["label"], 32) for row in rows], fontsize=7)
    axes[0].set_ylim(len(rows) - 0.5, -0.5)  # the first model on top, as in the tables
    fig.suptitle(f"Is it the model or the map? {LONG[metric]} per model and explainer", fontsize=9)
    handles = [Patch(color=colours(j), label=explainer) for j, explainer in enumerate(explainers)]
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=min(5, len(explainers)))
    atomic_write(path, figure_png(fig))
    return fig


# -- the documents ---------------------------------------------------------------------------------
def saved_images(run: Run) -> dict[str, list[tuple[Path, str]]]:
    """The run's calibration plots and heatmap samples, per section title: (file, caption)."""
    sections: dict[str, list[tuple[Path, str]]] = {}
    for folder in sorted((run.folder / "calibration").glob("*")):
        files = [folder / "threshold_all.png", folder / "reliability_all.png"]
        found = [(f, f"{folder.name}: {f.stem.replace('_all', ' (every finding)')}") for f in files if f.is_file()]
        if found:
            sections[f"Calibration, {folder.name}"] = found
    samples = run.folder / "heatmaps" / "samples.csv"
    if samples.is_file():
        with samples.open() as f:
            for row in csv.DictReader(f):
                caption = (f"{row['finding']} | {row['image_id']} | score {float(row['score']):.3f} | label {row['label']} | "
                           f"PG {float(row['pointing_game']):.2f}")
                sections.setdefault(f"Heatmap samples, {row['dataset']}", []).append((run.folder / "heatmaps" / row["file"], caption))
    return sections


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|---" * len(header) + "|", *("| " + " | ".join(r) + " |" for r in rows)])


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; } h3 { margin-top: 1.4rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.6rem 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; } th { background: #f1f3f5; }
td:first-child, th:first-child { text-align: left; } th { overflow-wrap: anywhere; max-width: 12rem; }
figure { display: inline-block; margin: 0.4rem; vertical-align: top; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.75rem; color: #555; max-width: 420px; }
.warn { background: #fff3cd; border: 1px solid #e0c060; padding: 0.5rem 0.8rem; }
.gallery figure img { width: 260px; }
"""

CHECK_IMAGES = """
window.addEventListener("load", function () {
  var images = Array.from(document.images);
  var ok = images.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images", ok + "/" + images.length);
  document.body.setAttribute("data-width", document.documentElement.scrollWidth);  // wider than the window: the page scrolls sideways
});
"""


def _figure_html(path: Path, caption: str) -> str:
    return (f'<figure><img src="{_data_uri(path)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


EXPLAINER_FIGURE = "pointing_game_by_explainer.png"


def explainer_section(runs: list[Run], grid: dict, figures: Path) -> tuple[list[str], list[str]]:
    """The "Model × explainer" section (markdown lines, HTML parts): per dataset a table per ``EXPLAINER_KEYS``
    (split at ``COLUMNS_PER_TABLE``), the spreads, the grouped bars and where each run's maps come from."""
    title = "Model × explainer: is it the model or the map?"
    intro = ("Macro means over findings, per dataset: a row per model (per setting where its runs differ in more than "
             "the explainer: the differing config keys follow its name), a column per explainer (`--model.explainer`; "
             "none recorded = native). Scores are the model's whatever the explainer, so only the maps differ along a row. "
             "Repeats (same model, setting and explainer) are averaged. If max − min along the rows (across explainers) "
             "exceeds that down the columns (across models), the map moves the number more than the model does.")
    md, doc = ["", f"## {title}", "", intro], [f"<h2>{html.escape(title)}</h2>", f"<p>{html.escape(intro.replace('`', ''))}</p>"]
    for dataset in grid["datasets"]:
        md += ["", f"### {dataset}"]
        doc.append(f"<h3>{html.escape(dataset)}</h3>")
        for metric in EXPLAINER_KEYS:
            add_tables(md, doc, [(f"{dataset}: {SHORT[metric]} by model and explainer", explainer_table(grid, dataset, metric))])
            spread = spread_text(grid, dataset, metric)
            md += ["", spread]
            doc.append(f"<p>{html.escape(spread)}</p>")
    figure_explainers(grid, figures / EXPLAINER_FIGURE)
    caption = "Pointing Game per model (a group of bars) and explainer (a bar), per dataset"
    md += ["", f"![{caption}](figures/{EXPLAINER_FIGURE})", "", f"*{caption}*"]
    doc.append(_figure_html(figures / EXPLAINER_FIGURE, caption))
    h, r = explainers_used(runs)
    md += ["", "### Where each run's maps come from", "", _md_table(h, r)]
    doc += ["<h3>Where each run's maps come from</h3>", _html_table(h, r)]
    return md, doc


def build(runs: list[Run], out: Path) -> dict:
    """Write ``report.md``, ``report.html`` and ``figures/``; return the numbers the figures show."""
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    _, fit = figure_auroc_pg(runs, figures / "auroc_vs_pointing_game.png")
    figure_dice_gap(runs, figures / "dice_fixed_vs_best.png")
    random_runs = [r.name for r in runs if r.metrics.get("random_weights")]
    header, rows = table1(runs)
    md = ["# XBench report", "", f"{len(runs)} run(s): " + ", ".join(f"{r.name} (`{r.folder}`)" for r in runs)]
    doc = [f"<h1>XBench report</h1><p>{len(runs)} run(s): " + ", ".join(html.escape(r.name) for r in runs) + "</p>"]
    if random_runs:
        note = f"RANDOM weights (smoke tests, not results): {', '.join(random_runs)}"
        md += ["", f"> **{note}**"]
        doc.append(f'<p class="warn">{html.escape(note)}</p>')
    md += ["", "## Grounding per dataset and model (macro means; Table 1)"]
    doc.append("<h2>Grounding per dataset and model (macro means; Table 1)</h2>")
    for h, r in split_columns(header, rows, COLUMNS_PER_TABLE, group=len(TABLE1)):
        md += ["", _md_table(h, r)]
        doc.append(_html_table(h, r))
    grid = explainer_grid(runs) if has_explainers(runs) else None
    if grid is not None:
        section_md, section_html = explainer_section(runs, grid, figures)
        md += section_md
        doc += section_html
    reader_table = against_reader(runs)
    if reader_table:
        section_md, section_html = reader_section(reader_table)
        md += section_md
        doc += section_html
    fairness_table_ = fairness(runs)
    if fairness_table_:
        section_md, section_html = fairness_section(fairness_table_)
        md += section_md
        doc += section_html
    r2 = r2_text(fit["r2"])
    fig_text = [("auroc_vs_pointing_game.png", f"AUROC against Pointing Game per (model, dataset, finding): "
                 f"{fit['points']} points, R² = {r2} (Fig. 3)"),
                ("dice_fixed_vs_best.png", "Dice at τ = 0.5 vs at tau_best per model and dataset (Fig. 4)")]
    md += ["", "## Recognition against grounding, calibration gap", ""]
    doc.append("<h2>Recognition against grounding, calibration gap</h2>")
    for name, caption in fig_text:
        md += [f"![{caption}](figures/{name})", "", f"*{caption}*", ""]
        doc.append(_figure_html(figures / name, caption))
    stats = correlation_stats(auroc_pg_points(runs))
    atomic_write(out / "report.json", json.dumps({"runs": [{"name": r.name, "folder": str(r.folder), "model": r.model,
                                                           "explainer": r.explainer} for r in runs],
                                                 "auroc_vs_pointing_game": stats,
                                                 **({"model_x_explainer": grid} if grid is not None else {}),
                                                 **({"against_reader": reader_table} if reader_table else {}),
                                                 **({"fairness": fairness_table_} if fairness_table_ else {})}, indent=1) + "\n")
    h, r = correlation_table(stats)
    title = "AUROC against Pointing Game per finding: Pearson r (undefined: a constant side)"
    md += [f"### {title}", "", _md_table(h, r), ""]
    doc += [f"<h3>{html.escape(title)}</h3>", _html_table(h, r)]
    md += ["## Per finding"]
    doc.append("<h2>Per finding</h2>")
    for dataset in _datasets(runs):
        md += ["", f"### {dataset}"]
        doc.append(f"<h3>{html.escape(dataset)}</h3>")
        for key, header, rows in finding_tables(runs, dataset):
            md += ["", f"#### {dataset}: {key}"]
            doc.append(f"<h4>{html.escape(dataset)}: {html.escape(key)}</h4>")
            for h, r in split_columns(header, rows, COLUMNS_PER_TABLE):
                md += ["", _md_table(h, r)]
                doc.append(_html_table(h, r))
    progress = ProgressLines("report: saved plots and samples", len(runs), "runs", after=QUIET_SECONDS)
    for run in runs:
        sections = saved_images(run)
        progress.step()
        if not sections:
            continue
        md += ["", f"## {run.name}: saved plots and samples"]
        doc.append(f"<h2>{html.escape(run.name)}: saved plots and samples</h2>")
        for title, images in sections.items():
            md += ["", f"### {title}", ""]
            doc.append(f'<h3>{html.escape(title)}</h3><div class="gallery">' if title.startswith("Heatmap") else f"<h3>{html.escape(title)}</h3><div>")
            for path, caption in images:
                md.append(f"![{caption}]({Path(os.path.relpath(path, out)).as_posix()})")
                doc.append(_figure_html(path, caption))
            doc.append("</div>")
    atomic_write(out / "report.md", "\n".join(md) + "\n")
    page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>XBench report</title>'
            f"<style>{STYLE}</style><script>{CHECK_IMAGES}</script></head><body>{''.join(doc)}</body></html>\n")
    atomic_write(out / "report.html", page)
    return fit


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = ArgumentParser(prog="python -m xbench_pl report", description=__doc__.split("\n\n")[1], **PARSER_KWARGS)
    parser.add_argument("runs", type=str, nargs="+", help="run folders (test --out) or sweep folders (sweep --out)")
    parser.add_argument("--out", type=str, default="report", help="folder for report.md, report.html and figures/")
    try:
        args = parser.parse_args(argv)
    except Exception as error:
        print(f"error: {str(error).splitlines()[0]} (see python -m xbench_pl report --help)", file=sys.stderr)
        return 2
    try:
        runs = find_runs([r for group in args.runs for r in (group if isinstance(group, list) else [group])])
    except (FileNotFoundError, json.JSONDecodeError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    check_writable({"--out": args.out})
    out = Path(args.out)
    fit = write_whole(out, lambda folder: build(runs, folder))
    r2 = r2_text(fit["r2"])
    print(f"{len(runs)} run(s); AUROC vs Pointing Game: {fit['points']} points, R² = {r2}")
    print(f"wrote {out / 'report.md'}, {out / 'report.html'} and {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
