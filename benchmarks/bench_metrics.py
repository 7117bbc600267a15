"""How fast are the grounding metrics? Prints ratios measured in one run, on this machine.

1. ``dice_iou_curve`` on N maps of S x S (a box mask, 101 thresholds) three ways: the fused kernel
   (``xbench_pl/metrics/kernels.py``, numba), the torch reference (one histogram pass with full-size
   temporaries) and the lean per-threshold loop (``B = M >= t; (B & R).sum(1); B.sum(1)`` per threshold,
   vectorised over maps, Dice only), against the read floor (``maps.sum()``: reading the maps once).
   All must give the same Dice. Goals (issue 14): kernel >= 50x the lean loop, <= 20x the read floor.
2. Per region pair on the 512² eval grid, each statistic of ``BenchmarkMetrics``: the torch reference
   against the kernels (same numbers; energy_pg within 1e-15, see kernels.py).
3. The benchmark's per-batch metric cost (warp to the eval grid + every statistic + recognition) as a
   share of a CLIP ViT-B/16 image forward (random init) on the same batch, kernels on and off.
4. ``parallel``: the numba kernels' speed-up over one thread (every statistic of ``--pairs`` maps of 512²; the
   kernels use torch's thread count, a DDP rank's share of the cores).
5. ``device``: on ``--device`` (cpu or cuda), the vectorised torch path (``device_kernels.py``, the one CUDA maps
   take; on the CPU under its switch) against numba on the CPU's cores for the same maps and the read floor
   (``maps.sum()`` on that device): the counts of every statistic, and the Dice/IoU curve alone.
With ``--device cuda``, part 1 also runs on CUDA tensors (the torch path).

Timings are best-of ``--repeats`` and interleaved (each round times every variant once), so a busy
machine slows all variants alike; compare the ratios. Run:
``python benchmarks/bench_metrics.py [--maps 1024] [--size 224] [--repeats 3] [--device cpu|cuda] [--parts ...]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch

from xbench_pl.geometry import warp_to_eval_grid
from xbench_pl.metrics import BenchmarkMetrics, default_thresholds, dice_iou_curve, functional, kernels, normalize_saliency


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def lean_loop(maps: torch.Tensor, masks: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """The baseline of issue 14: one vectorised pass over all maps per threshold, Dice only."""
    flat, region = maps.flatten(1), masks.flatten(1)
    truth = region.sum(1).double()
    dice = []
    for t in thresholds.tolist():
        selected = flat >= t
        inter, predicted = (selected & region).sum(1).double(), selected.sum(1).double()
        dice.append(2 * inter / (predicted + truth))
    return torch.stack(dice, 1)


def interleaved(fns: dict, repeats: int, once: tuple = ()) -> tuple[dict, dict]:
    """Best-of-``repeats`` seconds per function, every round timing each once (``once``: first round only)."""
    best, out = {k: float("inf") for k in fns}, {}
    for round_ in range(repeats):
        for name, fn in fns.items():
            if round_ and name in once:
                continue
            synchronize()
            start = time.perf_counter()
            out[name] = fn()
            synchronize()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, out


def curve_part(args, device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    maps = normalize_saliency(torch.rand(args.maps, args.size, args.size, generator=gen)).to(device)
    masks = torch.zeros(args.maps, args.size, args.size, dtype=torch.bool, device=device)
    masks[:, args.size // 4: args.size // 2, args.size // 3: 2 * args.size // 3] = True
    thresholds = default_thresholds().to(device)

    def reference():
        with kernels.disabled():
            return dice_iou_curve(maps, masks, thresholds)[0]

    fns = {"read floor (maps.sum())": lambda: maps.sum(), "dice_iou_curve": lambda: dice_iou_curve(maps, masks, thresholds)[0],
           "torch reference": reference, "lean per-threshold loop": lambda: lean_loop(maps, masks, thresholds)}
    if args.skip_loop:
        fns.pop("lean per-threshold loop")
    best, out = interleaved(fns, args.repeats, once=("lean per-threshold loop",))
    path = {"numba": "numba kernel", "torch": "vectorised torch path", None: "torch reference"}[kernels.path(maps, masks)]
    print(f"dice_iou_curve on {device}, {args.maps} maps of {args.size}², box mask, {thresholds.numel()} thresholds ({path}):")
    floor, fast = best["read floor (maps.sum())"], best["dice_iou_curve"]
    for name, seconds in best.items():
        print(f"  {name:<26} {seconds * 1000:9.1f} ms   {seconds / floor:7.1f}x read floor   {seconds / fast:7.1f}x dice_iou_curve")
    same = all(torch.equal(out["dice_iou_curve"], out[k]) for k in ("torch reference", "lean per-threshold loop") if k in out)
    print(f"  identical Dice: {same}")
    goals = [f"{fast / floor:.1f}x the read floor (goal <= 20x, aim 10x)"]
    if "lean per-threshold loop" in best:
        goals.append(f"{best['lean per-threshold loop'] / fast:.0f}x over the lean loop (goal >= 50x)")
    print("  dice_iou_curve: " + ", ".join(goals))


def pair_part(args) -> None:
    gen = torch.Generator().manual_seed(1)
    n, e = args.pairs, 512
    maps = torch.nn.functional.interpolate(torch.randn(n, 1, 14, 14, generator=gen), size=e, mode="bilinear")[:, 0].contiguous()
    masks = torch.zeros(n, e, e, dtype=torch.bool)
    masks[:, 100:300, 150:350] = True
    thresholds = default_thresholds()

    def both(fn_ref, fn_fast):
        def ref():
            with kernels.disabled():
                return fn_ref()
        return ref, fn_fast

    normal = lambda: normalize_saliency(maps)  # noqa: E731  (the reference normalises first)
    stats = {
        "dice/iou curve": both(lambda: dice_iou_curve(normal(), masks, thresholds), lambda: kernels.dice_iou_curve(maps, masks, thresholds, "minmax")),
        "pointing game": both(lambda: functional.pointing_game(maps, masks), lambda: functional.pointing_game(maps, masks)),
        "dice/iou otsu": both(lambda: functional.otsu_dice_iou(normal(), masks), lambda: kernels.otsu_dice_iou(maps, masks, "minmax")),
        "energy_pg": both(lambda: functional.energy_pointing(normal(), masks), lambda: kernels.energy_pointing(maps, masks, "minmax")),
        "pixel_auroc": both(lambda: functional.pixel_auroc(maps, masks), lambda: functional.pixel_auroc(maps, masks)),
        "all, one fused pass": both(lambda: None, lambda: kernels.grounding_statistics(maps, masks, thresholds, "minmax")),
    }
    fns = {}
    for name, (ref, fast) in stats.items():
        fns[name + " ref"], fns[name + " kernel"] = ref, fast
    best, _ = interleaved(fns, args.repeats)
    print(f"per region pair, eval grid {e}² ({n} pairs, maps bilinear from 14²), ms per pair:")
    print(f"  {'statistic':<22} {'torch reference':>16} {'kernel':>9} {'speed-up':>9}")
    for name in stats:
        ref, fast = best[name + " ref"] / n * 1000, best[name + " kernel"] / n * 1000
        ref_text = f"{ref:16.2f}" if name != "all, one fused pass" else f"{'':>16}"
        speed = f"{ref / fast:8.1f}x" if name != "all, one fused pass" else ""
        print(f"  {name:<22} {ref_text} {fast:9.2f} {speed:>9}")


def forward_part(args) -> None:
    import open_clip

    gen = torch.Generator().manual_seed(2)
    model = open_clip.create_model("ViT-B-16", pretrained=None).visual.eval()
    images = torch.randn(args.batch, 3, 224, 224, generator=gen)
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
    keys = pairs[:, 0].long()

    def metric_update():
        metrics = BenchmarkMetrics(classes)
        maps = warp_to_eval_grid(saliency[pairs[:, 0], pairs[:, 1]], affine, 224, sizes, eval_size)
        metrics.update(scores, labels, maps, masks, pairs[:, 1], image_keys=keys, saliency=saliency)

    def reference_update():
        with kernels.disabled():
            metric_update()

    def forward():
        with torch.inference_mode():
            return model(images)

    best, _ = interleaved({"forward": forward, "kernel": metric_update, "reference": reference_update}, args.repeats)
    print(f"per batch of {args.batch} images x {args.classes} findings ({len(pairs)} region pairs, eval grid {eval_size}²):")
    print(f"  CLIP ViT-B/16 image forward {best['forward'] * 1000:.1f} ms")
    for name in ("reference", "kernel"):
        print(f"  metric update, {name:<9} {best[name] * 1000:8.1f} ms = {100 * best[name] / best['forward']:5.1f} % of the forward")


def pairs_512(n: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` smooth maps on the 512² eval grid (bilinear from 14²) and box regions."""
    gen = torch.Generator().manual_seed(3)
    maps = torch.nn.functional.interpolate(torch.randn(n, 1, 14, 14, generator=gen), size=512, mode="bilinear")[:, 0].contiguous()
    masks = torch.zeros(n, 512, 512, dtype=torch.bool)
    masks[:, 100:300, 150:350] = True
    return maps.to(device), masks.to(device)


