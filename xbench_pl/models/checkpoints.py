"""Reading weights files, shared by every model family.

``read_state_dict`` unwraps a file into a flat mapping of names to tensors (``read_checkpoint``
+ ``merge_parts`` for a dict of several state dicts, such as KAD's ``{model, image_encoder,
text_encoder, optimizer, ...}``); a family's own filter function then renames its foreign
layout, ``drop_aliases`` removes duplicate keys after checking they are identical copies, and
``load_weights`` loads it strictly, naming every missing, unexpected and mis-shaped key. Only
keys matching a family's declared ``ignore_unexpected`` patterns (training-only or unused
entries) may be left out, and nothing is loaded with ``strict=False``.

Files are read with ``torch.load(weights_only=True)``: tensors and plain Python containers
only; a pickled foreign class (an OmegaConf config, a numpy array) is refused with a message
naming it and how to convert the file once.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

# OpenAI's TorchScript archives carry these as entries of their state dict; they are not weights.
OPENAI_JIT_EXTRAS = ("input_resolution", "context_length", "vocab_size")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or does not fit the architecture."""


def is_torchscript(path: Path) -> bool:
    """TorchScript archives are zips with ``constants.pkl``; ``torch.save`` zips have none."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/constants.pkl") or name == "constants.pkl" for name in archive.namelist())


def read_checkpoint(path: Path) -> object:
    """The object stored in a checkpoint file (``torch.load(weights_only=True)``, safetensors or
    TorchScript), on the CPU; ``CheckpointError`` naming the file if it cannot be read."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        if is_torchscript(path):
            state = torch.jit.load(str(path), map_location="cpu").state_dict()
            return {k: v for k, v in state.items() if k not in OPENAI_JIT_EXTRAS}
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        if "weights only load failed" in str(error).lower():
            found = next((line.strip() for line in str(error).splitlines() if "GLOBAL" in line or "global" in line), "")
            raise CheckpointError(
                f"cannot read checkpoint {path} with weights_only=True: it pickles a type that is not plain data "
                f"({found.split(' by default')[0][:300]}). Nothing unsafe is unpickled here. If the file is trusted, convert it once to "
                "tensors and plain containers, e.g. keep only its state dicts: "
                "c = torch.load(F, weights_only=False); torch.save({k: c[k] for k in KEYS}, OUT)") from error
        raise CheckpointError(f"cannot read checkpoint {path}: {type(error).__name__}: {error} "
                              "(truncated download, or not a PyTorch/safetensors state dict?)") from error


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint file, unwrapped (``state_dict`` entry, ``module.`` prefix, JIT extras)."""
    state = read_checkpoint(path)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"checkpoint {path} holds no state dict (a mapping of parameter names to tensors)")
    if all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return dict(state)


def _listing(kind: str, items: list[str], limit: int = 20) -> str:
    more = f", ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"{len(items)} {kind}: [{', '.join(items[:limit])}{more}]"


def merge_parts(checkpoint: object, parts: Mapping[str, str], source: str, layout: str = "") -> dict[str, torch.Tensor]:
    """One flat state dict from a dict of state dicts: entry ``name`` gets ``parts[name]`` as key
    prefix (``{"image_encoder": "image.", "model": ""}``); other entries (optimizer, scheduler,
    config, epoch) are training-only and ignored. Raises naming what the file holds instead."""
    what = layout or "this model"
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"checkpoint {source} holds a {type(checkpoint).__name__}, not the dict "
                              f"{{{', '.join(parts)}, ...}} that {what} checkpoints are")
    absent = [name for name in parts if not isinstance(checkpoint.get(name), Mapping)]
    if absent:
        entries = sorted(map(str, checkpoint))
        flat = bool(entries) and all(isinstance(v, torch.Tensor) for v in checkpoint.values())
        found = (f"a flat state dict of {len(entries)} tensors ({', '.join(entries[:4])}, ...){guess_layout(entries)}"
                 if flat else f"entries {entries[:12]}")
        raise CheckpointError(f"checkpoint {source} is not a {what} checkpoint: it has no {absent} "
                              f"state dict(s) (expected a dict with {list(parts)}); it holds {found}")
    merged: dict[str, torch.Tensor] = {}
    for name, prefix in parts.items():
        for key, value in checkpoint[name].items():
            if not isinstance(value, torch.Tensor):
                raise CheckpointError(f"checkpoint {source}: entry {name}[{key!r}] is a {type(value).__name__}, not a tensor")
            merged[prefix + key] = value
    return merged


def guess_layout(keys: Iterable[str]) -> str:
    """A hint naming the family a foreign state dict's keys look like (empty if unknown)."""
    keys = set(keys)
    if {"visual.conv1.weight", "visual.proj"} & keys or any(k.startswith("visual.trunk.") for k in keys):
        return ": this looks like a CLIP / open_clip checkpoint"
    if any(k.startswith(("res_features.", "decoder.layers.")) for k in keys):
        return ": this looks like one part of a KAD/MedKLIP-style checkpoint"
    return ""


