"""What the deterministic test-data modules (``kad_reference``, ``medklip_mavl_reference``,
``carzero_reference``) share: the seeded filling of a checkpoint manifest, the smooth grey reference
images and the BERT WordPiece vocabulary layout, and how the tests compare our outputs with the authors'
float32 outputs. Plain module: only torch.

Every committed reference output (``tests/data/*_reference*.pt``) was made from these draws: a change
here that alters one random number, or the order of the draws, invalidates them.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

NUM_BATCHES_TRACKED = 100_000
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "mask_token": "[MASK]"}
PUNCTUATION_DIGITS = list("!\"#$%&'()*+,-./0123456789:;<=>?@[\\]^_`{|}~")
LOWER = [chr(c) for c in range(ord("a"), ord("z") + 1)]
LETTER_PIECES = [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"]

Fill = Callable[[str, list, str, torch.Generator], torch.Tensor]


def fill(key: str, shape: list[int], dtype: str, g: torch.Generator) -> torch.Tensor:
    """One tensor of a manifest; the rule depends only on the key's name and shape. A family's own
    ``_fill`` handles its special keys first and hands the rest here."""
    if dtype == "int64":
        if key.endswith("num_batches_tracked"):
            return torch.tensor(NUM_BATCHES_TRACKED, dtype=torch.int64)
        if key.endswith("position_ids"):
            return torch.arange(shape[-1], dtype=torch.int64).expand(shape).clone()
        raise ValueError(f"no fill rule for int64 key {key!r}")
    if dtype != "float32":
        raise ValueError(f"no fill rule for {dtype} key {key!r}")
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "logit_scale":
        return math.log(1 / 0.07) + 0.1 * torch.randn(shape, generator=g)
    if leaf == "running_var":
        return 0.5 + torch.rand(shape, generator=g)
    if leaf == "running_mean":
        return 0.1 * torch.randn(shape, generator=g)
    if len(shape) == 1:  # LayerNorm / BatchNorm weights; biases (incl. in_proj_bias)
        noise = 0.1 * torch.randn(shape, generator=g)
        return 1 + noise if leaf == "weight" else noise
    return torch.randn(shape, generator=g) * fan_in_std(shape)


def fan_in_std(shape: list[int]) -> float:
    return math.prod(shape[1:]) ** -0.5


def seeded_tensors(keys: dict[str, list], aliases: dict[str, str], fill_fn: Fill, g: torch.Generator) -> dict:
    """``{key: tensor}`` in ``keys``' order: every non-alias key drawn from ``g`` in sorted key order;
    an alias key holds the very tensor of its source."""
    made = {k: fill_fn(k, *keys[k], g) for k in sorted(keys) if k not in aliases}
    return {k: made[aliases.get(k, k)] for k in keys}


def grey_fields(size: int, g: torch.Generator, batch: int = 2, fine: int = 24) -> torch.Tensor:
    """``[batch, 3, size, size]`` smooth grey fields in [0, 1] (two scales of up-sampled noise, 6x6 and
    ``fine`` x ``fine``, through a sigmoid: a chest-X-ray-like grey image) repeated on RGB."""
    coarse = torch.randn(batch, 1, 6, 6, generator=g)
    detail = torch.randn(batch, 1, fine, fine, generator=g)
    field = (F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
             + 0.5 * F.interpolate(detail, size=(size, size), mode="bilinear", align_corners=False))
    return torch.sigmoid(1.5 * field).expand(batch, 3, size, size)


def imagenet_normalise(grey: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return ((grey - mean) / std).contiguous()


def bert_specials(unused: range = range(99)) -> list[str]:
    """BERT's first 104 entries: ``[PAD]``=0, ``[unusedN]``, ``[UNK]``=100, ``[CLS]``=101, ``[SEP]``=102,
    ``[MASK]``=103 (uncased vocabularies number the unused tokens from 0, cased ones from 1)."""
    return ["[PAD]", *(f"[unused{i}]" for i in unused), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(folder: str | Path, vocab: list[str]) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder


def write_json(path: Path, data: dict, indent: int = 1) -> None:
    path.write_text(json.dumps(data, indent=indent) + "\n")


# -- manifests of the authors' modules (tests/data/make_*_manifests.py) ----------------------------
def describe_module(module: torch.nn.Module) -> dict:
    """``{"keys": {key: [shape, dtype]}, "aliases": {key: first key of the same tensor}, "parameters": n}``
    of a module's ``state_dict`` (built on the meta device: an alias is the very same tensor object)."""
    state = module.state_dict(keep_vars=True)
    keys = {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state.items()}
    first: dict[int, str] = {}
    aliases = {}
    for k, v in state.items():
        if id(v) in first:
            aliases[k] = first[id(v)]
        else:
            first[id(v)] = k
    return {"keys": keys, "aliases": aliases, "parameters": sum(p.numel() for p in module.parameters())}


def versions(*extra: str) -> dict:
    """Installed versions of torch, torchvision, transformers, tokenizers, numpy and ``extra``."""
    import importlib.metadata

    names = ("torch", "torchvision", "transformers", "tokenizers", "numpy", *extra)
    return {n: importlib.metadata.version(n) for n in names}


# -- comparing our forward with the authors' float32 outputs ---------------------------------------
EPS32 = torch.finfo(torch.float32).eps
ROUNDOFF_FACTOR = 4


def float64_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of ``model`` with empty embedding caches. Its round-off is 2^-29 of float32's, so its
    distance to a float32 output of the same forward is that output's round-off."""
    twin = copy.deepcopy(model).double()
    twin.clear_caches()
    return twin


def assert_within_float32_roundoff(name: str, ours: torch.Tensor, exact: torch.Tensor, reference: torch.Tensor,
                                   factor: float = ROUNDOFF_FACTOR) -> None:
    """Our float32 output ``ours`` and the same forward in float64 (``exact``) are both within ``factor``
    times the float32 round-off of the authors' float32 ``reference``.

    The round-off is measured here, on this CPU: max |ours - exact|, at least one float32 ulp of the
    largest |reference|. These deep random networks amplify float32 rounding to 1e-6 .. 1e-3 (depending
    on the tensor), and how they round depends on the CPU's kernels: a fixed tolerance is either
    fragile across machines or blind. An implementation error moves ``exact`` away from the reference
    by far more than the reference's own round-off (docs/models.md, "Equal to the authors' code").
    """
    reference = reference.double()
    roundoff = max((ours.double() - exact.double()).abs().max().item(), EPS32 * reference.abs().max().item())
    for label, value in (("float32", ours), ("float64", exact)):
        error = (value.double() - reference).abs().max().item()
        assert error <= factor * roundoff, (f"{name}: |ours ({label}) - authors| = {error:.3g} > {factor} x the float32 "
                                            f"round-off {roundoff:.3g} measured here")
