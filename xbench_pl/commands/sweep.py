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
runs last; each failed run's reason, its log's ``error:`` line, is printed as it fails and again at the end
(once, with the runs it ended, where runs failed alike).

``--dry-run`` prints one line per run, its full command, runs nothing, and checks what would stop the runs
(``run_problems``): each data root (``--data.root``, ``--data.image_root``; pooled, each dataset's folder in it) a
folder, each ``--model`` a registered name or an existing file with no path left as a placeholder, and its weights in
the weights cache (``weights pull``) or a checkpoint that exists; one ``error:`` line per problem, naming the runs it
stops. Exit status: 0, or 1 when a run failed; 2 for a
bad sweep file or a problem found by ``--dry-run``.
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

from xbench_pl.commands import print_error
from xbench_pl.commands.arguments import TRAINER_COMMANDS, is_name
from xbench_pl.commands.parsing import PARSER_KWARGS
from xbench_pl.console import wrap
from xbench_pl.outputs import atomic_write, check_writable, write_results

DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]
METHODS = ("grid", "random")
#: how the shipped sweep files spell a path for the user to fill in (``--data.root /path/to/xbench_datasets``)
PLACEHOLDER = "/path/to/"
#: run ids named in one line of runs a problem stops or an error ended, before "and N more"
LISTED_RUNS = 8


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
    error: str | None = None
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


