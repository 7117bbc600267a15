"""Deterministic inputs for the CheXlocalize-mode equivalence test: saliency maps (and, for
synthetic images, ground-truth masks) from a seed.

Used both by the scratch run of CheXlocalize's own evaluation code
(``tests/data/make_chexlocalize_reference.py``, which wrote ``tests/data/chexlocalize_reference.json``)
and by ``tests/test_chexlocalize_mode.py``, which recomputes the same numbers with
``xbench_pl.metrics.chexlocalize``. Plain module: numpy, torch and PIL only.

Two cases:

* ``real``: the two real CheXpert validation images of CheXlocalize's sample (their ground truth,
  read from ``shared/data/real_cxr/chexlocalize``) with seeded maps on one ``REAL_GRID``, 10 tasks
  each (one grid, so that a model can return them as one saliency tensor).
* ``synthetic``: six small images (sizes below) with seeded polygon regions and maps.

Map kinds (cycled over the pairs): Gaussian blobs on a coarse grid (Grad-CAM-like), a blob on the
region's centroid (hits), uniform noise (many Otsu specks and holes), blobs with a clipped top
(tied maxima: the first in row-major order wins), negative-valued blobs, and a constant map.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

SEED = 20240612
#: CheXlocalize's 10 localisation tasks as its files spell them (``eval_constants.LOCALIZATION_TASKS``, sorted).
TASKS = ("Airspace Opacity", "Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Enlarged Cardiomediastinum",
         "Lung Lesion", "Pleural Effusion", "Pneumothorax", "Support Devices")
REAL_IDS = ("patient64541_study1_view1_frontal", "patient64542_study1_view1_frontal")
SYNTHETIC_SIZES = ((300, 370), (257, 311), (400, 280), (333, 333), (290, 350), (310, 305))  # (H, W)
SYNTHETIC_IDS = tuple(f"patient9{i:04d}_study1_view1_frontal" for i in range(len(SYNTHETIC_SIZES)))
REAL_GRID = (10, 12)
GRIDS = ((7, 7), (10, 10), (14, 14), (10, 12), (16, 9), (20, 20), (32, 32), (320, 320))
KINDS = ("blobs", "centroid", "noise", "plateau", "negative", "blobs", "centroid", "constant")


def _blobs(rng: np.random.Generator, h: int, w: int, count: int, centre: tuple[float, float] | None = None) -> np.ndarray:
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    out = np.zeros((h, w))
    for k in range(count):
        cy, cx = (centre if (centre is not None and k == 0) else (rng.uniform(0, h), rng.uniform(0, w)))
        sigma = rng.uniform(0.08, 0.3) * max(h, w)
        out += rng.uniform(0.3, 1.0) * np.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / (2 * sigma**2))
    return out


def make_map(rng: np.random.Generator, kind: str, grid: tuple[int, int], region: np.ndarray | None) -> torch.Tensor:
    """One native map ``[h, w]`` float32 spanning the whole image."""
    h, w = grid
    if kind == "centroid" and region is not None and region.any():
        rows, cols = np.nonzero(region)
        centre = ((rows.mean() + 0.5) * h / region.shape[0] - 0.5, (cols.mean() + 0.5) * w / region.shape[1] - 0.5)
        values = _blobs(rng, h, w, 2, centre)
    elif kind == "noise":
        values = rng.random((h, w))
    elif kind == "plateau":
        values = _blobs(rng, h, w, 2)
        values = np.minimum(values, np.quantile(values, 0.8))
    elif kind == "negative":
        values = _blobs(rng, h, w, 3) - 2.0
    elif kind == "constant":
        values = np.full((h, w), 0.25)
    else:
        values = _blobs(rng, h, w, 3)
    return torch.from_numpy(values.astype(np.float32))


def _polygon(rng: np.random.Generator, height: int, width: int) -> list[tuple[float, float]]:
    cy, cx = rng.uniform(0.2, 0.8) * height, rng.uniform(0.2, 0.8) * width
    angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(5, 11))))
    radii = rng.uniform(0.05, 0.25, angles.size) * min(height, width)
    return [(float(cx + r * np.cos(a)), float(cy + r * np.sin(a))) for r, a in zip(radii, angles)]


def synthetic_regions(seed: int = SEED) -> dict[str, dict[str, np.ndarray]]:
    """Per synthetic image id, per task, its ground-truth mask ``[H, W]`` bool (empty for most tasks):
    one or two seeded polygons filled as PIL ``polygon(outline=1, fill=1)``."""
    rng = np.random.default_rng(seed)
    out = {}
    for image_id, (height, width) in zip(SYNTHETIC_IDS, SYNTHETIC_SIZES):
        masks = {}
        for task in TASKS:
            canvas = Image.new("1", (width, height))
            if rng.random() < 0.4:
                for _ in range(int(rng.integers(1, 3))):
                    ImageDraw.Draw(canvas).polygon(_polygon(rng, height, width), outline=1, fill=1)
            masks[task] = np.asarray(canvas, dtype=bool)
        out[image_id] = masks
    return out


def make_maps(regions: dict[str, dict[str, np.ndarray]], seed: int = SEED, grid: tuple[int, int] | None = None
              ) -> dict[str, dict[str, torch.Tensor]]:
    """Per image id (in sorted order), per task, a native map; ``regions`` gives each pair's
    ground truth (for the ``centroid`` kind) and the image ids. ``grid``: one native size for all
    maps (default: cycled over ``GRIDS``)."""
    rng = np.random.default_rng(seed + 1)
    out, pair = {}, 0
    for image_id in sorted(regions):
        out[image_id] = {}
        for task in TASKS:
            kind = KINDS[pair % len(KINDS)]
            out[image_id][task] = make_map(rng, kind, grid or GRIDS[(pair * 3) % len(GRIDS)], regions[image_id].get(task))
            pair += 1
    return out
