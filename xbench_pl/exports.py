"""A prediction store in other tools' formats (``python -m xbench_pl export``).

``npy``: what ``score --maps`` reads, so that ``export`` then ``score --maps`` gives the numbers of
``score --predictions`` exactly:

* ``OUT/<image_id>/<finding>.npy``: the stored native map, as stored (float16 or float32; a bfloat16
  store's as float32, which holds it exactly);
* ``OUT/scores.csv``: ``image_id,finding,score``, each float64 score written to round-trip exactly;
* ``OUT/preprocess.json``: the ``geometry.Preprocess`` (``resize``, ``size``, ``canvas``) that gives
  every stored image's affine exactly (``infer_preprocess``): the maps span that model input. For
  ``letterbox_resize`` (CheXzero) the affine does not fix the canvas: the smallest that gives every affine.

``cheXlocalize``: CheXlocalize's layout, ``OUT/{cxr_id}_{task}_map.pkl`` per (image, finding), ``task`` the
dataset's own name of the finding (``vocabulary.native_name``: CheXlocalize's ``Airspace Opacity``, not
``Lung Opacity``, or their ``eval.py`` stops with a ``KeyError``), a plain dict as theirs: ``map`` (float32
tensor ``[1, 1, h, w]`` spanning the whole original image, which their ``eval.py`` resizes to ``cxr_dims``),
``prob`` (the score, a float), ``task``, ``gt`` (the run's label, an int) and ``cxr_dims`` (the original
``(W, H)``); no ``cxr_img`` (the store holds no image). The map:

* the stored native map itself where it spans the whole image (a model with ``resize="squash"``, as
  CheXlocalize's own DenseNet): their bilinear resize of it is then the run's own full-resolution map
  (``--model.cxl true``), so their numbers are the run's (exactly from a float32 store), and a file holds
  ``h * w`` floats, not the eval grid's (the demo's 96 maps: under 2 MB, not 97 MB);
* else (a model that crops or letterboxes) the stored map resampled onto an ``S x S`` grid over the
  original image by the benchmark's own warp (``geometry.warp_to_eval_grid``): ``S`` is the run's eval
  size (the grid the benchmark judges on; the model input side when the store records none); pixels
  the model never saw get the map's minimum. ``--size S`` resamples every map so.

Tensors pickle as ``torch`` does (``torch._utils._rebuild_tensor_v2`` and the storage's ``torch.save``
bytes; no other global), as theirs, whose tools call ``F.interpolate`` on the map. ``score --maps`` reads
these too and gives the numbers of ``score --predictions``: every number for native maps, every number
but ``map_similarity`` (which compares the native maps, here resampled) for resampled ones (tested on the demo).

A store of several datasets is exported one folder per dataset (``OUT/<dataset>/``).
"""

from __future__ import annotations

import csv
import json
import io
import pickle
from itertools import chain
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from xbench_pl.data.vocabulary import native_name
from xbench_pl.geometry import Preprocess, spans_image, warp_to_eval_grid
from xbench_pl.outputs import atomic_write, file_bytes
from xbench_pl.prediction_store import Store, StoreError

FORMATS = ("npy", "cheXlocalize")


def store_shards(store: Store) -> dict[str, list[tuple[dict, list[int]]]]:
    """``{dataset: [(shard, rows), ...]}``: every stored image once (the first shard holding it, in name
    order, as ``score`` replays them), each shard read back and checked but kept without its maps
    (``with_maps`` reads them again, one shard at a time: memory flat in the store's size); ``StoreError``
    if a shard does not read back."""
    paths = store.shard_paths()
    if not paths:
        raise StoreError(f"{store} holds no shard: nothing to export")
    out: dict[str, list[tuple[dict, list[int]]]] = {}
    seen: dict[str, set[str]] = {}
    for path in paths:
        shard = store.read_intact(path)
        del shard["saliency"]
        done = seen.setdefault(shard["dataset"], set())
        rows = [r for r, image_id in enumerate(shard["image_ids"]) if image_id not in done]
        done.update(shard["image_ids"][r] for r in rows)
        if rows:
            out.setdefault(shard["dataset"], []).append((shard, rows))
    return out


