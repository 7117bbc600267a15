"""The prediction store's files: what a model said about every (image, finding), saved as a run goes.

``test --predictions DIR`` (or the ``xbench_pl.callbacks.predictions.PredictionWriter`` callback)
writes a store; ``test --predictions DIR --resume`` continues one after a crash; ``score
--predictions DIR`` recomputes the metrics from it without a model (``xbench_pl.predictions`` replays it). This
module reads and writes the folder and imports neither Lightning nor the model and data classes, so ``export``
and ``store upgrade`` start without them.

Layout::

    DIR/manifest.json          what wrote the store (``manifest``): model name, model/data config,
                               precision, metric settings, map dtype, xbench_pl version, format
    DIR/shards/*.safetensors   one shard = consecutive images of one dataset from one rank

A shard holds, per image: ``image_ids``, ``scores [N, C]`` (float64: exact for any model
dtype), ``saliency [N, C, h, w]`` (the model's native-grid maps, every finding, in the store's
dtype: float16 by default, float32 for bit-identical re-scoring), ``affine [N, 4]`` (float64),
``original_size [N, 2]`` (H, W, int64) and ``labels [N, C]`` (uint8, as the run saw them, for
reference), plus the shard's ``dataset``, ``classes`` and ``input_size`` (the side of the model
input the maps span): exactly what ``ZeroShotModel.test_step`` reads of a batch and of the model's
answer to warp the maps to the eval grid and feed ``BenchmarkMetrics`` (``replay`` runs that very
judging, ``Judge.update_metrics``). Regions are not stored: they come from the dataset, rasterised on the eval grid of whatever
``--data.eval_size`` re-scoring asks for.

A model that states boxes (a grounded generative model: ``judging.StatedBoxes``) adds ``stated_boxes [M, 5]`` (float64:
every box in model-input pixels with its confidence, image-major then finding, in the order stated),
``stated_counts [N, C]`` (int64, boxes per pair) and ``stated_failed [N, C]`` (uint8: the answer did not parse), and in
the metadata ``stated_texts`` (JSON: the raw generated text of every pair); a replay judges those boxes as the run did.

A shard file (format 2) is a safetensors file: the five arrays as tensors, and in its string
metadata ``format`` (``SHARD_FORMAT``), ``dataset``, ``classes`` and ``image_ids`` (JSON lists),
``input_size``, ``saliency_dtype`` and ``sha256``: the SHA-256 of the whole file with those 64 hex
digits written as zeros. ``numpy`` and ``safetensors`` alone read it (``safetensors.numpy.load_file``;
no pickle anywhere); a bfloat16 store's maps are their raw bits as uint16 (numpy has no bfloat16:
``(bits.astype(np.uint32) << 16).view(np.float32)`` is exact). It is written to a temporary name,
fsynced, then renamed (and the folder fsynced): a crash leaves a complete shard or none; a truncated
or altered one fails its length or checksum and is never trusted.

Format 1 stores (``*.xbp``: ``LEGACY_MAGIC``, the payload's length and SHA-256, a ``torch.save``
pickle read back with ``weights_only=True``) are still read (``score``, ``compare``, ``export``) but
not written to: ``upgrade`` (``python -m xbench_pl store upgrade DIR``) converts one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

from xbench_pl.outputs import atomic_write, fsync_dir

FORMAT = 2
SHARD_SUFFIX = ".safetensors"
#: a shard file's ``format`` metadata
SHARD_FORMAT = "xbench_pl.shard.2"
#: format 1 shards (read-only): magic, payload length, SHA-256, ``torch.save`` payload
LEGACY_MAGIC = b"XBPSHRD1"
LEGACY_SUFFIX = ".xbp"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
#: a shard's arrays: name -> dtype in the file (``saliency``: the store's dtype), largest items first (aligned)
ARRAYS = {"scores": torch.float64, "affine": torch.float64, "original_size": torch.int64, "saliency": None,
          "labels": torch.uint8}
#: a model that states boxes (``judging.StatedBoxes.arrays``; its raw texts in the metadata's ``stated_texts``)
STATED_ARRAYS = {"stated_boxes": torch.float64, "stated_counts": torch.int64, "stated_failed": torch.uint8}
_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.int64: "I64", torch.float32: "F32", torch.float16: "F16",
                       torch.uint16: "U16", torch.uint8: "U8"}
_NO_DIGEST = "0" * 64
#: manifest keys that must agree for two runs to write into one store
FINGERPRINT = ("format", "xbench_pl", "model_name", "random_weights", "explainer", "config", "metrics", "dtype")


class StoreError(ValueError):
    """A store that cannot be used as asked (another config, not resumable, corrupt, incomplete); the message says why and what to do."""


@dataclass
class BadShard:
    path: Path
    reason: str

    @classmethod
    def of(cls, path: Path, error: Exception) -> BadShard:
        return cls(Path(path), str(error) or type(error).__name__)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


# -- shard files ------------------------------------------------------------------------------
def _header(arrays: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """A safetensors header (its 8-byte length and the JSON, space-padded to 8 bytes), metadata keys sorted: one
    shard always encodes to the same bytes."""
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name, array in arrays.items():
        size = array.numel() * array.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[array.dtype], "shape": list(array.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def encode_shard(shard: dict) -> bytes:
    """A shard as a safetensors file (the module docstring): its arrays as tensors, its strings as metadata."""
    saliency = shard["saliency"]
    names = {dtype: name for name, dtype in DTYPES.items()}
    if saliency.dtype not in names:
        raise ValueError(f"saliency dtype {saliency.dtype} is none of {sorted(DTYPES)}")
    arrays = {}
    stated = shard.get("stated")
    given = {**shard, **(stated.arrays() if stated is not None else {})}
    for name, dtype in {**ARRAYS, **(STATED_ARRAYS if stated is not None else {})}.items():
        value = given[name].detach().cpu()
        value = value.view(torch.uint16) if name == "saliency" and value.dtype == torch.bfloat16 else value.to(dtype or value.dtype)
        arrays[name] = value.contiguous()
    metadata = {"format": SHARD_FORMAT, "dataset": str(shard["dataset"]), "classes": json.dumps(list(shard["classes"]), separators=(",", ":")),
                "image_ids": json.dumps(list(shard["image_ids"]), separators=(",", ":")), "input_size": str(int(shard["input_size"])),
                "saliency_dtype": names[saliency.dtype], "sha256": _NO_DIGEST}
    if stated is not None:
        metadata["stated_texts"] = json.dumps(stated.texts, separators=(",", ":"))
    buffers = [memoryview(a.numpy()).cast("B") if a.numel() else memoryview(b"") for a in arrays.values()]  # (no box stated)
    digest = hashlib.sha256(_header(arrays, metadata))
    for buffer in buffers:
        digest.update(buffer)
    return b"".join([_header(arrays, {**metadata, "sha256": digest.hexdigest()}), *buffers])


def decode_shard(data: bytes) -> dict:
    """The shard dict of a shard file (either format); ``ValueError`` saying what is wrong for a truncated or corrupt one."""
    if data.startswith(LEGACY_MAGIC):
        return decode_legacy_shard(data)
    if len(data) < 8:
        raise ValueError(f"truncated: {len(data)} bytes, not even a header length")
    (length,) = struct.unpack("<Q", data[:8])
    if len(data) < 8 + length:
        raise ValueError(f"truncated: {len(data)} bytes, shorter than its {length}-byte header")
    try:
        header = json.loads(data[8:8 + length])
        metadata = header["__metadata__"]
        if metadata["format"] != SHARD_FORMAT:
            raise ValueError(f"format {metadata['format']!r}")
        end = max(spec["data_offsets"][1] for name, spec in header.items() if name != "__metadata__")
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"not a shard (bad header: {error}): overwritten, or not written by xbench_pl") from None
    if len(data) != 8 + length + end:
        raise ValueError(f"truncated: {len(data) - 8 - length} of {end} data bytes")
    stated = metadata.get("sha256", "")
    field = f'"sha256":"{stated}"'.encode()
    head = data[8:8 + length]
    if len(stated) != 64 or head.count(field) != 1:
        raise ValueError("checksum mismatch: the header's sha256 is missing or altered")
    digest = hashlib.sha256(data[:8] + head.replace(field, field.replace(stated.encode(), _NO_DIGEST.encode())))
    digest.update(memoryview(data)[8 + length:])
    if digest.hexdigest() != stated:
        raise ValueError("checksum mismatch: the file was altered after it was written")
    tensors = safetensors.torch.load(data)
    if metadata["saliency_dtype"] == "bfloat16":
        tensors["saliency"] = tensors["saliency"].view(torch.bfloat16)
    out = {"dataset": metadata["dataset"], "classes": json.loads(metadata["classes"]),
           "image_ids": json.loads(metadata["image_ids"]), "input_size": int(metadata["input_size"]),
           **{name: tensors[name] for name in ARRAYS}}
    if "stated_texts" in metadata:
        from xbench_pl.judging import StatedBoxes

        out["stated"] = StatedBoxes.from_arrays(*(tensors[name] for name in STATED_ARRAYS), json.loads(metadata["stated_texts"]))
    return out


def decode_legacy_shard(data: bytes) -> dict:
    """A format 1 shard (``*.xbp``, read-only); ``ValueError`` saying what is wrong for a truncated or corrupt file."""
    head = len(LEGACY_MAGIC) + 8 + 32
    if len(data) < head or not data.startswith(LEGACY_MAGIC):
        raise ValueError("not a shard (bad header): truncated or overwritten")
    (length,) = struct.unpack("<Q", data[len(LEGACY_MAGIC):len(LEGACY_MAGIC) + 8])
    payload = data[head:]
    if len(payload) != length:
        raise ValueError(f"truncated: {len(payload)} of {length} payload bytes")
    if hashlib.sha256(payload).digest() != data[len(LEGACY_MAGIC) + 8:head]:
        raise ValueError("checksum mismatch: the file was altered after it was written")
    return torch.load(io.BytesIO(payload), weights_only=True)


# -- the store folder -------------------------------------------------------------------------
class Store:
    """A prediction store folder (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.shards_dir = self.root / "shards"
        self.manifest_path = self.root / "manifest.json"

    def read_manifest(self) -> dict | None:
        if not self.manifest_path.is_file():
            return None
        try:
            return json.loads(self.manifest_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:  # (from None: the one line is this one, not its cause's)
            raise StoreError(f"{self.manifest_path}: unreadable manifest ({error}); this folder is no usable prediction store") from None

    def write_manifest(self, manifest: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write(self.manifest_path, json.dumps(manifest, indent=2) + "\n", sync=True)

    def shard_paths(self) -> list[Path]:
        """Every shard file: ``*.safetensors``, and format 1 ``*.xbp`` not yet converted (``upgrade``)."""
        if not self.shards_dir.is_dir():
            return []
        files = [p for p in self.shards_dir.iterdir() if not p.name.startswith(".")]
        new = {p.stem for p in files if p.suffix == SHARD_SUFFIX}
        return sorted(p for p in files if p.suffix == SHARD_SUFFIX or (p.suffix == LEGACY_SUFFIX and p.stem not in new))

    def load_intact(self) -> list[dict]:
        """``load``'s shards; ``StoreError`` (naming ``--resume``, which redoes their images) if one does not read back."""
        good, bad = self.load()
        if bad:
            raise StoreError(f"{len(bad)} shard(s) of {self} do not read back ({bad[0]}"
                             f"{'; ...' if len(bad) > 1 else ''}): continue the run with test ... --predictions {self} --resume, "
                             "which redoes their images")
        return good

    def load(self) -> tuple[list[dict], list[BadShard]]:
        """Every shard that reads back intact (in name order), and every one that does not, with why."""
        good, bad = [], []
        for path in self.shard_paths():
            try:
                good.append(self.read(path))
            except Exception as error:  # noqa: BLE001 - any failure to read back means: not trusted
                bad.append(BadShard.of(path, error))
        return good, bad

    def read_intact(self, path: Path) -> dict:
        """``read``; ``StoreError`` (naming ``--resume``, as ``load_intact``) if the shard does not read back."""
        try:
            return self.read(path)
        except Exception as error:  # noqa: BLE001 - any failure to read back means: not trusted
            raise StoreError(f"a shard of {self} does not read back ({BadShard.of(path, error)}): continue the run with "
                             f"test ... --predictions {self} --resume, which redoes its images") from None

    def read(self, path: Path) -> dict:
        """One shard, whole, with its ``path``; raises whatever stops it reading back intact."""
        shard = decode_shard(Path(path).read_bytes())
        shard["path"] = str(path)
        return shard

    def write_shard(self, name: str, shard: dict) -> Path:
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        path = self.shards_dir / f"{name}{SHARD_SUFFIX}"
        atomic_write(path, encode_shard(shard), sync=True)
        return path

    def set_aside(self, bad: list[BadShard]) -> None:
        """Move unreadable shards to ``DIR/corrupt/`` (kept for inspection, never read again)."""
        if not bad:
            return
        folder = self.root / "corrupt"
        folder.mkdir(parents=True, exist_ok=True)
        for shard in bad:
            if shard.path.exists():
                os.replace(shard.path, folder / shard.path.name)
        fsync_dir(self.shards_dir)

    def __str__(self) -> str:
        return str(self.root)


def upgrade(store: Store) -> tuple[int, list[BadShard]]:
    """Convert a format 1 store to this format in place: each ``*.xbp`` shard rewritten as ``*.safetensors``
    (atomically), the manifest's ``format`` raised (``upgraded_from`` recording the old one), then the old shards
    removed; a shard that does not read back is set aside (``DIR/corrupt/``; ``--resume`` redoes its images).
    Safe to repeat after a crash. Returns (shards converted, shards set aside)."""
    stored = store.read_manifest()
    if stored is None:
        raise StoreError(f"{store.manifest_path} not found: {store} is no prediction store")
    version = stored.get("format", 1)
    if version > FORMAT:
        raise StoreError(f"{store} is in format {version}, newer than this xbench_pl's {FORMAT}: upgrade xbench_pl")
    legacy = sorted(store.shards_dir.glob(f"*{LEGACY_SUFFIX}")) if store.shards_dir.is_dir() else []
    converted, bad = [], []
    for path in legacy:
        try:
            shard = decode_legacy_shard(path.read_bytes())
        except Exception as error:  # noqa: BLE001 - any failure to read back means: not trusted
            bad.append(BadShard.of(path, error))
            continue
        atomic_write(path.with_suffix(SHARD_SUFFIX), encode_shard(shard), sync=True)
        converted.append(path)
    store.set_aside(bad)
    if version < FORMAT:
        store.write_manifest({**stored, "format": FORMAT, "upgraded_from": version})
    for path in converted:
        path.unlink()
    if converted:
        fsync_dir(store.shards_dir)
    return len(converted), bad


def manifest(model_name: str | None, config: dict, metrics: dict, dtype: str, random_weights: bool,
             explainer: dict | None = None) -> dict:
    """What a store records of the run that writes it (as JSON data: tuples become lists, so that it compares equal when read back)."""
    import xbench_pl

    return json.loads(json.dumps({"format": FORMAT, "xbench_pl": xbench_pl.__version__, "model_name": model_name,
                                  "random_weights": random_weights, "explainer": explainer, "config": config, "metrics": metrics,
                                  "dtype": dtype}))


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def differences(stored: dict, wanted: dict) -> list[str]:
    """The fingerprint keys (dotted) on which two manifests disagree: ``key: stored -> wanted``."""
    a = _flat({k: stored.get(k) for k in FINGERPRINT})
    b = _flat({k: wanted.get(k) for k in FINGERPRINT})
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def upgrade_hint(store: Store) -> str:
    return f"python -m xbench_pl store upgrade {store}"


def check_same_config(store: Store, stored: dict | None, wanted: dict) -> None:
    if stored is None:
        return
    if stored.get("format", 1) < FORMAT:
        raise StoreError(f"the prediction store {store} is in format {stored.get('format', 1)} (*{LEGACY_SUFFIX} shards), "
                         f"read-only: convert it to format {FORMAT} with {upgrade_hint(store)}, then resume")
    # a setting an older manifest records that is no judging setting now (fit's trainable, lr, weight_decay) is not compared
    stored = {**stored, "metrics": {k: v for k, v in stored.get("metrics", {}).items() if k in wanted.get("metrics", {})}}
    diff = differences(stored, wanted)
    if diff:
        shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
        raise StoreError(f"the prediction store {store} was written by another configuration ({shown}); "
                         "a store holds one model, config and dataset setting: use another --predictions folder")


def model_name(stored: dict) -> str:
    """A store's model as its manifest names it (the model's class path where it has no name)."""
    return stored.get("model_name") or stored.get("config", {}).get("model", {}).get("class_path", "model")
