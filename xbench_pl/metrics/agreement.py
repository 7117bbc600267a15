"""Agreement across models: how alike two runs' maps of the same (image, finding) are, as a matrix.

Each run is a prediction store (``test --predictions DIR``: the native maps of every (image, finding)). Per dataset,
the maps of the findings an image is labelled with (by every run of the comparison) are carried onto the eval grid
(``geometry.warp_to_eval_grid``: E x E pixels over the whole original image, so models that crop, letterbox or
squash meet on the same pixels) and normalised as each run's benchmark normalised them (``--model.normalize``, the
store's manifest); two runs' maps of one (image, finding) are then compared by SSIM (``metrics.trust.ssim``, Arun et
al.'s settings). A cell of the matrix is the mean SSIM over those pairs, with a bootstrap interval over images (the
pairs of an image drawn together); the diagonal compares a run with itself (1 where SSIM is defined).

Two runs are compared only on the same images: where their stores hold different image sets (or findings) of a
dataset, the cell is undefined and ``mismatches`` says which runs, how many images each holds and how many they
share, never a mean over the images they happen to have in common.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from xbench_pl.metrics.functional import bootstrap_weights, normalize_saliency, percentile_interval
from xbench_pl.metrics.resampling import image_key

#: images whose maps are warped and compared at once (each run's maps of them on the eval grid live together)
CHUNK_IMAGES = 4


@dataclass
class StoredMaps:
    """What one run's store holds of one dataset: ``classes``, and per image id its shard and row; ``normalize``,
    the run's normalisation of its maps."""
    classes: list[str]
    normalize: str
    rows: dict[str, tuple[dict, int]] = field(default_factory=dict)


@dataclass
class Agreement:
    """One dataset's matrix over ``names`` (runs): ``ssim[i][j]`` the mean SSIM of run i's and run j's maps of the
    same (image, finding) (None where not compared or undefined), ``interval[i][j]`` its bootstrap interval over
    images, ``pairs[i][j]`` the (image, finding) pairs it averages; ``mismatches``: why a cell is not compared."""
    names: list[str]
    ssim: list[list[float | None]]
    interval: list[list[list[float] | None]]
    pairs: list[list[int]]
    mismatches: list[str]

    def as_dict(self) -> dict:
        return {"runs": self.names, "ssim": self.ssim, "interval": self.interval, "pairs": self.pairs,
                "mismatches": self.mismatches}


def stored_maps(store_dir: str | Path) -> dict[str, StoredMaps]:
    """A prediction store's maps by dataset (``StoredMaps``), every shard checked as it is read (``Store.load_intact``)."""
    from xbench_pl.prediction_store import Store  # torch: only when a store is read

    store = Store(store_dir)
    manifest = store.read_manifest() or {}
    normalize = ((manifest.get("metrics") or {}).get("normalize")) or "minmax"
    found: dict[str, StoredMaps] = {}
    for shard in store.load_intact():
        held = found.setdefault(shard["dataset"], StoredMaps(list(shard["classes"]), normalize))
        if list(shard["classes"]) != held.classes:
            raise ValueError(f"{shard['path']}: findings {shard['classes']} differ from the store's other shards' {held.classes}")
        for row, image_id in enumerate(shard["image_ids"]):
            held.rows.setdefault(image_id, (shard, row))
    return found


def stored_labels(held: StoredMaps, image_ids: list[str]) -> torch.Tensor:
    """The stored labels of ``image_ids`` ``[B, C]`` (bool: the finding is present)."""
    return torch.stack([held.rows[i][0]["labels"][held.rows[i][1]].bool() for i in image_ids])


def eval_grid_maps(held: StoredMaps, image_ids: list[str], present: torch.Tensor, eval_size: int) -> torch.Tensor:
    """The maps of the (image, finding) pairs ``present`` ``[B, C]`` marks among ``image_ids``, in that order (image,
    then finding), on the eval grid and normalised as their run did: ``[K, E, E]`` float64."""
    from xbench_pl.geometry import warp_to_eval_grid

    maps = []
    for image_id, wanted in zip(image_ids, present):
        shard, row = held.rows[image_id]
        saliency = shard["saliency"][row][wanted].float()  # [K_i, h, w]
        k = saliency.shape[0]
        warped = warp_to_eval_grid(saliency, shard["affine"][row].expand(k, 4), int(shard["input_size"]),
                                   shard["original_size"][row].expand(k, 2), eval_size)
        maps.append(normalize_saliency(warped.double(), held.normalize))
    return torch.cat(maps)


def _same_images(a: StoredMaps, b: StoredMaps) -> bool:
    return a.classes == b.classes and a.rows.keys() == b.rows.keys()


