"""The full benchmark's real shape, per model: images/s, the projected time of all 44,014 images, and where it goes.

Per dataset of the seven (docs/datasets.md: images, findings, region pairs; original sizes from each module's
docstring) ``--limit N`` synthetic images in memory, at their dataset's original size, go through the model's own
``Preprocess`` (loading: what is left once ``--data.cache_dir`` holds the decoded images), its ``zero_shot`` at full
size with random weights (forward, under autocast for ``--precision 16-mixed|bf16-mixed``), the warp to the
512² eval grid and the metric update (``ZeroShotModel.update_metrics``: test_step without the forward) and, at
the end, ``compute`` (bootstrap included). Each image has its dataset's share of region pairs (a box on a finding,
labels random elsewhere). A first pass of 2 images warms up (numba's compilation, CUDA's kernels), and one image per dataset embeds its
findings' texts (once per run, cached), untimed. Per
model it prints images/s (loading, forward and metric update), the seconds projected to the full 44,014 images
(each dataset's per-image time x its image count), the seconds of ``compute`` at ``--limit`` (its bootstrap
grows with the pairs: not projected), the share of forward / loading / metric update / compute, and peak GPU
memory (cuda) or the process's peak RSS (cpu); and the metric update of the same maps on the device (the path
``--device`` gives them: BenchmarkMetrics on CUDA tensors) against the CPU's (numba kernels over its cores).

    python benchmarks/bench_full_scale.py --device cpu --limit 4 --models location_prior clip kad_224
    python benchmarks/bench_full_scale.py --device cuda --limit 200 --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

import xbench_pl
from xbench_pl.data.base import Batch
from xbench_pl.data.vocabulary import dataset_classes
from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.registry import available

EVAL_SIZE = 512


@dataclass(frozen=True)
class Shape:
    """One dataset of the benchmark: its images, their original (H, W), and its (image, finding) region pairs."""

    name: str
    images: int
    size: tuple[int, int]
    pairs: int


#: docs/datasets.md's default evaluation sets; pairs: images x findings with a region (chexlocalize, vindr_cxr:
#: estimated so that the seven total ≈ 15,000, as docs/scale.md); sizes: covid_rural, chexlocalize and vindr_cxr
#: vary per image (a typical size)
SHAPES = (
    Shape("nih_bbox", 880, (1024, 1024), 984),
    Shape("rsna_pneumonia", 26_684, (1024, 1024), 6_012),
    Shape("siim_pneumothorax", 12_047, (1024, 1024), 2_669),
    Shape("covid_rural", 193, (2048, 2048), 193),
    Shape("chestx_det10", 542, (1024, 1024), 1_476),
    Shape("chexlocalize", 668, (2320, 2828), 1_300),
    Shape("vindr_cxr", 3_000, (2500, 3000), 2_400),
)
FULL_IMAGES = sum(shape.images for shape in SHAPES)  # 44,014


def synthetic_batch(shape: Shape, model, start: int, count: int, device: torch.device, original: np.ndarray) -> Batch:
    """Images ``start .. start + count`` of ``shape``: the same in-memory original through the model's
    ``Preprocess`` (the loading cost), each image's share of region pairs as boxes on the eval grid."""
    classes = list(dataset_classes(shape.name))
    images, affines = zip(*(model.preprocess(original) for _ in range(count)))
    generator = torch.Generator().manual_seed(start)
    labels = (torch.rand(count, len(classes), generator=generator) < 0.1).long()
    index, masks = [], []
    for b in range(count):
        image = start + b  # image i has a region when its share of the pairs crosses an integer
        for k in range(int((image + 1) * shape.pairs / shape.images) - int(image * shape.pairs / shape.images)):
            finding = (image + k) % len(classes)
            labels[b, finding] = 1
            y, x = (int(v) for v in torch.randint(0, EVAL_SIZE // 2, (2,), generator=generator))
            mask = torch.zeros(EVAL_SIZE, EVAL_SIZE, dtype=torch.bool)
            mask[y:y + EVAL_SIZE // 4, x:x + EVAL_SIZE // 4] = True
            index.append((b, finding))
            masks.append(mask)
    return Batch(images=torch.stack(images).to(device), image_ids=[f"{shape.name}_{start + b}" for b in range(count)],
                 datasets=[shape.name] * count, classes=classes,
                 original_size=torch.tensor([original.shape] * count, device=device), affine=torch.stack(affines).to(device),
                 labels=labels.to(device), region_masks=torch.stack(masks).to(device) if masks else
                 torch.zeros(0, EVAL_SIZE, EVAL_SIZE, dtype=torch.bool, device=device),
                 region_index=torch.tensor(index, dtype=torch.long, device=device).view(-1, 2),
                 index=torch.arange(start, start + count, device=device), counted=torch.ones(count, dtype=torch.bool, device=device))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn):
    synchronize(device)
    start = time.perf_counter()
    value = fn()
    synchronize(device)
    return value, time.perf_counter() - start


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux: the process's peak RSS


def run_model(name: str, args, device: torch.device) -> dict:
    """One model over ``--limit`` images of every dataset: seconds per part, projected to the full benchmark."""
    model = build(name).to(device).eval()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16 if args.precision == "bf16-mixed" else torch.float16)
                if args.precision != "32-true" else nullcontext())
    spent = {"loading": 0.0, "forward": 0.0, "metric update": 0.0, "compute": 0.0}
    projected, metric_cpu, metric_device, images = 0.0, 0.0, 0.0, 0
    for step_index, shape in enumerate((SHAPES[0], *SHAPES)):
        warm_up = step_index == 0  # numba's compilation, CUDA's kernels: untimed
        model.add_dataset(shape.name, list(dataset_classes(shape.name)))
        original = np.random.default_rng(0).random(shape.size, dtype=np.float32)
        count = 2 if warm_up else min(args.limit, shape.images)
        part = dict.fromkeys(spent, 0.0)
        with torch.inference_mode(), autocast:  # the dataset's text/query embeddings, made once per run: untimed
            model.batch_output(synthetic_batch(shape, model, 0, 1, device, original))
        for start in range(0, count, args.batch):
            batch, seconds = timed(device, lambda: synthetic_batch(shape, model, start, min(args.batch, count - start), device, original))
            part["loading"] += seconds
            with torch.inference_mode():
                with autocast:
                    output, seconds = timed(device, lambda: model.batch_output(batch))
                part["forward"] += seconds
                output = output.promoted()
                step, seconds = timed(device, lambda: model.update_metrics(batch, output))
                part["metric update"] += seconds
                metric_device += seconds
                if device.type != "cpu":  # the same maps through the CPU's metrics (numba kernels)
                    cpu = BenchmarkMetrics(batch.classes, model.normalize, model.fixed_threshold, model.score_threshold, bootstrap=0)
                    cpu_args = [t.cpu() for t in (output.scores[batch.counted], batch.labels, step.maps, step.masks, step.pairs[:, 1])]
                    metric_cpu += timed(torch.device("cpu"), lambda: cpu.update(*cpu_args))[1]
        with torch.inference_mode():
            part["compute"] += timed(device, lambda: model.benchmark[shape.name].compute())[1]
        if warm_up:
            model.benchmark.clear()
            metric_cpu = metric_device = 0.0
            continue
        for key, value in part.items():
            spent[key] += value
        projected += (part["loading"] + part["forward"] + part["metric update"]) / count * shape.images
        images += count
    total = sum(spent.values())
    return {"model": name, "input": model.preprocess.size, "images": images, "images/s": images / (total - spent["compute"]),
            "compute (s)": spent["compute"],
            "full (s)": projected, **{k: v / total for k, v in spent.items()}, "peak (GB)": peak_memory_gb(device),
            "metric device (ms/img)": 1e3 * metric_device / images,
            "metric cpu numba (ms/img)": 1e3 * metric_cpu / images if device.type != "cpu" else None}