# -- what would stop a run (--dry-run) ---------------------------------------------------------------------------
def last_option(argv: list[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``argv`` (the one the parser keeps); None without."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.partition("=")[2]
    return value


def path_problem(option: str, path: str, what: str, written_in: str = "the sweep file") -> str | None:
    """``option path``'s problem where ``path`` is a placeholder (to edit where it is ``written_in``) or does not exist
    (``what``: the thing it should be); else None."""
    if path.startswith(PLACEHOLDER):
        return f"{option} {path}: a placeholder, no such {what}; edit it in {written_in}"
    return None if Path(path).expanduser().exists() else f"{option} {path}: no such {what}"


def data_problems(argv: list[str]) -> list[str]:
    """A run's ``--data`` that is not registered, each of its data roots (``--data.root``, ``--data.image_root``, ...)
    that is no folder and, for pooled data, each dataset that reads a root whose folder ``ROOT/NAME`` is missing
    (``data.pooled``). A dataset read without a root must have been pulled (``data pull NAME``: ``unpulled``)."""
    from xbench_pl.commands.early import reads_root
    from xbench_pl.registry import UnknownName, class_path, config_path

    name = last_option(argv, "--data")
    if not name or not is_name(name):
        return []
    try:
        data_class = class_path("data", name)
    except UnknownName as error:
        return [f"--data {name}: {error}"]
    if not reads_root(data_class):  # a demo draws itself into its root
        return []
    flags = dict.fromkeys(f for f in (a.partition("=")[0] for a in argv) if f.startswith("--data.") and f.endswith("root"))
    roots = {flag: value for flag in flags if (value := last_option(argv, flag))}
    problems = [problem for flag, value in roots.items() if (problem := path_problem(flag, value, "folder"))]
    root = roots.get("--data.root")
    if problems:
        return problems
    if not data_class.endswith("PooledDataModule"):
        return [] if root is not None else unpulled([name])
    if given := last_option(argv, "--data.datasets"):
        try:
            names = yaml.safe_load(given)
        except yaml.YAMLError:
            return [f"--data.datasets {given}: not a YAML list of datasets"]
    else:  # the pooled config's own list
        names = yaml.safe_load(config_path("data", name).read_text())["init_args"]["datasets"]
    rooted = []
    for dataset in (d for d in (names if isinstance(names, list) else []) if isinstance(d, str)):  # a mapping: its own root
        try:
            needs_root = reads_root(class_path("data", dataset))
        except UnknownName as error:
            problems.append(f"--data.datasets: {error}")
            continue
        if needs_root and root is None:
            rooted.append(dataset)
        elif needs_root and not (Path(root).expanduser() / dataset).is_dir():
            problems.append(f"--data.root {root}: no folder {dataset}/ in it (the {dataset} dataset as it unpacks from "
                            "its source)")
    return problems + unpulled(rooted)


def unpulled(datasets: list[str]) -> list[str]:
    """Datasets read without a ``--data.root`` whose folder ``data pull`` fills (``sources.default_root``) is not there."""
    from xbench_pl.data.sources import PULL_COMMAND, data_dir, default_root

    return [f"--data {dataset}: no --data.root, and not pulled into {data_dir() / dataset} ({PULL_COMMAND} {dataset})"
            for dataset in datasets if default_root(dataset) is None]


def model_problems(argv: list[str]) -> list[str]:
    """A run's ``--model`` that is neither registered nor an existing file, and what it reads: a model file's paths
    left as placeholders, a checkpoint given (``--model.checkpoint``, or the model file's) that does not exist, or for
    a registered name without one, files of its release missing from the weights cache (``weights.cached_arguments``)
    or no release at all. ``random_init`` needs no files."""
    from xbench_pl.registry import UnknownName, class_path
    from xbench_pl.weights import CACHE_ENV, HUB, PULL_COMMAND, Needs, cache_dir, cached_arguments, read_sources

    model = last_option(argv, "--model")
    if not model or model.startswith("{"):
        return []
    from_file = {}  # a model file's init args that no --model.ARG of the command overrides
    if is_name(model):
        try:
            class_path("models", model)
        except UnknownName as error:
            return [f"--model {model}: {error}"]
    elif model.endswith((".yaml", ".yml")):
        if problem := path_problem("--model", model, "model file"):
            return [problem]
        init_args = (yaml.safe_load(Path(model).expanduser().read_text()) or {}).get("init_args") or {}
        from_file = {key: value for key, value in init_args.items() if last_option(argv, f"--model.{key}") is None}
    random_init = last_option(argv, "--model.random_init")
    if (yaml.safe_load(random_init) if random_init is not None else from_file.get("random_init")) is True:
        return []
    placeholders = [path_problem(f"--model {model}: {key}", path, "file", model) for key, value in from_file.items()
                    for path in (value if isinstance(value, list) else [value])
                    if isinstance(path, str) and path.startswith(PLACEHOLDER)]
    if placeholders:
        return placeholders
    checkpoint = last_option(argv, "--model.checkpoint") or from_file.get("checkpoint")
    if isinstance(checkpoint, str):
        where = f"--model {model}: checkpoint" if "checkpoint" in from_file else "--model.checkpoint"
        problem = None if checkpoint.startswith(HUB) else path_problem(where, checkpoint, "checkpoint")
        return [problem] if problem else []
    needs = read_sources()[1].get(model) if is_name(model) else None
    if needs is None:
        return []
    if needs.none and not needs.arguments:
        return [f"--model {model}: {needs.none}"]
    wanted = {arg: refs for arg, refs in needs.arguments.items() if last_option(argv, f"--model.{arg}") is None}
    cache = cache_dir()
    missing = cached_arguments(Needs(model, wanted, needs.listed), cache)[1]
    if not missing:
        return []
    return [f"--model {model}: its released files are not in the weights cache {cache} ({len(missing)} missing, e.g. "
            f"{missing[0].relative_to(cache)}): run `{PULL_COMMAND} {model}` (same ${CACHE_ENV}), or give "
            "--model.checkpoint PATH"]


def run_problems(run: Run) -> list[str]:
    """What would stop ``run`` before it computes anything (``data_problems``, ``model_problems``); nothing for a
    command that is not ``xbench_pl test`` or ``fit``."""
    command = run.command
    at = next((i for i, token in enumerate(command[:-1])
               if token == "xbench_pl" and command[i + 1] in TRAINER_COMMANDS), None)
    if at is None:
        return []
    argv = command[at + 2:]
    return data_problems(argv) + model_problems(argv)


def which_runs(ids: list[str], total: int) -> str:
    """The runs of ``ids`` in words: all of them, or their ids (``LISTED_RUNS`` at most)."""
    if len(ids) == total > 1:
        return f"all {total} runs"
    listed = ", ".join(ids[:LISTED_RUNS]) + (f" and {len(ids) - LISTED_RUNS} more" if len(ids) > LISTED_RUNS else "")
    return f"run {listed}" if len(ids) == 1 else f"{len(ids)} runs: {listed}"


def problems_of(runs: list[Run]) -> list[str]:
    """Each problem that would stop runs (``run_problems``) once, with the runs it stops."""
    stopped: dict[str, list[str]] = {}
    for run in runs:
        for problem in run_problems(run):
            stopped.setdefault(problem, []).append(run.run_id)
    return [f"{problem} ({which_runs(ids, len(runs))})" for problem, ids in stopped.items()]


# -- running ------------------------------------------------------------------------------------------------------
def error_line(log: Path) -> str | None:
    """Why a run failed, from its ``log.txt``: its last ``error:`` line (with the lines it was wrapped onto), else
    the last line after the command (a traceback's exception); None for a log with nothing more."""
    try:
        lines = log.read_text(errors="replace").splitlines()[2:]  # the command and a blank line first (execute)
    except OSError:
        return None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error:"):
            continued = []
            for line in lines[i + 1:]:
                if not line.startswith("  "):
                    break
                continued.append(line.strip())
            return " ".join([lines[i], *continued])
    said = [line.strip() for line in lines if line.strip()]
    return said[-1] if said else None


def failures(runs: list[Run]) -> list[str]:
    """The failed runs' reasons (``Run.error``), each once with the runs it ended."""
    failed = [run for run in runs if run.status.startswith("failed")]
    ended: dict[str, list[str]] = {}
    for run in failed:
        ended.setdefault(run.error, []).append(run.run_id)
    count = f"{len(failed)} of {len(runs)} run{'s' if len(runs) > 1 else ''} failed"
    if len(ended) == 1:
        ((reason, ids),) = ended.items()
        return [f"{count}, all with: {reason}" if len(ids) > 1 else f"{count} (run {ids[0]}): {reason}"]
    return [f"{count}:", *(f"  {which_runs(ids, len(runs))}: {reason}" for reason, ids in ended.items())]


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
        if run.status.startswith("failed"):
            run.error = error_line(run.folder / "log.txt") or "no error line in its log"
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
    parser.add_argument("--dry-run", action="store_true",
                        help="print each run's command and check its data folders, model and weights; run nothing")
    parser.add_argument("--count", type=int, default=None, help="runs of a random sweep (default: run_cap); caps a grid")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random draws")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except Exception as error:  # jsonargparse's usage error
        print_error(f"{str(error).splitlines()[0]} (see python -m xbench_pl sweep --help)")
        return 2
    try:
        sweep = read_sweep(args.sweep)
        out = Path(args.out or f"results/sweep_{Path(args.sweep).stem}")
        runs = plan(sweep, out, args.count, args.seed)
    except SweepError as error:
        print_error(str(error))
        return 2
    if args.dry_run:
        for run in runs:
            print(shlex.join(run.command))
        problems = problems_of(runs)
        for problem in problems:
            print_error(problem)
        return 2 if problems else 0
    check_writable({"--out": out})
    metric = (sweep.get("metric") or {}).get("name")
    first_with: dict[str, str] = {}  # a failure's reason -> the first run it ended
    for i, run in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {run.run_id} {json.dumps(run.params, default=str)}", flush=True)
        execute(run, metric)
        line = f"    {run.status}" + (f", {metric} = {run.metric:.4f}" if run.metric is not None else "")
        if run.status.startswith("failed"):
            said = first_with.setdefault(run.error, run.run_id)
            line += f": {run.error if said == run.run_id else f'as run {said}'} (log: {run.folder / 'log.txt'})"
        print(wrap(line), flush=True)
    print()
    print(summarize(runs, sweep, out))
    print(f"wrote {out / 'summary.md'} and {out / 'summary.csv'}")
    if any(r.status.startswith("failed") for r in runs):
        print("\n".join(wrap(line) for line in failures(runs)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
