"""``python -m xbench_pl score --predictions DIR [--data NAME] [--data.ARG V] [--out DIR] [--normalize M] ...``.

Recomputes ``metrics.json`` and ``metrics.md`` from a prediction store (written by ``test
--predictions DIR``) and the dataset's regions alone: no model is built or run, no image is
decoded for the model (setup still reads each image's size, as ``test`` does). The stored native
maps go through the benchmark's own warp to the eval grid and ``BenchmarkMetrics`` (``predictions.replay``),
so from a float32 store the result equals the run that wrote it byte for byte (all but
``provenance``); a float16 store changes the grounding numbers slightly (see docs/store.md).

The dataset is the store's (its manifest's data config) unless ``--data`` names another
config; ``--data.ARG V`` overrides one setting (``--data.root`` where the data moved,
``--data.eval_size`` to judge on another grid, ``--data.split_file`` to score a subset).
``--normalize``, ``--fixed_threshold`` and ``--score_threshold`` re-evaluate with other metric
settings (default: the run's). Every evaluated image must be in the store, and every shard must
read back intact: otherwise the command names what is missing or corrupt and exits 2 (continue
the run with ``test ... --predictions DIR --resume``).

``score --maps DIR --data NAME ...`` scores saliency maps made elsewhere instead (``score --maps DIR --help``), and
``score --boxes FILE --data NAME ...`` boxes predicted elsewhere (``score --boxes FILE --help``).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from jsonargparse import ArgumentParser
from jsonargparse.typing import ClosedUnitInterval, NonNegativeInt

from xbench_pl.commands import print_error
from xbench_pl.commands.arguments import PROG, command_help, datamodule_problems, take_option
from xbench_pl.commands.parsing import PARSER_KWARGS
from xbench_pl.data.errors import DataError
from xbench_pl.options import GridThreshold
from xbench_pl.outputs import check_writable
from xbench_pl.registry import class_path, data_class, read_data_config

# torch, albumentations and the metrics (xbench_pl.run_files, geometry, predictions) load only where a command runs: --help
# and option errors start without them

MAPS_HELP = """``python -m xbench_pl score --maps DIR --data NAME [--data.ARG V] [--out DIR] [--cxl true] ...``.

Scores saliency maps made by anything (Grad-CAM, attention rollout, a new method) with the
benchmark's own metrics: the maps go through the same warp to the eval grid, the same judging
(``judging.Judge``, as ``ZeroShotModel.test_step``) and ``BenchmarkMetrics`` as a ``test`` run (``predictions.replay``),
so ``metrics.json`` / ``metrics.md`` have the same layout. No model is built; images are not
decoded (only their headers, for their size).

``DIR`` holds, in any mix:

* ``DIR/<image_id>/<finding>.npy`` or ``.pt``: one 2-D array (any resolution) per (image, finding);
  ``<image_id>`` is the dataset's image id, ``<finding>`` its finding name or any spelling the
  dataset's vocabulary knows (e.g. CheXlocalize's ``Airspace Opacity`` for ``Lung Opacity``);
* ``DIR/**/<cxr_id>_<task>_map.pkl``: CheXlocalize's Grad-CAM pickles as that project distributes
  them (read without running pickled code, ``external_maps``); their ``prob`` is the score;
* ``DIR/scores.csv`` (optional): ``image_id,finding,score`` rows, scores in [0, 1];
* ``DIR/preprocess.json`` (optional): the ``geometry.Preprocess`` the maps were made on, e.g.
  ``{"resize": "crop", "size": 224}``; each map then spans that model input. Without it a map
  spans the whole original image (the CheXlocalize convention).

Without any score the run is grounding-only: the recognition keys (``auroc``, ``auprc``, ``f1``,
``hamming_acc``, ``ece``) are null. An evaluated image without a map for every finding is left out
and listed in ``problems`` (naming the findings missing); maps matching no evaluated image or
finding are counted there too. A map that cannot be read, is not 2-D or holds NaN/inf is an error
naming its file (exit 2); so is an image whose maps differ in size (score them as separate runs), and a
folder where no image has a map for every finding.
"""

#: the columns of a box file (``external_boxes``)
BOX_LAYOUT = "image_id,finding,x_min,y_min,x_max,y_max[,confidence][,score]"
BOXES_HELP = f"""``python -m xbench_pl score --boxes FILE --data NAME [--data.ARG V] [--out DIR] ...``.

