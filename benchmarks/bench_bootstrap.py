"""What do the bootstrap intervals cost at the end of a test run? Prints seconds measured on this machine.

1. ``BenchmarkMetrics.compute`` on ``--images`` images x ``--classes`` findings (two regions per image on a
   64² grid, patients of ~3 images each) without and with ``--resamples`` resamples: the difference is the
   bootstrap (pair keys, image-level keys and recognition keys on the same draws).
2. ``recognition.replicate_recognition`` alone (AUROC, AUPRC, F1, accuracy and ECE per replicate): the
   part that grows with images x findings x resamples.

Timings are best-of ``--repeats``. Run: ``python benchmarks/bench_bootstrap.py [--images 1000] [--classes 14]
[--resamples 1000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import time

import torch

from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.functional import bootstrap_weights
from xbench_pl.metrics.recognition import replicate_recognition
from xbench_pl.metrics.resampling import image_key, unit_key


def filled(images: int, classes: int, resamples: int, batch: int = 50, size: int = 64) -> BenchmarkMetrics:
    gen = torch.Generator().manual_seed(0)
    bench = BenchmarkMetrics([f"F{k}" for k in range(classes)], bootstrap=resamples)
    masks = torch.zeros(2 * batch, size, size, dtype=torch.bool)
    masks[:, 10:30, 12:40] = True
    for start in range(0, images, batch):
        ids = [f"img{i}" for i in range(start, start + batch)]
        keys = torch.tensor([image_key(i) for i in ids])
        units = torch.tensor([unit_key(i, f"patient{(start + j) // 3}") for j, i in enumerate(ids)])
        pair_image = torch.arange(batch).repeat_interleave(2)
        bench.update(torch.rand(batch, classes, generator=gen), (torch.rand(batch, classes, generator=gen) < 0.2).long(),
                     torch.rand(2 * batch, size, size, generator=gen), masks, torch.randint(0, classes, (2 * batch,), generator=gen),
                     image_keys=keys[pair_image], unit_keys=units[pair_image], sample_keys=keys, sample_units=units,
                     saliency=torch.rand(batch, classes, 8, 8, generator=gen))
    return bench


def best_of(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--classes", type=int, default=14)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.images} images x {args.classes} findings, {args.resamples} resamples, {torch.get_num_threads()} threads")
    for resamples in (0, args.resamples):
        bench = filled(args.images, args.classes, resamples)
        print(f"  compute, bootstrap={resamples}: {best_of(args.repeats, bench.compute):.2f} s")
    gen = torch.Generator().manual_seed(1)
    scores = torch.rand(args.images, args.classes, generator=gen, dtype=torch.float64)
    labels = (torch.rand(args.images, args.classes, generator=gen) < 0.2).long()
    weights = bootstrap_weights(args.images, args.resamples, 0)
    print(f"  replicate_recognition alone: {best_of(args.repeats, lambda: replicate_recognition(scores, labels, weights)):.2f} s")


if __name__ == "__main__":
    main()
