"""``python -m xbench_pl score --predictions DIR [--data NAME] [--data.ARG V] [--out DIR] [--normalize M] ...``.

Recomputes ``metrics.json`` and ``metrics.md`` from a prediction store (written by ``test
--predictions DIR``) and the dataset's regions alone: no model is built or run, no image is
decoded for the model (setup still reads each image's size, as ``test`` does). The stored native
maps go through the benchmark's own warp to the eval grid and ``BenchmarkMetrics`` (``predictions.replay``),
so from a float32 store the result equals the run that wrote it byte for byte (all but
``provenance``); a float16 store changes the grounding numbers slightly (see the README).

The dataset is the store's (its manifest's data config) unless ``--data`` names another
config; ``--data.ARG V`` overrides one setting (``--data.root`` where the data moved,
``--data.eval_size`` to judge on another grid, ``--data.split_file`` to score a subset).
``--normalize``, ``--fixed_threshold`` and ``--score_threshold`` re-evaluate with other metric
settings (default: the run's). Every evaluated image must be in the store, and every shard must
read back intact: otherwise the command names what is missing or corrupt and exits 1 (continue
the run with ``test ... --predictions DIR --resume``).

``score --maps DIR --data NAME ...`` scores saliency maps made elsewhere instead (``score_maps.py``).
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch
from jsonargparse import ArgumentParser

from xbench_pl.arguments import PROG, datamodule_problems, take_option
from xbench_pl.data.base import XBenchDataModule, XBenchDataset
from xbench_pl.data.io import DataError
from xbench_pl.predictions import Replayer, Store, StoreError, replay
from xbench_pl.registry import read_config, resolve_class
from xbench_pl.report import build_report, provenance, publish_report

METRIC_OPTIONS = {"normalize": str, "fixed_threshold": float, "score_threshold": float}


def build_parser(datamodule_class: type, data_defaults: dict, metric_defaults: dict) -> ArgumentParser:
    parser = ArgumentParser(prog=f"{PROG} score --predictions DIR", description=__doc__.split("\n\n")[1], exit_on_error=False)
    parser.add_class_arguments(datamodule_class, "data", skip={"preprocess"})
    parser.set_defaults({f"data.{k}": v for k, v in data_defaults.items() if k != "preprocess"})
    parser.add_argument("--out", default="results", help="folder for metrics.json and metrics.md")
    for name, kind in METRIC_OPTIONS.items():
        parser.add_argument(f"--{name}", type=Optional[kind], default=metric_defaults.get(name),
                            help=f"metric setting (default: the run's, {metric_defaults.get(name)!r})")
    parser.add_argument("--chunk", type=int, default=64, help="images replayed per metric update")
    return parser


def score_host() -> SimpleNamespace:
    """What ``report.provenance`` reads of a trainer, for a run without one (one CPU process)."""
    from lightning.pytorch.accelerators import CPUAccelerator

    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")), accelerator=CPUAccelerator(),
                           world_size=1, num_nodes=1)


def metrics_replayer(datamodule: XBenchDataModule, **settings) -> Replayer:
    """A ``Replayer`` (``ZeroShotModel`` metric ``settings``) holding the metrics of every dataset of
    ``datamodule``, created in the order a test run creates them."""
    replayer = Replayer(**settings)
    for spec in datamodule.dataset_specs:
        replayer.add_dataset(spec.name, spec.classes)
    return replayer


def compute_tables(replayer: Replayer) -> dict[str, dict]:
    """Every dataset's table: ``{dataset: BenchmarkMetrics.compute()}``."""
    with torch.inference_mode():
        return {name: table.compute() for name, table in replayer.benchmark.items()}


def publish_scores(out: str, started: float, scored_from: str, **report) -> Path:
    """Write and print the report (``report.build_report`` arguments) of a run scored without a model:
    one CPU process, ``scored_from`` the store or maps folder."""
    report = build_report(**report, provenance={**provenance(score_host(), started), "scored_from": scored_from})
    return publish_report(report, out)


def replay_store(store: Store, datamodule: XBenchDataModule, metrics: dict, chunk: int = 64) -> Replayer:
    """A ``Replayer`` whose ``benchmark`` holds every dataset's metrics fed from the store; ``metrics``:
    ``ZeroShotModel``'s arguments (``predictions.metric_settings``) to evaluate with."""
    good, bad = store.load()
    if bad:
        raise StoreError(f"{len(bad)} shard(s) of {store} do not read back ({bad[0]}"
                         f"{'; ...' if len(bad) > 1 else ''}): continue the run with test ... --predictions {store} --resume, "
                         "which redoes their images")
    replayer = metrics_replayer(datamodule, **metrics)
    for child in datamodule.datamodules:
        dataset = XBenchDataset(child.name, child.prepare_records(), child.classes, None, child.eval_size)
        seen: set[str] = set()
        for shard in good:
            if shard["dataset"] == child.name:
                seen.update(replay(replayer, dataset, shard, skip=seen, chunk=chunk))
        missing = [r.image_id for r in dataset.records if r.image_id not in seen]
        if missing:
            raise StoreError(f"{store} lacks {len(missing)} of the {len(dataset)} image(s) of {child.name} (first: "
                             f"{missing[0]!r}): its run did not finish; continue it with test ... --predictions {store} --resume")
    return replayer


