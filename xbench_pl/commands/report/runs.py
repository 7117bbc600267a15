"""The runs a report shows: found under the given folders, each with one label that every section uses, and
its tables by the name the report gives their dataset (split where runs saw different images)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from xbench_pl.outputs import read_metrics


def explainer_name(metrics: dict) -> str:
    """The explainer of a run's maps: ``metrics.json``'s ``explainer.name``; ``native`` where absent (older runs)."""
    return (metrics.get("explainer") or {}).get("name") or "native"


@dataclass
class Run:
    """One run: ``name``, its label in every section, shared by the model's runs on other datasets (one row of Table
    1); ``unique_name``, the label with its datasets where it is shared (where a run, not a model, is meant);
    ``setting_name``, the label without its explainer (the row of the model × explainer tables); ``shown``, the
    settings its label names (those where runs differ); ``datasets``, its tables by the report's dataset names
    (``image_sets``)."""
    name: str
    folder: Path
    metrics: dict
    setting: dict = field(default_factory=dict)
    setting_name: str = ""
    unique_name: str = ""
    shown: dict = field(default_factory=dict)
    datasets: dict = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.metrics["model"]

    @property
    def explainer(self) -> str:
        return explainer_name(self.metrics)


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: value} if prefix else {}


def setting(metrics: dict, params: dict) -> dict:
    """What a run was apart from its maps: a sweep's parameters (``params.json``) and over them the run's ``config``
    (``metrics.json``: model, data, precision) as dotted keys, ``init_args`` left out (``model.positive``); without
    the model's name and explainer, which a label shows apart."""
    flat = {key.replace(".init_args.", ".", 1): value for key, value in _flatten(metrics.get("config") or {}).items()}
    merged = {**params, **flat}
    for key in ("model", "model.explainer"):
        merged.pop(key, None)
    return merged


def _value(run: Run, key: str) -> str | None:
    return json.dumps(run.setting[key], sort_keys=True, default=str) if key in run.setting else None


