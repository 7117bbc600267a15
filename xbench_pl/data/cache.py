"""Decoded pixels, bounded in size and optionally cached on disk, memory-mapped.

Every dataset reads its images through an ``ImageStore``: decode (``read_image``), shrink
so the long side is at most ``max_side`` (``None``: keep full resolution), quantise to 8 or
16 bits. With a cache folder the quantised array is written once as ``.npy`` and later read
memory-mapped, so repeated runs, sweeps and DataLoader workers skip decoding.

Geometry stays exact: the stored copy is a rescale of the original frame by ``w / W`` and
``h / H`` (nearly equal, but rounding the shrunk size to whole pixels makes them differ
slightly, so the two axes are scaled separately), and the original ``(H, W)`` is stored
beside it; ``XBenchDataset`` composes that per-axis rescale into the affine, and regions
stay in original coordinates.

Results do not depend on the cache: with or without it an image goes through the same
bound + quantise step, so pixels are bit-identical. Quantisation is lossless for 8-bit
sources (``k / 255`` values are stored as uint8) and within ``0.5 / 65535`` otherwise.

Cache key: the file's resolved path, size and mtime (ns), ``max_side`` and
``DECODE_VERSION`` (bumped whenever decoding changes what a file decodes to). An entry is
``<cache>/<key[:2]>/<key>.npy`` plus ``<key>.json`` (original size); both are written to a
temporary name and renamed into place, so concurrent workers and processes never see a
half-written entry, and a damaged entry is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np

from xbench_pl.data.io import read_image
from xbench_pl.outputs import atomic_write, file_bytes

DECODE_VERSION = 1
CACHE_ENV = "XBENCH_CACHE_DIR"


def bound_size(image: np.ndarray, max_side: int | None) -> np.ndarray:
    """Area-downscale so that the long side is at most ``max_side`` (never upscales)."""
    height, width = image.shape
    if max_side is None or max(height, width) <= max_side:
        return image
    scale = max_side / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


def quantize(image: np.ndarray) -> np.ndarray:
    """[0, 1] float -> uint8 when that is lossless (8-bit sources), else uint16."""
    levels = np.rint(image * 255.0)
    if np.array_equal(levels.astype(np.float32) / 255.0, image):
        return levels.astype(np.uint8)
    return np.rint(np.clip(image, 0.0, 1.0) * 65535.0).astype(np.uint16)


def dequantize(stored: np.ndarray) -> np.ndarray:
    return stored.astype(np.float32) / (255.0 if stored.dtype == np.uint8 else 65535.0)


class ImageStore:
    """Where datasets get pixels: ``store(path) -> (image, (H, W))``.

    ``image`` is float32 ``[h, w]`` in [0, 1] (``h, w`` = ``H, W`` unless ``max_side``
    shrank it); ``(H, W)`` is the original size. Picklable, so DataLoader workers share it.

    Args:
        cache_dir: folder for the decode cache (created if needed); ``None`` decodes every time.
        max_side: bound on the long side of the decoded copy; ``None`` keeps full resolution.
    """

    def __init__(self, cache_dir: str | Path | None = None, max_side: int | None = None):
        if max_side is not None and max_side < 1:
            raise ValueError(f"max_side must be positive, got {max_side}")
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.max_side = max_side

    def __call__(self, path: str | Path) -> tuple[np.ndarray, tuple[int, int]]:
        stored, original_size = self.load(Path(path))
        return dequantize(stored), original_size

    def load(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        """The quantised array (memory-mapped when cached) and the original size."""
        if self.cache_dir is None or not path.is_file():
            return self.decode(path)
        entry = self.entry(path)
        if entry.is_file():
            try:
                original_size = tuple(json.loads(entry.with_suffix(".json").read_text())["original_size"])
                return np.load(entry, mmap_mode="r"), original_size
            except (OSError, ValueError, KeyError, TypeError):
                pass  # damaged entry: decode again and overwrite it
        stored, original_size = self.decode(path)
        entry.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(entry.with_suffix(".json"), json.dumps({"original_size": original_size, "file": str(path)}))
        atomic_write(entry, file_bytes(lambda f: np.save(f, stored)))
        return stored, original_size

    def decode(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        image = read_image(path)
        return quantize(bound_size(image, self.max_side)), image.shape

    def entry(self, path: Path) -> Path:
        stat = path.stat()
        fields = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, self.max_side, DECODE_VERSION)
        key = hashlib.sha256("\0".join(map(str, fields)).encode()).hexdigest()
        return self.cache_dir / key[:2] / f"{key}.npy"
