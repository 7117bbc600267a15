"""What does the generative family's grounding cost beyond the model's own ``generate``? Per family: images/s and
generated tokens/s of the stated boxes (``GenerativeModel.stated``: the prompts encoded, one ``generate`` per image's
prompts with left padding and the KV cache, greedy, each answer decoded and parsed) against a plain loop of
``network.generate`` calls on the same inputs encoded beforehand (the same work, none of ours): the ratio is this
package's overhead (goal: <= 1.10). Also the recognition forward (``answered``: the score and the map of every
(image, finding), the image tower once per image) in images/s, and peak memory of each.

Random weights: ``--size tiny`` (the families' tiny configurations, CPU) or ``--size release`` (the releases' own
configurations, ``models/configs/generative``: real sizes, for a GPU); the stand-in tokenizer either way. A random
model rarely stops early: every answer runs to ``--max-new-tokens``, which is what the ratio wants (equal work).
Times are the best of ``--repeats`` runs, ours and the plain loop interleaved. Peak memory: RSS above the start on a
CPU, ``torch.cuda.max_memory_allocated`` on a GPU.

Run: ``python benchmarks/bench_generative.py [--models maira2 medgemma lingshu radvlm] [--images 4] [--findings 4]
[--max-new-tokens 32] [--size tiny|release] [--device cpu|cuda] [--dtype float32|bfloat16] [--repeats 5] [--json]``.
On a CPU the tiny models take milliseconds a call: the ratio is noisy there (1.05-1.45 between runs of 3); the
release sizes on a GPU are what it is for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_explainers import peak_rss  # noqa: E402
from bench_query_models import best_of_interleaved  # noqa: E402

MODELS = ["maira2", "medgemma", "lingshu", "radvlm"]
FINDINGS = ["Nodule", "Mass", "Pleural effusion", "Pneumothorax", "Cardiomegaly", "Atelectasis", "Consolidation", "Edema"]


def peak_memory(fn, device: torch.device) -> int:
    """Bytes of peak memory above the start of ``fn()``: CUDA's allocator on a GPU, resident memory on a CPU."""
    if device.type != "cuda":
        return peak_rss(fn)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def plain_loop(model, images: torch.Tensor, findings: list[str]):
    """The baseline: ``network.generate`` on each image's prompts, encoded beforehand, with the same arguments as
    ``GenerativeModel.generate``; returns the loop and a counter of the tokens it generates."""
    encoded = []
    for i in range(images.shape[0]):
        inputs = model.encode([model.prompt(model.GROUNDING_PROMPT.format(f)) for f in findings])
        encoded.append({**inputs, **model.token_inputs(inputs["input_ids"]),
                        **model.image_inputs(images[i:i + 1].expand(len(findings), -1, -1, -1))})
    generated = [0]

    def run():
        generated[0] = 0
        with torch.no_grad():
            for inputs in encoded:
                out = model.network.generate(**inputs, max_new_tokens=model.max_new_tokens, do_sample=False, num_beams=1,
                                             use_cache=True, pad_token_id=model.tokenizer.pad_token_id)
                generated[0] += int((out[:, inputs["input_ids"].shape[1]:] != model.tokenizer.pad_token_id).sum())
    return run, generated


def measure(name: str, args, device: torch.device, dtype: torch.dtype) -> dict:
    from xbench_pl.registry import create_model

    with warnings.catch_warnings(), torch.device(device):  # built where it runs: a release size's random init on the GPU
        warnings.simplefilter("ignore")  # the random-weights warning: this is a benchmark of random weights
        model = create_model(name, random_init=True, random_size=args.size, max_new_tokens=args.max_new_tokens)
    model = model.to(device=device, dtype=dtype).eval()
    size = model.preprocess.size
    images = torch.randn(args.images, 3, size, size, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    findings = FINDINGS[:args.findings]
    baseline, generated = plain_loop(model, images, findings)

    def ours():
        with torch.no_grad():
            model.stated(images, findings)

    def answered():
        with torch.no_grad():
            model.answered(images, findings)

    ours(), baseline(), answered()  # warm-up: allocator, kernels
    ours_s, plain_s, answered_s = best_of_interleaved(args.repeats, ours, baseline, answered)
    tokens = generated[0]
    return {"model": name, "size": args.size, "device": device.type, "dtype": str(dtype).removeprefix("torch."),
            "images": args.images, "findings": len(findings), "max_new_tokens": args.max_new_tokens,
            "stated_images_per_s": args.images / ours_s, "generated_tokens_per_s": tokens / ours_s,
            "plain_generate_s": plain_s, "stated_s": ours_s, "overhead_ratio": ours_s / plain_s,
            "answered_images_per_s": args.images / answered_s,
            "stated_peak_mb": peak_memory(ours, device) / 2**20, "answered_peak_mb": peak_memory(answered, device) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--findings", type=int, default=4, choices=range(1, len(FINDINGS) + 1), metavar=f"1..{len(FINDINGS)}")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--size", choices=["tiny", "release"], default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON object per model instead of the table")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rows = [measure(name, args, device, dtype) for name in args.models]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"{args.images} images x {args.findings} findings, {args.max_new_tokens} new tokens, {args.size} sizes, "
          f"{args.device} {args.dtype}, best of {args.repeats}")
    print("| model | stated images/s | generated tokens/s | plain generate s | stated s | overhead ratio | "
          "answered images/s | stated peak MB | answered peak MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['stated_images_per_s']:.2f} | {r['generated_tokens_per_s']:.0f} | {r['plain_generate_s']:.3f} | "
              f"{r['stated_s']:.3f} | {r['overhead_ratio']:.3f} | {r['answered_images_per_s']:.2f} | {r['stated_peak_mb']:.0f} | "
              f"{r['answered_peak_mb']:.0f} |")


if __name__ == "__main__":
    main()
