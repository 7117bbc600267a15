"""What do the trust measures (``--model.trust``) cost? Per model and measure: time per image relative to the native
pass (``test_step``'s forward, ``batch_output``) on the same batch. Random weights in each model's released architecture.

For each model (built once, full size) and each measure: ``TrustRun.measure`` on one batch of the demo (its images
with a region, the pairs ``test_step`` would measure), under inference mode as in a run, with the settings given
(``--steps``, ``--stages``). Times are the best of ``--repeats`` runs, interleaved with the native pass's (a shared
machine's load hits both alike), the model's caches warm. Randomization's working copy is made once per run: its
making is timed apart (``copies_s``, once per run, not per image); the per-image cost is a walk down the cascade with
the maps of every measured stage.

Run: ``python benchmarks/bench_trust.py [--models clip medklip ...] [--measures randomization deletion ...]
[--batch 4] [--steps 10] [--stages all|last] [--repeats 2] [--device cuda]``.
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
    batch = next(iter(datamodule.test_dataloader()))
    return batch.to(device) if hasattr(batch, "to") else batch


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--measures", nargs="+", default=list(TRUST_MEASURES), choices=TRUST_MEASURES)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--stages", default="all", choices=("all", "last"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {device_name(device)}, batch {args.batch}, {args.steps} steps, stages {args.stages}")
    with tempfile.TemporaryDirectory() as tmp:
        options = model_options(sorted(args.models), Path(tmp))
        rows = [row for name in args.models
                for row in measure(name, options[name], args.measures, args.batch, args.steps, args.stages, args.repeats, device)]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
