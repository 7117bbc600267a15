"""The store's shard format (safetensors: read by numpy + safetensors alone) and format 1 stores (read, refused
for --resume naming ``store upgrade``, converted by it)."""

import hashlib
import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import safetensors
import torch
from safetensors import safe_open
from test_cli import in_process
from test_predictions import COMMON, MODEL, metrics, run_test, shard_of

from xbench_pl.commands import main
from xbench_pl.prediction_store import FORMAT, LEGACY_MAGIC, SHARD_FORMAT, Store, decode_shard, encode_shard


def test_a_shard_is_a_safetensors_file_with_its_strings_in_the_metadata(tmp_path):
    shard = shard_of()
    path = Store(tmp_path).write_shard("demo-x", shard)
    with safe_open(path, "np") as handle:
        meta = handle.metadata()
        arrays = {name: handle.get_tensor(name) for name in handle.keys()}
    assert sorted(arrays) == ["affine", "labels", "original_size", "saliency", "scores"]
    assert {k: str(v.dtype) for k, v in arrays.items()} == {"scores": "float64", "saliency": "float16", "affine": "float64",
                                                            "original_size": "int64", "labels": "uint8"}
    assert arrays["saliency"].shape == (2, 2, 14, 14)
    assert {k: v for k, v in meta.items() if k != "sha256"} == {
        "format": SHARD_FORMAT, "dataset": "demo", "classes": '["Mass","Nodule"]', "image_ids": '["a","b"]',
        "input_size": "56", "saliency_dtype": "float16"}
    data = path.read_bytes()  # the digest, as docs/store.md says: the file with its 64 hex digits as zeros
    assert hashlib.sha256(data.replace(meta["sha256"].encode(), b"0" * 64, 1)).hexdigest() == meta["sha256"]
    for name, array in arrays.items():
        assert numpy.array_equal(array, shard[name].numpy())


BARE = """
import json, sys
for name in ("xbench_pl", "torch"):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} is importable: the interpreter is not bare")
sys.path.insert(0, sys.argv[1])
import numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
import pickle, _pickle  # numpy imports them (for np.load): any use of them now fails
def refuse(*args, **kwargs):
    raise AssertionError("pickle was used")
for module in (pickle, _pickle):
    module.load = module.loads = module.Unpickler = refuse
out = {}
for path in sys.argv[2:]:
    arrays = load_file(path)
    meta = safe_open(path, "np").metadata()
    if meta["saliency_dtype"] == "bfloat16":  # docs/store.md: raw bits -> float32, exact
        arrays["saliency"] = (arrays["saliency"].astype(np.uint32) << 16).view(np.float32)
    out[path] = {"meta": meta, "arrays": {k: [str(v.dtype), v.tolist()] for k, v in arrays.items()}}
assert "torch" not in sys.modules and "xbench_pl" not in sys.modules, sorted(sys.modules)
print(json.dumps(out))
"""


