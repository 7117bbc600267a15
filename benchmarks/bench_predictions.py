"""The prediction store: its size, re-scoring speed, and what a float16 store changes. Prints numbers measured in one run.

1. Store size per 1,000 images x 10 findings at native grids 14², 16², 32² (and 64²), float16 and
   float32: real shards (``encode_shard``, 64 images each, as ``test --predictions`` writes them), and
   the ratio to format 1 shards (``legacy_shard``: the ``XBPSHRD1`` header + ``torch.save`` pickle).
1b. Write speed: encoding and atomically writing (fsync, rename) those shards, format 2 against
   format 1, interleaved, best of ``--repeats``.
2. Re-scoring throughput (what ``score`` does per image: the dataset's regions rasterised on the
   eval grid, the stored maps warped there and every benchmark metric updated, through
   ``ZeroShotModel.test_step``), images/s, on synthetic records: 10 findings, 2 boxed findings per
   image, E = 512, 14² maps; best of ``--repeats``.
3. float16 against float32 stores on the synthetic demo (12 images, 8 findings) for the
   weight-free baselines: the largest change of any number in the table.

Run: ``python benchmarks/bench_predictions.py [--images 256] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import struct
import tempfile
import time
from pathlib import Path

import torch

from xbench_pl import create_datamodule, create_model
from xbench_pl.data.base import Record, XBenchDataset
from xbench_pl.data.regions import Box
from xbench_pl.outputs import atomic_write
from xbench_pl.prediction_store import LEGACY_MAGIC, encode_shard
from xbench_pl.predictions import Replayer, replay

FINDINGS = [f"finding_{i}" for i in range(10)]


def shard_of(ids: list[str], classes: list[str], grid: int, dtype: torch.dtype, input_size: int = 224, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n, c = len(ids), len(classes)
    return {"dataset": "bench", "classes": classes, "input_size": input_size, "image_ids": ids,
            "scores": torch.rand(n, c, generator=g, dtype=torch.float64),
            "saliency": torch.rand(n, c, grid, grid, generator=g).to(dtype),
            "affine": torch.tensor([[224 / 1024, 224 / 1024, 0.0, 0.0]], dtype=torch.float64).expand(n, 4).clone(),
            "original_size": torch.tensor([[1024, 1024]]).expand(n, 2).clone(),
            "labels": torch.randint(0, 2, (n, c), generator=g, dtype=torch.uint8)}


def legacy_shard(shard: dict) -> bytes:
    """A format 1 shard, as xbench_pl wrote them before safetensors: the baseline."""
    buffer = io.BytesIO()
    torch.save(shard, buffer)
    payload = buffer.getvalue()
    return LEGACY_MAGIC + struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + payload


def shards(images: int, grid: int, dtype: torch.dtype, per_shard: int = 64) -> list[dict]:
    return [shard_of([f"{i:08d}.png" for i in range(start, min(images, start + per_shard))], FINDINGS, grid, dtype, seed=start)
            for start in range(0, images, per_shard)]


def store_size(parts: list[dict], encode=encode_shard) -> int:
    return sum(len(encode(shard)) for shard in parts)


def write_seconds(parts: list[dict], repeats: int) -> dict[str, float]:
    """Best time to encode and atomically write every shard, per format (runs interleaved: same machine state)."""
    best = {"format 2": math.inf, "format 1": math.inf}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(repeats):
            for name, encode in (("format 2", encode_shard), ("format 1", legacy_shard)):
                start = time.perf_counter()
                for i, shard in enumerate(parts):
                    atomic_write(Path(folder) / f"{i:05d}", encode(shard))
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def synthetic_dataset(images: int, eval_size: int = 512) -> XBenchDataset:
    g = torch.Generator().manual_seed(1)
    records = []
    for i in range(images):
        chosen = torch.randperm(len(FINDINGS), generator=g)[:2].tolist()
        regions = {}
        for c in chosen:
            x0, y0 = (float(v) for v in torch.randint(0, 700, (2,), generator=g))
            w, h = (float(v) for v in torch.randint(40, 300, (2,), generator=g))
            regions[FINDINGS[c]] = [Box(x0, y0, x0 + w, y0 + h)]
        labels = {FINDINGS[c]: 1 for c in chosen}
        records.append(Record(f"{i:08d}.png", Path("unused.png"), labels, regions))
    return XBenchDataset("bench", records, FINDINGS, None, eval_size)


def rescore_rate(images: int, repeats: int) -> tuple[float, float]:
    dataset = synthetic_dataset(images)
    shards = [shard_of([r.image_id for r in dataset.records[s:s + 64]], FINDINGS, 14, torch.float16, seed=s)
              for s in range(0, images, 64)]
    best, in_metrics = math.inf, math.inf
    for _ in range(repeats):
        replayer = Replayer()
        replayer.add_dataset("bench", FINDINGS)
        metrics, spent = replayer.benchmark["bench"], [0.0]
        update = metrics.update

        def timed(*args, **kwargs):  # the share spent in BenchmarkMetrics.update (the same cost a test run pays)
            start = time.perf_counter()
            update(*args, **kwargs)
            spent[0] += time.perf_counter() - start

        metrics.update = timed
        start = time.perf_counter()
        for shard in shards:
            replay(replayer, dataset, shard)
        with torch.inference_mode():
            metrics.compute()
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best, in_metrics = elapsed, spent[0]
    return images / best, best, in_metrics


def demo_shards(model_name: str, dtype: torch.dtype) -> tuple[XBenchDataset, list[dict]]:
    model = create_model(model_name).eval()
    dm = create_datamodule("demo", preprocess=model.preprocess)
    dm.setup("test")
    shards = []
    with torch.inference_mode():
        for batch in dm.test_dataloader():
            out = model.zero_shot(batch.images, batch.classes)
            shards.append({"dataset": "demo", "classes": batch.classes, "input_size": batch.images.shape[-1],
                           "image_ids": batch.image_ids, "scores": out.scores.double(), "saliency": out.saliency.to(dtype),
                           "affine": batch.affine, "original_size": batch.original_size, "labels": batch.labels.to(torch.uint8)})
    return dm.test_set, shards


def demo_table(model_name: str, dtype: torch.dtype) -> dict:
    dataset, shards = demo_shards(model_name, dtype)
    replayer = Replayer()
    replayer.add_dataset("demo", dataset.classes)
    for shard in shards:
        replay(replayer, dataset, shard)
    with torch.inference_mode():
        return replayer.benchmark["demo"].compute()


def largest_change(a: dict, b: dict) -> tuple[float, str, int]:
    """The largest |a - b| over every number of two tables, where it is, and how many numbers differ."""
    worst, where, changed = 0.0, "", 0
    rows = [("mean", a["mean"], b["mean"])] + [(c, a["classes"][c], b["classes"][c]) for c in a["classes"]]
    for name, ra, rb in rows:
        for key, va in ra.items():
            vb = rb[key]
            if va is None or vb is None:
                changed += (va is None) != (vb is None)
                continue
            changed += va != vb
            if abs(va - vb) > worst:
                worst, where = abs(va - vb), f"{name}/{key}"
    return worst, where, changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256, help="images re-scored for the throughput")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("store size per 1,000 images x 10 findings (shards of 64 images), format 2 (safetensors) / format 1 (pickle):")
    for grid in (14, 16, 32, 64):
        row = []
        for name, dtype in (("float16", torch.float16), ("float32", torch.float32)):
            parts = shards(1000, grid, dtype)
            new, old = store_size(parts), store_size(parts, legacy_shard)
            row.append(f"{name} {new / 1e6:7.2f} MB ({new / old:.3f}x of {old / 1e6:.2f})")
        print(f"  {grid:>2}²: " + " | ".join(row))
    for grid in (14, 32):
        seconds = write_seconds(shards(1000, grid, torch.float16), args.repeats * 3)
        print(f"write 1,000 images x 10 findings, {grid}² float16 (encode, fsync, rename): format 2 {seconds['format 2']:.3f} s, "
              f"format 1 {seconds['format 1']:.3f} s ({seconds['format 2'] / seconds['format 1']:.2f}x)")
    rate, seconds, in_metrics = rescore_rate(args.images, args.repeats)
    print(f"re-scoring {args.images} images x 10 findings (2 regions each, E = 512, 14² float16 maps): "
          f"{seconds:.2f} s, {rate:.2f} images/s; {100 * in_metrics / seconds:.0f} % of it in BenchmarkMetrics.update")
    print("float16 vs float32 store, synthetic demo (12 images x 8 findings), every number of the table:")
    for name in ("center", "location_prior"):
        worst, where, changed = largest_change(demo_table(name, torch.float32), demo_table(name, torch.float16))
        print(f"  {name}: largest change {worst:.3g} ({where or '-'}), {changed} number(s) differ")


if __name__ == "__main__":
    main()
