"""Reading weights files, shared by every model family.

``read_state_dict`` unwraps a file into a flat mapping of names to tensors (``read_checkpoint``
+ ``merge_parts`` for a dict of several state dicts, such as KAD's ``{model, image_encoder,
text_encoder, optimizer, ...}``); a family's own filter function then renames its foreign
layout, ``drop_aliases`` removes duplicate keys after checking they are identical copies, and
``load_weights`` loads it strictly, naming every missing, unexpected and mis-shaped key. Only
keys matching a family's declared ``ignore_unexpected`` patterns (training-only or unused
entries) may be left out, and nothing is loaded with ``strict=False``.

No weights file runs code by default (``read_checkpoint``):

* ``torch.save`` files: ``torch.load(weights_only=True)``, tensors and plain containers only. A
  family may allow a few more globals *by name* (``safe_globals``): harmless builtins
  (``dict``, ``collections.defaultdict``, ``typing.Any`` ...) or inert stand-in records
  (``inert_class``) for foreign classes whose objects are only carried along (CARZero's
  OmegaConf config and Lightning callback keys); neither omegaconf nor Lightning is imported.
* TorchScript archives (OpenAI's CLIP release): never ``torch.jit.load``; ``read_torchscript``
  unpickles ``data.pkl`` with ``RestrictedUnpickler`` (``__torch__`` modules become inert records,
  tensors are rebuilt from the archive's storages by allow-listed functions, anything else is
  refused) and collects parameters and buffers by the ``__parameters__``/``__buffers__`` lists
  of the archive's ``code/`` (read as text, never run), named as ``state_dict()`` names them.
* safetensors: no code by design.

A file that needs anything else is refused with a ``CheckpointError`` naming every global it
references beyond the allowed ones. ``trust=True`` (a model's ``trust_checkpoint``, CLI
``--model.trust_checkpoint true``) is the explicit opt-in: ``torch.load(weights_only=False)`` /
``torch.jit.load``, which run code from the file; use it only for files you trust.

Over 500 lines on purpose: the one safe, strict reader of every format the families ship (pickles read by a
restricted unpickler, TorchScript archives, Lightning checkpoints); one file keeps the never-execute rule in one place.
"""

from __future__ import annotations

import collections
import hashlib
import io
import pickle
import re
import typing
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

# OpenAI's TorchScript archives carry these as entries of their state dict; they are not weights.
OPENAI_JIT_EXTRAS = ("input_resolution", "context_length", "vocab_size")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or does not fit the architecture."""


#: a ``fit`` checkpoint's record of its base weights, beside the trained tensors (``ZeroShotModel.on_save_checkpoint``)
FIT_RECORD = "xbench_fit"


def weights_fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of the names, dtypes, shapes and bytes of ``state``: equal only for the same weights."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def fit_checkpoint_name(record: Mapping) -> str:
    """``clip (xbench_pl.models.open_clip_model.OpenCLIPModel)``: the model a ``fit`` checkpoint was fitted on."""
    return f"{record['name']} ({record['model']})" if record.get("name") else record["model"]


def check_lightning_checkpoint(path: str | Path, model_class: str) -> None:
    """Raise a one-line ``CheckpointError`` unless ``path`` is a Lightning checkpoint that a ``model_class``
    (dotted path) can load: a readable ``torch.save`` zip of tensors and plain data holding a ``state_dict``
    and, when ``fit`` wrote it, fitted on that class. Read memory-mapped (cheap)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: not a checkpoint written by torch.save (a truncated or damaged file, "
                              "or another kind of file)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:  # LightningCLI reads the file with weights_only=True too
        raise CheckpointError(f"{path} holds more than tensors and plain data (a pickled object), so it is not "
                              "loaded; nothing from the file was run") from error
    except Exception as error:  # noqa: BLE001  (any other failure to read is a damaged file)
        raise CheckpointError(f"{path}: cannot read the checkpoint ({_last_words(error)}): a truncated or damaged file?") from error
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("state_dict"), Mapping):
        entries = sorted(map(str, checkpoint))[:6] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
        raise CheckpointError(f"{path} is not a Lightning checkpoint (no state_dict; it holds {entries}): a model's own "
                              "weights go to --model.checkpoint")
    record = checkpoint.get(FIT_RECORD)
    if record is not None and record["model"] != model_class:
        raise CheckpointError(f"{path} is a `fit` checkpoint of {fit_checkpoint_name(record)}, not of --model "
                              f"{model_class}: test it with the --model options fit had (its fit.json records them)")