def rescore(store: Store, datamodule: XBenchDataModule, metrics: dict, chunk: int = 64) -> dict[str, dict]:
    """Every dataset's table from the store: ``{dataset: BenchmarkMetrics.compute()}`` (``replay_store``)."""
    return compute_tables(replay_store(store, datamodule, metrics, chunk))


def model_name(stored: dict) -> str:
    """A store's model as its manifest names it (the model's class path where it has no name)."""
    return stored.get("model_name") or stored.get("config", {}).get("model", {}).get("class_path", "model")


class UsageProblem(ValueError):
    """A command-line problem with a store or its options (the command prints it and exits 2)."""


def open_store(folder: str, rest: list[str]) -> SimpleNamespace:
    """A prediction store and what to score it on: ``store``, its manifest ``stored``, the run's ``config``
    (with the data and metric settings ``rest`` changes), the ``datamodule`` (``--data NAME``/``--data.ARG V``
    in ``rest``, else the store's), the metric settings ``metrics`` and the parsed ``args``."""
    store = Store(folder)
    stored = store.read_manifest()
    if stored is None:
        raise UsageProblem(f"{store.manifest_path} not found: {folder} is no prediction store "
                           f"(write one with {PROG} test ... --predictions {folder})")
    config = copy.deepcopy(stored["config"])
    name, rest = take_option(rest, "--data")
    data_config = config.get("data") or {}
    if name is not None:
        datamodule_class, defaults = read_config("data", name)
        base = {"class_path": f"{datamodule_class.__module__}.{datamodule_class.__qualname__}", "init_args": dict(defaults)}
    elif "init_args" in data_config:
        datamodule_class, base = resolve_class(data_config["class_path"]), data_config
    else:
        raise UsageProblem(f"the store {folder} records no data config (written by the callback outside the CLI): "
                           "give the dataset with --data NAME [--data.ARG V]")
    args = build_parser(datamodule_class, base.get("init_args", {}), stored.get("metrics", {})).parse_args(rest)
    chosen = args.data.as_dict()
    changed = name is not None or any(base["init_args"].get(k) != v for k, v in chosen.items())
    if changed:
        config["data"] = {"class_path": base["class_path"], "init_args": {**base.get("init_args", {}), **chosen}}
    chosen_metrics = {k: getattr(args, k) for k in METRIC_OPTIONS}
    init_args = config.get("model", {}).setdefault("init_args", {})
    for key, value in chosen_metrics.items():
        if key in init_args or value != stored.get("metrics", {}).get(key):
            init_args[key] = value
    metrics = {**stored.get("metrics", {}), **chosen_metrics}  # every metric setting of the run, as asked
    return SimpleNamespace(store=store, stored=stored, config=config, datamodule=datamodule_class(**chosen), metrics=metrics, args=args)


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--maps" or a.startswith("--maps=") for a in argv):  # maps made elsewhere: score_maps.py
        from xbench_pl.score_maps import main as score_maps

        return score_maps(argv)
    folder, rest = take_option(argv, "--predictions")
    if folder is None:
        if any(a in ("-h", "--help") for a in rest):
            print(f"usage: {PROG} score --predictions DIR [--data NAME] [--data.ARG V] [--out DIR] [--normalize M] "
                  f"[--fixed_threshold T] [--score_threshold T]\n\n{__doc__.split(chr(10) + chr(10), 1)[1]}")
            return 0
        print(f"error: --predictions DIR is required (a store written by {PROG} test --predictions DIR)", file=sys.stderr)
        return 2
    try:
        run = open_store(folder, rest)
    except UsageProblem as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except DataError as error:  # the datamodule's arguments
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        results = rescore(run.store, run.datamodule, run.metrics, run.args.chunk)
    except (DataError, StoreError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    out = publish_scores(run.args.out, started, str(Path(folder)),
                         model=model_name(run.stored),
                         results=results, problems=datamodule_problems(run.datamodule), config=run.config,
                         random_weights=bool(run.stored.get("random_weights")))
    print(f"\nwrote {out / 'metrics.json'} and {out / 'metrics.md'} (from the prediction store {folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
