"""What does an explainer cost? Per model and explainer: time and peak memory per image, relative to the
native forward (``zero_shot``) on the same batch and to the method's floor. Random weights in each model's released
architecture.

The floor of a method is what it cannot do without: its own forward (the one that exposes what it reads: a CAM's
hooked forward, the native forward with each block's attention computed beside it for rollout, the explicit
attention of Chefer; for ScoreCAM also one forward per channel of its layer, in the chunks it scores them, of an
input the size of a masked one: no masking), plus, for a method with a target, ONE backward over all
findings at once (``torch.autograd.grad(..., is_grads_batched=True)``: the backward vmapped over the C one-hot
cotangents) from the targets to the tensors it reads (the CAM's layer; every attention probability for Chefer).
Nothing else: no map arithmetic, no second forward. ``time_ratio`` is the explainer's time over the native forward's,
``floor_ratio`` over the floor's.

For each model (built once, full size) and each explainer: ``model.explained(batch, findings)`` under
inference mode, as ``test_step`` runs it, on the demo's first images with the 14 ChestX-ray14 findings. Times are the best of
``--repeats`` runs, interleaved with the native forward's and the floor's (a shared machine's load hits all alike); the
native forward is measured with the model's own caches warm, as in a run. Peak memory, in a separate pass
(the sampler costs time), is the most resident memory (RSS, sampled every millisecond) above what the process
held before the call: what the explainer needs beyond what a native run already holds. Every explainer's
maps also run through ``test_step``'s shape and NaN check, so a model that cannot run an explainer fails here.

``--leak N`` then runs one explainer (``--leak-explainer``, default gradcam) on N images in batches and
prints the RSS after each 10 % of them: it must stay flat (no graph or activation kept across batches).

Run: ``python benchmarks/bench_explainers.py [--models clip biomedclip medklip mavl kad_224 devide carzero]
[--explainers gradcam hirescam ...] [--batch 4] [--repeats 2] [--leak 1000] [--device cuda]``. Text encoders and
tokenizers are the test suite's stand-ins in the released layouts (none is available here); the text side
is cached either way, so they do not enter the ratios. On a shared CPU, ``OMP_NUM_THREADS=1`` keeps the times steady
(with two threads every operator waits for the second to be scheduled).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

import xbench_pl
from xbench_pl.explainers import EXPLAINERS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_query_models import CXR14, best_of_interleaved  # noqa: E402
from bench_scale import model_kwargs  # noqa: E402

MODELS = ["clip", "biomedclip", "medklip", "mavl", "kad_224", "devide", "carzero"]
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def trimmed_rss() -> int:
    """RSS after glibc hands its free pages back (``malloc_trim``): without it, memory an earlier call freed
    hides what the next one needs."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss()


def peak_rss(fn) -> int:
    """Peak RSS above the start of ``fn()`` in bytes, sampled every millisecond."""
    start, peak, done = trimmed_rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak[0], rss()) - start


