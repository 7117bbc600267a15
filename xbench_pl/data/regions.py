"""Ground-truth regions in the original image frame, and their raster on the evaluation grid.

A region is rasterised by sampling it at the centres of the ``E x E`` eval-grid pixels
(which uniformly cover the original image): nearest-neighbour resampling of the region,
never interpolation. Several instances of one finding in one image are united.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw


def _centres(n_original: int, eval_size: int) -> np.ndarray:
    return (np.arange(eval_size) + 0.5) * (n_original / eval_size)


def sample_indices(height: int, width: int, eval_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The original pixel (row, column) under each eval-pixel centre: what a mask is sampled at."""
    return np.floor(_centres(height, eval_size)).astype(np.int64), np.floor(_centres(width, eval_size)).astype(np.int64)


@dataclass(frozen=True)
class Box:
    """Axis-aligned box ``[x0, x1) x [y0, y1)`` in continuous original pixel coordinates.

    Datasets convert their own convention on reading: xywh -> ``(x, y, x + w, y + h)``;
    inclusive integer xyxy -> ``(x1, y1, x2 + 1, y2 + 1)``.
    """

    x0: float
    y0: float
    x1: float
    y1: float

    def rasterize(self, height: int, width: int, eval_size: int) -> np.ndarray:
        xs, ys = _centres(width, eval_size), _centres(height, eval_size)
        inside_x = (xs >= self.x0) & (xs < self.x1)
        inside_y = (ys >= self.y0) & (ys < self.y1)
        return inside_y[:, None] & inside_x[None, :]


@dataclass(frozen=True)
class Polygon:
    """Closed polygon of ``[x, y]`` points, filled as PIL ``ImageDraw.polygon(outline=1, fill=1)``
    on the original ``W x H`` canvas (the CheXlocalize / LabelMe convention)."""

    points: tuple[tuple[float, float], ...]

    def rasterize(self, height: int, width: int, eval_size: int) -> np.ndarray:
        canvas = Image.new("1", (width, height))
        ImageDraw.Draw(canvas).polygon([tuple(p) for p in self.points], outline=1, fill=1)
        return Mask(np.asarray(canvas, dtype=bool)).rasterize(height, width, eval_size)


@dataclass(frozen=True, eq=False)
class Mask:
    """Binary mask ``[H, W]`` at the original resolution."""

    array: np.ndarray

    def rasterize(self, height: int, width: int, eval_size: int) -> np.ndarray:
        if self.array.shape != (height, width):
            raise ValueError(f"mask shape {self.array.shape} != image size {(height, width)}")
        rows, cols = sample_indices(height, width, eval_size)
        return self.array[np.ix_(rows, cols)].astype(bool)


Region = Box | Polygon | Mask


def rasterize_original(regions: list, height: int, width: int) -> np.ndarray:
    """Union of all instances of one finding at the original resolution, ``[H, W]`` bool (the
    CheXlocalize-comparable metrics judge there): a box by the pixel centres inside it, a polygon
    filled as PIL does, a mask as decoded (``decode()``, or ``decode(height, width)`` for masks whose
    runs need the image size)."""
    import inspect

    out = np.zeros((height, width), dtype=bool)
    for region in regions:
        if isinstance(region, Box):
            xs, ys = np.arange(width) + 0.5, np.arange(height) + 0.5
            mask = ((ys >= region.y0) & (ys < region.y1))[:, None] & ((xs >= region.x0) & (xs < region.x1))[None, :]
        elif isinstance(region, Polygon):
            canvas = Image.new("1", (width, height))
            ImageDraw.Draw(canvas).polygon([tuple(p) for p in region.points], outline=1, fill=1)
            mask = np.asarray(canvas, dtype=bool)
        elif isinstance(region, Mask):
            mask = region.array
        else:
            decode = region.decode
            mask = decode(height, width) if len(inspect.signature(decode).parameters) == 2 else decode()
        if mask.shape != (height, width):
            raise ValueError(f"mask shape {mask.shape} != image size {(height, width)}")
        out |= mask.astype(bool)
    return out


def region_bounds(region, height: int, width: int) -> tuple[float, float, float, float] | None:
    """A region's bounding box ``(x0, y0, x1, y1)`` in continuous original pixels (the box metrics' ground truth): a
    box as it is, a polygon by its points' extent, a mask (or a run-length region) by its pixels' extent (pixel ``i``
    spans ``[i, i + 1)``); None for an empty mask."""
    if isinstance(region, Box):
        return (region.x0, region.y0, region.x1, region.y1)
    if isinstance(region, Polygon):
        xs, ys = [p[0] for p in region.points], [p[1] for p in region.points]
        return (min(xs), min(ys), max(xs), max(ys))
    mask = rasterize_original([region], height, width)
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if not rows.size:
        return None
    return (float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1))


def rasterize_union(regions: list[Region], height: int, width: int, eval_size: int) -> np.ndarray:
    """Union of all instances of one finding on the eval grid, ``[E, E]`` bool."""
    out = np.zeros((eval_size, eval_size), dtype=bool)
    for region in regions:
        out |= region.rasterize(height, width, eval_size)
    return out