def _last_words(error: BaseException) -> str:
    return " ".join(str(error).split())[:160] or type(error).__name__


def is_torchscript(path: Path) -> bool:
    """TorchScript archives are zips with ``constants.pkl``; ``torch.save`` zips have none."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/constants.pkl") or name == "constants.pkl" for name in archive.namelist())


TRUST_OPT_IN = ("If you trust the file, opt in with trust_checkpoint=True (CLI: --model.trust_checkpoint true), "
                "which reads it with {how}: that can run code from the file")

# harmless builtins a family may allow by name (protocol-2 pickles name builtins ``__builtin__.*``)
PLAIN_GLOBALS: dict[str, object] = {
    "builtins.dict": dict, "builtins.list": list, "builtins.int": int, "builtins.float": float,
    "builtins.tuple": tuple, "builtins.set": set, "builtins.str": str, "builtins.bool": bool,
    "collections.OrderedDict": collections.OrderedDict, "collections.defaultdict": collections.defaultdict,
    "typing.Any": typing.Any,
}
_PY2_BUILTINS = {"__builtin__.dict": "builtins.dict", "__builtin__.list": "builtins.list",
                 "__builtin__.long": "builtins.int", "__builtin__.int": "builtins.int",
                 "__builtin__.float": "builtins.float", "__builtin__.tuple": "builtins.tuple",
                 "__builtin__.set": "builtins.set", "__builtin__.unicode": "builtins.str",
                 "__builtin__.bool": "builtins.bool"}


class InertRecord:
    """Stand-in for a class a checkpoint pickles but whose code must not run: construction and
    ``__setstate__`` only record what the pickle gives (``args``, ``state``); no method of the
    real class exists here. ``state`` is the pickled ``__dict__`` (or state tuple)."""

    def __init__(self, *args, **kwargs):
        self.__dict__["args"], self.__dict__["kwargs"] = args, kwargs

    def __setstate__(self, state):
        self.__dict__["state"] = state

    def __repr__(self) -> str:
        return f"<inert {type(self).__module__}.{type(self).__qualname__}>"


_INERT_CLASSES: dict[str, type] = {}


def inert_class(dotted: str) -> type:
    """The (cached) ``InertRecord`` subclass standing in for class ``dotted`` (``module.Name``)."""
    if dotted not in _INERT_CLASSES:
        module, _, name = dotted.rpartition(".")
        _INERT_CLASSES[dotted] = type(name, (InertRecord,), {"__module__": module, "__qualname__": name})
    return _INERT_CLASSES[dotted]


def _allowed_globals(names: Iterable[str]) -> list[tuple[object, str]]:
    """``(object, dotted name)`` pairs for ``torch.serialization.safe_globals``: harmless builtins
    as themselves, every other name as an inert stand-in class."""
    allowed = []
    for name in names:
        plain = PLAIN_GLOBALS.get(_PY2_BUILTINS.get(name, name))
        if plain is None:
            allowed.append((inert_class(name), name))
        elif name.startswith("builtins.") or name.startswith("__builtin__."):
            allowed.append(plain)  # torch maps protocol-2 __builtin__ names to builtins itself
        else:
            allowed.append((plain, name))
    return allowed


def _unsafe_globals(path: Path, allowed: Iterable[str]) -> list[str]:
    """Globals the pickle of ``path`` references beyond torch's and ``allowed`` (read, never run)."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001  (naming them is a courtesy; the refusal stands)
        return []
    allowed = {_PY2_BUILTINS.get(a, a) for a in allowed}
    return sorted(g for g in found if _PY2_BUILTINS.get(g, g) not in allowed)