def apart_in_data(runs: list[Run], keys: list[str]) -> bool:
    """Whether the runs alike in ``keys`` and explainer saw no dataset in common: what tells them apart (their data)
    is their datasets, each a column of its own."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault((run.explainer, *(_value(run, k) for k in keys)), []).append(run)
    return all(not shared_datasets(group) for group in groups.values())


def shared_datasets(runs: list[Run]) -> bool:
    """Whether two of the runs scored a dataset of the same name."""
    names = [d for run in runs for d in run.metrics["datasets"]]
    return len(names) > len(set(names))


def label_runs(runs: list[Run]) -> None:
    """Each run's one label: its model, its explainer in brackets where not native, and in parentheses the setting
    keys in which the model's runs differ (``clip [gradcam] (model.positive=There is {})``), but the data's
    (``data.*``) where runs that differ only in them saw other datasets: those are one model (the paper's sweep: a
    model's seven runs, one per dataset, are one row of Table 1, a column group per dataset). Runs still alike
    (repeats) on a dataset add their folder (its name, or its path where that is shared too). ``setting_name``: the
    label without the explainer and the folder; ``unique_name``: the label, with its datasets where other runs share
    it."""
    for model in dict.fromkeys(r.model for r in runs):
        mine = [r for r in runs if r.model == model]
        keys = dict.fromkeys(k for r in mine for k in r.setting)
        differ = [k for k in keys if len({_value(r, k) for r in mine}) > 1]
        beside_data = [k for k in differ if not k.startswith("data.")]
        if apart_in_data(mine, beside_data):
            differ = beside_data
        for run in mine:
            run.shown = {k: run.setting[k] for k in differ if k in run.setting}
            shown = ", ".join(f"{k}={v}" for k, v in run.shown.items())
            explainer = "" if run.explainer == "native" else f" [{run.explainer}]"
            run.setting_name = f"{model} ({shown})" if shown else model
            run.name = f"{model}{explainer} ({shown})" if shown else f"{model}{explainer}"
    alike = {name: [r for r in runs if r.name == name] for name in dict.fromkeys(r.name for r in runs)}
    repeats = {name for name, group in alike.items() if shared_datasets(group)}
    for run in runs:
        if run.name in repeats:
            places = [r.folder.name for r in alike[run.name]]
            place = run.folder.name if places.count(run.folder.name) == 1 else str(run.folder)
            run.name = f"{run.name[:-1]}, {place})" if run.name.endswith(")") else f"{run.name} ({place})"
    names = [r.name for r in runs]
    for run in runs:
        shared = names.count(run.name) > 1
        run.unique_name = f"{run.name} on {', '.join(run.metrics['datasets'])}" if shared else run.name


# -- image sets ----------------------------------------------------------------------------------
def image_set(table: dict) -> tuple | None:
    """What a table tells of the images it scored: per finding its ``n_pos``, ``n_neg`` and ``n_regions`` (None where a
    count is missing). Different counts are different images; metrics.json keeps no image ids, so two sets with the
    same counts are not told apart."""
    counts = tuple((f, row.get("n_pos"), row.get("n_neg"), row.get("n_regions")) for f, row in sorted(table.get("classes", {}).items()))
    return None if not counts or any(None in c for c in counts) else counts


def image_count(table: dict) -> int | None:
    """The images a table scored: the most (positives + negatives) of any finding."""
    counts = image_set(table)
    return max(pos + neg for _, pos, neg, _ in counts) if counts else None


def image_sets(runs: list[Run]) -> dict[str, dict[str, list[str]]]:
    """Per dataset whose runs saw different images (``image_set``): the report's name for each image set
    (``demo (8 images)``; ``demo (8 images, set 2)`` where two sets have as many) and the runs that saw it."""
    split = {}
    for dataset in dict.fromkeys(d for r in runs for d in r.metrics["datasets"]):
        tables = {r.name: r.metrics["datasets"][dataset] for r in runs if dataset in r.metrics["datasets"]}
        sets = list(dict.fromkeys(map(image_set, tables.values())))
        if len(sets) < 2:
            continue
        counts = [image_count(next(t for t in tables.values() if image_set(t) == s)) for s in sets]
        split[dataset] = {}
        for i, (s, n) in enumerate(zip(sets, counts)):
            images = "images unknown" if n is None else f"{n} images"
            name = f"{dataset} ({images})" if counts.count(n) == 1 else f"{dataset} ({images}, set {counts[:i].count(n) + 1})"
            split[dataset][name] = [run for run, t in tables.items() if image_set(t) == s]
    return split


def datasets(runs: list[Run]) -> list[str]:
    """The report's dataset names (``Run.datasets``): the datasets first seen first, a dataset's image sets together."""
    seen = {name: dataset for run in runs for dataset, table in run.metrics["datasets"].items()
            for name, mine in run.datasets.items() if mine is table}
    order = list(dict.fromkeys(seen.values()))
    return sorted(seen, key=lambda name: order.index(seen[name]))


# -- finding runs ----------------------------------------------------------------------------------
def parameter_order(params: dict) -> tuple:
    """A sort key for a sweep run's parameters: numbers by value, then text, then anything else, in the
    parameters' own order."""
    def key(value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (0, value, "")
        return (1, 0, value) if isinstance(value, str) else (2, 0, json.dumps(value, sort_keys=True))

    return tuple(key(v) for v in params.values())


def _params(folder: Path) -> dict | None:
    path = folder / "params.json"
    return json.loads(path.read_text()) if path.is_file() else None


def sweep_runs(folder: Path) -> list[Path]:
    """A sweep's run folders (``runs/*/`` with a ``metrics.json``) ordered by their parameters (``params.json``;
    folders without one last, by name): the folder names are hashes."""
    found = [p.parent for p in folder.glob("runs/*/metrics.json")]
    params = {f: _params(f) for f in found}
    return sorted(found, key=lambda f: (params[f] is None, parameter_order(params[f] or {}), f.name))


def find_runs(folders: list[str]) -> list[Run]:
    """Every run under the given folders (a run folder, or a sweep folder with ``runs/*/``, ``sweep_runs``), labelled
    (``label_runs``), with its tables by the report's dataset names (``image_sets``)."""
    found = []
    for folder in map(Path, folders):
        if (folder / "metrics.json").is_file():
            found.append(folder)
        elif runs := sweep_runs(folder):
            found += runs
        else:
            raise FileNotFoundError(f"{folder}: no metrics.json (nor runs/*/metrics.json of a sweep); "
                                    "give folders written by test --out or sweep --out")
    runs = []
    for folder in found:
        metrics = read_metrics(folder)
        runs.append(Run(metrics["model"], folder, metrics, setting(metrics, _params(folder) or {})))
    label_runs(runs)
    split = image_sets(runs)
    for run in runs:  # a dataset whose runs saw one image set keeps its name
        run.datasets = {next((name for name, members in split.get(d, {}).items() if run.name in members), d): table
                        for d, table in run.metrics["datasets"].items()}
    return runs
