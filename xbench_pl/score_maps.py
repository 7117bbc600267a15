"""``python -m xbench_pl score --maps DIR --data NAME [--data.ARG V] [--out DIR] [--cxl true] ...``.

Scores saliency maps made by anything (Grad-CAM, attention rollout, a new method) with the
benchmark's own metrics: the maps go through the same warp to the eval grid, the same
``ZeroShotModel.test_step`` and ``BenchmarkMetrics`` as a ``test`` run (``predictions.replay``),
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
naming its file (exit 1); so is an image whose maps differ in size (score them as separate runs).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from xbench_pl.arguments import PROG, datamodule_problems, take_option
from xbench_pl.data.base import XBenchDataModule, XBenchDataset
from xbench_pl.data.io import DataError, Problem, read_image_size
from xbench_pl.data.vocabulary import canonical
from xbench_pl.external_maps import parse_chexlocalize_name, read_chexlocalize_pickle
from xbench_pl.geometry import Preprocess
from xbench_pl.metrics.recognition import RECOGNITION_KEYS
from xbench_pl.predictions import Replayer, replay
from xbench_pl.registry import read_config


def finding_name(name: str, dataset: str, classes: list[str]) -> str | None:
    """The dataset's finding for a file's spelling of it, None if it is none of ``classes``."""
    if name in classes:
        return name
    try:
        found = canonical(name, dataset)
    except KeyError:
        return None
    return found if found in classes else None


def index_maps(folder: Path) -> list[tuple[str, str, Path]]:
    """Every map file of ``folder`` as ``(image_id, finding as spelled, path)``."""
    out = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        if path.name.endswith("_map.pkl"):
            image_id, task = parse_chexlocalize_name(path)
            out.append((image_id, task, path))
        elif path.suffix in (".npy", ".pt") and path.parent != folder:
            out.append((path.parent.relative_to(folder).as_posix(), path.stem, path))
    return out


def read_map(path: Path) -> tuple[torch.Tensor, float | None, tuple[int, int] | None]:
    """``(map [h, w] float32, score or None, original (H, W) the file states or None)``."""
    if path.suffix == ".pkl":
        info = read_chexlocalize_pickle(path)
        saliency, score, size = info["map"], info["prob"], info["size"]
    else:
        try:
            array = np.load(path, allow_pickle=False) if path.suffix == ".npy" else torch.load(path, weights_only=True, map_location="cpu")
        except Exception as error:  # noqa: BLE001 - any unreadable file is the user's input error
            raise DataError(path, f"cannot read the map ({error})") from None
        saliency, score, size = torch.as_tensor(np.asarray(array) if not torch.is_tensor(array) else array), None, None
        saliency = saliency.squeeze() if saliency.dim() > 2 else saliency
    if saliency.dim() != 2 or min(saliency.shape) < 1:
        raise DataError(path, f"expected one 2-D map, got shape {tuple(saliency.shape)}")
    saliency = saliency.float()
    if not torch.isfinite(saliency).all():
        raise DataError(path, "the map contains NaN or inf")
    return saliency, score, size


def read_scores(path: Path) -> dict[tuple[str, str], float]:
    scores = {}
    with open(path, newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), 2):
            try:
                value = float(row["score"])
                scores[(row["image_id"], row["finding"])] = value
            except (KeyError, TypeError, ValueError):
                raise DataError(path, "expected columns image_id,finding,score with a number", row=line) from None
            if not 0 <= value <= 1:
                raise DataError(path, f"score {value} is not in [0, 1]", row=line)
    return scores


def score_dataset(child: XBenchDataModule, files: list[tuple[str, str, Path]], scores: dict, preprocess: Preprocess | None,
                  replayer: Replayer, chunk: int) -> tuple[int, bool]:
    """Feed one dataset's maps into ``replayer``: returns (images scored, whether every pair had a score)."""
    classes = list(child.classes)
    records = child.prepare_records()
    wanted = {r.image_id for r in records}
    found: dict[str, dict[str, tuple[Path, str]]] = {}
    unmatched = []
    for image_id, spelled, path in files:
        finding = finding_name(spelled, child.name, classes)
        if image_id not in wanted or finding is None:
            unmatched.append(path)
            continue
        if finding in found.setdefault(image_id, {}):
            raise DataError(path, f"a second map for {image_id} / {finding} (first: {found[image_id][finding][0]})")
        found[image_id][finding] = (path, spelled)
    if unmatched:
        child.problems.append(Problem(str(unmatched[0].parent), None, f"{len(unmatched)} map file(s) match no evaluated image "
                                      f"and finding of {child.name} (first: {unmatched[0].name}); not scored"))
    kept = []
    for record in records:
        have = found.get(record.image_id, {})
        missing = [c for c in classes if c not in have]
        if missing:
            child.problems.append(Problem(record.image_id, None, f"no map for {', '.join(missing)}"
                                          + ("" if have else " (no map at all)") + "; image not scored"))
            continue
        kept.append(record)
    if not kept:
        raise DataError(child.root or child.name, f"{child.name}: no image has a map for every finding "
                        f"({len(child.problems)} problem(s))")
    dataset = XBenchDataset(child.name, kept, classes, None, child.eval_size)
    all_scored = True
    for start in range(0, len(kept), chunk):
        part = kept[start:start + chunk]
        groups: dict[tuple[int, int], list] = {}
        for record in part:
            height, width = read_image_size(record.path)
            maps, row = [], []
            for finding in classes:
                path, spelled = found[record.image_id][finding]
                saliency, score, size = read_map(path)
                if size is not None and size != (height, width):
                    raise DataError(path, f"the map's file says the image is {size[0]}x{size[1]} (H x W); "
                                    f"{record.path} is {height}x{width}")
                if score is None:
                    score = scores.get((record.image_id, finding), scores.get((record.image_id, spelled)))
                maps.append(saliency)
                row.append(float("nan") if score is None else float(score))
            if len({m.shape for m in maps}) != 1:
                raise DataError(found[record.image_id][classes[0]][0].parent, f"{record.image_id}: its maps differ in size "
                                f"({sorted({tuple(m.shape) for m in maps})}); score maps of one size per run")
            groups.setdefault(tuple(maps[0].shape), []).append((record.image_id, (height, width), torch.stack(maps), row))
        for (h, w), items in groups.items():
            if preprocess is None:  # the map spans the whole original image: call that an input of max(h, w) squared
                size = max(h, w)
                affine = [[size / W, size / H, 0.0, 0.0] for _, (H, W), _, _ in items]
            else:
                size = preprocess.size
                affine = [list(preprocess.plan(H, W)[1]) for _, (H, W), _, _ in items]
            score_rows = torch.tensor([row for *_, row in items], dtype=torch.float32)
            all_scored &= not bool(torch.isnan(score_rows).any())
            shard = {"classes": classes, "image_ids": [i for i, *_ in items], "input_size": size,
                     "original_size": torch.tensor([s for _, s, _, _ in items]),
                     "affine": torch.tensor(affine, dtype=torch.float64),
                     "scores": torch.nan_to_num(score_rows, nan=0.5), "saliency": torch.stack([m for *_, m, _ in items])}
            replay(replayer, dataset, shard, chunk=chunk)
    return len(kept), all_scored