def drop_aliases(state: dict[str, torch.Tensor], aliases: Mapping[str, str], source: str) -> dict[str, torch.Tensor]:
    """Remove duplicate keys: ``aliases`` maps a duplicate key prefix to the prefix of the copy kept
    (``{"decoder_norm.": "decoder.norm."}``). A duplicate is dropped only if its kept twin exists
    and ``torch.equal`` confirms the copy; a differing copy is a ``CheckpointError``. A duplicate
    without a twin in ``state`` is left in place (then unexpected, unless declared ignorable)."""
    out = dict(state)
    differing = []
    for key in sorted(state):
        for duplicate, kept in aliases.items():
            if key.startswith(duplicate):
                twin = kept + key[len(duplicate):]
                if twin in state:
                    if state[twin].shape != state[key].shape or not torch.equal(state[twin], state[key]):
                        differing.append(f"{key} != {twin}")
                    del out[key]
                break
    if differing:
        raise CheckpointError(f"checkpoint {source}: {_listing('keys that should be identical copies differ', differing)}; "
                              "the file is corrupt or not of this architecture")
    return out


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str,
                 ignore_unexpected: Iterable[str] = (), hint: str = "") -> None:
    """Load ``state`` into ``model`` exactly, or raise naming every missing, unexpected and mis-shaped key.

    ``ignore_unexpected``: regexes (``re.search``) of checkpoint keys the model does not use
    (training-only entries, unused heads); only keys the model lacks may match. ``hint`` is
    appended to the error (e.g. which architecture the file looks like).
    """
    expected = model.state_dict()
    # non-persistent buffers some checkpoints still carry (BERT's position_ids from older transformers)
    transient = {name for name, _ in model.named_buffers()} - expected.keys()
    state = {k: v for k, v in state.items() if k not in transient}
    patterns = [re.compile(p) for p in ignore_unexpected]
    state = {k: v for k, v in state.items() if k in expected or not any(p.search(k) for p in patterns)}
    for key in ("logit_scale", "logit_bias"):  # scalar vs [1], as open_clip tolerates
        if key in state and key in expected and state[key].numel() == expected[key].numel() == 1:
            state[key] = state[key].reshape(expected[key].shape)
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    mismatched = [f"{k} {tuple(state[k].shape)} != {tuple(expected[k].shape)}"
                  for k in sorted(expected.keys() & state.keys()) if state[k].shape != expected[k].shape]
    if missing or unexpected or mismatched:
        problems = [_listing(kind, items) for kind, items in
                    (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches (checkpoint != model)", mismatched))
                    if items]
        if len(missing) > len(expected) / 2:
            problems.append("most keys differ: are these weights of another architecture?")
        if hint:
            problems.append(hint)
        raise CheckpointError(f"checkpoint {source} does not fit the architecture: " + "; ".join(problems))
    model.load_state_dict(state, strict=True)