def biomedclip_tokenizer(folder: Path) -> str:
    """A BERT WordPiece folder (the vocabulary of the suite's BiomedCLIP stand-in) for BiomedCLIP's text tower."""
    folder.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_open_clip_models import BERT_VOCAB

    (folder / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    return str(folder)


def model_options(names: list[str], folder: Path) -> dict[str, dict]:
    """create_model kwargs: bench_scale's stand-ins, and a BiomedCLIP tokenizer where asked for."""
    options = model_kwargs(names, folder)
    if "biomedclip" in names:
        options["biomedclip"] = {"text": biomedclip_tokenizer(folder / "biomedbert")}
    return options


def applicable(model) -> list[str]:
    """The explainers this model's architecture takes (rollout needs a ViT tower; chefer a ViT or a decoder)."""
    from xbench_pl.explainers import build_explainer

    out = []
    for name in EXPLAINERS[1:]:
        try:
            build_explainer(model, name, None)
        except ValueError:
            continue
        out.append(name)
    return out


def device_name(device: torch.device) -> str:
    """What ran the benchmark: the GPU's name, or the CPU thread count."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"


def on_device(fn, device: torch.device):
    """``fn`` that waits for the device's queued work, so that its time is the work's (CUDA runs asynchronously)."""
    if device.type != "cuda":
        return fn

    def synchronized():
        fn()
        torch.cuda.synchronize(device)

    return synchronized


def peak_memory(fn, device: torch.device) -> int:
    """Peak bytes above the start of ``fn()``: resident memory on CPU, the CUDA allocator's peak on a GPU."""
    if device.type != "cuda":
        return peak_rss(fn)
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def floor(model, images: torch.Tensor, classes: list[str]) -> tuple[torch.Tensor | None, ...]:
    """The floor of ``model``'s explainer (see the module docstring): its forward, and one batched backward over every
    finding from the targets to what the method reads. Returns those gradients, ``[C, B, ...]`` per tensor read (None
    for an attention no target reads; nothing for the methods without a target)."""
    from xbench_pl.explainers.cams import SCORECAM_CHANNELS, CAMExplainer

    explainer = model.explainer_method
    with torch.inference_mode(False):
        model.thaw_caches()
        images = images.clone()
        if isinstance(explainer, CAMExplainer):
            activation, _, targets = explainer.activations(model, images, classes)
            read = [activation] if explainer.uses_gradients else []
            if explainer.name == "scorecam":  # what it reads: the scores of one masked input per channel
                channels = explainer.as_map(activation.detach()).shape[1]
                with torch.no_grad():
                    for image in images:
                        for start in range(0, channels, SCORECAM_CHANNELS):
                            count = min(SCORECAM_CHANNELS, channels - start)
                            model.explainer_forward(image.expand(count, *image.shape).contiguous(), classes, grad=False)
        else:
            tower, decoder, _, targets = explainer.recorded(model, images, classes)
            read = [p for p in tower + [p for pair in decoder for p in pair] if p is not None and p.requires_grad]
        if not read:
            return ()
        count = targets.shape[1]
        cotangents = torch.eye(count, dtype=targets.dtype, device=targets.device)[:, None].expand(count, *targets.shape)
        return torch.autograd.grad(targets, read, cotangents, is_grads_batched=True, allow_unused=True)


def measure(name: str, options: dict, explainers: list[str] | None, batch: int, repeats: int,
            device: torch.device = torch.device("cpu")) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = xbench_pl.create_model(name, random_init=True, **options).eval().to(device)
    images = demo_images(model, batch).to(device)
    rows = []
    with torch.inference_mode():
        model.zero_shot(images, CXR14)  # the text side cached, as in a run
    usable = applicable(model)
    for explainer in [e for e in explainers or usable if e in usable]:
        model.explainer = explainer
        model.attach_explainer()
        run_native = on_device(lambda: model.zero_shot(images, CXR14), device)
        run_explained = on_device(lambda: check(model.explained(images, CXR14), batch), device)
        run_floor = on_device(lambda: floor(model, images, CXR14), device)
        with torch.inference_mode():
            t_native, t_explained, t_floor = best_of_interleaved(repeats, run_native, run_explained, run_floor)
            # apart from the times: the CPU's sampler costs time
            m_native, m_explained = peak_memory(run_native, device), peak_memory(run_explained, device)
        rows.append({"model": name, "explainer": explainer, "layer": model.explainer_info["target_layer"],
                     "native_s_per_image": t_native / batch, "s_per_image": t_explained / batch,
                     "time_ratio": t_explained / t_native, "floor_s": t_floor / batch, "floor_ratio": t_explained / t_floor,
                     "native_peak_mb": m_native / 2**20,
                     "peak_mb": m_explained / 2**20, "memory_ratio": m_explained / max(m_native, 1)})
        print(f"{name:>10} {explainer:>9}  {t_explained / batch:7.3f} s/image  x{t_explained / t_native:5.2f} time   "
              f"floor {t_floor / batch:7.3f} s/image  x{t_explained / t_floor:5.2f} floor   "
              f"peak +{m_explained / 2**20:7.0f} MB (native +{m_native / 2**20:5.0f} MB)", flush=True)
    return rows


def demo_images(model, count: int) -> torch.Tensor:
    """The demo's first ``count`` images as the model's preprocessing makes them."""
    datamodule = xbench_pl.create_datamodule("demo", preprocess=model.preprocess, batch_size=count, num_workers=0)
    datamodule.setup("test")
    return next(iter(datamodule.test_dataloader())).images


def check(output, batch: int) -> None:
    if output.saliency.shape[:2] != (batch, len(CXR14)) or not torch.isfinite(output.saliency).all():
        raise AssertionError(f"maps {tuple(output.saliency.shape)} with NaN or the wrong shape")


def leak(name: str, options: dict, explainer: str, images: int, batch: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = xbench_pl.create_model(name, random_init=True, explainer=explainer, **options).eval()
    size = model.preprocess.size
    generator = torch.Generator().manual_seed(0)
    marks = []
    for done in range(0, images, batch):
        with torch.inference_mode():
            model.explained(torch.randn(batch, 3, size, size, generator=generator), CXR14)
        if (done // batch) % max(1, images // batch // 10) == 0:
            marks.append((done + batch, trimmed_rss() / 2**20))
    print(f"\n{name} {explainer}: RSS (MB) after n images, {images} in batches of {batch}:")
    print("  " + "  ".join(f"{n}: {mb:.0f}" for n, mb in marks))
    print(f"  growth from the 2nd mark to the last: {marks[-1][1] - marks[1][1]:+.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--explainers", nargs="+", default=None, help="default: every one the model takes")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--leak", type=int, default=0, help="images for the flat-memory check (0: skip)")
    parser.add_argument("--leak-model", default="clip", choices=MODELS)
    parser.add_argument("--leak-explainer", default="gradcam")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (the leak check runs on the CPU)")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {device_name(device)}, batch {args.batch}, {len(CXR14)} findings")
    with tempfile.TemporaryDirectory() as tmp:
        options = model_options(sorted({*args.models, args.leak_model}), Path(tmp))
        rows = [row for name in args.models for row in measure(name, options[name], args.explainers, args.batch, args.repeats, device)]
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        if args.leak:
            leak(args.leak_model, options[args.leak_model], args.leak_explainer, args.leak, args.batch)


if __name__ == "__main__":
    main()