def with_maps(shards: list[tuple[dict, list[int]]], store: Store):
    """Each ``(shard, rows)`` of ``store_shards`` with its maps, read one shard at a time."""
    for shard, rows in shards:
        yield store.read_intact(Path(shard["path"])), rows


def infer_preprocess(shards: list[tuple[dict, list[int]]]) -> dict:
    """The ``Preprocess`` settings (``{"resize", "size"[, "canvas"]}``) whose ``plan`` gives every stored image's
    affine exactly; ``StoreError`` when none does (images of one model input side and resize rule are needed)."""
    sizes = {int(shard["input_size"]) for shard, _ in shards}
    if len(sizes) != 1:
        raise StoreError(f"the store's model input sizes differ ({sorted(sizes)}): no single preprocess.json describes its maps")
    size = sizes.pop()
    shard, rows = shards[0]
    (height, width), affine = shard["original_size"][rows[0]].tolist(), shard["affine"][rows[0]].tolist()
    long_side = round(affine[0] * width) if width >= height else round(affine[1] * height)  # letterbox's canvas
    short_side = round(affine[0] * width) if width <= height else round(affine[1] * height)  # crop's canvas
    candidates = [{"resize": "squash", "size": size}, {"resize": "crop", "size": size}]
    if short_side > size:
        candidates.append({"resize": "crop", "size": size, "canvas": short_side})
    if long_side >= size:
        candidates.append({"resize": "letterbox", "size": size, "canvas": long_side})
    # letterbox_resize's zoom cancels its canvas in the affine but for rounding: the smallest canvas that gives every
    # affine (the same numbers from score --maps; the model's own canvas may be another)
    candidates = chain(candidates, ({"resize": "letterbox_resize", "size": size, "canvas": c}
                                    for c in range(1, 2 * max(height, width) + 1)
                                    if affine_of(Preprocess("letterbox_resize", size, c), height, width) == affine))

    def fits(config: dict) -> bool:
        preprocess = Preprocess(**config)
        return all(affine_of(preprocess, *shard["original_size"][r].tolist()) == shard["affine"][r].tolist()
                   for shard, rows in shards for r in rows)

    found = next((config for config in candidates if fits(config)), None)
    if found is None:
        raise StoreError("the store's affines come from no single squash, crop, letterbox or letterbox_resize Preprocess "
                         f"of side {size}: export --to cheXlocalize instead (maps resampled over the whole image)")
    return found


def affine_of(preprocess: Preprocess, height: int, width: int) -> list[float]:
    return list(preprocess.plan(height, width)[1])


def _folder_name(text: str, what: str) -> PurePosixPath:
    path = PurePosixPath(text)
    if not text or path.is_absolute() or any(part in ("", ".", "..") for part in text.split("/")):
        raise StoreError(f"{what} {text!r} cannot name a file or folder: not exportable")
    return path


def export_npy(store: Store, shards: list[tuple[dict, list[int]]], out: Path) -> int:
    """Write one dataset's maps, ``scores.csv`` and ``preprocess.json`` (the module docstring); returns the images written."""
    config = infer_preprocess(shards)
    out.mkdir(parents=True, exist_ok=True)
    images = 0
    scores = io.StringIO()
    writer = csv.writer(scores)
    writer.writerow(["image_id", "finding", "score"])
    for shard, rows in with_maps(shards, store):
        classes = list(shard["classes"])
        if any("/" in c or c in ("", ".", "..") for c in classes):
            raise StoreError(f"a finding name of {classes} cannot name a file: not exportable")
        saliency = shard["saliency"]
        saliency = saliency.float() if saliency.dtype == torch.bfloat16 else saliency
        for r in rows:
            image_id = shard["image_ids"][r]
            folder = out / _folder_name(image_id, "image id")
            folder.mkdir(parents=True, exist_ok=True)
            for c, finding in enumerate(classes):
                atomic_write(folder / f"{finding}.npy", file_bytes(lambda f: np.save(f, saliency[r, c].numpy())))
                writer.writerow([image_id, finding, repr(float(shard["scores"][r, c]))])
            images += 1
    atomic_write(out / "scores.csv", scores.getvalue())
    atomic_write(out / "preprocess.json", json.dumps(config) + "\n")
    return images