def build(name: str):
    """A registered model at full size, with random weights (``random_init``: no file needed, stand-in tokenizers)."""
    return xbench_pl.create_model(name, random_init=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--limit", type=int, default=50, help="images per dataset (of 880 .. 26,684)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--precision", choices=("32-true", "16-mixed", "bf16-mixed"), default="32-true")
    parser.add_argument("--models", nargs="*", default=[m for m in available("models") if m != "reader"],
                        help="registered models (default: every one but the reader, which needs annotation files)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    warnings.filterwarnings("ignore")  # the random-weights note, once per model
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}; {args.precision}; {args.limit} images per dataset of {len(SHAPES)} (full: {FULL_IMAGES:,}); "
          f"eval grid {EVAL_SIZE}²; batch {args.batch}; torch {torch.__version__}; load average {os.getloadavg()[0]:.1f}")
    header = ["model", "input", "img/s", "full 44,014 (s)", "compute (s)", "forward", "loading", "metric update", "compute",
              "peak GPU (GB)" if device.type == "cuda" else "peak RSS (GB)", f"metric on {device.type} (ms/img)",
              "metric CPU numba (ms/img)"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name in args.models:
        row = run_model(name, args, device)
        numba = row["metric cpu numba (ms/img)"]
        print(f"| `{name}` | {row['input']} | {row['images/s']:.2f} | {row['full (s)']:,.0f} | {row['compute (s)']:.1f} | {row['forward']:.0%} | "
              f"{row['loading']:.0%} | {row['metric update']:.0%} | {row['compute']:.0%} | {row['peak (GB)']:.2f} | "
              f"{row['metric device (ms/img)']:.1f} | {'–' if numba is None else f'{numba:.1f}'} |", flush=True)


if __name__ == "__main__":
    main()