def grounding_only(table: dict) -> dict:
    """Null the recognition keys of a table made without scores (their bootstrap intervals too)."""
    ci = table.get("ci") or {"classes": {}, "mean": {}}
    for row in [*table["classes"].values(), table["mean"], *ci["classes"].values(), ci["mean"]]:
        row.update({k: None for k in RECOGNITION_KEYS if k in row})
    return table


def main(argv: list[str]) -> int:
    from xbench_pl.score import METRIC_OPTIONS, build_parser, compute_tables, metrics_replayer, publish_scores

    started = time.time()
    folder, rest = take_option(list(argv), "--maps")
    name, rest = take_option(rest, "--data")
    if any(a in ("-h", "--help") for a in rest):
        print(f"usage: {PROG} score --maps DIR --data NAME [--data.ARG V] [--out DIR] [--cxl true] [--bootstrap N] "
              f"[--normalize M] [--fixed_threshold T] [--score_threshold T]\n\n{__doc__.split(chr(10) + chr(10), 1)[1]}")
        return 0
    if folder is None or name is None:
        print(f"error: score --maps DIR needs --data NAME (the dataset the maps are of)", file=sys.stderr)
        return 2
    folder = Path(folder)
    if not folder.is_dir():
        print(f"error: --maps {folder}: not a folder", file=sys.stderr)
        return 2
    try:
        datamodule_class, defaults = read_config("data", name)
    except (KeyError, ValueError, FileNotFoundError) as error:
        print(f"error: --data {name}: {error}", file=sys.stderr)
        return 2
    parser = build_parser(datamodule_class, defaults, {"normalize": "minmax", "fixed_threshold": 0.5, "score_threshold": 0.5})
    parser.add_argument("--cxl", type=bool, default=False, help="also CheXlocalize's hit rate and mIoU at full resolution")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for ci (0 = off)")
    args = parser.parse_args(rest)
    chosen = args.data.as_dict()
    metrics = {k: getattr(args, k) for k in METRIC_OPTIONS}
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
        datamodule = datamodule_class(**chosen)
        replayer = metrics_replayer(datamodule, **metrics, cxl=args.cxl, bootstrap=args.bootstrap)
        scored = {}
        for child in datamodule.datamodules:
            scored[child.name] = score_dataset(child, files, scores, preprocess, replayer, args.chunk)
    except (DataError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    results = compute_tables(replayer)
    for n, (_, all_scored) in scored.items():
        if not all_scored:
            grounding_only(results[n])
    config = {"maps": str(folder), "data": {"class_path": f"{datamodule_class.__module__}.{datamodule_class.__qualname__}",
                                            "init_args": chosen},
              "model": {"init_args": {**metrics, "cxl": args.cxl, "bootstrap": args.bootstrap},
                        "preprocess": preprocess_config,
                        "scores": "given" if all(s for _, s in scored.values()) else "none or incomplete: grounding only"}}
    out = publish_scores(args.out, started, str(folder), model=f"maps:{folder.name}", results=results,
                         problems=datamodule_problems(datamodule), config=config)
    print(f"\nwrote {out / 'metrics.json'} and {out / 'metrics.md'} (from the maps in {folder}; "
          f"{', '.join(f'{n}: {k} image(s)' for n, (k, _) in scored.items())})")
    return 0
