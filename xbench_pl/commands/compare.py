"""``python -m xbench_pl compare --predictions A B [--data NAME] [--data.ARG V] [--out DIR] [--bootstrap N] [--seed S]``.

Is run A better grounded (or better at recognition) than run B on the same data? Both prediction
stores (written by ``test --predictions DIR``) are replayed through the benchmark (``predictions.replay_store``:
no model is run), each with its own run's metric settings, on one dataset: ``--data NAME [--data.ARG V]``,
else A's. Both must hold every image of it (else the command names what is missing).

A paired bootstrap then resamples the units (patients where the dataset records them, else images:
``metrics.resampling``) ``N`` times (default 1,000, seeded) and recomputes every key of both runs on the
same draws: per key, per finding and for the macro mean, the difference A - B of the table values, the
percentile 95 % interval of the replicates' differences, and a two-sided bootstrap p-value
``p = min(1, 2 min((1 + #{d_r <= 0}) / (1 + R), (1 + #{d_r >= 0}) / (1 + R)))`` over the ``R`` replicates
where the difference ``d_r`` is defined (small when the replicates' differences rarely cross 0; never 0).
Writes ``compare.json`` and ``compare.md`` to ``--out`` (default ``compare``).
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING

from xbench_pl.commands import print_error
from xbench_pl.commands.arguments import PROG, command_help, take_option
from xbench_pl.data.errors import DataError
from xbench_pl.commands.score import UsageProblem, open_store
from xbench_pl.outputs import check_writable, write_results

if TYPE_CHECKING:
    import torch

USAGE = "compare --predictions A B [--data NAME] [--data.ARG V] [--out DIR] [--bootstrap N] [--seed S]"
OPTIONS = {
    "--predictions A B": f"the two prediction stores ({PROG} test --predictions DIR), written on the same data",
    "--data NAME": "the dataset both are judged on (default: A's)",
    "--data.ARG V": "one of the dataset's settings (--data.root DIR, ...)",
    "--out DIR": "folder for compare.json and compare.md (default: compare)",
    "--bootstrap N": "paired bootstrap resamples (default: 1000)",
    "--seed S": "the seed of the resamples (default: 0)",
}


def bootstrap_p_value(differences: torch.Tensor) -> float | None:
    """Two-sided bootstrap p-value of replicate differences ``[R]`` (NaN ignored; the module's formula)."""
    import torch  # here, as in every function of this module: --help starts without torch

    d = differences[~torch.isnan(differences)]
    if d.numel() == 0:
        return None
    low, high = (1 + int((d <= 0).sum())) / (1 + d.numel()), (1 + int((d >= 0).sum())) / (1 + d.numel())
    return min(1.0, 2 * min(low, high))


def _difference(a: float | None, b: float | None, replicates: torch.Tensor, level: float) -> dict:
    from xbench_pl.metrics.resampling import interval
    from xbench_pl.metrics.functional import percentile_interval

    diff = None if a is None or b is None else a - b
    return {"a": a, "b": b, "diff": diff, "ci": interval(percentile_interval(replicates, level)) if diff is not None else None,
            "p": bootstrap_p_value(replicates) if diff is not None else None}


def paired_bootstrap(metrics_a, metrics_b, resamples: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """The paired comparison of two ``BenchmarkMetrics`` fed the same images: ``unit``, ``units``,
    ``resamples``, and per key ``mean`` and per finding ``classes`` ``{key: {a, b, diff, ci, p}}``
    (``diff`` = a - b of the table values; ``ci`` and ``p`` from the replicates' differences, the same
    draws for both). A ``ValueError`` when the two did not see the same images and pairs."""
    import torch

    from xbench_pl.metrics.functional import bootstrap_weights

    state_a, state_b = metrics_a.sample_state(), metrics_b.sample_state()
    if metrics_a.classes != metrics_b.classes:
        raise ValueError(f"the runs' findings differ: {metrics_a.classes} vs {metrics_b.classes}")
    for part, names in (("images", ("image", "unit")), ("pairs", ("image", "unit", "cls"))):
        if not all(torch.equal(state_a[part][n], state_b[part][n]) for n in names):
            raise ValueError(f"the runs did not evaluate the same {part} (image ids, patients or regions differ): "
                             "compare runs on the same data")
    table_a, table_b = metrics_a.compute(), metrics_b.compute()
    universe, unit = metrics_a.units(state_a)
    weights = bootstrap_weights(universe.numel(), resamples, seed)
    reps_a = metrics_a.replicates(state_a, universe, weights)
    reps_b = metrics_b.replicates(state_b, universe, weights)
    keys = [k for k in reps_a if k in reps_b]
    out = {"unit": unit, "units": universe.numel(), "resamples": resamples, "seed": seed, "level": level, "mean": {}, "classes": {}}
    for key in keys:
        # the macro mean per replicate: over the classes defined in that replicate, as the intervals of ci
        out["mean"][key] = _difference(table_a["mean"][key], table_b["mean"][key],
                                       reps_a[key].nanmean(1) - reps_b[key].nanmean(1), level)
    for j, name in enumerate(metrics_a.classes):
        out["classes"][name] = {key: _difference(table_a["classes"][name][key], table_b["classes"][name][key],
                                                 reps_a[key][:, j] - reps_b[key][:, j], level) for key in keys}
    return out


def _cell(value, digits: int = 4) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def render_markdown(report: dict) -> str:
    lines = [f"# Paired comparison: A = {report['a']['model']} ({report['a']['store']}), B = {report['b']['model']} ({report['b']['store']})", "",
             f"{report['resamples']} paired bootstrap resamples (seed {report['seed']}); difference A − B, its "
             f"{int(report['level'] * 100)} % interval and two-sided bootstrap p-value."]
    for name, d in report["datasets"].items():
        lines += ["", f"## {name} ({d['units']} {d['unit']} units)", "", "| key | A | B | A − B | 95 % CI | p |", "|---|---|---|---|---|---|"]
        for key, row in d["mean"].items():
            ci = "–" if row["ci"] is None else f"[{row['ci'][0]:.4f}, {row['ci'][1]:.4f}]"
            lines.append(f"| {key} | {_cell(row['a'])} | {_cell(row['b'])} | {_cell(row['diff'])} | {ci} | {_cell(row['p'], 3)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(command_help(USAGE, __doc__.split("\n\n", 1)[1], OPTIONS))
        return 0
    stores = argv[argv.index("--predictions") + 1:][:2] if "--predictions" in argv else []
    if len(stores) < 2 or any(s.startswith("-") for s in stores):
        print_error("--predictions A B is required: two stores written by "
                    f"{PROG} test ... --predictions DIR on the same data")
        return 2
    i = argv.index("--predictions")
    folders, rest = argv[i + 1:i + 3], argv[:i] + argv[i + 3:]
    options = {}
    for flag, default in (("--out", "compare"), ("--bootstrap", "1000"), ("--seed", "0")):
        value, rest = take_option(rest, flag)
        options[flag] = value if value is not None else default
    try:
        resamples, seed = int(options["--bootstrap"]), int(options["--seed"])
        if resamples < 1:
            raise ValueError
    except ValueError:
        print_error(f"--bootstrap must be a positive number of resamples and --seed an integer, got "
                    f"{options['--bootstrap']!r} and {options['--seed']!r}")
        return 2
    check_writable({"--out": options["--out"]})
    import torch

    from xbench_pl.judging import stored_judge_settings  # here: --help starts without torch
    from xbench_pl.prediction_store import Store, StoreError, model_name
    from xbench_pl.predictions import replay_store

    try:
        run_a = open_store(folders[0], rest)
        store_b = Store(folders[1])
        stored_b = store_b.read_manifest()
        if stored_b is None:
            raise UsageProblem(f"{store_b.manifest_path} not found: {folders[1]} is no prediction store")
        metrics_b = {**stored_judge_settings(stored_b), "bootstrap": 0}
        replay_a = replay_store(run_a.store, run_a.datamodule, {**run_a.metrics, "bootstrap": 0})
        replay_b = replay_store(store_b, run_a.datamodule, metrics_b)  # the same data as A
        with torch.inference_mode():
            datasets = {name: paired_bootstrap(replay_a.benchmark[name], replay_b.benchmark[name], resamples, seed)
                        for name in replay_a.benchmark}
    except (UsageProblem, DataError, StoreError, ValueError) as error:
        print_error(str(error))
        return 2
    report = {"a": {"store": folders[0], "model": model_name(run_a.stored)}, "b": {"store": folders[1], "model": model_name(stored_b)},
              "resamples": resamples, "seed": seed, "level": 0.95,
              "p_value": "two-sided bootstrap: min(1, 2 min((1 + #{d <= 0}) / (1 + R), (1 + #{d >= 0}) / (1 + R))) "
                         "over the R replicates with a defined difference d = A - B",
              "datasets": datasets}
    out = write_results(options["--out"], {"compare.json": json.dumps(report, indent=1) + "\n",
                                           "compare.md": render_markdown(report)})
    print(render_markdown(report))
    print(f"wrote {out / 'compare.json'} and {out / 'compare.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
