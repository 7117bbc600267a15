"""Saliency maps made elsewhere (Grad-CAM, attention rollout, ...), read without running their code.

CheXlocalize distributes one pickle per (image, task), ``{cxr_id}_{task}_map.pkl`` (e.g.
``patient64541_study1_view1_frontal_Cardiomegaly_map.pkl``), holding a dict with ``map`` (a float
tensor ``[1, 1, h, w]`` spanning the whole image), ``prob`` (the model's probability), ``task``,
``gt``, ``cxr_img`` (the model input) and ``cxr_dims`` (the original ``(W, H)``), pickled with
``torch`` tensors inside. ``read_chexlocalize_pickle`` reads them with an unpickler that admits only
what such a file needs (tensor rebuilding, ``torch.load(weights_only=True)`` of the storages,
``OrderedDict``, latin-1 ``bytes`` of protocol-2 pickles): a pickle asking for anything else is refused, naming the global.
"""

from __future__ import annotations

import collections
import csv
import io
import pickle
from pathlib import Path

import numpy as np
import torch

from xbench_pl.console import QUIET_SECONDS, ProgressLines
from xbench_pl.data.base import XBenchData, XBenchDataset
from xbench_pl.data.errors import DataError, Problem
from xbench_pl.data.vocabulary import canonical
from xbench_pl.geometry import Preprocess
from xbench_pl.metrics.recognition import RECOGNITION_KEYS
from xbench_pl.predictions import Replayer, images_per_update, replay


#: CheXpert's 14 labels in its CSV order: a pickle whose ``prob`` holds all 14 is indexed by its task.
CHEXPERT_TASKS = ("No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity", "Edema",
                  "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Pleural Other",
                  "Fracture", "Support Devices")