Scores boxes predicted by anything (a detector; a grounded report generator such as MAIRA-2, its
boxes parsed from the text) with the benchmark's own metrics, like ``score --maps``: each (image,
finding) becomes a map, the pixel-wise maximum of the confidences of the boxes covering the pixel
(1 without a confidence column), drawn on the eval grid exactly as the ground-truth boxes are, so the
ground-truth boxes themselves score Pointing Game, dice_best and iou_best 1. No model is built;
images are not decoded (only their headers, for their size).

``FILE`` is ``.csv`` (with a header) or ``.jsonl`` / ``.json`` (JSON lines), one box per row:

    {BOX_LAYOUT}

Corners are the original image's continuous pixel coordinates (pixel i spans [i, i + 1): inclusive
integer corners add 1 to x_max and y_max) and must lie inside the image.
``confidence`` is in [0, 1]; ``score`` (in [0, 1]) is the (image, finding) recognition score, the same
on every row of a pair; a row with empty corners and a score scores a pair without a box.

Recognition: the score column, else each pair's maximum confidence; a pair without a row scores 0.
Without both columns the run is grounding-only (the recognition keys are null). Every evaluated image
is scored: a pair without a box has a constant zero map, which scores as the ``uniform`` baseline
(Pointing Game = the region's area fraction, chance). A malformed row (a missing column, not a number,
x_max <= x_min, a confidence or score outside [0, 1]), an image the dataset does not evaluate, an
unknown finding, a box outside its image or scores of one pair that differ end the command naming the
file and row (exit 2); with ``--data.on_error skip`` the row is left out and listed in ``problems``.
"""

#: ``--help`` of both forms: the options all take
SHARED_HELP = {
    "--data.ARG V": f"one of the dataset's settings (--data.root DIR, --data.eval_size N, ...: {PROG} describe "
                    "--data NAME --help lists them)",
    "--out DIR": "folder for metrics.json and metrics.md (default: results)",
    "--normalize M": "saliency normalisation: minmax, max or none",
    "--fixed_threshold T": "the fixed Dice/IoU threshold, on the grid 0, 0.01, ..., 1",
    "--score_threshold T": "the threshold on scores for F1 and Hamming accuracy, in [0, 1]",
    "--chunk N": "images replayed per metric update at most (default: 64; fewer for large maps)",
    "--device D": "where the maps are warped and judged: cpu (default) or cuda[:N]",
    "--columns all|KEY,...": "the printed table's columns (default: the paper's and n_regions; metrics.md has all)",
}
#: the metric settings a score run can change (``build_parser`` gives their types)
METRIC_OPTIONS = ("normalize", "fixed_threshold", "score_threshold")


def build_parser(dataset_class: type, data_defaults: dict, metric_defaults: dict) -> ArgumentParser:
    from xbench_pl.metrics.functional import NormalizeMode

    kinds = {"normalize": NormalizeMode, "fixed_threshold": GridThreshold, "score_threshold": ClosedUnitInterval}
    parser = ArgumentParser(prog=f"{PROG} score --predictions DIR", description=__doc__.split("\n\n")[1], **PARSER_KWARGS)
    parser.add_class_arguments(dataset_class, "data", skip={"preprocess"})
    parser.set_defaults({f"data.{k}": v for k, v in data_defaults.items() if k != "preprocess"})
    parser.add_argument("--out", default="results", help="folder for metrics.json and metrics.md")
    for name, kind in kinds.items():
        parser.add_argument(f"--{name}", type=Optional[kind], default=metric_defaults.get(name),
                            help=f"metric setting (default: the run's, {metric_defaults.get(name)!r})")
    parser.add_argument("--chunk", type=int, default=64, help="images replayed per metric update at most (fewer for large maps)")
    parser.add_argument("--device", default="cpu", help="where the maps are warped and judged: cpu or cuda[:N]")
    return parser


class UsageProblem(ValueError):
    """A command-line problem with a store or its options (the command prints it and exits 2)."""


def checked_device(name: str):
    """``--device``: a torch device that is there."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise UsageProblem(f"--device: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageProblem("--device: no cuda device on this machine (torch.cuda.is_available() is False); use cpu")
    return device


