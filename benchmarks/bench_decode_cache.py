"""Decode cache speed: images/s decoding every time vs reading the memory-mapped cache.

    python benchmarks/bench_decode_cache.py [--n 16] [--size 1024]

Writes synthetic files in a temporary folder: 16-bit MONOCHROME1 DICOMs with a window
(uncompressed, ``size``² and ``2 * size``², as VinDr), RLE Lossless DICOMs and 8-bit PNGs
(``size``²). For each kind it times one pass without a cache (``cold``), the pass that
fills the cache (``fill``) and a pass over the filled cache (``cached``), through
``ImageStore`` exactly as datasets read images, and prints images/s and cached/cold.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_dicom import write_dicom  # noqa: E402

from xbench_pl.data.cache import ImageStore  # noqa: E402


def smooth_image(size: int, seed: int, peak: int) -> np.ndarray:
    """A chest-like smooth image with noise (compresses like a radiograph, not like white noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    base = 0.5 + 0.3 * np.sin(6 * x + seed) * np.cos(4 * y) + 0.05 * rng.standard_normal((size, size))
    return (np.clip(base, 0, 1) * peak).astype(np.uint16 if peak > 255 else np.uint8)


def write_files(folder: Path, kind: str, n: int, size: int) -> list[Path]:
    paths = []
    for i in range(n):
        if kind == "png":
            path = folder / f"{kind}{i}.png"
            Image.fromarray(smooth_image(size, i, 255)).save(path)
        else:
            side = 2 * size if kind == "dicom_2x" else size
            path = write_dicom(folder / f"{kind}{i}.dcm", smooth_image(side, i, 4095), "MONOCHROME1", bits_stored=12,
                               window=(2048, 4096), rle=kind == "dicom_rle")
        paths.append(path)
    return paths


def images_per_second(store: ImageStore, paths: list[Path]) -> float:
    start = time.perf_counter()
    for path in paths:
        image, _ = store(path)
        image.sum()  # touch every pixel, as preprocessing would
    return len(paths) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=16, help="files per kind")
    parser.add_argument("--size", type=int, default=1024, help="image side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(f"{'kind':<10} {'side':>5} {'cold img/s':>11} {'fill img/s':>11} {'cached img/s':>13} {'cached/cold':>12}")
        for kind in ("dicom", "dicom_2x", "dicom_rle", "png"):
            paths = write_files(tmp, kind, args.n, args.size)
            cold = images_per_second(ImageStore(), paths)
            cache = ImageStore(tmp / f"cache_{kind}")
            fill = images_per_second(cache, paths)
            cached = images_per_second(cache, paths)
            side = 2 * args.size if kind == "dicom_2x" else args.size
            print(f"{kind:<10} {side:>5} {cold:>11.1f} {fill:>11.1f} {cached:>13.1f} {cached / cold:>11.1f}x")


if __name__ == "__main__":
    main()
