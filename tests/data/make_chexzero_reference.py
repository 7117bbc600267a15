"""Regenerate CheXzero's state-dict manifest and the reference outputs of the authors' own code.

Run from the repo root in the *scratch* environment of ``tests/data/make_chexzero_reference.md`` (a venv
with h5py, reusing the project's torch/torchvision, and an export of the authors' repository)::

    CHEXZERO_SRC=/work/scratch/chexzero/CheXzero /work/scratch/chexzero/venv/bin/python tests/data/make_chexzero_reference.py manifest
    CHEXZERO_SRC=/work/scratch/chexzero/CheXzero /work/scratch/chexzero/venv/bin/python tests/data/make_chexzero_reference.py reference

Nothing of the authors' code is copied here: this script *imports* their modules (``model``, ``clip``,
``zero_shot``, ``data_process``) from an export of ``rajpurkarlab/CheXzero`` at ``CHEXZERO_COMMIT``.
What cannot run today is replaced at run time, without touching their files:

* ``zero_shot.tqdm`` is ``tqdm.notebook.tqdm`` (needs ipywidgets): plain iteration instead;
* ``PIL.Image.ANTIALIAS`` (removed in Pillow 10) is set to ``Image.LANCZOS``, which it always was;
* ``clip.load("ViT-B/32")`` (a download, in their ``load_clip(pretrained=True)``) is replaced by what it
  does on CPU with a state dict: ``build_model(state_dict)`` (their ``CLIP`` + ``convert_weights``) and
  ``.float()``; then ``load_clip``'s own ``load_state_dict(torch.load(path))``;
* their ``Resize(224, interpolation=BICUBIC)`` is given ``antialias=False``: torchvision 0.11.3 (their pin)
  did not antialias tensors; current torchvision does by default.

``manifest`` builds their ``CLIP`` (ViT-B/32 as ``clip.load`` builds it, and the tiny size of
``chexzero_reference.AUTHORS_ARGS``) on the meta device, applies ``convert_weights`` (what the trained
and released weights went through) and records every ``state_dict`` key with shape and dtype.

``reference`` writes ``chexzero_reference.state_dict("tiny", seed=0)`` to a ``.pt`` file, loads it as
above, writes ``chexzero_reference.canvases(seed=0)`` to an ``.h5`` file read by their ``CXRTestDataset``
with their ``make`` transform, and runs their ``run_softmax_eval`` with ``("{}", "no {}")``. Maps: their
model's patch tokens (a forward hook on ``visual.transformer``) through their ``visual.ln_post`` and
``visual.proj``, cosine with their ``zeroshot_classifier`` embedding of ``"{}"``. It also runs their
``data_process.preprocess`` (PIL) on ``chexzero_reference.original()`` and saves the 320 canvas.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))

import chexzero_reference as ref  # noqa: E402  (tests/chexzero_reference.py: the shared test-data generator)
from reference_common import versions  # noqa: E402


def import_official():
    src = os.environ.get("CHEXZERO_SRC")
    if not src or not (Path(src) / "zero_shot.py").is_file():
        sys.exit("set CHEXZERO_SRC to an export of rajpurkarlab/CheXzero (see make_chexzero_reference.md)")
    sys.path.insert(0, src)
    from PIL import Image

    Image.ANTIALIAS = Image.LANCZOS
    import clip
    import data_process
    import model
    import zero_shot

    zero_shot.tqdm = lambda iterable, *args, **kwargs: iterable
    return model, clip, zero_shot, data_process


def manifest() -> None:
    model, *_ = import_official()
    out = {"source": f"rajpurkarlab/CheXzero @ {ref.CHEXZERO_COMMIT}: model.py CLIP(**AUTHORS_ARGS[size]) "
                     "+ convert_weights, on the meta device (the layout of a released best_*.pt)",
           "versions": versions()}
    for size, args in ref.AUTHORS_ARGS.items():
        with torch.device("meta"):
            clip_model = model.CLIP(**args)
        model.convert_weights(clip_model)
        state = clip_model.state_dict()
        out[size] = {"args": args, "parameters": sum(p.numel() for p in clip_model.parameters()),
                     "keys": {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state.items()}}
        print(f"{size}: {len(state)} keys, {out[size]['parameters']:,} parameters")
    (HERE / "chexzero_state_dict_manifest.json").write_text(one_key_a_line(out))


def one_key_a_line(data: dict) -> str:
    """JSON with each state-dict key (and its ``[shape, dtype]``) on one line."""
    text = json.dumps({k: v for k, v in data.items() if k not in ref.AUTHORS_ARGS}, indent=1)[:-2]
    for size in ref.AUTHORS_ARGS:
        head = json.dumps({k: v for k, v in data[size].items() if k != "keys"})[:-1]
        keys = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in data[size]["keys"].items())
        text += f',\n "{size}": {head}, "keys": {{\n{keys}\n  }}}}'
    return text + "\n}\n"


def reference() -> None:
    import h5py
    from torchvision.transforms import Compose, InterpolationMode, Normalize, Resize

    model, clip, zero_shot, data_process = import_official()
    from PIL import Image

    torch.set_num_threads(2)
    labels, (positive, negative) = list(ref.LABELS), ref.PAIR_TEMPLATE
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "best_tiny.pt"
        torch.save(ref.state_dict("tiny", seed=0), checkpoint)
        clip_model = model.build_model(torch.load(checkpoint, map_location="cpu")).float()  # clip.load on CPU
        clip_model.load_state_dict(torch.load(checkpoint, map_location="cpu"))  # load_clip
        clip_model.eval()

        images = Path(tmp) / "test_cxr.h5"
        with h5py.File(images, "w") as h5f:
            h5f.create_dataset("cxr", data=ref.canvases(seed=0))
        transform = Compose([Normalize((ref.MEAN,) * 3, (ref.STD,) * 3),  # zero_shot.make
                             Resize(ref.INPUT, interpolation=InterpolationMode.BICUBIC, antialias=False)])
        dataset = zero_shot.CXRTestDataset(img_path=str(images), transform=transform)
        loader = torch.utils.data.DataLoader(dataset, shuffle=False)

        scores = zero_shot.run_softmax_eval(clip_model, loader, labels, ref.PAIR_TEMPLATE)
        text = zero_shot.zeroshot_classifier(labels, [positive], clip_model)  # [D, C], unit columns

        tokens: list[torch.Tensor] = []
        hook = clip_model.visual.transformer.register_forward_hook(lambda m, i, o: tokens.append(o.permute(1, 0, 2)))
        maps, pooled = [], []
        with torch.no_grad():
            for batch in loader:
                pooled.append(clip_model.encode_image(batch["img"]))
                patches = clip_model.visual.ln_post(tokens[-1][:, 1:]) @ clip_model.visual.proj
                cls = clip_model.visual.ln_post(tokens[-1][:, 0]) @ clip_model.visual.proj
                assert torch.equal(cls, pooled[-1])  # the hook sees what encode_image pools
                patches = patches / patches.norm(dim=-1, keepdim=True)
                grid = ref.INPUT // ref.AUTHORS_ARGS["tiny"]["vision_patch_size"]
                maps.append((patches @ text).transpose(1, 2).reshape(-1, len(labels), grid, grid))
        hook.remove()
        model_input = torch.cat([batch["img"] for batch in loader])

    prompts = [t.format(label) for t in (positive, negative) for label in labels]
    canvas = data_process.preprocess(Image.fromarray(ref.original()).convert("RGB"), desired_size=ref.CANVAS)
    out = {
        "seed": 0, "chexzero_commit": ref.CHEXZERO_COMMIT, "versions": versions("h5py", "pillow"),
        "labels": labels, "prompts": prompts,
        "tokens": clip.tokenize(prompts),  # [2C, 77]: positives, then negatives
        "scores": torch.from_numpy(np.asarray(scores, dtype=np.float32)),  # [B, C] run_softmax_eval
        "maps": torch.cat(maps),  # [B, C, 7, 7], row-major
        "image_embedding": torch.cat(pooled),  # [B, D] encode_image, unnormalised
        "model_input": model_input[:, 0].contiguous(),  # [B, 224, 224], one channel of three equal ones
        "original_canvas": torch.from_numpy(np.array(canvas, dtype=np.uint8)),  # [320, 320]
    }
    torch.save(out, HERE / "chexzero_reference.pt")
    print({k: tuple(v.shape) for k, v in out.items() if isinstance(v, torch.Tensor)})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["manifest", "reference"])
    {"manifest": manifest, "reference": reference}[parser.parse_args().command]()
