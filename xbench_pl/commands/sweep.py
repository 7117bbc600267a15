"""``python -m xbench_pl sweep SWEEP.yaml [--dry-run] [--out DIR] [--count N] [--seed S]``: a W&B sweep, locally.

W&B sweeps need a server (``wandb sweep`` / ``wandb agent``); offline there is none. This command
reads the same sweep YAML and runs it here: it expands ``parameters`` by ``method`` (``grid``: every
combination of ``values``/``value``, in YAML order; ``random``: ``--count`` draws, default the
YAML's ``run_cap``, from ``values`` (optionally ``probabilities``), ``value`` or a ``distribution``
(``constant``, ``categorical``, ``int_uniform``, ``uniform``, ``q_uniform``, ``log_uniform``,
``log_uniform_values``, ``q_log_uniform_values``, ``normal``, ``q_normal``, ``log_normal``) with
a seed, ``--seed``, default 0), and runs the YAML's ``command`` once per configuration, each in
its own process, so that a failing run is recorded and the others go on. Macros as the agent
fills them: ``${env}`` (dropped), ``${interpreter}`` and a bare ``python`` (this Python),
``${program}``, ``${args}`` (``--name=value``), ``${args_no_hyphens}``, ``${args_no_boolean_flags}``,
``${args_json}``; no ``command`` means ``${env} ${interpreter} ${program} ${args}``.

Each run writes to ``OUT/runs/RUN_ID`` (``--out`` appended to its command; with a ``WandbLogger``
in the command, also its ``save_dir``), ``RUN_ID`` a hash of its parameters, with ``params.json``
and ``log.txt`` (its output). A run whose ``metrics.json`` exists is skipped, so an interrupted
sweep restarted with the same ``--out`` goes on where it stopped. At the end ``OUT/summary.md``
and ``OUT/summary.csv`` list every run (parameters, status, the sweep's ``metric``, e.g.
``demo/pointing_game`` = that dataset's mean, wall time), sorted by the metric (``goal``), failed
runs last. ``--dry-run`` prints one line per run, its full command, and runs nothing. Exit status:
0, or 1 when a run failed; 2 for a bad sweep file.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import yaml
from jsonargparse import ArgumentParser

from xbench_pl.commands.parsing import PARSER_KWARGS
from xbench_pl.outputs import atomic_write, check_writable, write_results

DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]
METHODS = ("grid", "random")


class SweepError(ValueError):
    """A sweep file this runner cannot run: the message names the key and what is wrong."""


@dataclass
class Run:
    params: dict
    run_id: str
    command: list[str]
    folder: Path
    status: str = "pending"
    metric: float | None = None
    wall_s: float | None = None
    extra: dict = field(default_factory=dict)


def read_sweep(path: str | Path) -> dict:
    path = Path(path)
    try:
        sweep = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{path}: no such sweep file") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SweepError(f"{path}: not valid YAML ({getattr(error, 'problem', None) or error}{where})") from None
    if not isinstance(sweep, dict) or not isinstance(sweep.get("parameters"), dict) or not sweep["parameters"]:
        raise SweepError(f"{path}: a sweep needs a 'parameters' mapping (W&B sweep format)")
    method = sweep.get("method")
    if method not in METHODS:
        raise SweepError(f"{path}: method {method!r} cannot run locally; use one of {list(METHODS)} "
                         "(bayes needs the W&B server: wandb sweep / wandb agent)")
    for name, spec in sweep["parameters"].items():
        if not isinstance(spec, dict):
            raise SweepError(f"{path}: parameters.{name} must be a mapping (values, value or distribution)")
        if "parameters" in spec:
            raise SweepError(f"{path}: parameters.{name}: nested parameters are not supported locally; "
                             "use dotted names (model.positive)")
    return sweep


def _distribution(spec: dict) -> str:
    if "distribution" in spec:
        return spec["distribution"]
    if "values" in spec:
        return "categorical"
    if "value" in spec:
        return "constant"
    if "min" in spec and "max" in spec:  # W&B infers the distribution from the bounds' type
        return "int_uniform" if all(isinstance(spec[k], int) for k in ("min", "max")) else "uniform"
    raise SweepError(f"parameter spec {spec} has none of values, value, distribution, min/max")


def _quantize(value: float, q: float) -> float:
    return round(value / q) * q


def draw(name: str, spec: dict, rng: random.Random):
    """One random draw of a parameter, as the W&B random search defines its distributions."""
    kind = _distribution(spec)
    if kind == "constant":
        return spec["value"]
    if kind == "categorical":
        values = spec["values"]
        weights = spec.get("probabilities")
        return rng.choices(values, weights=weights)[0] if weights else rng.choice(values)
    try:
        if kind == "int_uniform":
            return rng.randint(int(spec["min"]), int(spec["max"]))
        if kind == "uniform":
            return rng.uniform(spec["min"], spec["max"])
        if kind == "q_uniform":
            return _quantize(rng.uniform(spec["min"], spec["max"]), spec.get("q", 1.0))
        if kind == "log_uniform":  # min/max are exponents (natural log)
            return math.exp(rng.uniform(spec["min"], spec["max"]))
        if kind == "log_uniform_values":
            return math.exp(rng.uniform(math.log(spec["min"]), math.log(spec["max"])))
        if kind == "q_log_uniform_values":
            return _quantize(math.exp(rng.uniform(math.log(spec["min"]), math.log(spec["max"]))), spec.get("q", 1.0))
        if kind == "normal":
            return rng.gauss(spec.get("mu", 0.0), spec.get("sigma", 1.0))
        if kind == "q_normal":
            return _quantize(rng.gauss(spec.get("mu", 0.0), spec.get("sigma", 1.0)), spec.get("q", 1.0))
        if kind == "log_normal":
            return math.exp(rng.gauss(spec.get("mu", 0.0), spec.get("sigma", 1.0)))
    except KeyError as error:
        raise SweepError(f"parameters.{name}: distribution {kind} needs {error.args[0]!r}") from None
    raise SweepError(f"parameters.{name}: distribution {kind!r} is not supported locally")


def expand(sweep: dict, count: int | None = None, seed: int = 0) -> list[dict]:
    """The configurations of a sweep: ``grid`` -> the product of the values (YAML order, last varies
    fastest), ``random`` -> ``count`` (or ``run_cap``) seeded draws."""
    if count is not None and count < 1:  # a slice by -1 would silently drop the last run
        raise SweepError(f"--count {count}: a sweep runs at least one configuration (give N >= 1, or no --count for all)")
    parameters = sweep["parameters"]
    if sweep["method"] == "grid":
        axes = []
        for name, spec in parameters.items():
            kind = _distribution(spec)
            if kind == "constant":
                axes.append([spec["value"]])
            elif kind == "categorical":
                axes.append(list(spec["values"]))
            else:
                raise SweepError(f"parameters.{name}: grid search takes values or value, not a {kind} distribution")
        configs = [dict(zip(parameters, combo)) for combo in product(*axes)]
        return configs[:count] if count else configs
    count = count or sweep.get("run_cap")
    if not count:
        raise SweepError("random search needs a run count: --count N (or run_cap in the sweep file)")
    rng = random.Random(seed)
    return [{name: draw(name, spec, rng) for name, spec in parameters.items()} for _ in range(int(count))]


def run_id(params: dict) -> str:
    return hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:10]


def build_command(sweep: dict, params: dict, out: Path) -> list[str]:
    """The sweep's ``command`` with its macros filled as the W&B agent fills them, then ``--out`` (and a
    ``WandbLogger``'s ``save_dir``) pointing at this run's folder."""
    flags = [f"--{k}={v}" for k, v in params.items()]
    macros = {
        "${env}": [],
        "${interpreter}": [sys.executable],
        "${program}": [str(sweep.get("program", ""))] if sweep.get("program") else [],
        "${args}": flags,
        "${args_no_hyphens}": [f"{k}={v}" for k, v in params.items()],
        "${args_no_boolean_flags}": [f"--{k}" if v is True else f"--{k}={v}" for k, v in params.items() if v is not False],
        "${args_json}": [json.dumps(params)],
    }
    command = []
    for token in sweep.get("command") or DEFAULT_COMMAND:
        token = str(token)
        if token in macros:
            command += macros[token]
        elif token in ("python", "python3") and not command:
            command.append(sys.executable)  # the same environment as this runner
        else:
            command.append(token)
    command += ["--out", str(out)]
    if any("WandbLogger" in token for token in command):
        command += ["--trainer.logger.init_args.save_dir", str(out)]
    return command


def metric_value(metrics: dict, name: str | None) -> float | None:
    """``DATASET/KEY`` -> that dataset's mean; ``KEY`` -> the mean over datasets where it is defined."""
    if not name:
        return None
    datasets = metrics.get("datasets", {})
    dataset, _, key = name.rpartition("/")
    if dataset:
        return datasets.get(dataset, {}).get("mean", {}).get(key)
    values = [d["mean"].get(key) for d in datasets.values() if d.get("mean", {}).get(key) is not None]
    return sum(values) / len(values) if values else None


