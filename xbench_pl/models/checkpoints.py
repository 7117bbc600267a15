"""Reading weights files, shared by every model family.

``read_state_dict`` unwraps a file into a flat mapping of names to tensors; a family's own
filter function then renames its foreign layout, and ``load_weights`` loads it strictly,
naming every missing, unexpected and mis-shaped key.
"""

from __future__ import annotations

import zipfile
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


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint file, unwrapped (``state_dict`` entry, ``module.`` prefix, JIT extras)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        elif is_torchscript(path):
            state = torch.jit.load(str(path), map_location="cpu").state_dict()
            state = {k: v for k, v in state.items() if k not in OPENAI_JIT_EXTRAS}
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {type(error).__name__}: {error} "
                              "(truncated download, or not a PyTorch/safetensors state dict?)") from error
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


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into ``model`` exactly, or raise naming every missing, unexpected and mis-shaped key."""
    expected = model.state_dict()
    # non-persistent buffers some checkpoints still carry (BERT's position_ids from older transformers)
    transient = {name for name, _ in model.named_buffers()} - expected.keys()
    state = {k: v for k, v in state.items() if k not in transient}
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
        raise CheckpointError(f"checkpoint {source} does not fit the architecture: " + "; ".join(problems))
    model.load_state_dict(state, strict=True)


