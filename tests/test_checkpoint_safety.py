"""No weights file runs code by default: TorchScript archives are read without ``torch.jit.load``
(tensors equal to ``torch.jit.load(...).state_dict()``), pickles with ``weights_only=True``; a file
whose pickle would run something is refused with a ``CheckpointError`` naming the global and the
``trust_checkpoint`` opt-in, and the payload never runs (its marker file is never written).
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import xbench_pl
from xbench_pl.models.checkpoints import CheckpointError, read_checkpoint, read_state_dict, read_torchscript
from xbench_pl.models.open_clip_model import OpenCLIPModel, build_open_clip

PACKAGE = Path(xbench_pl.__file__).resolve().parent
TINY_CLIP = {
    "embed_dim": 16, "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def write_marker(path):
    """The payload: what a malicious file would do (here, only write a file)."""
    Path(path).write_text("ran")
    return {}


class Payload:
    """Pickles as a call of ``write_marker(marker)``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return write_marker, (self.marker,)


def evil_state_dict(marker: Path) -> dict:
    return {"visual.proj": torch.zeros(2), "payload": Payload(marker)}


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    torch.manual_seed(0)
    model = build_open_clip(TINY_CLIP).eval()
    config = tmp_path_factory.mktemp("cfg") / "tiny_clip.json"
    config.write_text(json.dumps({"model_cfg": TINY_CLIP}))
    return model, str(config)


def script_archive(model: nn.Module, path: Path, extras: bool = True) -> Path:
    """A TorchScript archive laid out like OpenAI's CLIP release (fp16, the three int entries)."""
    import copy

    model = copy.deepcopy(model)
    if extras:
        for name, value in (("input_resolution", 32), ("context_length", 77), ("vocab_size", 49408)):
            vars(model).pop(name, None)
            model.register_buffer(name, torch.tensor(value))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(model.half()), str(path))
    return path


def jit_state(path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.load(str(path), map_location="cpu").state_dict()


# -- TorchScript: the same tensors, nothing run -----------------------------------------------------
def test_torchscript_clip_tensors_equal_jit_load(tiny_clip, tmp_path):
    path = script_archive(tiny_clip[0], tmp_path / "ViT-B-16.pt")
    ours, theirs = read_torchscript(path), jit_state(path)
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
    # through read_checkpoint: OpenAI's three int entries are dropped, as before
    state = read_state_dict(path)
    assert set(theirs) - set(state) == {"input_resolution", "context_length", "vocab_size"}


def test_traced_archive_with_mangled_classes(tmp_path):
    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.linear = nn.Linear(2, width)
            if width == 3:
                self.register_buffer("extra", torch.arange(3.0))
            self.plain = torch.ones(1)  # a tensor attribute, not a parameter or buffer: not in state_dict

        def forward(self, x):
            return self.linear(x) + self.plain

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.seq = Block(2), Block(3), nn.Sequential(nn.Linear(2, 2), nn.ReLU())
            self.shared = self.seq[0]  # one module under two names

        def forward(self, x):
            return self.a(x).sum() + self.b(x).sum() + self.seq(x).sum() + self.shared(x).sum()

    path = tmp_path / "traced.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(Net(), torch.ones(1, 2)), str(path))
    ours, theirs = read_torchscript(path), jit_state(path)
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], v) for k, v in theirs.items())


def test_open_clip_loads_the_archive_without_jit_load(tiny_clip, tmp_path, monkeypatch):
    model, config = tiny_clip
    path = script_archive(model, tmp_path / "ViT-B-16.pt")

    def refuse(*args, **kwargs):
        raise AssertionError("torch.jit.load was called")

    monkeypatch.setattr(torch.jit, "load", refuse)
    loaded = OpenCLIPModel(config, checkpoint=str(path))
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[key], value.half().float(), msg=key)
    with pytest.raises(CheckpointError, match="torch.jit.load was called"):  # the opt-in is what calls it
        OpenCLIPModel(config, checkpoint=str(path), trust_checkpoint=True)


def replace_record(source: Path, target: Path, record: str, data: bytes) -> Path:
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        for info in old.infolist():
            new.writestr(info, data if info.filename.endswith(record) else old.read(info.filename))
    return target


def test_malicious_torchscript_is_refused_and_never_runs(tiny_clip, tmp_path):
    model, config = tiny_clip
    marker = tmp_path / "marker"
    archive = script_archive(model, tmp_path / "ViT-B-16.pt")
    evil = replace_record(archive, tmp_path / "evil.pt", "/data.pkl", pickle.dumps(Payload(marker), protocol=2))
    pattern = r"refusing TorchScript archive .*evil\.pt.*test_checkpoint_safety\.write_marker.*Nothing from the file was run.*--model\.trust_checkpoint true"
    with pytest.raises(CheckpointError, match=pattern):
        read_checkpoint(evil)
    with pytest.raises(CheckpointError, match=pattern):
        OpenCLIPModel(config, checkpoint=str(evil))
    assert not marker.exists()
    # C++ script classes (they carry code) are refused as well
    custom = replace_record(archive, tmp_path / "custom.pt", "/data.pkl",
                            b"\x80\x02c__torch__.torch.classes.quantized\nLinearPackedParamsBase\nq\x00)\x81q\x01.")
    with pytest.raises(CheckpointError, match=r"__torch__\.torch\.classes\.quantized\.LinearPackedParamsBase"):
        read_checkpoint(custom)