def _mismatch(dataset: str, name_a: str, a: StoredMaps, name_b: str, b: StoredMaps) -> str:
    if a.classes != b.classes:
        return (f"{dataset}: {name_a} and {name_b} hold different findings ({', '.join(a.classes)} vs "
                f"{', '.join(b.classes)}): not compared")
    shared = len(a.rows.keys() & b.rows.keys())
    return (f"{dataset}: {name_a} and {name_b} saw different images ({len(a.rows)} and {len(b.rows)} images, {shared} in "
            "common): not compared")


def matrix(runs: dict[str, StoredMaps], dataset: str, eval_size: int, resamples: int = 1000, seed: int = 0,
           level: float = 0.95) -> Agreement:
    """The agreement matrix of ``runs`` (name -> its ``StoredMaps`` of ``dataset``) on the ``eval_size`` grid: per pair
    of runs with the same images and findings, SSIM of their maps of every (image, finding) labelled present (by every
    such run's store), its mean and its percentile interval over ``resamples`` bootstrap draws of the images (seeded:
    ``bootstrap_weights``, over the images with a pair compared); the rest recorded in ``mismatches``."""
    from xbench_pl.metrics.trust import ssim

    names = list(runs)
    m = len(names)
    sums = {}  # (i, j) -> per image [sum of SSIM over its pairs, number of pairs], images in image-key order
    mismatches = [_mismatch(dataset, names[i], runs[names[i]], names[j], runs[names[j]])
                  for i in range(m) for j in range(i + 1, m) if not _same_images(runs[names[i]], runs[names[j]])]
    groups: list[list[int]] = []  # runs with the same images and findings are compared together
    for i, name in enumerate(names):
        group = next((g for g in groups if _same_images(runs[names[g[0]]], runs[name])), None)
        if group is None:
            groups.append([i])
        else:
            group.append(i)
    for group in groups:
        image_ids = sorted(runs[names[group[0]]].rows, key=image_key)
        per_image = {(i, j): torch.zeros(len(image_ids), 2, dtype=torch.float64) for i in group for j in group if i <= j}
        for start in range(0, len(image_ids), CHUNK_IMAGES):
            chunk = image_ids[start:start + CHUNK_IMAGES]
            present = torch.stack([stored_labels(runs[names[i]], chunk) for i in group]).all(0)  # labelled by every run
            image = start + present.nonzero()[:, 0]
            maps = [eval_grid_maps(runs[names[i]], chunk, present, eval_size) for i in group]
            for a, i in enumerate(group):
                for b, j in enumerate(group[a:], start=a):
                    values = ssim(maps[a], maps[b])
                    defined = ~torch.isnan(values)
                    per_image[(i, j)][:, 0].index_add_(0, image[defined], values[defined])
                    per_image[(i, j)][:, 1].index_add_(0, image[defined], torch.ones_like(values[defined]))
        sums.update(per_image)
    ssim_cells = [[None] * m for _ in range(m)]
    intervals = [[None] * m for _ in range(m)]
    pairs = [[0] * m for _ in range(m)]
    for (i, j), per_image in sums.items():
        total, count = per_image.sum(0)
        pairs[i][j] = pairs[j][i] = int(count)
        if count == 0:
            continue
        ssim_cells[i][j] = ssim_cells[j][i] = float(total / count)
        compared = per_image[per_image[:, 1] > 0]  # the units: images with a pair compared
        weights = bootstrap_weights(compared.shape[0], resamples, seed).double()
        drawn = weights @ compared  # [R, 2]: resampled sum and count
        low, high = percentile_interval(drawn[:, 0] / drawn[:, 1], level).tolist()
        intervals[i][j] = intervals[j][i] = [low, high]
    return Agreement(names, ssim_cells, intervals, pairs, mismatches)


def agreement(stores: dict[str, str | Path], eval_size: int, resamples: int = 1000, seed: int = 0) -> dict[str, Agreement]:
    """Per dataset any of the ``stores`` (run name -> prediction store folder) holds, the ``matrix`` of the runs
    that hold it; a run without the dataset is left out of its matrix and named in its ``mismatches``."""
    held = {name: stored_maps(folder) for name, folder in stores.items()}
    out = {}
    for dataset in dict.fromkeys(d for maps in held.values() for d in maps):
        runs = {name: maps[dataset] for name, maps in held.items() if dataset in maps}
        result = matrix(runs, dataset, eval_size, resamples, seed)
        result.mismatches += [f"{dataset}: {name} holds no maps of it" for name in held if name not in runs]
        out[dataset] = result
    return out