def not_a_checkpoint(path: Path) -> str | None:
    """Why ``path`` cannot be a checkpoint at all, read from its first bytes (None where it may be one): a web page (a
    download that fetched a page, such as Google Drive's virus-scan warning, instead of the file), a truncated zip
    archive (an interrupted download of a torch.save or TorchScript file), or none of the formats: a torch zip archive,
    a legacy pickle (protocol 2+), a safetensors file."""
    import zipfile

    with open(path, "rb") as handle:
        head = handle.read(1024)
    if not head:
        return "the file is empty"
    if head.lstrip()[:1] == b"<" and b"html" in head.lower():
        return "it is a web page (HTML), not the file: the download fetched a page (e.g. Google Drive's virus-scan warning)"
    if head[:4] == b"PK\x03\x04":
        return None if zipfile.is_zipfile(path) else "it is a truncated zip archive (an interrupted download)"
    if head[:1] == b"\x80" and 2 <= head[1] <= 5:  # a pickle's PROTO opcode: torch.save's legacy format
        return None
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size:  # safetensors
        return None
    return (f"it is no PyTorch (zip or pickle) or safetensors file (its first bytes: {head[:16]!r}): a corrupt or partial "
            "download")


def read_checkpoint(path: Path, trust: bool = False, safe_globals: Iterable[str] = ()) -> object:
    """The object stored in a checkpoint file, on the CPU, without running code from it.

    ``torch.load(weights_only=True)`` (plus ``safe_globals``: dotted names allowed as harmless
    builtins or inert stand-ins, see the module docstring), ``read_torchscript`` for TorchScript
    archives, safetensors. ``trust=True`` is the opt-in for files needing more (full unpickling /
    ``torch.jit.load``). ``CheckpointError`` names the file, and what it needs when refused."""
    path = Path(path)
    safe_globals = tuple(safe_globals)
    if path.is_file() and (problem := not_a_checkpoint(path)) is not None:  # before any advice on trusting a pickle
        raise CheckpointError(f"cannot read checkpoint {path}: not a checkpoint, {problem}; download it again (nothing from it "
                              "was run)")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        if is_torchscript(path):
            if trust:
                state = torch.jit.load(str(path), map_location="cpu").state_dict()
                return {k: v for k, v in state.items() if k not in OPENAI_JIT_EXTRAS}
            state = read_torchscript(path)
            return {k: v for k, v in state.items() if k not in OPENAI_JIT_EXTRAS}
        with torch.serialization.safe_globals(_allowed_globals(safe_globals)):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(checkpoint, Mapping) and FIT_RECORD in checkpoint:
            raise CheckpointError(f"{path} is a `fit` checkpoint of {fit_checkpoint_name(checkpoint[FIT_RECORD])} (its "
                                  "trained tensors only): pass it as --ckpt_path, with the --model options fit had")
        return checkpoint
    except CheckpointError:
        raise
    except Exception as error:
        if "weights only load failed" in str(error).lower():
            if trust:
                try:
                    return torch.load(path, map_location="cpu", weights_only=False)
                except Exception as trusted_error:
                    raise CheckpointError(f"cannot read checkpoint {path} even with trust_checkpoint=True (full unpickling): "
                                          f"{type(trusted_error).__name__}: {trusted_error}") from trusted_error
            unsafe = _unsafe_globals(path, safe_globals)
            found = next((line.strip() for line in str(error).splitlines() if "GLOBAL" in line or "global" in line), "")
            named = f"globals {unsafe}" if unsafe else found.split(" by default")[0][:300]
            raise CheckpointError(
                f"cannot read checkpoint {path} with weights_only=True: it pickles a type that is not plain data "
                f"({named}). Nothing from the file was run. {TRUST_OPT_IN.format(how='torch.load(weights_only=False)')}; "
                "or convert it once to tensors and plain containers, e.g. keep only its state dicts: "
                "c = torch.load(F, weights_only=False); torch.save({k: c[k] for k in KEYS}, OUT)") from error
        raise CheckpointError(f"cannot read checkpoint {path}: {type(error).__name__}: {error} "
                              "(truncated download, or not a PyTorch/safetensors state dict?)") from error


# -- TorchScript archives, read without torch.jit.load -----------------------------------------
_STORAGE_DTYPES = {
    "torch.FloatStorage": torch.float32, "torch.HalfStorage": torch.float16, "torch.BFloat16Storage": torch.bfloat16,
    "torch.DoubleStorage": torch.float64, "torch.LongStorage": torch.int64, "torch.IntStorage": torch.int32,
    "torch.ShortStorage": torch.int16, "torch.CharStorage": torch.int8, "torch.ByteStorage": torch.uint8,
    "torch.BoolStorage": torch.bool,
}