def export_chexlocalize(store: Store, shards: list[tuple[dict, list[int]]], out: Path, dataset: str,
                        size: int | None = None, chunk: int = 16) -> int:
    """Write one dataset's ``{cxr_id}_{task}_map.pkl`` files (the module docstring): the stored native maps as they
    are for ``size`` None (they must span the whole image, ``all_span``), else maps resampled onto a ``size`` square
    over the original image; returns the images written."""
    out.mkdir(parents=True, exist_ok=True)
    images = 0
    for shard, rows in with_maps(shards, store):
        classes = list(shard["classes"])
        tasks = [native_name(c, dataset) for c in classes]
        bad = [t for t in tasks if "_" in t or "/" in t]
        if bad:
            raise StoreError(f"finding {bad[0]!r} holds '_' or '/': CheXlocalize's {{cxr_id}}_{{task}}_map.pkl names cannot hold it")
        input_size = int(shard["input_size"])
        for start in range(0, len(rows), chunk):
            part = torch.tensor(rows[start:start + chunk])
            n, c = len(part), len(classes)
            native = shard["saliency"][part].float()
            maps = native if size is None else warp_to_eval_grid(
                native.flatten(0, 1), shard["affine"][part].repeat_interleave(c, 0), input_size,
                shard["original_size"][part].repeat_interleave(c, 0), size).view(n, c, size, size)
            for b, r in enumerate(part.tolist()):
                image_id = shard["image_ids"][r]
                if "/" in image_id or image_id in ("", ".", ".."):
                    raise StoreError(f"image id {image_id!r} holds '/': CheXlocalize's file names cannot hold it (export --to npy)")
                height, width = shard["original_size"][r].tolist()
                for k, task in enumerate(tasks):
                    info = {"map": maps[b, k][None, None].clone(), "prob": float(shard["scores"][r, k]), "task": task,
                            "gt": int(shard["labels"][r, k]), "cxr_dims": (int(width), int(height))}
                    atomic_write(out / f"{image_id}_{task}_map.pkl", pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL))
                images += 1
    return images


def eval_size(stored: dict) -> int | None:
    """The eval size a store's run judged on (its manifest's data config), None if it records none."""
    data = (stored.get("config") or {}).get("data") or {}
    size = (data.get("init_args") or {}).get("eval_size", data.get("eval_size"))
    return int(size) if isinstance(size, int) else None


def export(store: Store, to: str, out: Path, size: int | None = None) -> dict[str, int]:
    """Export every dataset of ``store`` as ``to`` (``FORMATS``) into ``out`` (``out/<dataset>`` when several);
    ``size``: the side of the cheXlocalize maps resampled over the whole image (default: native maps that span
    it, the run's eval size for others). Returns ``{dataset: images written}``."""
    if to not in FORMATS:
        raise ValueError(f"--to must be one of {', '.join(FORMATS)}, got {to!r}")
    judged = eval_size(store.read_manifest() or {})
    datasets = store_shards(store)
    written = {}
    for name, shards in datasets.items():
        folder = out if len(datasets) == 1 else out / _folder_name(name, "dataset")
        if to == "npy":
            written[name] = export_npy(store, shards, folder)
        else:
            side = size or (None if all_span(shards) else judged or int(shards[0][0]["input_size"]))
            written[name] = export_chexlocalize(store, shards, folder, name, side)
    return written


def all_span(shards: list[tuple[dict, list[int]]]) -> bool:
    """Whether every stored map spans its whole original image (``geometry.spans_image``: squash)."""
    return all(spans_image(shard["affine"][r], int(shard["input_size"]), *shard["original_size"][r].tolist())
               for shard, rows in shards for r in rows)
