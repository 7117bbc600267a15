"""Scale on paper: forward FLOPs per image of each model, its measured CPU rate, and the metric cost per region pair.

Per model (random weights; FLOPs do not depend on them): the forward FLOPs of ``zero_shot`` on one image
(``torch.utils.flop_counter.FlopCounterMode``: matrix products and convolutions, which are nearly all of
it; the query/text embeddings are cached first, as in a run, so they are not counted) and the measured CPU
rate of ``zero_shot`` (batch ``--batch``, best of ``--repeats``). Then the CPU cost of the metrics per
region pair on the 512² eval grid (``BenchmarkMetrics.update``: warp + every statistic, fused kernels) and
per image without a region (recognition only). ``docs/scale.md`` turns these into the time of the
full seven-dataset benchmark.

    python benchmarks/bench_scale.py [--models clip kad_224 kad_512 kad_1024 devide medklip mavl carzero] [--batch 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import xbench_pl
from xbench_pl.geometry import warp_to_eval_grid
from xbench_pl.metrics import BenchmarkMetrics, kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_query_models import CXR14, best_of_interleaved, carzero_tokenizer, medklip_family_files, write_tokenizer  # noqa: E402


def model_kwargs(names: list[str], scratch: Path) -> dict[str, dict]:
    """create_model kwargs: the stand-in tokenizer and knowledge files of bench_query_models."""
    kwargs = {name: {} for name in names}
    if any(n.startswith("kad") or n == "devide" for n in names):
        tokenizer = write_tokenizer(scratch / "tokenizer")
        kwargs.update({n: {"text": tokenizer} for n in names if n.startswith("kad") or n == "devide"})
    if {"medklip", "mavl"} & set(names):
        kwargs.update({k: v for k, v in medklip_family_files(scratch).items() if k in names})
    if "carzero" in names:
        kwargs["carzero"] = {"text": carzero_tokenizer(scratch / "bioclinicalmpbert")}
    return kwargs


def forward_cost(model, batch: int, repeats: int) -> tuple[float, float, int]:
    """(GFLOPs per image, CPU seconds per image, input size) of ``zero_shot`` on CXR14's 14 findings."""
    size = model.preprocess.size
    images = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # as bench_query_models (the query caches are filled and hit under no_grad)
        model.zero_shot(images[:1], CXR14)  # fills the text/query caches
        counter = FlopCounterMode(display=False)
        fast_path = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)  # the fused inference attention op is invisible to the counter
        try:
            with counter:
                model.zero_shot(images[:1], CXR14)
        finally:
            torch.backends.mha.set_fastpath_enabled(fast_path)
        seconds, = best_of_interleaved(repeats, lambda: model.zero_shot(images, CXR14))
    return counter.get_total_flops() / 1e9, seconds / batch, size


def metric_cost(repeats: int, eval_size: int = 512) -> tuple[float, float]:
    """CPU seconds of ``BenchmarkMetrics.update`` per region pair and per image without one (14 findings, 14² maps)."""
    gen = torch.Generator().manual_seed(0)
    images, pairs = 16, 16  # one region pair per image

    def update(with_pairs: bool):
        metrics = BenchmarkMetrics(CXR14)
        saliency = torch.randn(images, len(CXR14), 14, 14, generator=gen)
        scores, labels = torch.rand(images, len(CXR14), generator=gen), torch.zeros(images, len(CXR14))
        index = torch.stack((torch.arange(pairs), torch.arange(pairs) % len(CXR14)), 1)[: pairs if with_pairs else 0]
        labels[index[:, 0], index[:, 1]] = 1
        masks = torch.zeros(len(index), eval_size, eval_size, dtype=torch.bool)
        masks[:, 100:300, 150:350] = True
        affine = torch.tensor([[224 / 1024, 224 / 1024, 0.0, 0.0]], dtype=torch.float64).expand(len(index), 4)
        sizes = torch.tensor([[1024, 1024]]).expand(len(index), 2)
        maps = warp_to_eval_grid(saliency[index[:, 0], index[:, 1]], affine, 224, sizes, eval_size)
        metrics.update(scores, labels, maps, masks, index[:, 1], image_keys=index[:, 0], saliency=saliency)

    update(True)  # loads the compiled kernels
    with_pairs, without = best_of_interleaved(repeats, lambda: update(True), lambda: update(False))
    return (with_pairs - without) / pairs, without / images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["clip", "kad_224", "kad_512", "kad_1024", "devide", "medklip", "mavl", "carzero"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*RANDOM weights.*")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, batch {args.batch}, best of {args.repeats}, "
          f"metric kernels {'on' if kernels.available() else 'off'}")
    pair, image = metric_cost(args.repeats)
    print(f"metrics (CPU): {pair * 1000:.1f} ms per region pair (512² eval grid), {image * 1000:.2f} ms per image without one")
    print("| model | input | GFLOPs / image | CPU s / image |")
    print("|---|---|---|---|")
    kwargs = model_kwargs(args.models, Path(tempfile.mkdtemp()))
    for name in args.models:
        start = time.perf_counter()
        model = xbench_pl.create_model(name, random_init=True, **kwargs[name]).eval()
        gflops, seconds, size = forward_cost(model, args.batch, args.repeats)
        print(f"| {name} | {size} px | {gflops:.1f} | {seconds:.3f} |  ({time.perf_counter() - start:.0f} s)", flush=True)
        del model


if __name__ == "__main__":
    main()