def test_numpy_and_safetensors_alone_read_a_shard(tmp_path):
    """A bare interpreter (``-I -S``: no site-packages, no PYTHONPATH) that sees only numpy and safetensors reads
    the shards of every dtype: xbench_pl and torch cannot even be imported there."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for module in (numpy, safetensors):
        package = Path(module.__file__).parent
        for entry in package.parent.iterdir():  # the package and its vendored libraries (numpy.libs)
            if entry.name == package.name or entry.name.startswith(package.name + "."):
                (bare / entry.name).symlink_to(entry)
    store = Store(tmp_path / "store")
    shards = {str(store.write_shard(name, shard_of(dtype))): shard_of(dtype)
              for name, dtype in (("f16", torch.float16), ("f32", torch.float32), ("bf16", torch.bfloat16))}
    result = subprocess.run([sys.executable, "-I", "-S", "-c", BARE, str(bare), *shards], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={})
    assert result.returncode == 0, result.stderr[-3000:]
    for path, read in json.loads(result.stdout).items():
        shard = shards[path]
        assert json.loads(read["meta"]["image_ids"]) == shard["image_ids"]
        for name, (dtype, values) in read["arrays"].items():
            expected = shard[name].float() if shard[name].dtype == torch.bfloat16 else shard[name]
            assert dtype == str(expected.numpy().dtype) and values == expected.tolist(), (path, name)


# -- format 1 stores ---------------------------------------------------------------------------
def legacy_bytes(shard: dict) -> bytes:
    """A format 1 shard as xbench_pl 0.1 wrote it: magic, payload length, SHA-256, ``torch.save`` payload."""
    buffer = io.BytesIO()
    torch.save(shard, buffer)
    payload = buffer.getvalue()
    return LEGACY_MAGIC + struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + payload


def make_legacy(store: Path) -> dict[str, bytes]:
    """Turn a store into format 1 in place; returns its format 2 shards' bytes by name stem."""
    originals = {}
    for path in Store(store).shard_paths():
        originals[path.stem] = path.read_bytes()
        path.with_suffix(".xbp").write_bytes(legacy_bytes(decode_shard(originals[path.stem])))
        path.unlink()
    manifest = json.loads((store / "manifest.json").read_text())
    (store / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    return originals


@pytest.fixture(scope="module")
def run_and_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("format")
    run_test(root / "run", "--predictions", str(root / "store"), "--predictions_dtype", "float32", "--predictions_shard_images", "3")
    return root / "run", root / "store"


def test_a_format_1_store_is_read_refused_for_resume_and_upgraded(run_and_store, tmp_path, capsys):
    run, reference = run_and_store
    store = tmp_path / "store"
    subprocess.run(["cp", "-r", str(reference), str(store)], check=True)
    originals = make_legacy(store)
    assert sorted(p.suffix for p in Store(store).shard_paths()) == [".xbp"] * 4
    scored = in_process("score", "--predictions", str(store), "--out", str(tmp_path / "old"))
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert metrics(tmp_path / "old") == metrics(run)  # read as it is
    resumed = in_process("test", *MODEL, *COMMON, "--out", str(tmp_path / "resumed"), "--predictions", str(store),
                         "--predictions_dtype", "float32", "--resume", "true")
    assert resumed.returncode == 2
    (line,) = [line for line in resumed.stderr.splitlines() if line.startswith("error:")]
    assert f"python -m xbench_pl store upgrade {store}" in line and "format 1" in line
    assert main(["store", "upgrade", str(store)]) == 0
    assert "4 shard(s) converted" in capsys.readouterr().out
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["format"] == FORMAT and manifest["upgraded_from"] == 1
    # the very bytes the run wrote: one shard, one encoding
    assert {p.stem: p.read_bytes() for p in Store(store).shard_paths()} == originals
    assert sorted(p.name for p in (store / "shards").iterdir()) == sorted(f"{stem}.safetensors" for stem in originals)
    assert main(["store", "upgrade", str(store)]) == 0 and "0 shard(s) converted" in capsys.readouterr().out
    scored = in_process("score", "--predictions", str(store), "--out", str(tmp_path / "new"))
    assert scored.returncode == 0 and metrics(tmp_path / "new") == metrics(run)
    resumed = in_process("test", *MODEL, *COMMON, "--out", str(tmp_path / "resumed"), "--predictions", str(store),
                         "--predictions_dtype", "float32", "--resume", "true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert metrics(tmp_path / "resumed") == metrics(run)


def test_upgrade_sets_a_damaged_shard_aside_and_can_be_repeated(tmp_path, capsys):
    store = Store(tmp_path / "store")
    store.write_manifest({"format": 1, "config": {}})
    store.shards_dir.mkdir()
    good = legacy_bytes(shard_of())
    (store.shards_dir / "a.xbp").write_bytes(good)
    (store.shards_dir / "b.xbp").write_bytes(good[:-40])
    (store.shards_dir / "c.safetensors").write_bytes(encode_shard(shard_of()))  # converted before a crash
    (store.shards_dir / "c.xbp").write_bytes(good)
    assert [p.name for p in store.shard_paths()] == ["a.xbp", "b.xbp", "c.safetensors"]  # never both copies
    assert main(["store", "upgrade", str(store)]) == 0
    out = capsys.readouterr().out
    assert "2 shard(s) converted" in out and "1 unreadable shard(s) set aside" in out and "--resume" in out
    assert [p.name for p in store.shard_paths()] == ["a.safetensors", "c.safetensors"]
    assert [p.name for p in (store.root / "corrupt").iterdir()] == ["b.xbp"]
    assert decode_shard((store.shards_dir / "a.safetensors").read_bytes())["image_ids"] == ["a", "b"]
    assert main(["store", "upgrade", str(tmp_path / "nothing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["store", "convert", str(store)]) == 2


def test_upgrade_that_cannot_write_is_one_error_line(tmp_path, capsys):
    store = Store(tmp_path / "store")
    store.write_manifest({"format": 1, "config": {}})
    store.shards_dir.mkdir()
    (store.shards_dir / "a.xbp").write_bytes(legacy_bytes(shard_of()))
    (store.shards_dir / "a.safetensors").mkdir()  # the converted shard's name is taken by a folder: the write fails
    assert main(["store", "upgrade", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {store}: cannot write a converted shard")


@pytest.mark.parametrize("command", ["score", "export"])
def test_a_corrupt_manifest_is_one_line_naming_it(tmp_path, capsys, command):
    """A store whose manifest.json was cut short: ``score`` and ``export`` name that file (not only the JSON parser's
    complaint), exit 2."""
    store = tmp_path / "store"
    run_test(tmp_path / "run", "--predictions", str(store))
    manifest = store / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    args = ["--predictions", str(store), "--out", str(tmp_path / "out")] + (["--to", "npy"] if command == "export" else [])
    assert main([command, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"{manifest}: unreadable manifest" in " ".join(err.split())