class _StorageType:
    """What a ``torch.*Storage`` global stands for here: only its dtype."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


def _rebuild_tensor(storage: torch.Tensor, offset: int, size, stride, *_ignored) -> torch.Tensor:
    """Inert twin of ``torch._utils._rebuild_tensor_v2``: a view of the flat storage tensor
    (``requires_grad``, backward hooks and metadata are dropped)."""
    return storage.as_strided(tuple(size), tuple(stride), offset)


def _rebuild_parameter(data: torch.Tensor, *_ignored) -> torch.Tensor:
    return data


class _ScriptModule(InertRecord):
    """Base of the stand-ins for a TorchScript archive's ``__torch__.*`` classes."""

    qualified = ""


class _Refused:
    """A global that is not allowed: recorded, and inert if the pickle calls it."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        return None


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles a TorchScript ``data.pkl`` without running anything from it.

    ``find_class`` answers only: ``__torch__.*`` classes (not ``__torch__.torch.classes``, which
    are C++ objects with code) -> inert ``_ScriptModule`` stand-ins recording their state;
    ``torch.*Storage`` -> a dtype; ``torch._utils._rebuild_tensor_v2`` / ``_rebuild_parameter``
    and ``torch.jit._pickle`` list builders -> inert twins; ``collections.OrderedDict``. Every
    other global is recorded in ``refused`` (and replaced by an inert placeholder); the caller
    raises naming them. Storages (``persistent_load``) are read from ``data/`` of the archive."""

    INERT = {
        "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
        "torch._utils._rebuild_tensor": _rebuild_tensor,
        "torch._utils._rebuild_parameter": _rebuild_parameter,
        "torch.jit._pickle.build_intlist": list,
        "torch.jit._pickle.build_doublelist": list,
        "torch.jit._pickle.build_boollist": list,
        "torch.jit._pickle.build_tensorlist": list,
        "torch.jit._pickle.restore_type_tag": lambda value, _type=None: value,
        "collections.OrderedDict": collections.OrderedDict,
    }

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix = archive, prefix
        self.refused: list[str] = []
        self.classes: dict[str, type] = {}
        self.storages: dict[str, torch.Tensor] = {}

    def find_class(self, module: str, name: str):
        dotted = f"{module}.{name}"
        if dotted in self.INERT:
            return self.INERT[dotted]
        if dotted in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[dotted])
        if (module == "__torch__" or module.startswith("__torch__.")) and not module.startswith("__torch__.torch.classes"):
            if dotted not in self.classes:
                self.classes[dotted] = type(name, (_ScriptModule,), {"__module__": module, "__qualname__": name,
                                                                      "qualified": dotted})
            return self.classes[dotted]
        if dotted not in self.refused:
            self.refused.append(dotted)
        return _Refused(dotted)

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"unsupported persistent id {str(pid)[:80]}")
        _, storage_type, key, _location, numel = pid
        if key not in self.storages:
            raw = bytearray(self.archive.read(f"{self.prefix}data/{key}"))
            flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            self.storages[key] = flat.view(storage_type.dtype)[:numel] if raw else torch.empty(0, dtype=storage_type.dtype)
        return self.storages[key]


_CLASS_LINE = re.compile(r"^class ([\w.]+)\(Module\):", re.M)
_LIST_LINE = re.compile(r"^\s+__(parameters|buffers)__ = \[(.*?)\]", re.M)