def open_store(folder: str, rest: list[str]) -> SimpleNamespace:
    """A prediction store and what to score it on: ``store``, its manifest ``stored``, the run's ``config``
    (with the data and metric settings ``rest`` changes), the ``datamodule`` (``--data NAME``/``--data.ARG V``
    in ``rest``, else the store's), the metric settings ``metrics`` and the parsed ``args``."""
    from xbench_pl.judging import stored_judge_settings  # here, not at the top: --help starts without torch
    from xbench_pl.prediction_store import Store

    store = Store(folder)
    stored = store.read_manifest()
    if stored is None:
        raise UsageProblem(no_store(folder))
    config = copy.deepcopy(stored["config"])
    name, rest = take_option(rest, "--data")
    data_config = config.get("data") or {}
    if name is not None:
        dataset_class, defaults = read_data_config(name)
        base = {"class_path": class_path("data", name), "init_args": dict(defaults)}
    elif "init_args" in data_config:
        dataset_class, base = data_class(data_config["class_path"]), data_config
    else:
        raise UsageProblem(f"the store {folder} records no data config (written by the callback outside the CLI): "
                           "give the dataset with --data NAME [--data.ARG V]")
    args = build_parser(dataset_class, base.get("init_args", {}), stored.get("metrics", {})).parse_args(rest)
    chosen = args.data.as_dict()
    changed = name is not None or any(base["init_args"].get(k) != v for k, v in chosen.items())
    if changed:
        config["data"] = {"class_path": base["class_path"], "init_args": {**base.get("init_args", {}), **chosen}}
    chosen_metrics = {k: getattr(args, k) for k in METRIC_OPTIONS}
    init_args = config.get("model", {}).setdefault("init_args", {})
    for key, value in chosen_metrics.items():
        if key in init_args or value != stored.get("metrics", {}).get(key):
            init_args[key] = value
    metrics = {**stored_judge_settings(stored), **chosen_metrics}  # every metric setting of the run, as asked
    return SimpleNamespace(store=store, stored=stored, config=config, datamodule=dataset_class(**chosen), metrics=metrics, args=args)


def no_store(folder: str) -> str | None:
    """The line for a ``--predictions`` folder that is no prediction store: it has no manifest
    (``prediction_store.Store.manifest_path``, looked for here without torch); None for one that has."""
    manifest = Path(folder) / "manifest.json"
    if manifest.is_file():
        return None
    return f"{manifest} not found: {folder} is no prediction store (write one with {PROG} test ... --predictions {folder})"


def take_columns(argv: list[str]) -> tuple[list[str] | str | None, list[str]]:
    """``--columns all|KEY,...`` (the printed table's, ``run_files.parse_columns``) and the rest; UsageProblem if unknown."""
    from xbench_pl.run_files import parse_columns

    text, rest = take_option(argv, "--columns")
    try:
        return parse_columns(text), rest
    except ValueError as error:
        raise UsageProblem(f"--columns: {error}") from None


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--maps" or a.startswith("--maps=") for a in argv):  # maps made elsewhere
        return score_maps(argv)
    if any(a == "--boxes" or a.startswith("--boxes=") for a in argv):  # boxes predicted elsewhere
        return score_boxes(argv)
    folder, rest = take_option(argv, "--predictions")
    if folder is None:
        if any(a in ("-h", "--help") for a in rest):
            print(command_help("score --predictions DIR [--data NAME] [--data.ARG V] [--out DIR] [--normalize M] "
                               "[--fixed_threshold T] [--score_threshold T] [--columns all|KEY,...]", __doc__.split("\n\n", 1)[1], {
                "--predictions DIR": f"the prediction store ({PROG} test --predictions DIR)",
                "--data NAME": "the dataset to score on (default: the store's)", **SHARED_HELP,
                "--maps DIR": f"score saliency maps made elsewhere instead ({PROG} score --maps DIR --help)",
                "--boxes FILE": f"score boxes predicted elsewhere instead ({PROG} score --boxes FILE --help)"}))
            return 0
        print_error(f"--predictions DIR is required (a store written by {PROG} test --predictions DIR)")
        return 2
    if not Path(folder).is_dir():  # before torch loads
        print_error(f"--predictions {folder}: no such folder (a store written by {PROG} test --predictions DIR)")
        return 2
    if problem := no_store(folder):
        print_error(str(problem))
        return 2
    from xbench_pl.prediction_store import StoreError, model_name
    from xbench_pl.predictions import rescore
    from xbench_pl.run_files import publish_scores

    try:
        columns, rest = take_columns(rest)
        run = open_store(folder, rest)
        device = checked_device(run.args.device)
    except (UsageProblem, DataError) as error:  # DataError: the datamodule's arguments
        print_error(str(error))
        return 2
    check_writable({"--out": run.args.out})
    try:
        results = rescore(run.store, run.datamodule, run.metrics, run.args.chunk, device)
    except (DataError, StoreError) as error:
        print_error(str(error))
        return 2
    out = publish_scores(run.args.out, started, str(Path(folder)),
                         model=model_name(run.stored),
                         results=results, problems=datamodule_problems(run.datamodule), config=run.config,
                         random_weights=bool(run.stored.get("random_weights")), explainer=run.stored.get("explainer"),
                         columns=columns)
    print(f"\nwrote {out / 'metrics.json'} and {out / 'metrics.md'} (from the prediction store {folder})")
    return 0


