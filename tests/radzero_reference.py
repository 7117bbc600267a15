"""Deterministic test data for RadZero: tiny towers of the released architecture (a tiny DINOv2, a tiny
MPNet with a tiny vocabulary, two tiny alignment layers), a seeded state dict in the layout of the authors'
``CxrAlignModel``, an MPNet tokenizer folder, reference images and the prompts.

Used both by the scratch run of the authors' code (``tests/data/make_radzero_reference.py reference``, which
wrote ``tests/data/radzero_reference.pt``) and by ``tests/test_radzero.py``, which loads the same state dict
into ``xbench_pl.models.radzero`` and compares. Plain module: only torch and the standard library.

The tiny layout (keys, shapes) is ``tests/data/radzero_tiny_manifest.json``, written by the authors' classes
on the meta device from ``TINY_*`` below (``make_radzero_reference.py manifests``), as is the full-size
``radzero_checkpoint_manifest.json``.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import torch

from reference_common import LETTER_PIECES, LOWER, PUNCTUATION_DIGITS, fill, grey_fields, seeded_tensors, write_json

DATA = Path(__file__).resolve().parent / "data"

RADZERO_COMMIT = "656ae5f1af3f106e96c95542ce3ee5c0ee8777fc"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # the BlipImageProcessor normalisation (see radzero.py)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGE_SIZE = 28  # input of the tiny model: a 7 x 7 patch grid from a 4 x 4 position grid (interpolated)
GRID = 7

# the hub configs of the two towers, tiny; the align/loss entries of their radzero.yaml, tiny
TINY_VISION = {"model_type": "dinov2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "mlp_ratio": 2,
               "image_size": 16, "patch_size": 4, "num_channels": 3, "layer_norm_eps": 1e-6, "layerscale_value": 1.0,
               "hidden_act": "gelu", "qkv_bias": True, "use_swiglu_ffn": False, "drop_path_rate": 0.0,
               "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
TINY_ALIGN = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "mlp_ratio": 2}
TINY_HIDDEN = 32

# all-mpnet-base-v2's special tokens (its tokenizer_config.json); the words are ours
SPECIALS = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
_WORDS = """
there is no small left right apical pleural effusion lung nodule mass pulmonary pneumothorax atelectasis
opacity at the base bases seen with and of in
"""
_PIECES = "ele ect asis thor ax ef fus ion"

# their evaluation prompts ("There is {finding}", ChestX-Det10 / ChestX-ray14 spellings) and a free-text
# phrase (their MS-CXR grounding feeds the phrase itself): the classes of the tiny test, in order
CLASSES = ("Atelectasis", "Effusion", "Nodule", "Pneumothorax", "Small left apical pneumothorax, no effusion.")
PROMPTS = ("There is Atelectasis", "There is Pleural Effusion", "There is Lung Nodule", "There is Pneumothorax",
           "Small left apical pneumothorax, no effusion.")

ATTENTION_GAIN = 1.0  # query/key weights at their fan-in scale: float32 round-off stays near 1e-7 through 4 DINOv2 layers
TOKEN_STD = 0.5  # class, mask and position tokens


def vocabulary() -> list[str]:
    words = _WORDS.split()
    pieces = [f"##{p}" for p in _PIECES.split()]
    return list(dict.fromkeys(SPECIALS + PUNCTUATION_DIGITS + LOWER + LETTER_PIECES + words + pieces))


def tiny_text_config() -> dict:
    """A tiny MPNet config (all-mpnet-base-v2's layout: pad 1, bos 0, eos 2, 32 relative buckets)."""
    return {"model_type": "mpnet", "vocab_size": len(vocabulary()), "hidden_size": TINY_HIDDEN, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64, "relative_attention_num_buckets": 32,
            "layer_norm_eps": 1e-5, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "initializer_range": 0.02}


def write_tokenizer_folder(folder: str | Path) -> Path:
    """An MPNet tokenizer folder (``vocab.txt``, ``tokenizer_config.json``) of the tiny vocabulary."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocabulary()) + "\n")
    write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "MPNetTokenizer", "do_lower_case": True, "model_max_length": 60, "bos_token": "<s>",
        "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>", "unk_token": "[UNK]", "pad_token": "<pad>",
        "mask_token": "<mask>"})
    return folder


def write_tower_folders(folder: str | Path) -> dict[str, Path]:
    """``{"vision": DIR, "text": DIR}``: hub-style folders holding the tiny towers' ``config.json``."""
    folder = Path(folder)
    out = {}
    for name, config in (("vision", TINY_VISION), ("text", tiny_text_config())):
        (folder / name).mkdir(parents=True, exist_ok=True)
        write_json(folder / name / "config.json", config)
        out[name] = folder / name
    return out


@lru_cache(maxsize=None)
def manifest(name: str = "radzero_tiny_manifest.json") -> dict:
    return json.loads((DATA / name).read_text())


def _fill(key: str, shape: list[int], dtype: str, g: torch.Generator) -> torch.Tensor:
    leaf = key.rsplit(".", 1)[-1]
    if leaf in ("cls_token", "mask_token", "position_embeddings"):
        return TOKEN_STD * torch.randn(shape, generator=g)
    if leaf == "loss_temperature":
        return math.log(0.07) + 0.1 * torch.randn(shape, generator=g)
    if leaf == "lambda1":  # DINOv2 layer scale: around 1, so that every layer moves the tokens
        return 1 + 0.1 * torch.randn(shape, generator=g)
    w = fill(key, shape, dtype, g)
    if len(shape) > 1 and key.endswith(("attention.attention.query.weight", "attention.attention.key.weight",
                                        "attention.attn.q.weight", "attention.attn.k.weight")):
        w = w * ATTENTION_GAIN
    return w


def state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """The tiny model's weights in the authors' layout, every key drawn from one generator in sorted key order."""
    spec = manifest()
    return seeded_tensors(spec["keys"], spec["aliases"], _fill, torch.Generator().manual_seed(seed))


def reference_images(seed: int = 0, batch: int = 2) -> torch.Tensor:
    """``[batch, 3, 28, 28]`` grey fields normalised with the BlipImageProcessor's mean/std (the model's input)."""
    grey = grey_fields(IMAGE_SIZE, torch.Generator().manual_seed(seed), batch=batch, fine=12)
    mean, std = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return ((grey - mean) / std).contiguous()


def tiny_architecture(towers: dict[str, Path]) -> dict:
    """``configs/radzero.json`` with the tiny towers (their folders from ``write_tower_folders``) at 28 px."""
    config = json.loads((Path(__file__).resolve().parents[1] / "xbench_pl/models/configs/radzero.json").read_text())
    config["vision"], config["text"] = str(towers["vision"]), str(towers["text"])
    config["align"] = {**config["align"], **TINY_ALIGN}
    config["preprocess"] = {**config["preprocess"], "size": IMAGE_SIZE}
    return config
