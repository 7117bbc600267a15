"""Pieces the dataset readers share: finding image files, checking boxes, lazily decoded masks.

Masks are kept as their encoding (``RLEMask``) or their file (``MaskFile``) and decoded only
when the sample is rasterised, so a dataset of full-resolution masks costs no memory at load.
COCO RLE (CheXlocalize ``gt_segmentations_*.json``) is decoded here, without pycocotools:
``counts`` is the compressed string of ``pycocotools.mask.encode`` (runs alternating 0/1 from
0, in column-major order, i.e. of ``np.asfortranarray(mask)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from xbench_pl.data.io import DataError
from xbench_pl.data.regions import Box, Mask


def image_size(path: Path) -> tuple[int, int]:
    """``(H, W)`` of an image file from its header (no pixel decoding)."""
    if not path.is_file():
        raise DataError(path, "image file not found")
    try:
        with Image.open(path) as image:
            width, height = image.size
    except (UnidentifiedImageError, OSError) as error:
        raise DataError(path, f"cannot read image header ({error})") from error
    return height, width


class ImageIndex:
    """Image files under ``folder`` matching ``pattern``, by file name (or stem).

    A name found in two places is ambiguous: looking it up is an error naming both paths.
    """

    def __init__(self, folder: Path, pattern: str, by: str = "name"):
        self.folder = folder
        self.paths: dict[str, list[Path]] = {}
        for path in sorted(folder.glob(pattern)):
            self.paths.setdefault(getattr(path, by), []).append(path)

    def __len__(self) -> int:
        return len(self.paths)

    def __contains__(self, key: str) -> bool:
        return key in self.paths

    def get(self, key: str) -> Path:
        found = self.paths.get(key, [])
        if not found:
            raise DataError(self.folder / key, "image file not found")
        if len(found) > 1:
            raise DataError(found[0], f"image name {key!r} is ambiguous: also at {[str(p) for p in found[1:]]}")
        return found[0]


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


def decode_coco_rle(encoded: str, height: int, width: int) -> np.ndarray:
    """Binary ``[H, W]`` mask of a column-major COCO compressed RLE."""
    counts = np.asarray(rle_counts(encoded), dtype=np.int64)
    if (counts < 0).any() or counts.sum() != height * width:
        raise ValueError(f"COCO RLE runs (sum {counts.sum()}) do not tile a {height}x{width} mask")
    values = np.arange(len(counts)) % 2 == 1  # runs alternate 0, 1, 0, ... from 0
    return np.repeat(values, counts).reshape(width, height).T


@dataclass(frozen=True)
class RLEMask:
    """A mask kept as COCO compressed RLE ``counts`` of ``size = (H, W)``; decoded when rasterised."""

    counts: str
    size: tuple[int, int]

    def decode(self) -> np.ndarray:
        return decode_coco_rle(self.counts, *self.size)

    def rasterize(self, height: int, width: int, eval_size: int) -> np.ndarray:
        return Mask(self.decode()).rasterize(height, width, eval_size)


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
