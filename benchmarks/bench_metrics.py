"""How fast are the grounding metrics? Prints ratios measured in one run, on this machine.

1. ``dice_iou_curve`` (one histogram pass for all thresholds) against the per-threshold loop
   that is already vectorised over maps, on N maps of S x S with 101 thresholds; both must
   give the same numbers.
2. The benchmark's per-batch metric cost (warp to the eval grid + Pointing Game + Dice/IoU
   curve + recognition) as a share of a CLIP ViT-B/16 forward (random init) on the same batch.

Run: ``python benchmarks/bench_metrics.py [--maps 1000] [--size 224] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import time

import torch

from xbench_pl.geometry import warp_to_eval_grid
from xbench_pl.metrics import BenchmarkMetrics, default_thresholds, dice_iou_curve, normalize_saliency


def loop_over_thresholds(maps: torch.Tensor, masks: torch.Tensor, thresholds: torch.Tensor):
    """The baseline: one vectorised pass over all maps per threshold."""
    truth = masks.flatten(1).sum(1).double()
    dice, iou = [], []
    for t in thresholds:
        selected = maps >= t
        predicted = selected.flatten(1).sum(1).double()
        inter = (selected & masks).flatten(1).sum(1).double()
        dice.append(2 * inter / (predicted + truth))
        iou.append(inter / (predicted + truth - inter))
    return torch.stack(dice, 1), torch.stack(iou, 1)


def best_of(repeats: int, fn):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maps", type=int, default=1000)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--classes", type=int, default=8)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    maps = normalize_saliency(torch.rand(args.maps, args.size, args.size, generator=gen))
    masks = torch.rand(args.maps, args.size, args.size, generator=gen) > 0.8
    thresholds = default_thresholds()
    t_hist, (dice, iou) = best_of(args.repeats, lambda: dice_iou_curve(maps, masks, thresholds))
    t_loop, (ref_dice, ref_iou) = best_of(args.repeats, lambda: loop_over_thresholds(maps, masks, thresholds))
    same = torch.equal(dice, ref_dice) and torch.equal(iou, ref_iou)
    print(f"dice_iou_curve, {args.maps} maps of {args.size}², {thresholds.numel()} thresholds:")
    print(f"  histogram pass {t_hist:.3f} s | per-threshold loop {t_loop:.3f} s | speed-up {t_loop / t_hist:.1f}x | identical: {same}")

    import open_clip

    model = open_clip.create_model("ViT-B-16", pretrained=None).visual.eval()
    images = torch.randn(args.batch, 3, 224, 224, generator=gen)
    with torch.inference_mode():
        t_forward, _ = best_of(args.repeats, lambda: model(images))
    classes = [f"finding {i}" for i in range(args.classes)]
    saliency = torch.randn(args.batch, args.classes, 14, 14, generator=gen)
    scores = torch.rand(args.batch, args.classes, generator=gen)
    labels = (torch.rand(args.batch, args.classes, generator=gen) > 0.7).float()
    pairs = labels.nonzero()
    eval_size = 512
    masks = torch.zeros(len(pairs), eval_size, eval_size, dtype=torch.bool)
    masks[:, 100:300, 150:350] = True
    affine = torch.tensor([[224 / 1024, 224 / 1024, 0.0, 0.0]], dtype=torch.float64).expand(len(pairs), 4)
    sizes = torch.tensor([[1024, 1024]]).expand(len(pairs), 2)

    def metric_update():
        metrics = BenchmarkMetrics(classes)
        maps = warp_to_eval_grid(saliency[pairs[:, 0], pairs[:, 1]], affine, 224, sizes, eval_size)
        metrics.update(scores, labels, maps, masks, pairs[:, 1])

    t_metric, _ = best_of(args.repeats, metric_update)
    print(f"per batch of {args.batch} images x {args.classes} findings ({len(pairs)} region pairs, eval grid {eval_size}²):")
    print(f"  metric update {t_metric * 1000:.1f} ms | CLIP ViT-B/16 image forward {t_forward * 1000:.1f} ms | "
          f"metrics = {100 * t_metric / t_forward:.1f} % of the forward")


if __name__ == "__main__":
    main()
