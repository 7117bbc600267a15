"""Peak memory of trust randomization (``--model.trust randomization``, every stage) against the plain run of the same
model and explainer: the peak RSS of one ``python -m xbench_pl test`` process each (from ``wait4``) and their ratio.
A copy of the weights per stage made the ratio grow with the stages; one working copy walked down the cascade at
every batch keeps it under 2 (the model's weights and the copy's).

The model: a CLIP of ViT-B/16's depth (12 image and 12 text blocks: 15 stages), ``--width`` wide (default 256: 122 MB
of weights; ViT-B/16 is 768), random init, 112-pixel input, Grad-CAM, on the demo's 12 images (``--images``: the first
N) with a 64-pixel eval grid: a few minutes on a 2-core CPU. ``--full``: CLIP ViT-B/16 itself (571 MB of weights;
``--images 2`` keeps it to minutes on a CPU: the copies, not the images, make the peak). ``--repo DIR``: another
checkout to measure (e.g. an older commit's ``git archive``), for a before/after on one machine. The wall times include
start-up and the text encodings; the randomization run's stderr line (``trust randomization: ...``) is its own estimate.

    python benchmarks/bench_trust_memory.py [--width 256] [--full] [--images 12] [--batch 4] [--repo DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: OpenAI CLIP's normalisation (open_clip's OPENAI_DATASET_MEAN / STD)
PREPROCESS_CFG = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]}


def narrow_clip(width: int) -> dict:
    """open_clip's CLIP layout at ViT-B/16's depth (12 + 12 blocks), ``width`` wide (64-wide heads), a 112-pixel input."""
    return {"embed_dim": width // 2, "quick_gelu": True,
            "vision_cfg": {"image_size": 112, "layers": 12, "width": width, "head_width": 64, "patch_size": 16},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": width, "heads": width // 64, "layers": 12}}


def weights_mb(options: list[str]) -> tuple[float, int]:
    """The model's float32 weights in MB and its number of cascade stages (built on the meta device: no memory)."""
    import torch

    import xbench_pl
    from xbench_pl.models.randomization import cascade_stages

    kwargs = dict(zip((key.removeprefix("--model.") for key in options[::2]), options[1::2]))
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its random weights: no data runs through this one
        model = xbench_pl.create_model("clip", random_init=True, **kwargs)
    return sum(p.numel() for p in model.parameters()) * 4 / 2**20, len(cascade_stages(model))


def first_images(count: int, folder: Path) -> Path:
    """A split file of the first ``count`` demo images (by id)."""
    from xbench_pl.data.nih_bbox import DemoDataModule

    ids = sorted(record.image_id for record in DemoDataModule().load_records())[:count]
    path = folder / "split.csv"
    path.write_text("image_id\n" + "\n".join(ids) + "\n")
    return path


def peak_rss_mb(command: list[str], repo: Path) -> tuple[float, float, str]:
    """Peak RSS (MB) and wall time (s) of ``command`` run in ``repo``, and its ``trust randomization`` line if any."""
    env = {**os.environ, "WANDB_MODE": "offline", "NO_ALBUMENTATIONS_UPDATE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.time()
    process = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(stderr[-3000:])
    said = next((line for line in stderr.splitlines() if line.startswith("trust randomization:")), "")
    return usage.ru_maxrss / 1024, time.time() - started, said  # ru_maxrss is in KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256, help="the narrow CLIP's width (a multiple of 64)")
    parser.add_argument("--full", action="store_true", help="CLIP ViT-B/16 itself instead of the narrow one")
    parser.add_argument("--images", type=int, default=12, help="the first N demo images (all 12 by default)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to measure (default: this one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        options = ["--model.explainer", "gradcam"]
        if not args.full:
            architecture = Path(tmp) / "clip.json"
            architecture.write_text(json.dumps({"model_cfg": narrow_clip(args.width), "preprocess_cfg": PREPROCESS_CFG}))
            options += ["--model.architecture", str(architecture)]
        mb, stages = weights_mb(options)
        split = ["--data.split_file", str(first_images(args.images, Path(tmp)))] if args.images < 12 else []
        print(f"{'CLIP ViT-B/16' if args.full else f'CLIP of ViT-B/16 depth, width {args.width}'}: {mb:.0f} MB of weights, "
              f"{stages} stages; {args.images} demo images, batch {args.batch}, Grad-CAM; {args.repo}", flush=True)
        runs = {}
        for name, trust in (("plain", []), ("randomization", ["--model.trust", "randomization"])):
            command = [sys.executable, "-m", "xbench_pl", "test", "--model", "clip", "--model.random_init", "true", *options,
                       *trust, "--model.bootstrap", "0", "--data", "demo", *split, "--data.batch_size", str(args.batch),
                       "--data.eval_size", str(args.eval_size), "--trainer.accelerator", "cpu",
                       "--trainer.enable_progress_bar", "false", "--out", str(Path(tmp) / name)]
            runs[name] = peak_rss_mb(command, args.repo)
            rss, wall, said = runs[name]
            print(f"{name:>13}: peak RSS {rss:7.0f} MB  wall {wall:6.1f} s  {said}", flush=True)
    (plain, plain_wall, _), (randomized, randomized_wall, _) = runs["plain"], runs["randomization"]
    print(f"peak RSS ratio randomization / plain: {randomized / plain:.2f} ({stages} stages; "
          f"+{randomized - plain:.0f} MB = {(randomized - plain) / mb:.1f} x the weights); "
          f"wall ratio {randomized_wall / plain_wall:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