def _script_classes(archive: zipfile.ZipFile, prefix: str) -> dict[str, tuple[list[str], list[str]]]:
    """``{qualified class: (parameter names, buffer names)}`` from the archive's ``code/*.py``,
    read as text (TorchScript writes ``__parameters__ = [...]``/``__buffers__ = [...]`` per module)."""
    classes = {}
    for name in archive.namelist():
        if not (name.startswith(f"{prefix}code/") and name.endswith(".py")):
            continue
        module = name[len(f"{prefix}code/"):-len(".py")].replace("/", ".")
        text = archive.read(name).decode("utf-8", "replace")
        heads = list(_CLASS_LINE.finditer(text))
        for i, head in enumerate(heads):
            body = text[head.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
            lists = {kind: re.findall(r'"([^"]*)"', items) for kind, items in _LIST_LINE.findall(body)}
            classes[f"{module}.{head.group(1)}"] = (lists.get("parameters", []), lists.get("buffers", []))
    return classes


def read_torchscript(path: Path) -> dict[str, torch.Tensor]:
    """Parameters and buffers of a TorchScript archive, named as its ``state_dict()``, without
    ``torch.jit.load``: nothing from the archive runs (see ``RestrictedUnpickler``)."""
    path = Path(path)
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("data.pkl") and n.count("/") <= 1 and not n.startswith(".")]
        if len(pickles) != 1:
            raise CheckpointError(f"cannot read TorchScript archive {path}: expected one data.pkl record, found {pickles}")
        prefix = pickles[0][: -len("data.pkl")]
        if f"{prefix}byteorder" in names and archive.read(f"{prefix}byteorder").strip() not in (b"little", b""):
            raise CheckpointError(f"TorchScript archive {path} was written big-endian; only little-endian archives are read")
        unpickler = RestrictedUnpickler(archive.read(pickles[0]), archive, prefix)
        try:
            root = unpickler.load()
            failure = None
        except Exception as error:  # noqa: BLE001  (reported below, after any refused globals)
            root, failure = None, error
        if unpickler.refused:
            raise CheckpointError(
                f"refusing TorchScript archive {path}: its pickle references globals that are not tensors or modules: "
                f"{unpickler.refused}. Nothing from the file was run. "
                f"{TRUST_OPT_IN.format(how='torch.jit.load')}") from failure
        if failure is not None:
            raise CheckpointError(f"cannot read TorchScript archive {path}: {type(failure).__name__}: {failure} "
                                  "(truncated or damaged file?)") from failure
        classes = _script_classes(archive, prefix)
    if not isinstance(root, _ScriptModule):
        raise CheckpointError(f"TorchScript archive {path} holds a {type(root).__name__}, not a scripted module")
    state: dict[str, torch.Tensor] = {}
    _collect_module_state(root, classes, "", state, path)
    return state


def _collect_module_state(module: _ScriptModule, classes: dict, prefix: str, out: dict, path: Path) -> None:
    if module.qualified not in classes:
        raise CheckpointError(f"TorchScript archive {path}: no __parameters__/__buffers__ declaration for class "
                              f"{module.qualified} in its code/ folder; cannot tell weights from attributes. "
                              f"{TRUST_OPT_IN.format(how='torch.jit.load')}")
    attributes = module.__dict__.get("state")
    attributes = attributes if isinstance(attributes, dict) else {}
    parameters, buffers = classes[module.qualified]
    for name in (*parameters, *buffers):
        if isinstance(attributes.get(name), torch.Tensor):
            out[prefix + name] = attributes[name]
    for name, value in attributes.items():
        if isinstance(value, _ScriptModule):
            _collect_module_state(value, classes, f"{prefix}{name}.", out, path)


def read_state_dict(path: Path, trust: bool = False) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint file, unwrapped (``state_dict`` entry, ``module.`` prefix, JIT extras);
    ``trust``: see ``read_checkpoint``."""
    state = read_checkpoint(path, trust=trust)
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


def rename_prefix(key: str, renames: Iterable[tuple[str, str]]) -> str:
    """``key`` with the first matching ``(old prefix, new prefix)`` of ``renames`` replaced (a family's filter table)."""
    for old, new in renames:
        if key.startswith(old):
            return new + key[len(old):]
    return key


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




RANDOM_INIT_SEED = 0  # random_init weights are drawn from this seed: the same model on every rank and run


def build_weights(build: Callable[[], None], random_init: bool) -> None:
    """Run ``build()`` (which creates the modules); for a model without a checkpoint under a forked RNG
    seeded ``RANDOM_INIT_SEED``, so that smoke runs are reproducible and the global RNG is untouched."""
    if not random_init:
        build()
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_INIT_SEED)
        build()


def load_or_warn(model: nn.Module, checkpoint_file: Path | None) -> None:
    """``model.load_checkpoint(checkpoint_file)``, or without a file ``model.warn_random_weights()``
    (reports say so); then evaluation mode."""
    if checkpoint_file is not None:
        model.load_checkpoint(checkpoint_file)
    else:
        model.warn_random_weights()
    model.eval()
