"""End to end: how much does the benchmark add to the model's forward, and does its memory grow with the data?

1. Throughput. ``test`` (the CLI's own code, in this process) with a CLIP ViT-B/16 (random init) on N synthetic
   NIH-format images (the demo's boxed phantoms copied under new ids, ``bench_callbacks_memory.make_dataset``),
   decode cache filled beforehand. The run's phases are timed inside it (``PHASES``: the functions are wrapped),
   so load changes on a shared machine hit the forward and the rest alike: the run (``trainer.test`` and the
   report), the ``zero_shot`` forward in it (less the one-off text embeddings), loading, warping, metric update
   and compute, report, and the rest (Lightning's loop, setup). Overhead = (run - forward - text embeddings) /
   forward (goal of issue 14: <= 15 % on CPU). Then the bare ``zero_shot`` on the same preprocessed batches,
   again, as a cross-check.
2. Memory. Peak RSS (``wait4``) of ``test`` with the ``uniform`` baseline (no network: what grows is the
   benchmark's) on ``--rss_sizes`` images; goal: within 10 %.

``--profile`` instead runs ``test`` in this process under cProfile and prints the top functions.

    python benchmarks/bench_end_to_end.py [--images 64] [--repeats 1] [--num_workers 0] [--rss_sizes 100 1000]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_callbacks_memory import make_dataset, peak_rss_mb  # noqa: E402

CLIP = ["--model", "clip", "--model.random_init", "true"]


def test_command(model: list[str], data: Path, cache: Path, out: Path, extra: list[str]) -> list[str]:
    return ["-m", "xbench_pl", "test", *model, "--data", "nih_bbox", "--data.root", str(data),
            "--data.cache_dir", str(cache), "--out", str(out), *extra]


def fill_cache(data: Path, cache: Path) -> None:
    from xbench_pl.data.cache import ImageStore

    store = ImageStore(cache)
    for path in sorted((data / "images").iterdir()):
        store.load(path)


def bare_forward(data: Path, cache: Path, repeats: int) -> tuple[float, int]:
    """Best-of-``repeats`` seconds of ``zero_shot`` over every test batch (preprocessed beforehand), and the image count."""
    from xbench_pl.data.nih_bbox import NIHBoxDataModule
    from xbench_pl.models.open_clip_model import OpenCLIPModel

    model = OpenCLIPModel("clip-ViT-B-16", random_init=True).eval()
    datamodule = NIHBoxDataModule(root=str(data), cache_dir=str(cache), preprocess=model.preprocess)
    datamodule.setup("test")
    batches = [(batch.images, batch.classes) for batch in datamodule.test_dataloader()]
    best = float("inf")
    with torch.inference_mode():
        model.zero_shot(*batches[0])  # text embeddings are cached per class list: fill before timing
        for _ in range(repeats):
            start = time.perf_counter()
            for images, classes in batches:
                model.zero_shot(images, classes)
            best = min(best, time.perf_counter() - start)
    return best, sum(len(images) for images, _ in batches)


#: where a run's time goes: phase -> the functions timed for it (module, class or None, attribute); calls made
#: where the name is looked up at call time (models.base's warp_to_eval_grid, cli's publish_report)
PHASES = {
    "zero_shot forward": [("xbench_pl.models.open_clip_model", "OpenCLIPModel", "zero_shot")],
    "text embeddings (once)": [("xbench_pl.models.open_clip_model", "OpenCLIPModel", "text_embeddings")],
    "loading (cached decode, preprocess, regions, collate)": [("xbench_pl.data.base", "XBenchDataset", "__getitem__"),
                                                              ("xbench_pl.data.base", None, "collate")],
    "warp to the eval grid": [("xbench_pl.models.base", None, "warp_to_eval_grid")],
    "metric update": [("xbench_pl.metrics.benchmark", "BenchmarkMetrics", "update")],
    "metric compute (bootstrap)": [("xbench_pl.metrics.benchmark", "BenchmarkMetrics", "compute")],
    "report": [("xbench_pl.commands.trainer", None, "publish_report")],
    "run": [("xbench_pl.commands.trainer", "XBenchCLI", "_run_subcommand")],  # trainer.test and the hooks around it
}


def timed_phases() -> dict[str, float]:
    """Wrap every function of ``PHASES`` to add its wall time to the returned dict (this process only)."""
    import importlib

    spent = dict.fromkeys(PHASES, 0.0)
    for phase, targets in PHASES.items():
        for module, owner, attribute in targets:
            holder = importlib.import_module(module)
            holder = getattr(holder, owner) if owner else holder
            original = getattr(holder, attribute)

            def wrapper(*args, _original=original, _phase=phase, **kwargs):
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    spent[_phase] += time.perf_counter() - start

            setattr(holder, attribute, wrapper)
    return spent


def throughput(args, tmp: Path) -> None:
    from xbench_pl.commands import main as cli_main

    data = make_dataset(tmp / "nih", args.images)
    cache = tmp / "cache"
    fill_cache(data, cache)
    spent = timed_phases()
    argv, sys.argv = sys.argv, sys.argv[:1]  # the CLI is given its arguments, not this script's
    try:
        cli_main(test_command(CLIP, data, cache, tmp / "out", ["--data.num_workers", str(args.num_workers)])[2:])
    finally:
        sys.argv = argv
    spent = dict(spent)  # this run's (the wrappers stay in place and the bare pass below calls zero_shot)
    run, text = spent.pop("run"), spent.pop("text embeddings (once)")
    forward = spent.pop("zero_shot forward") - text
    n = args.images
    print(f"\ntest, CLIP ViT-B/16 random init, {n} images, {torch.get_num_threads()} threads, num_workers {args.num_workers}, "
          "decode cache filled; phases timed inside the run:")
    print(f"  run (trainer.test + report): {run:.1f} s = {n / run:.2f} images/s; of it the zero_shot forward {forward:.1f} s "
          f"= {n / forward:.2f} images/s, text embeddings (once) {text:.1f} s")
    for phase, seconds in [*spent.items(), ("Lightning loop, setup, other", run - forward - text - sum(spent.values()))]:
        print(f"    {phase:<55} {seconds:7.2f} s  {100 * seconds / forward:5.1f} % of the forward")
    print(f"  overhead of the benchmark (run - forward - text embeddings): {100 * (run - forward - text) / forward:.1f} % "
          "of the forward (goal <= 15 %)")
    bare, counted = bare_forward(data, cache, args.repeats)
    print(f"  bare zero_shot forward on the same preprocessed batches, afterwards in this process: {bare:.1f} s = "
          f"{counted / bare:.2f} images/s ({100 * (run - text - bare) / bare:.1f} % overhead against it)")


def memory(args, tmp: Path) -> None:
    cache = tmp / "cache"
    peaks = {}
    for n in args.rss_sizes:
        data = make_dataset(tmp / f"rss{n}", n)
        fill_cache(data, cache)
        rss, seconds, _ = peak_rss_mb([sys.executable, *test_command(["--model", "uniform"], data, cache, tmp / f"rss_out{n}", [])])
        peaks[n] = rss
        print(f"  peak RSS of test, uniform baseline, {n:>5} images: {rss:7.0f} MB ({seconds:.1f} s)", flush=True)
    small, large = min(peaks), max(peaks)
    print(f"  {small} -> {large} images: {100 * (peaks[large] / peaks[small] - 1):+.1f} % (goal: within 10 %)")


def profile(args, tmp: Path) -> None:
    from xbench_pl.commands import main as cli_main

    data = make_dataset(tmp / "profiled", args.images)
    cache = tmp / "cache"
    fill_cache(data, cache)
    profiler = cProfile.Profile()
    profiler.runcall(cli_main, test_command(CLIP, data, cache, tmp / "profile_out", ["--data.num_workers", str(args.num_workers)])[2:])
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats("xbench_pl", args.top)  # where the project's own steps spend it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="bare forward passes (best of)")
    parser.add_argument("--num_workers", type=int, default=0)
    parser.add_argument("--rss_sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--parts", default="throughput,memory")
    parser.add_argument("--profile", action="store_true", help="profile one in-process run of --images instead")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile:
            profile(args, Path(tmp))
            return 0
        if "throughput" in args.parts:
            throughput(args, Path(tmp))
        if "memory" in args.parts:
            memory(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
