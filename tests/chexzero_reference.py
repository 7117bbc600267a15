"""Deterministic test data for CheXzero: checkpoints laid out like the released ``best_*.pt`` files (a
``state_dict()`` of OpenAI's ``clip`` model, fp16 weights and fp32 embeddings/norms), at full size
(ViT-B/32) and at a tiny size of the same code, the stored-image canvases and the labels.

Used both by the scratch run of the authors' code (``tests/data/make_chexzero_reference.py reference``,
which wrote ``tests/data/chexzero_reference.pt``) and by ``tests/test_chexzero.py``, which loads the same
checkpoint into ``OpenCLIPModel`` and compares. Plain module: only torch and numpy.

Key names, shapes and dtypes come from ``tests/data/chexzero_state_dict_manifest.json``, derived from
the authors' ``model.py`` (``CLIP`` + ``convert_weights``) on the meta device.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from reference_common import fill, grey_fields

DATA = Path(__file__).resolve().parent / "data"

CHEXZERO_COMMIT = "5c341db0fe0db2f663a2c136c7120a8b303f1d11"
MEAN, STD = 101.48761, 83.43944  # zero_shot.py make(): Normalize on the stored 0-255 values
CANVAS, INPUT = 320, 224  # data_process.py preprocess(desired_size=320); Resize(224) for the ViT-B/32

# Their CLIP(...) arguments: ViT-B/32 as clip.load("ViT-B/32") builds it, and a tiny model of the same
# code (2 + 2 layers, width 128: 2 heads as build_model derives them, width // 64) at the same 224 px.
AUTHORS_ARGS = {
    "vit_b32": dict(embed_dim=512, image_resolution=224, vision_layers=12, vision_width=768, vision_patch_size=32,
                    context_length=77, vocab_size=49408, transformer_width=512, transformer_heads=8, transformer_layers=12),
    "tiny": dict(embed_dim=32, image_resolution=224, vision_layers=2, vision_width=128, vision_patch_size=32,
                 context_length=77, vocab_size=49408, transformer_width=128, transformer_heads=2, transformer_layers=2),
}

# run_cxr_zero_shot's 14 CheXpert labels, plus a phrase (phrase grounding embeds any text the same way)
LABELS = ("Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Enlarged Cardiomediastinum", "Fracture",
          "Lung Lesion", "Lung Opacity", "No Finding", "Pleural Effusion", "Pleural Other", "Pneumonia",
          "Pneumothorax", "Support Devices", "small left pleural effusion")
PAIR_TEMPLATE = ("{}", "no {}")  # run_cxr_zero_shot's cxr_templates
ORIGINAL_SIZE = (300, 400)  # (H, W) of the landscape original the letterbox check starts from


@lru_cache(maxsize=None)
def manifest() -> dict:
    return json.loads((DATA / "chexzero_state_dict_manifest.json").read_text())


def model_cfg(size: str) -> dict:
    """open_clip ``model_cfg`` of ``AUTHORS_ARGS[size]`` (QuickGELU; heads = width // 64)."""
    a = AUTHORS_ARGS[size]
    return {
        "embed_dim": a["embed_dim"], "quick_gelu": True,
        "vision_cfg": {"image_size": a["image_resolution"], "layers": a["vision_layers"], "width": a["vision_width"],
                       "head_width": 64, "patch_size": a["vision_patch_size"]},
        "text_cfg": {"context_length": a["context_length"], "vocab_size": a["vocab_size"], "width": a["transformer_width"],
                     "heads": a["transformer_heads"], "layers": a["transformer_layers"]},
    }


def state_dict(size: str = "tiny", seed: int = 0) -> dict[str, torch.Tensor]:
    """A released-style checkpoint: every tensor drawn in float32 from one ``torch.Generator(seed)`` in
    sorted key order (``reference_common.fill``), then cast to the manifest's dtype (fp16 / fp32)."""
    keys = manifest()[size]["keys"]
    g = torch.Generator().manual_seed(seed)
    made = {k: fill(k, keys[k][0], "float32", g).to(getattr(torch, keys[k][1])) for k in sorted(keys)}
    return {k: made[k] for k in keys}


def canvases(seed: int = 0, batch: int = 2) -> np.ndarray:
    """``[batch, 320, 320]`` float32 integer values 0..255, as their ``.h5`` stores images: smooth grey
    fields with black letterbox bands (image 0 from a landscape original, image 1 from a portrait one)."""
    grey = np.round(grey_fields(CANVAS, torch.Generator().manual_seed(seed), batch)[:, 0].numpy() * 255)
    grey[0, :40], grey[0, 280:] = 0, 0
    if batch > 1:
        grey[1, :, :20], grey[1, :, 300:] = 0, 0
    return grey.astype(np.float32)


def original(seed: int = 1) -> np.ndarray:
    """A ``300 x 400`` uint8 grey original image (smooth field) for the letterbox step."""
    field = grey_fields(max(ORIGINAL_SIZE), torch.Generator().manual_seed(seed), batch=1)[0, 0]
    return np.round(field[: ORIGINAL_SIZE[0], : ORIGINAL_SIZE[1]].numpy() * 255).astype(np.uint8)