def with_threads(k: int, fn):
    """``fn`` with torch's (and so the kernels') thread count set to ``k``."""
    def run():
        before = torch.get_num_threads()
        torch.set_num_threads(k)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)
    return run


def parallel_part(args) -> None:
    import numba

    maps, masks = pairs_512(args.pairs)
    thresholds = default_thresholds()
    threads = torch.get_num_threads()
    counts = lambda: kernels.grounding_statistics(maps, masks, thresholds, "minmax")  # noqa: E731
    best, out = interleaved({"all": counts, "one": with_threads(1, counts)}, args.repeats)
    speed = best["one"] / best["all"]
    print(f"numba kernels, every statistic of {args.pairs} maps of 512² (NUMBA_NUM_THREADS {numba.config.NUMBA_NUM_THREADS}, "
          f"threading layer {numba.threading_layer()}, load average {os.getloadavg()[0]:.1f}):")
    print(f"  1 thread {best['one'] * 1000:8.1f} ms, {threads} threads {best['all'] * 1000:8.1f} ms: "
          f"speed-up {speed:.2f}x ({100 * speed / threads:.0f} % of linear); identical: "
          f"{all(torch.equal(out['all'][k].nan_to_num(-1), out['one'][k].nan_to_num(-1)) for k in out['all'])}")