def external_run(flag: str, what: str, argv: list[str], usage: str, text: str, options: dict[str, str],
                 cxl: bool = True) -> SimpleNamespace | int:
    """What ``score --maps`` and ``score --boxes`` share before reading their input: ``source`` (``flag``'s
    value, ``what`` the help calls it), the table ``columns``, the ``dataset_class`` (``--data NAME``) and
    its ``chosen`` settings, the ``metrics`` settings and the parsed ``args``; or the exit code (0 after
    ``--help``, 2 on a usage error)."""
    source, rest = take_option(list(argv), flag)
    name, rest = take_option(rest, "--data")
    if any(a in ("-h", "--help") for a in rest):
        print(command_help(usage, text, options))
        return 0
    if source is None:
        print_error(f"{flag} needs a value: score {flag} {what} --data NAME")
        return 2
    if name is None:
        print_error(f"score {flag} {what} needs --data NAME (the dataset they are of)")
        return 2
    try:
        columns, rest = take_columns(rest)
        dataset_class, defaults = read_data_config(name)
    except UsageProblem as error:
        print_error(str(error))
        return 2
    except (KeyError, ValueError, FileNotFoundError) as error:
        print_error(f"--data {name}: {error}")
        return 2
    parser = build_parser(dataset_class, defaults, {"normalize": "minmax", "fixed_threshold": 0.5, "score_threshold": 0.5})
    if cxl:
        parser.add_argument("--cxl", type=bool, default=False, help="also CheXlocalize's hit rate and mIoU at full resolution")
    parser.add_argument("--bootstrap", type=NonNegativeInt, default=1000, help="bootstrap resamples for ci (0 = off)")
    args = parser.parse_args(rest)
    check_writable({"--out": args.out})
    settings = {"cxl": args.cxl} if cxl else {}
    return SimpleNamespace(source=Path(source), columns=columns, dataset_class=dataset_class,
                           data_class_path=class_path("data", name), chosen=args.data.as_dict(),
                           metrics={k: getattr(args, k) for k in METRIC_OPTIONS}, settings={**settings, "bootstrap": args.bootstrap},
                           args=args)


def external_replayer(run: SimpleNamespace, states_boxes: bool = False):
    """The datamodule of ``run`` (``external_run``) and a ``Replayer`` holding its metrics, as asked (``states_boxes``:
    with the stated-box metrics)."""
    from xbench_pl.predictions import metrics_replayer

    datamodule = run.dataset_class(**run.chosen)
    return datamodule, metrics_replayer(datamodule, states_boxes=states_boxes, **run.metrics, **run.settings)


def publish_external(run: SimpleNamespace, started: float, key: str, datamodule, replayer, scored: dict[str, bool],
                     **model_config) -> Path:
    """Compute and publish the tables of ``run`` (grounding-only where a dataset had no scores, ``scored``);
    ``key`` names the input in the config (``maps``, ``boxes``), ``model_config`` adds to its model entry."""
    from xbench_pl.external_maps import grounding_only
    from xbench_pl.predictions import compute_tables
    from xbench_pl.run_files import publish_scores

    results = compute_tables(replayer)
    for name, all_scored in scored.items():
        if not all_scored:
            grounding_only(results[name])
    config = {key: str(run.source), "data": {"class_path": run.data_class_path, "init_args": run.chosen},
              "model": {"init_args": {**run.metrics, **run.settings}, **model_config,
                        "scores": "given" if all(scored.values()) else "none or incomplete: grounding only"}}
    return publish_scores(run.args.out, started, str(run.source), model=f"{key}:{run.source.name}", results=results,
                          problems=datamodule_problems(datamodule), config=config, columns=run.columns)


