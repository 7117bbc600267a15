"""Peak memory of ``score --boxes``, ``score --maps`` and ``export --to cheXlocalize`` on N vs 10 N images.

Each command runs as its own ``python -m xbench_pl`` process; its peak RSS comes from ``wait4``
(``bench_callbacks_memory.peak_rss_mb``). Inputs are synthetic, from the demo's 12 boxed phantoms copied
under new ids into an NIH-format folder (``make_dataset``; score reads only the images' headers):

* ``score --boxes``: the ground-truth boxes as a box file (``image_id,finding,x_min,y_min,x_max,y_max``);
* ``score --maps``: one seeded ``--map_side``² ``.npy`` map per (image, finding) and a ``scores.csv``;
* ``export``: a prediction store of the same maps written with ``prediction_store.Store`` (squash: the maps
  span the whole image), exported ``--to cheXlocalize`` as it is and resampled (``--size``, the eval grid).

``--eval_size`` (default 128) and ``--bootstrap 0`` (default) keep 1,000 images feasible on 2 cores; the memory of a metric update is
bounded by ``predictions.UPDATE_PIXELS`` whatever the eval grid. Prints one row per (command, images) and
the growth from the smallest to the largest N.

    python benchmarks/bench_score_memory.py [--sizes 100 1000] [--eval_size 128] [--map_side 16] [--bootstrap 0]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_callbacks_memory import make_dataset, peak_rss_mb  # noqa: E402

def image_ids(data: Path) -> list[str]:
    return sorted(p.name for p in (data / "images").iterdir())


def write_boxes(data: Path, path: Path) -> Path:
    with open(data / "BBox_List_2017.csv") as handle, open(path, "w") as out:
        out.write("image_id,finding,x_min,y_min,x_max,y_max\n")
        for row in list(csv.reader(handle))[1:]:
            x, y, w, h = map(float, row[2:6])
            out.write(f"{row[0]},{row[1]},{x},{y},{x + w},{y + h}\n")
    return path


def write_maps(data: Path, folder: Path, classes: list[str], side: int) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    with open(folder / "scores.csv", "w") as scores:
        scores.write("image_id,finding,score\n")
        for image_id in image_ids(data):
            (folder / image_id).mkdir(parents=True)
            for finding in classes:
                np.save(folder / image_id / f"{finding}.npy", rng.random((side, side), dtype=np.float32))
                scores.write(f"{image_id},{finding},{rng.random():.6f}\n")
    return folder


def write_store(data: Path, folder: Path, classes: list[str], side: int, eval_size: int, shard_images: int = 64) -> Path:
    from xbench_pl.geometry import Preprocess
    from xbench_pl.prediction_store import Store

    preprocess, store, rng = Preprocess("squash", side * 4), Store(folder), torch.Generator().manual_seed(0)
    store.write_manifest({"format": 2, "config": {"data": {"init_args": {"eval_size": eval_size}}}})
    ids = image_ids(data)
    for start in range(0, len(ids), shard_images):
        part = ids[start:start + shard_images]
        n, c = len(part), len(classes)
        store.write_shard(f"{start:08d}", {
            "dataset": "nih_bbox", "classes": classes, "image_ids": part, "input_size": preprocess.size,
            "scores": torch.rand(n, c, generator=rng, dtype=torch.float64), "labels": torch.zeros(n, c, dtype=torch.uint8),
            "saliency": torch.rand(n, c, side, side, generator=rng).half(), "original_size": torch.tensor([[512, 512]] * n),
            "affine": torch.tensor([preprocess.plan(512, 512)[1]] * n, dtype=torch.float64)})
    return folder


def classes_of(data: Path) -> list[str]:
    from xbench_pl.data.nih_bbox import NIHBoxData

    return list(NIHBoxData(root=str(data)).classes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--eval_size", type=int, default=128)
    parser.add_argument("--map_side", type=int, default=16)
    parser.add_argument("--bootstrap", type=int, default=0, help="score's bootstrap resamples (its records grow with N as test's)")
    args = parser.parse_args()
    peaks: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            root = Path(tmp) / f"n{n}"
            data = make_dataset(root / "nih", n)
            classes = classes_of(data)
            maps = write_maps(data, root / "maps", classes, args.map_side)
            store = write_store(data, root / "store", classes, args.map_side, args.eval_size)
            data_args = ["--data", "nih_bbox", "--data.root", str(data), "--data.eval_size", str(args.eval_size),
                         "--bootstrap", str(args.bootstrap)]
            commands = {
                "score --boxes": ["score", "--boxes", str(write_boxes(data, root / "boxes.csv")), *data_args, "--out", str(root / "b")],
                "score --maps": ["score", "--maps", str(maps), *data_args, "--out", str(root / "m")],
                "export --to cheXlocalize": ["export", "--predictions", str(store), "--to", "cheXlocalize", "--out", str(root / "e")],
                f"export --to cheXlocalize --size {args.eval_size}": ["export", "--predictions", str(store), "--to", "cheXlocalize",
                                                                     "--size", str(args.eval_size), "--out", str(root / "g")],
            }
            for name, command in commands.items():
                rss, seconds, _ = peak_rss_mb([sys.executable, "-m", "xbench_pl", *command])
                peaks[name, n] = rss
                print(f"{name:<34} {n:>6} images: peak RSS {rss:7.0f} MB ({seconds:.0f} s)", flush=True)
    small, large = min(args.sizes), max(args.sizes)
    if small != large:
        print()
        for name in dict.fromkeys(name for name, _ in peaks):
            print(f"{name:<34} {small} -> {large} images: {peaks[name, large] - peaks[name, small]:+.0f} MB "
                  f"({(peaks[name, large] / peaks[name, small] - 1) * 100:+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