def _load_storage(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """What protocol-2 pickles use for ``bytes`` (``_codecs.encode(text, "latin1")``); nothing else."""
    if encoding != "latin1":
        raise pickle.UnpicklingError(f"refused _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


_ALLOWED = {
    ("_codecs", "encode"): _latin1,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch.storage", "_load_from_bytes"): _load_storage,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _MapUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused global {module}.{name} (a CheXlocalize map pickle needs only "
                                         "tensors, storages and OrderedDict)") from None


def parse_chexlocalize_name(path: str | Path) -> tuple[str, str]:
    """``(cxr_id, task)`` of a ``{cxr_id}_{task}_map.pkl`` file name (task names contain no ``_``)."""
    parts = Path(path).name.split("_")
    if len(parts) < 3 or parts[-1] != "map.pkl":
        raise ValueError(f"{Path(path).name}: not a CheXlocalize map name ({{cxr_id}}_{{task}}_map.pkl)")
    return "_".join(parts[:-2]), parts[-2]


def read_chexlocalize_pickle(path: str | Path) -> dict:
    """``{"map": [h, w] float32, "prob": float | None, "task": str, "size": (H, W) | None}`` of one
    CheXlocalize ``*_map.pkl``; ``DataError`` naming the file when it cannot be read or holds no map."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            info = _MapUnpickler(handle).load()
    except (OSError, pickle.UnpicklingError, EOFError, RuntimeError, ValueError) as error:
        raise DataError(path, f"cannot read the map pickle ({error})") from None
    if not isinstance(info, dict) or not torch.is_tensor(info.get("map")):
        raise DataError(path, "expected a dict with a tensor 'map' (CheXlocalize's *_map.pkl layout)")
    saliency = info["map"].detach().float()
    while saliency.dim() > 2 and saliency.shape[0] == 1:
        saliency = saliency[0]
    if saliency.dim() != 2:
        raise DataError(path, f"'map' has shape {tuple(info['map'].shape)}; expected [1, 1, h, w] or [h, w]")
    prob = info.get("prob")
    if torch.is_tensor(prob):
        flat = prob.flatten()
        if flat.numel() == len(CHEXPERT_TASKS) and info.get("task") in CHEXPERT_TASKS:
            prob = float(flat[CHEXPERT_TASKS.index(info["task"])])  # all 14 CheXpert probabilities: the task's
        else:
            prob = float(flat[0]) if flat.numel() == 1 else None
    dims = info.get("cxr_dims")
    size = (int(dims[1]), int(dims[0])) if isinstance(dims, (tuple, list)) and len(dims) == 2 else None
    return {"map": saliency, "prob": None if prob is None else float(prob), "task": info.get("task"), "size": size}


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


def score_dataset(child: XBenchData, maps: Path, files: list[tuple[str, str, Path]], scores: dict,
                  preprocess: Preprocess | None, replayer: Replayer, chunk: int) -> tuple[int, bool]:
    """Feed one dataset's maps (``files``, found in the folder ``maps``) into ``replayer``: returns (images scored,
    whether every pair had a score)."""
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
        why = f"no image of {child.name} has a map for every finding (first: {child.problems[0]})" if files else "no map file"
        raise DataError(maps, f"{why}; the layout: score --maps DIR --help")
    dataset = XBenchDataset(child.name, kept, classes, None, child.eval_size)
    all_scored = True
    progress = ProgressLines(f"{child.name} maps", len(kept), "images", after=QUIET_SECONDS)
    held: list = []  # images read (of one map size), until one metric update's worth

    def flush() -> None:
        nonlocal all_scored
        shape = tuple(held[0][2].shape[1:])
        if preprocess is None:  # the map spans the whole original image: call that an input of max(h, w) squared
            size = max(shape)
            affine = [[size / W, size / H, 0.0, 0.0] for _, (H, W), _, _ in held]
        else:
            size = preprocess.size
            affine = [list(preprocess.plan(H, W)[1]) for _, (H, W), _, _ in held]
        all_scored &= replay_items(replayer, dataset, held, size, affine, chunk)
        progress.step(len(held))
        held.clear()

    for record in kept:
        height, width = child.image_sizes[record.image_id]
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
        if held and held[0][2].shape != (len(classes), *maps[0].shape):
            flush()
        held.append((record.image_id, (height, width), torch.stack(maps), row))
        if len(held) == images_per_update(chunk, len(classes), *maps[0].shape):
            flush()
    if held:
        flush()
    return len(kept), all_scored


def replay_items(replayer: Replayer, dataset: XBenchDataset, items: list, size: int, affine: list, chunk: int,
                 stated=None) -> bool:
    """Feed ``items``, ``(image_id, (H, W), maps [C, h, w], scores [C] with NaN for none)`` per image, each map
    spanning a ``size`` square input placed by its ``affine`` ``(sx, sy, tx, ty)``, into ``replayer`` as one shard
    (``predictions.replay``; ``stated``: the images' ``judging.StatedBoxes``, in that input's pixels); returns whether
    every pair had a score (a missing one is fed as 0.5)."""
    score_rows = torch.tensor([row for *_, row in items], dtype=torch.float64)  # scores.csv text and pickled floats: exact
    shard = {"classes": list(dataset.classes), "image_ids": [i for i, *_ in items], "input_size": size,
             "original_size": torch.tensor([s for _, s, _, _ in items]),
             "affine": torch.tensor(affine, dtype=torch.float64),
             "scores": torch.nan_to_num(score_rows, nan=0.5), "saliency": torch.stack([m for *_, m, _ in items])}
    if stated is not None:
        shard["stated"] = stated
    replay(replayer, dataset, shard, chunk=chunk)
    return not bool(torch.isnan(score_rows).any())


def grounding_only(table: dict) -> dict:
    """Null the recognition keys of a table made without scores (their bootstrap intervals too)."""
    ci = table.get("ci") or {"classes": {}, "mean": {}}
    for row in [*table["classes"].values(), table["mean"], *ci["classes"].values(), ci["mean"]]:
        row.update({k: None for k in RECOGNITION_KEYS if k in row})
    return table