def score_maps(argv: list[str]) -> int:
    """``score --maps DIR``: maps made elsewhere (``MAPS_HELP``)."""
    started = time.time()
    run = external_run("--maps", "DIR", argv, "score --maps DIR --data NAME [--data.ARG V] [--out DIR] [--cxl true] [--bootstrap N] "
                       "[--normalize M] [--fixed_threshold T] [--score_threshold T] [--columns all|KEY,...]", MAPS_HELP.split("\n\n", 1)[1], {
                           "--maps DIR": "the folder of maps (and optional scores.csv, preprocess.json)",
                           "--data NAME": "the dataset the maps are of", **SHARED_HELP,
                           "--cxl true": "also CheXlocalize's hit rate and mIoU at full resolution",
                           "--bootstrap N": "bootstrap resamples for ci (0 = off; default: 1000)"})
    if isinstance(run, int):
        return run
    folder = run.source
    if not folder.is_dir():
        print_error(f"--maps {folder}: not a folder")
        return 2
    from xbench_pl.external_maps import index_maps, read_scores, score_dataset
    from xbench_pl.geometry import Preprocess

    try:
        preprocess, preprocess_config = None, None
        if (folder / "preprocess.json").is_file():
            try:
                preprocess_config = json.loads((folder / "preprocess.json").read_text())
                preprocess = Preprocess(**preprocess_config)
            except (ValueError, TypeError) as error:
                raise DataError(folder / "preprocess.json", f"not a Preprocess ({error})") from None
        scores = read_scores(folder / "scores.csv") if (folder / "scores.csv").is_file() else {}
        files = index_maps(folder)
        datamodule, replayer = external_replayer(run)
        scored = {}
        for child in datamodule.datamodules:
            scored[child.name] = score_dataset(child, folder, files, scores, preprocess, replayer, run.args.chunk)
    except (DataError, ValueError) as error:
        print_error(str(error))
        return 2
    out = publish_external(run, started, "maps", datamodule, replayer, {n: s for n, (_, s) in scored.items()},
                           preprocess=preprocess_config)
    print(f"\nwrote {out / 'metrics.json'} and {out / 'metrics.md'} (from the maps in {folder}; "
          f"{', '.join(f'{n}: {k} image(s)' for n, (k, _) in scored.items())})")
    return 0


def score_boxes(argv: list[str]) -> int:
    """``score --boxes FILE``: boxes predicted elsewhere (``BOXES_HELP``)."""
    started = time.time()
    run = external_run("--boxes", "FILE", argv, "score --boxes FILE --data NAME [--data.ARG V] [--out DIR] [--bootstrap N] "
                       "[--normalize M] [--fixed_threshold T] [--score_threshold T] [--columns all|KEY,...]", BOXES_HELP.split("\n\n", 1)[1], {
                           "--boxes FILE": f"the boxes: .csv or .jsonl with {BOX_LAYOUT}",
                           "--data NAME": "the dataset the boxes are of", **SHARED_HELP,
                           "--bootstrap N": "bootstrap resamples for ci (0 = off; default: 1000)"}, cxl=False)
    if isinstance(run, int):
        return run
    if not run.source.is_file():
        print_error(f"--boxes {run.source}: no such file")
        return 2
    from xbench_pl.external_boxes import score_box_file

    try:
        datamodule, replayer = external_replayer(run, states_boxes=True)
        scored = score_box_file(run.source, datamodule, replayer, run.args.chunk)
    except (DataError, ValueError) as error:
        print_error(str(error))
        return 2
    out = publish_external(run, started, "boxes", datamodule, replayer, {n: s for n, (_, _, s) in scored.items()})
    print(f"\nwrote {out / 'metrics.json'} and {out / 'metrics.md'} (from the boxes in {run.source}; "
          f"{', '.join(f'{n}: {k} image(s), {b} with a box' for n, (k, b, _) in scored.items())})")
    return 0