def device_part(args) -> None:
    device = args.device
    maps, masks = pairs_512(args.pairs, device)
    cpu_maps, cpu_masks = maps.cpu(), masks.cpu()
    thresholds = default_thresholds()

    def on_device(fn):
        def run():
            with kernels.device_path() if device == "cpu" else contextlib.nullcontext():
                return fn()
        return run

    counts = lambda m, g: kernels.grounding_counts(m, g, thresholds, "minmax")  # noqa: E731
    curve = lambda m, g: kernels.grounding_counts(m, g, thresholds, "minmax", want=0)  # noqa: E731
    fns = {"read floor (maps.sum())": lambda: maps.sum(),
           "torch path, all counts": on_device(lambda: counts(maps, masks)),
           "torch path, curve only": on_device(lambda: curve(maps, masks)),
           "torch path, pixel AUROC": on_device(lambda: kernels.pixel_auroc(maps, masks)),
           "numba (CPU), all counts": lambda: counts(cpu_maps, cpu_masks),
           "numba (CPU), curve only": lambda: curve(cpu_maps, cpu_masks),
           "numba (CPU), pixel AUROC": lambda: kernels.pixel_auroc(cpu_maps, cpu_masks)}
    best, out = interleaved(fns, args.repeats)
    floor = best["read floor (maps.sum())"]
    print(f"torch path on {device} vs numba on {torch.get_num_threads()} CPU threads, {args.pairs} maps of 512², ms per batch:")
    for name, seconds in best.items():
        print(f"  {name:<26} {seconds * 1000:9.2f} ms   {seconds / floor:8.1f}x the {device} read floor")
    for what in ("all counts", "curve only", "pixel AUROC"):
        print(f"  {what}: torch path on {device} {best['numba (CPU), ' + what] / best['torch path, ' + what]:.2f}x the speed of numba")
    same = all(torch.equal(out["torch path, all counts"][k], out["numba (CPU), all counts"][k]) for k in ("maximal", "curve", "levels"))
    same = same and (out["torch path, all counts"]["mass"] == out["numba (CPU), all counts"]["mass"]).all()
    auroc = out["torch path, pixel AUROC"].cpu().nan_to_num(-1), out["numba (CPU), pixel AUROC"].nan_to_num(-1)
    print(f"  identical counts and AUROC: {bool(same) and torch.equal(*auroc)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maps", type=int, default=1024)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=8, help="region pairs for the per-pair timings")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--skip_loop", action="store_true", help="leave out the (slow) lean loop")
    parser.add_argument("--parts", default="curve,pairs,forward,parallel,device")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the torch path runs (parts device, curve)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (torch.cuda.is_available() is False)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, kernels {'on' if kernels.available() else 'off (torch path)'}")
    tiny = torch.rand(2, 8, 8), torch.rand(2, 8, 8) > 0.5
    if kernels.available():
        kernels.grounding_statistics(*tiny, default_thresholds(), "minmax")  # load the compiled kernels before timing
    parts = args.parts.split(",")
    if "curve" in parts:
        curve_part(args, "cpu")
        if args.device == "cuda":
            curve_part(args, "cuda")
    if "pairs" in parts:
        pair_part(args)
    if "forward" in parts:
        forward_part(args)
    if "parallel" in parts and kernels.available():
        parallel_part(args)
    if "device" in parts:
        device_part(args)


if __name__ == "__main__":
    main()
