"""What do the trust measures (``--model.trust``) cost? Per model and measure: time per image relative to the native
pass (``test_step``'s forward, ``batch_output``) on the same batch. Random weights in each model's released architecture.

For each model (built once, full size) and each measure: ``TrustRun.measure`` on one batch of the demo (its images
with a region, the pairs ``test_step`` would measure), under inference mode as in a run, with the settings given
(``--steps``, ``--stages``). Times are the best of ``--repeats`` runs, interleaved with the native pass's (a shared
machine's load hits both alike), the model's caches warm. Randomization's working copy is made once per run: its
making is timed apart (``copies_s``, once per run, not per image); the per-image cost is a walk down the cascade with
the maps of every measured stage.

``--pairs-per-forward N`` (N > 1) then asks whether deletion's forwards should batch several pairs: per model, the
deletion curves of N demo images (one finding, their native maps) with each pair's ``steps + 1`` perturbed images a
forward of their own (what a run does: a curve never depends on the other pairs) against N pairs' in one forward
(``trust.perturbation_curve``'s ``batch_size``). It prints the time ratio (batched over per pair) and whether the
curves are the same bits (the model's outputs do not depend on the batch) or by how much they move.

Run: ``python benchmarks/bench_trust.py [--models clip medklip ...] [--measures randomization deletion ...]
[--batch 4] [--steps 10] [--stages all|last] [--repeats 2] [--pairs-per-forward 4] [--device cuda]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

import xbench_pl
from xbench_pl.models.trust_run import TrustRun
from xbench_pl.options import TRUST_MEASURES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_explainers import MODELS, device_name, model_options, on_device  # noqa: E402
from bench_query_models import best_of_interleaved  # noqa: E402


def demo_batch(model, count: int, device: torch.device):
    """The first batch of ``count`` demo images with a region, as the model's preprocessing makes them."""
    datamodule = xbench_pl.create_datamodule("demo", preprocess=model.preprocess, batch_size=count, num_workers=0, eval_size=512)
    datamodule.setup("test")
    return move_data_to_device(next(iter(datamodule.test_dataloader())), device)


def measure(name: str, options: dict, measures: list[str], batch_size: int, steps: int, stages: str, repeats: int,
            device: torch.device) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = xbench_pl.create_model(name, random_init=True, **options).eval().to(device)
    batch = demo_batch(model, batch_size, device)
    n = len(batch.image_ids)
    rows = []
    with torch.inference_mode():
        output = model.batch_output(batch)  # the text side cached, as in a run
    native = on_device(lambda: model.batch_output(batch), device)
    for measure_name in measures:
        run = TrustRun(measure_name, steps=steps, stages=stages)
        start = time.perf_counter()
        for _ in run.randomized(model):  # the working copy made (once per run), walked once
            pass
        copies_s = time.perf_counter() - start
        pairs = int(run.chosen_pairs(batch)[0].numel())
        trusted = on_device(lambda: run.measure(model, batch, output, model.normalize), device)
        with torch.inference_mode():
            t_native, t_trust = best_of_interleaved(repeats, native, trusted)
        row = {"model": name, "measure": measure_name, "pairs_per_image": pairs / n, "native_s_per_image": t_native / n,
               "s_per_image": t_trust / n, "time_ratio": t_trust / t_native, "copies_s": copies_s,
               "stages": len(run.stage_names(model)), "steps": steps}
        rows.append(row)
        extra = f"  ({row['stages']} stages; working copy made once in {copies_s:.1f} s)" if measure_name == "randomization" else ""
        print(f"{name:>10} {measure_name:>13}  {t_trust / n:7.3f} s/image  x{t_trust / t_native:6.1f} the native pass  "
              f"{pairs / n:.1f} pairs/image{extra}", flush=True)
        del run
    return rows


def pairs_per_forward(name: str, options: dict, pairs: int, steps: int, repeats: int, device: torch.device) -> dict:
    """Deletion curves of ``pairs`` images, finding 0: a forward per pair against one forward of all pairs."""
    from xbench_pl.metrics import trust

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = xbench_pl.create_model(name, random_init=True, **options).eval().to(device)
    batch = demo_batch(model, pairs, device)
    images, texts = batch.images, list(batch.classes)
    with torch.inference_mode():
        saliency = model.batch_output(batch).saliency[:, 0:1].float()
        maps = torch.nn.functional.interpolate(saliency, size=images.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
        baseline = trust.blurred_baseline(images, TrustRun("deletion").blur_sigma)  # a run's default

    def target(x: torch.Tensor) -> torch.Tensor:
        return model.explainer_forward(x, texts, grad=False)[1][:, 0].double()

    curves = {}

    def curve(batch_size: int):
        def run():
            curves[batch_size] = trust.perturbation_curve(target, images, maps, steps, baseline, insertion=False,
                                                          batch_size=batch_size)
        return on_device(run, device)

    with torch.inference_mode():
        t_each, t_batched = best_of_interleaved(repeats, curve(steps + 1), curve((steps + 1) * len(images)))
    each, batched = curves[steps + 1], curves[(steps + 1) * len(images)]
    row = {"model": name, "pairs": len(images), "steps": steps, "per_pair_s": t_each, "batched_s": t_batched,
           "batched_ratio": t_batched / t_each, "same_bits": bool(torch.equal(each, batched)),
           "max_abs_diff": float((each - batched).abs().max())}
    print(f"{name:>10}  deletion, {len(images)} pairs: a forward per pair {t_each:7.2f} s, one forward {t_batched:7.2f} s "
          f"(x{row['batched_ratio']:.2f}); curves {'the same bits' if row['same_bits'] else 'moved by up to %.2g' % row['max_abs_diff']}",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--measures", nargs="*", default=list(TRUST_MEASURES), choices=TRUST_MEASURES,
                        help="none (the option alone): only --pairs-per-forward")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--stages", default="all", choices=("all", "last"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--pairs-per-forward", type=int, default=1,
                        help="N > 1: also time deletion with N pairs' perturbed images in one forward")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {device_name(device)}, batch {args.batch}, {args.steps} steps, stages {args.stages}")
    with tempfile.TemporaryDirectory() as tmp:
        options = model_options(sorted(args.models), Path(tmp))
        rows = [row for name in args.models if args.measures
                for row in measure(name, options[name], args.measures, args.batch, args.steps, args.stages, args.repeats, device)]
        if args.pairs_per_forward > 1:
            rows += [pairs_per_forward(name, options[name], args.pairs_per_forward, args.steps, args.repeats, device)
                     for name in args.models]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
