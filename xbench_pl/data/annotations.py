"""Pieces the dataset readers share: finding image files, parsing and clipping boxes, lazily
decoded masks.

Masks are kept as their encoding (``RLEMask``) or their file (``MaskFile``) and decoded only
when the sample is rasterised, so a dataset of full-resolution masks costs no memory at load.
COCO RLE (CheXlocalize ``gt_segmentations_*.json``) is decoded here, without pycocotools:
``counts`` is the compressed string of ``pycocotools.mask.encode`` (runs alternating 0/1 from
0, in column-major order, i.e. of ``np.asfortranarray(mask)``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from xbench_pl.data.errors import DataError
from xbench_pl.data.io import parse_floats
from xbench_pl.data.regions import Box, Mask, Polygon, sample_indices


class ImageIndex:
    """Image files under ``folder`` matching ``pattern``, by ``key(path)`` (default: the file name).

    A key found in two places is ambiguous: looking it up is an error naming both paths. A
    key not found maps to ``default / key``, so that the image check at setup reports it
    missing (with the annotation row that wanted it).
    """

    def __init__(self, folder: Path, pattern: str, key: Callable[[Path], str] = attrgetter("name")):
        self.folder = folder
        self.paths: dict[str, list[Path]] = {}
        for path in sorted(folder.glob(pattern)):
            self.paths.setdefault(key(path), []).append(path)

    def __len__(self) -> int:
        return len(self.paths)

    def __contains__(self, key: str) -> bool:
        return key in self.paths

    def get(self, key: str, default: Path | None = None) -> Path:
        found = self.paths.get(key, [])
        if not found:
            return (default or self.folder) / key
        if len(found) > 1:
            raise DataError(found[0], f"image name {key!r} is ambiguous: also at {[str(p) for p in found[1:]]}")
        return found[0]


def find_one(root: Path, patterns: tuple[str, ...], required: bool = True) -> Path | None:
    """The one file anywhere under ``root`` matching the first of ``patterns`` (glob, in order of
    preference) that matches any. Two matches are ambiguous: an error naming both. None found:
    ``DataError``, or ``None`` when not ``required``."""
    for pattern in patterns:
        found = sorted(root.rglob(pattern))
        if len(found) > 1:
            raise DataError(found[0], f"{pattern} is ambiguous: also at {[str(p) for p in found[1:]]}")
        if found:
            return found[0]
    if required:
        raise DataError(root / patterns[0], f"not found under {root} (looked for {list(patterns)})")
    return None


def read_json(path: Path, expected: type = dict):
    """A JSON annotation file whose top level must be ``expected`` (``dict`` or ``list``)."""
    if not path.is_file():
        raise DataError(path, "annotation file not found")
    try:
        content = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(path, f"not valid JSON ({error})") from error
    if not isinstance(content, expected):
        raise DataError(path, f"expected a JSON {expected.__name__} at the top level, got {type(content).__name__}")
    return content


def parse_box(values, convention: str) -> Box:
    """A ``Box`` from annotation cells; ``ValueError`` saying what is malformed.

    conventions: ``"xywh"`` (top-left corner, width, height), ``"xyxy"`` (continuous corners),
    ``"xyxy_inclusive"`` (integer pixel corners, last row/column included: ``x2 + 1, y2 + 1``).
    """
    if len(values) != 4:
        raise ValueError(f"box {convention} {tuple(values)} does not have 4 values")
    a, b, c, d = parse_floats(values, f"box {convention}")
    x1, y1 = (a + c, b + d) if convention == "xywh" else (c + 1, d + 1) if convention == "xyxy_inclusive" else (c, d)
    if x1 <= a or y1 <= b:
        raise ValueError(f"box {convention} {tuple(values)} has a non-positive size")
    return Box(a, b, x1, y1)


def parse_polygon(points) -> Polygon:
    """A ``Polygon`` from a list of ``[x, y]`` points (at least 2, as PIL draws them); ``ValueError`` if malformed."""
    if not isinstance(points, list) or len(points) < 2:
        raise ValueError(f"polygon {str(points)[:80]} is not a list of at least 2 [x, y] points")
    try:
        pairs = tuple((float(x), float(y)) for x, y in points)
    except (TypeError, ValueError):
        raise ValueError(f"polygon {str(points)[:80]} has a point that is not a pair of numbers") from None
    if not all(math.isfinite(v) for pair in pairs for v in pair):
        raise ValueError(f"polygon {str(points)[:80]} has a non-finite point")
    return Polygon(pairs)


def checked_box(x0: float, y0: float, x1: float, y1: float, height: int, width: int) -> tuple[Box, bool]:
    """A ``Box`` clipped to the ``width x height`` image, and whether clipping changed it.

    ``ValueError`` for non-finite or non-positive-size boxes, and for boxes entirely outside.
    """
    if not all(math.isfinite(v) for v in (x0, y0, x1, y1)) or x1 <= x0 or y1 <= y0:
        raise ValueError(f"box x0,y0,x1,y1 = {x0, y0, x1, y1} is not a finite box of positive size")
    clipped = (max(x0, 0.0), max(y0, 0.0), min(x1, float(width)), min(y1, float(height)))
    if clipped[2] <= clipped[0] or clipped[3] <= clipped[1]:
        raise ValueError(f"box x0,y0,x1,y1 = {x0, y0, x1, y1} lies outside the {width}x{height} image")
    return Box(*clipped), clipped != (x0, y0, x1, y1)


def rle_counts(encoded: str) -> list[int]:
    """Run lengths of a COCO compressed RLE string (pycocotools ``rleFrString``)."""
    counts: list[int] = []
    position = 0
    while position < len(encoded):
        value, shift, more = 0, 0, True
        while more:
            if position >= len(encoded):
                raise ValueError("COCO RLE string ends inside a run length")
            chunk = ord(encoded[position]) - 48
            value |= (chunk & 0x1F) << shift
            more = bool(chunk & 0x20)
            position, shift = position + 1, shift + 5
            if not more and chunk & 0x10:
                value |= -1 << shift  # sign bit of the last chunk
        if len(counts) > 2:
            value += counts[-2]  # from the third count on, a delta to the count two back
        counts.append(value)
    return counts


@dataclass(frozen=True)
class RLEMask:
    """A mask of ``size = (H, W)`` kept as its column-major run lengths (0-run first).

    Rasterising samples the runs at the eval-grid pixel centres (as ``regions.Mask``) without
    decoding the full-resolution mask.
    """

    counts: tuple[int, ...]
    size: tuple[int, int]

    @classmethod
    def from_coco(cls, encoded: str, size: tuple[int, int]) -> RLEMask:
        """From a COCO compressed RLE string; ``ValueError`` if its runs do not tile ``size``."""
        counts = rle_counts(encoded)
        height, width = size
        if any(c < 0 for c in counts) or sum(counts) != height * width:
            raise ValueError(f"COCO RLE runs (sum {sum(counts)}) do not tile a {height}x{width} mask")
        return cls(tuple(counts), (height, width))

    def any(self) -> bool:
        return any(self.counts[1::2])

    def decode(self) -> np.ndarray:
        values = np.arange(len(self.counts)) % 2 == 1
        height, width = self.size
        return np.repeat(values, self.counts).reshape(width, height).T

    def rasterize(self, height: int, width: int, eval_size: int) -> np.ndarray:
        if self.size != (height, width):
            raise ValueError(f"mask size {self.size} != image size {(height, width)}")
        rows, cols = sample_indices(height, width, eval_size)
        run = np.searchsorted(np.cumsum(self.counts), cols[None, :] * height + rows[:, None], side="right")
        return run % 2 == 1


@dataclass(frozen=True)
class MaskFile:
    """A mask kept as an image file (non-zero = inside); read when rasterised."""

    path: Path

    def decode(self) -> np.ndarray:
        try:
            with Image.open(self.path) as image:
                return np.asarray(image.convert("L")) > 0
        except (UnidentifiedImageError, OSError) as error:
            raise DataError(self.path, f"cannot decode mask ({error})") from error

    def rasterize(self, height: int, width: int, eval_size: int) -> np.ndarray:
        return Mask(self.decode()).rasterize(height, width, eval_size)