def test_damaged_torchscript_names_the_file(tiny_clip, tmp_path):
    archive = script_archive(tiny_clip[0], tmp_path / "ViT-B-16.pt")
    damaged = replace_record(archive, tmp_path / "damaged.pt", "/data.pkl", pickle.dumps(torch.zeros(2), protocol=2)[:20])
    with pytest.raises(CheckpointError, match=r"damaged\.pt"):
        read_checkpoint(damaged)
    no_code = tmp_path / "no_code.pt"
    with zipfile.ZipFile(archive) as old, zipfile.ZipFile(no_code, "w") as new:
        for info in old.infolist():
            if "/code/" not in info.filename:
                new.writestr(info, old.read(info.filename))
    with pytest.raises(CheckpointError, match=r"no __parameters__/__buffers__ declaration.*trust_checkpoint"):
        read_checkpoint(no_code)


# -- torch.save pickles ---------------------------------------------------------------------------
def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save(evil_state_dict(marker), path)
    with pytest.raises(CheckpointError, match=r"evil\.pt with weights_only=True.*test_checkpoint_safety\.write_marker.*"
                                              r"Nothing from the file was run.*trust_checkpoint=True"):
        read_checkpoint(path)
    assert not marker.exists()
    # allowing other names does not allow this one
    with pytest.raises(CheckpointError, match="write_marker"):
        read_checkpoint(path, safe_globals=["omegaconf.dictconfig.DictConfig"])
    assert not marker.exists()
    # the explicit opt-in unpickles fully: that is exactly what runs the payload
    read_checkpoint(path, trust=True)
    assert marker.read_text() == "ran"


def test_every_model_refuses_the_malicious_file_by_default(tiny_clip, tmp_path):
    import carzero_reference as cr
    from xbench_pl.models.carzero import CARZero

    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save(evil_state_dict(marker), path)
    with pytest.raises(CheckpointError, match="write_marker"):
        OpenCLIPModel(tiny_clip[1], checkpoint=str(path))
    architecture = json.loads((PACKAGE / "models/configs/carzero.json").read_text())
    architecture.update(image={"image_size": 32, "patch_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 8},
                        text={"bert": {"vocab_size": len(cr.vocabulary()), "hidden_size": 8, "num_hidden_layers": 3,
                                       "num_attention_heads": 2, "intermediate_size": 8, "max_position_embeddings": 128},
                              "max_length": 97},
                        decoder={**architecture["decoder"], "d_model": 8, "heads": 2, "layers": 1, "ffn": 8},
                        head=[4, 1], attn_layers=[-1])
    config = tmp_path / "tiny_carzero.json"
    config.write_text(json.dumps(architecture))
    with pytest.raises(CheckpointError, match="write_marker"):
        CARZero(str(config), checkpoint=str(path), text=str(cr.write_text_encoder_folder(tmp_path / "bert")))
    assert not marker.exists()


def _calls(tree):
    """(call, enclosing ``if`` tests) for every call in an AST."""
    import ast

    def walk(node, tests):
        for child in ast.iter_child_nodes(node):
            inner = tests + [ast.unparse(node.test)] if isinstance(node, ast.If) and child in node.body else tests
            if isinstance(child, ast.Call):
                yield child, inner
            yield from walk(child, inner)

    yield from walk(tree, [])


def test_no_module_loads_weights_by_running_code():
    """Every ``torch.load`` in the package passes ``weights_only=True``, except one full unpickling
    behind ``if trust``; ``torch.jit.load`` appears only behind ``if trust``; no raw pickle loads."""
    import ast

    behind_trust = []
    for path in PACKAGE.rglob("*.py"):
        for call, tests in _calls(ast.parse(path.read_text())):
            name = ast.unparse(call.func)
            if name in ("torch.load", "torch.jit.load"):
                weights_only = {k.arg: ast.unparse(k.value) for k in call.keywords}.get("weights_only")
                if name == "torch.load" and weights_only == "True":
                    continue
                assert "trust" in tests, f"{path.name}: {ast.unparse(call)} is not behind `if trust`"
                behind_trust.append(f"{path.name}: {name}")
            assert not re.fullmatch(r"(pickle|cPickle|dill|joblib)\.loads?", name), f"{path.name}: {ast.unparse(call)}"
            if name in ("np.load", "numpy.load"):
                assert all(k.arg != "allow_pickle" or ast.unparse(k.value) == "False" for k in call.keywords), path
    assert sorted(behind_trust) == ["checkpoints.py: torch.jit.load", "checkpoints.py: torch.load"]


def _not_checkpoints(folder: Path) -> dict[str, Path]:
    """An HTML page saved as the checkpoint (Drive's virus-scan warning), random bytes, and a torch.save cut in half."""
    files = {"html": folder / "html.pth", "random": folder / "random.pth", "truncated": folder / "truncated.pth"}
    files["html"].write_bytes(b"<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head></html>")
    files["random"].write_bytes(bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0)).tolist()))
    whole = folder / "whole.pth"
    torch.save({"weight": torch.zeros(1000)}, whole)
    files["truncated"].write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    return files


@pytest.mark.parametrize("kind, says", [("html", "it is a web page (HTML)"), ("random", "it is no PyTorch (zip or pickle) or safetensors"),
                                        ("truncated", "it is a truncated zip archive")])
def test_a_file_that_is_no_checkpoint_is_said_so_and_trusting_it_is_never_advised(tmp_path, kind, says):
    """A corrupt download is not "a pickle of a type that is not plain data": the error says what the file is and to
    download it again, and never suggests --model.trust_checkpoint (trusting it would run nothing useful, or worse)."""
    path = _not_checkpoints(tmp_path)[kind]
    with pytest.raises(CheckpointError) as raised:
        read_checkpoint(path)
    message = str(raised.value)
    assert message.startswith(f"cannot read checkpoint {path}: not a checkpoint, {says}") and "download it again" in message
    assert "trust" not in message