def plan(sweep: dict, out: Path, count: int | None = None, seed: int = 0) -> list[Run]:
    runs = []
    for params in expand(sweep, count, seed):
        rid = run_id(params)
        folder = out / "runs" / rid
        runs.append(Run(params, rid, build_command(sweep, params, folder), folder))
    return runs


def execute(run: Run, metric: str | None) -> None:
    done = run.folder / "metrics.json"
    if done.is_file():
        run.status = "skipped (done)"
    else:
        run.folder.mkdir(parents=True, exist_ok=True)
        atomic_write(run.folder / "params.json", json.dumps(run.params, indent=2, default=str) + "\n")
        env = {**os.environ}
        env.setdefault("WANDB_MODE", "offline")  # no server: W&B logs go to the run folder, sync later
        started = time.time()
        with (run.folder / "log.txt").open("w") as log:  # the run's log, written as it goes
            log.write(shlex.join(run.command) + "\n\n")
            log.flush()
            result = subprocess.run(run.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        run.wall_s = round(time.time() - started, 1)
        run.status = "done" if result.returncode == 0 and done.is_file() else f"failed (exit {result.returncode})"
    if done.is_file():
        run.metric = metric_value(json.loads(done.read_text()), metric)


def summarize(runs: list[Run], sweep: dict, out: Path) -> str:
    metric = (sweep.get("metric") or {}).get("name")
    goal = (sweep.get("metric") or {}).get("goal", "maximize")
    names = list(sweep["parameters"])
    sign = -1 if goal == "maximize" else 1

    def order(run: Run):
        failed = run.status.startswith("failed")
        return (failed, run.metric is None, sign * run.metric if run.metric is not None else 0.0)

    ranked = sorted(runs, key=order)
    columns = ["run", *names, metric or "metric", "status", "wall_s", "folder"]
    rows = [[r.run_id, *(r.params.get(n) for n in names), r.metric, r.status, r.wall_s, str(r.folder)] for r in ranked]
    table = io.StringIO()
    csv.writer(table).writerows([columns, *rows])

    def cell(v):
        if v is None:
            return "–"
        return f"{v:g}" if isinstance(v, float) else str(v).replace("|", "\\|")

    lines = [f"# sweep {sweep.get('name') or ''}".rstrip(), "",
             f"method {sweep['method']}, {len(runs)} run(s); sorted by {metric or '(no metric)'} ({goal})", "",
             "| " + " | ".join(columns[:-1]) + " |", "|---" * (len(columns) - 1) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row[:-1]) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    write_results(out, {"summary.md": text, "summary.csv": table.getvalue()})
    return text


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m xbench_pl sweep", description=__doc__.split("\n\n")[1], **PARSER_KWARGS)
    parser.add_argument("sweep", type=str, help="a W&B sweep YAML (sweeps/*.yaml)")
    parser.add_argument("--out", type=str, default=None, help="folder of the runs and the summary (default: results/sweep_NAME)")
    parser.add_argument("--dry-run", action="store_true", help="print each run's command; run nothing")
    parser.add_argument("--count", type=int, default=None, help="runs of a random sweep (default: run_cap); caps a grid")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random draws")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except Exception as error:  # jsonargparse's usage error
        print(f"error: {str(error).splitlines()[0]} (see python -m xbench_pl sweep --help)", file=sys.stderr)
        return 2
    try:
        sweep = read_sweep(args.sweep)
        out = Path(args.out or f"results/sweep_{Path(args.sweep).stem}")
        runs = plan(sweep, out, args.count, args.seed)
    except SweepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        for run in runs:
            print(shlex.join(run.command))
        return 0
    check_writable({"--out": out})
    metric = (sweep.get("metric") or {}).get("name")
    for i, run in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {run.run_id} {json.dumps(run.params, default=str)}", flush=True)
        execute(run, metric)
        print(f"    {run.status}" + (f", {metric} = {run.metric:.4f}" if run.metric is not None else "")
              + (f" (log: {run.folder / 'log.txt'})" if run.status.startswith("failed") else ""), flush=True)
    print()
    print(summarize(runs, sweep, out))
    print(f"wrote {out / 'summary.md'} and {out / 'summary.csv'}")
    return 1 if any(r.status.startswith("failed") for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
