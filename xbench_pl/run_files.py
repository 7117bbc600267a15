"""The benchmark's output files: ``metrics.json`` (every number) and ``metrics.md`` (tables).

``metrics.json`` top-level keys:

- ``model``: the name asked for (``--model NAME``, kept in the config as ``model_name``), else the class path;
- ``random_weights``: true when the model ran with random weights (``random_init``, no checkpoint):
  the numbers then only smoke-test the set-up;
- ``datasets``: ``{DATASET: {"classes": {CLASS: ROW}, "mean": ROW, "problems": [...]}}``; ROW keys
  and their definitions are in ``xbench_pl.metrics.benchmark`` and the README's "Metrics"
  section. Fractions are float64 in [0, 1] (computed in float64 from exact sums and counts),
  null where undefined; ``problems``: ``{"file", "row", "reason", "action"}`` per bad input; ``evaluated`` (a
  dataset pulled by name): which images were scored, ``{"split", "images" (or the set's unit), "ids_sha256",
  "pinned"}``, the SHA-256 of the sorted ids against the evaluation set's pinned list
  (``xbench_pl.data.sources.compare_ids``), so two runs can be seen to have scored the same images;
- ``config``: the resolved ``model`` and ``data`` configs (``class_path``, ``init_args``) and the precision;
- ``provenance``: ``xbench_pl``, ``git_commit`` (null outside a git checkout), ``git_dirty``,
  ``python``, ``torch``, ``lightning``, ``torchmetrics``, ``device``, ``accelerator``,
  ``world_size``, ``num_nodes``, ``started`` (ISO 8601, UTC), ``wall_time_s``. Everything but
  ``provenance`` is identical on 1 and N processes.

Beside ``classes`` and ``mean`` a dataset has ``ci`` (``{"level", "resamples", "seed", "unit",
"mean": {KEY: [low, high]}, "classes": {CLASS: {KEY: [low, high]}}}``, null with ``bootstrap=0``;
``unit``: ``patient``, ``image`` or ``patient where known, else image``),
``by_size`` (``{"bounds": [small, large], "mean": {STRATUM: ROW}, "classes": {CLASS: {STRATUM: ROW}}}``,
strata ``small``/``medium``/``large``) and ``tuning`` (``{"source", "note"}``): see
``xbench_pl.metrics.benchmark``.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from xbench_pl.console import say, width
from xbench_pl.data.errors import Problem
from xbench_pl.data.groups import UNKNOWN
from xbench_pl.metrics.benchmark import COUNT_KEYS, NEGATIVE_KEYS, metric_keys
from xbench_pl.metrics.chexlocalize import CXL_KEYS
from xbench_pl.metrics.trust_mode import TRUST_KEYS
from xbench_pl.outputs import REPLICATES_FILE, OutputFolder, split_replicates, write_results

#: the console table's columns unless ``--columns`` says otherwise: the README's (the paper's) eight keys and
#: the grounding denominator; ``metrics.md`` and ``metrics.json`` keep every column
DEFAULT_COLUMNS = ("pointing_game", "dice@0.5", "iou@0.5", "dice_best", "iou_best", "tau_best", "delta_dice", "auroc",
                   "n_regions")
#: default columns a dataset adds (by its name's start): MS-CXR's contrast-to-noise ratio (BioViL's grounding measure)
DATASET_COLUMNS = {"ms_cxr": ("cnr",)}
#: the fixed-threshold keys, named by the run's threshold (``--model.fixed_threshold``)
FIXED_THRESHOLD_KEY = re.compile(r"(dice|iou)@[0-9.]+")


def format_value(value) -> str:
    if value is None:
        return "–"
    return str(value) if isinstance(value, (int, str)) else f"{value:.3f}"


def markdown_table(rows: dict[str, dict], first: str) -> str:
    keys = list(next(iter(rows.values())))
    lines = [f"| {first} | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(format_value(row[k]) for k in keys) + " |" for name, row in rows.items()]
    return "\n".join(lines)


def column_names() -> tuple[str, ...]:
    """Every key a table row can have (``dice@0.5``/``iou@0.5`` stand for any fixed threshold's)."""
    return (*metric_keys(), *COUNT_KEYS, *NEGATIVE_KEYS, *CXL_KEYS, *TRUST_KEYS)


def parse_columns(text: str | None) -> list[str] | str | None:
    """``--columns``: None (``DEFAULT_COLUMNS``), ``all``, or comma-separated keys; a ValueError names an unknown key."""
    if text is None or text == "all":
        return text
    keys = [key.strip() for key in text.split(",") if key.strip()]
    unknown = [key for key in keys if key not in column_names() and not FIXED_THRESHOLD_KEY.fullmatch(key)]
    if unknown or not keys:
        raise ValueError(f"unknown key {unknown[0] if unknown else text!r}; give all or keys among: {', '.join(column_names())}")
    return keys


def console_columns(row: dict, columns: list[str] | str | None = None) -> list[str]:
    """The keys of ``row`` to show: all of them (``columns="all"``), else ``columns`` (default ``DEFAULT_COLUMNS``),
    a fixed-threshold key the row lacks (``dice@0.5`` in a run at 0.3) taken as the row's own."""
    if columns == "all":
        return list(row)
    own = {key.partition("@")[0]: key for key in row if FIXED_THRESHOLD_KEY.fullmatch(key)}
    chosen = []
    for key in columns or DEFAULT_COLUMNS:
        if key not in row and FIXED_THRESHOLD_KEY.fullmatch(key):
            key = own.get(key.partition("@")[0], key)
        chosen.append(key)
    return chosen


def default_columns(datasets, rows=()) -> list[str]:
    """``DEFAULT_COLUMNS`` with the ``DATASET_COLUMNS`` of the ``datasets`` (names) and the trust keys (``--model.trust``)
    that the ``rows`` (the mean rows of the datasets with a ``trust`` block) have, before ``n_regions``."""
    extra = [key for prefix, keys in DATASET_COLUMNS.items() if any(name.startswith(prefix) for name in datasets)
             for key in keys]
    extra += [key for key in TRUST_KEYS if any(key in row for row in rows)]
    return [*DEFAULT_COLUMNS[:-1], *dict.fromkeys(extra), DEFAULT_COLUMNS[-1]]


def console_table(rows: dict[str, dict], first: str, columns: list[str] | str | None = None,
                  max_width: int | None = None) -> str:
    """``rows`` as aligned markdown with the ``console_columns``, split into as many tables (each led by the
    ``first`` column) as it takes for every line to fit ``max_width`` (default: ``console.width``): no value is cut."""
    max_width = max_width or width()
    keys = console_columns(next(iter(rows.values())), columns)
    cells = {name: [format_value(row.get(key)) for key in keys] for name, row in rows.items()}
    lead = max(len(first), *map(len, rows))
    widths = [max(len(key), *(len(c[i]) for c in cells.values())) for i, key in enumerate(keys)]
    groups, line = [[]], lead + 4
    for i, w in enumerate(widths):
        if groups[-1] and line + w + 3 > max_width:
            groups.append([])
            line = lead + 4
        groups[-1].append(i)
        line += w + 3
    tables = []
    for group in groups:
        lines = [f"| {first:<{lead}} |" + "".join(f" {keys[i]:>{widths[i]}} |" for i in group),
                 f"|{'-' * (lead + 2)}|" + "".join(f"{'-' * (widths[i] + 1)}:|" for i in group)]
        lines += [f"| {name:<{lead}} |" + "".join(f" {c[i]:>{widths[i]}} |" for i in group) for name, c in cells.items()]
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def format_problem(problem: dict) -> str:
    return str(Problem(**problem))


def extra_markdown(d: dict) -> list[str]:
    """Lines for a dataset's tuning note, bootstrap intervals of its mean and size strata (where present)."""
    parts = []
    if d.get("tuning"):
        parts += ["", f"Tuned threshold: {d['tuning']['note']}" + (f" (from {d['tuning']['source']})" if d["tuning"].get("source") else "")]
    ci = d.get("ci")
    if ci:
        cells = {k: "–" if v is None else f"[{v[0]:.3f}, {v[1]:.3f}]" for k, v in ci["mean"].items()}
        parts += ["", f"{int(ci['level'] * 100)} % bootstrap intervals of the mean ({ci['resamples']} resamples, unit: {ci['unit']}, seed {ci['seed']}):", "",
                  "| " + " | ".join(cells) + " |", "|---" * len(cells) + "|", "| " + " | ".join(cells.values()) + " |"]
    trust = d.get("trust")
    if trust:
        parts += ["", *trust_lines(trust, quote="`")]
        if trust["stages"]:
            parts += ["", markdown_table({s["stage"]: {k: v for k, v in s.items() if k != "stage" and not k.endswith("_interval")}
                                          for s in trust["stages"]}, "randomized up to")]
    by_size = d.get("by_size")
    if by_size:
        low, high = by_size["bounds"]
        parts += ["", f"By region size (area fraction: small < {low:g} <= medium < {high:g} <= large):", "",
                  markdown_table(by_size["mean"], "size")]
    return parts


def render_markdown(report: dict) -> str:
    datasets = report["datasets"]
    title = f"# {report['model']}" + (" (RANDOM weights: a smoke test, not a result)" if report.get("random_weights") else "")
    parts = [title, ""]
    explainer = report.get("explainer")
    if explainer and explainer["name"] != "native":
        parts += [f"Maps: {explainer_text(explainer, quote='`')}.", ""]
    parts += ["## Per dataset (macro mean over findings; counts summed)", "",
             markdown_table({name: d["mean"] for name, d in datasets.items()}, "dataset")]
    for name, d in datasets.items():
        parts += ["", f"## {name}", "", markdown_table(d["classes"], "finding")]
        parts += extra_markdown(d)
        if d.get("problems"):
            parts += ["", f"{len(d['problems'])} input problem(s) skipped or corrected:", ""]
            parts += [f"- {format_problem(p)} [{p['action']}]" for p in d["problems"]]
    return "\n".join(parts) + "\n"


def trust_lines(trust: dict, quote: str = "") -> list[str]:
    """What a dataset's ``trust`` block says in words: the measures' settings and, with randomization, whether the maps
    pass it (the last stage's mean SSIM below Arun et al.'s baseline)."""
    settings = trust["settings"]
    perturbation = (f", {settings['steps']} steps, baseline {settings['baseline']}" if {"deletion", "insertion"} & set(settings["measures"])
                    else "")
    lines = [f"Trust measures: {', '.join(settings['measures'])} (seed {settings['seed']}{perturbation}; "
             f"{settings['pairs_measured']} pairs of {settings['images_measured']} images, pairs: {settings['pairs']}, "
             f"sample fraction {settings['sample']['fraction']:g})."]
    verdict = {True: "passes", False: "FAILS", None: "undefined"}[trust["passes_randomization"]]
    if "randomization" in settings["measures"]:
        stages = ", ".join(f"{quote}{name}{quote}" for name in settings["stages"]) or "none (nothing to randomize)"
        lines.append(f"Randomization {verdict}: the maps of the model randomized from the top ({stages}) against the trained "
                     "model's, last stage's SSIM below the baseline of random image pairs = passes.")
    return lines


def explainer_text(explainer: dict, quote: str = "") -> str:
    """Which explainer made the maps: name, target layer and target, library (``explainers.explainer_info``)."""
    if explainer["name"] == "native":
        return "native (the model's own maps)"
    layer = f" on {quote}{explainer['target_layer']}{quote}" if explainer.get("target_layer") else ""
    target = f", target: {explainer['target']}" if explainer.get("target") else ""
    return f"{explainer['name']}{layer}{target} ({explainer['library']} {explainer['version']})"


def gap_row(gap: dict | None) -> dict:
    """A ``group_gap`` as a table row: the gap, which values (``high − low``), its interval and p; a tie says so."""
    if gap is None:
        return {"gap": None, "between": None, "interval": None, "p": None}
    between = "tie" if gap["gap"] == 0 else f"{gap['high']} − {gap['low']}"
    interval = f"[{gap['ci'][0]:.3f}, {gap['ci'][1]:.3f}]" if gap.get("ci") else None
    return {"gap": gap["gap"], "between": between, "interval": interval, "p": gap.get("p")}


def group_summary(name: str, by_group: dict, columns: list[str] | str | None) -> list[str]:
    """Console lines of a dataset's ``by_group``: per group, the images per value, a table of each value's mean and
    one of the gap of each shown key (with its bootstrap interval and p); one line for a group unknown for every
    image (no table of nothing)."""
    lines = []
    for group, entry in by_group.items():
        counts = entry["n_images"]
        known = {value: n for value, n in counts.items() if value != UNKNOWN and n}
        if not known:
            lines += ["", f"{name} by {group}: unknown for all {counts.get(UNKNOWN, 0)} images (no {group} in the "
                          f"dataset's metadata); no per-{group} table"]
            continue
        rows = {f"{value} ({n} images)": entry[value]["mean"] for value, n in known.items()}
        lines += ["", f"{name} by {group} ({', '.join(f'{v}: {n}' for v, n in counts.items())} images):",
                  console_table(rows, group, columns)]
        gaps = {key: gap_row(entry["gap"][key]) for key in console_columns(next(iter(rows.values())), columns)
                if entry["gap"].get(key)}
        if gaps:
            lines += [f"gap between the {group} values (largest − smallest mean, 95 % bootstrap interval, p):",
                      console_table(gaps, "key", "all")]
        else:
            lines.append(f"no gap: only {', '.join(known)} has images")
    return lines


def problem_summary(report: dict, out: Path) -> list[str]:
    """One console line per dataset with problems: how many were skipped and corrected, and where they are listed."""
    lines = []
    for name, d in report["datasets"].items():
        problems = d.get("problems") or []
        if not problems:
            continue
        skipped = sum(p["action"] == "skipped" for p in problems)
        corrected: dict[str, int] = {}
        for p in problems:
            if p["action"] != "skipped":
                corrected[p["action"]] = corrected.get(p["action"], 0) + 1
        what = [f"{skipped} image(s)/row(s) skipped"] if skipped else []
        if corrected:
            what.append(f"{sum(corrected.values())} corrected ({', '.join(f'{a} {n}' for a, n in corrected.items())})")
        lines.append(f"{name}: {' and '.join(what)}; listed in {out / 'metrics.json'} (datasets.{name}.problems) "
                     f"and {out / 'metrics.md'}")
    return ["", *lines] if lines else []


def git_commit(folder: Path | None = None) -> tuple[str | None, bool | None]:
    """The checkout's commit and whether tracked files differ from it; ``(None, None)`` outside git."""
    folder = folder or Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None, None
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        return commit.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def provenance(trainer, started: float) -> dict:
    """What produced a report of ``trainer``'s run (``host_provenance``)."""
    return host_provenance(started, trainer.strategy.root_device, type(trainer.accelerator).__name__, trainer.world_size,
                           trainer.num_nodes)


def host_provenance(started: float, device: torch.device, accelerator: str, world_size: int = 1, num_nodes: int = 1) -> dict:
    """What produced a report: versions, commit, device, the (Lightning) ``accelerator``, world size, start and wall
    time. Versions are read from the installed packages' metadata: a run scored without a model imports no Lightning."""
    from importlib.metadata import version

    import xbench_pl

    name = str(device)
    if device.type == "cuda":
        name += f" ({torch.cuda.get_device_name(device)})"
    commit, dirty = git_commit()
    return {
        "xbench_pl": xbench_pl.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": version("lightning"),
        "torchmetrics": version("torchmetrics"),
        "device": name,
        "accelerator": accelerator,
        "world_size": world_size,
        "num_nodes": num_nodes,
        "started": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": round(time.time() - started, 3),
    }


def build_report(model: str, results: dict[str, dict], problems: dict[str, list], config: dict,
                 random_weights: bool = False, provenance: dict | None = None, explainer: dict | None = None,
                 evaluated: dict[str, dict | None] | None = None) -> dict:
    datasets = {name: {**table, "problems": [p.to_dict() for p in problems.get(name, [])]} for name, table in results.items()}
    for name, identity in (evaluated or {}).items():  # which images were scored (data.sources.compare_ids)
        if identity is not None and name in datasets:
            datasets[name]["evaluated"] = identity
    report = {"model": model, "random_weights": random_weights, "datasets": datasets, "config": config}
    if explainer is not None:
        report["explainer"] = explainer
    if provenance is not None:
        report["provenance"] = provenance
    return report


def write_report(report: dict, out_dir: str | Path | OutputFolder) -> Path:
    """``metrics.json`` and ``metrics.md``, and the bootstrap replicates apart in ``REPLICATES_FILE`` (where kept),
    into ``out_dir`` (``write_results``); the folder they are in."""
    readable, replicates = split_replicates(report)
    files = {"metrics.json": json.dumps(readable, indent=2) + "\n", "metrics.md": render_markdown(readable)}
    if replicates:
        files[REPLICATES_FILE] = json.dumps(replicates) + "\n"
    return write_results(out_dir, files)


def publish_report(report: dict, out_dir: str | Path | OutputFolder, columns: list[str] | str | None = None) -> Path:
    """``write_report``, then print the per-dataset table (``console_table``) and ``problem_summary`` (what
    every command ends with)."""
    out = write_report(report, out_dir)
    means = {n: d["mean"] for n, d in report["datasets"].items()}
    columns = columns or default_columns(means, [d["mean"] for d in report["datasets"].values() if d.get("trust")])
    if report.get("explainer"):
        say(f"maps: {explainer_text(report['explainer'])}")
    print(console_table(means, "dataset", columns))
    every = len(next(iter(means.values())))
    shown = len(console_columns(next(iter(means.values())), columns))
    if shown < every:
        say(f"({shown} of {every} columns; every column: {out / 'metrics.md'} and metrics.json; "
            "choose with --columns all|KEY,...)")
    for name, d in report["datasets"].items():
        for line in group_summary(name, d.get("by_group") or {}, columns):
            say(line)
        if d.get("trust") and "randomization" in d["trust"]["settings"]["measures"]:
            say(f"{name}: {trust_lines(d['trust'])[-1]}")
    for line in problem_summary(report, out):
        say(line)
    return out


def publish_scores(out: str, started: float, scored_from: str, columns: list[str] | str | None = None, **report) -> Path:
    """Write and print the report (``build_report`` arguments) of a run scored without a model:
    one CPU process, ``scored_from`` the store or maps folder; ``columns`` as ``publish_report``'s."""
    # one CPU process, named as a test run on the CPU names its accelerator (Lightning's CPUAccelerator)
    host = host_provenance(started, torch.device("cpu"), "CPUAccelerator")
    report = build_report(**report, provenance={**host, "scored_from": scored_from})
    return publish_report(report, out, columns)
