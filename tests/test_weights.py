"""``weights list|pull|verify`` and ``test --model NAME`` on pulled files, against loopback hosts (tests/loopback_hosts.py)
serving tiny files in each release's layout: nothing here touches the internet. Pulls run as the command line does, in
a subprocess (huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when it is imported)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import chexzero_reference
import xbench_pl
from loopback_hosts import COMMIT, Hosts
from test_cli import in_process
from test_console_runs import imported
from test_open_clip_models import PREPROCESS_CFG, TINY_CLIP
from xbench_pl.commands.class_options import table_entry
from xbench_pl.commands.early import released_weights
from xbench_pl.models.open_clip_model import build_open_clip
from xbench_pl.registry import available
from xbench_pl.weights import LOCK_FILE, PARTIAL, read_sources

ROOT = Path(__file__).resolve().parent.parent
MEDKLIP_FOLDER = "1HBShH7J_pO8onkzuweDgDq2QPqj6zjG_"
CHEXZERO_FOLDER = "1makFLiEMbSleYltaRxw81aBhEDMpVwno"
CHEXZERO_FILE = "best_64_5e-05_original_22000_0.864.pt"
KNOWLEDGE = "MediaBrain-SJTU/MedKLIP/8e60b035ddc160f44a389f476b596f1052f02d8f/PreTrain_MedKLIP/data_file/observation explanation.json"
CLIP_REPO = "timm/vit_base_patch16_clip_224.openai"
BERT_REPO = "emilyalsentzer/Bio_ClinicalBERT"


#: CLIP's file is larger than huggingface_hub's 10 MB download chunk: a pull cut off half way has written a chunk
CLIP_SIZE = 24 << 20


def payload(seed: int, size: int = 1 << 20) -> bytes:
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)).numpy().tobytes()


@pytest.fixture
def hosts():
    """The loopback hosts serving MedKLIP's release (Drive folder + GitHub file + Bio_ClinicalBERT on the hub) and
    CLIP's and CheXzero's, with random bytes."""
    served = Hosts()
    served.drive_folder(MEDKLIP_FOLDER, "MedKLIP", {"checkpoint_final.pth": payload(1)})
    served.raw[KNOWLEDGE] = json.dumps({"normal": "no finding"}).encode()
    served.hub[BERT_REPO] = {"config.json": b"{}", "vocab.txt": b"[PAD]\n", "pytorch_model.bin": payload(2)}
    served.hub[CLIP_REPO] = {"open_clip_pytorch_model.bin": payload(3, CLIP_SIZE)}
    served.drive_folder(CHEXZERO_FOLDER, "CheXzero_Models", {CHEXZERO_FILE: payload(4)})
    yield served
    served.close()


def weights(hosts: Hosts, *args: str, cache: Path) -> subprocess.CompletedProcess:
    environ = {**os.environ, **hosts.environ(), "HF_HOME": str(cache.parent / "hf_home")}
    return subprocess.run([sys.executable, "-m", "xbench_pl", "weights", *args, "--dir", str(cache), "--quiet"],
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)


def said(text: str) -> str:
    """Console text with its wrapping undone (lines stay within the terminal width)."""
    return " ".join(text.split())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the data ----------------------------------------------------------------------------------------------------
def test_every_registered_model_has_an_entry_and_list_shows_sources_and_licences(tmp_path):
    sources, needs = read_sources()
    assert set(needs) == set(available("models"))
    assert needs["devide"].none and "no public release" in needs["devide"].none
    assert not needs["center"].arguments and not needs["uniform"].arguments
    assert sources["radzero"].licence.startswith("CC BY-NC 4.0")
    for model, entry in needs.items():  # each file goes to an argument the model has
        assert {f"--model.{argument}" for argument in entry.arguments} <= {
            flag for action in table_entry("models", model)["actions"] for flag in action["flags"]}, model
    result = in_process("weights", "list", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    blocks = {line.split(":")[0]: line for line in result.stdout.splitlines() if not line.startswith((" ", "weights cache"))}
    assert set(blocks) == set(available("models"))
    assert "missing 1 of 1 file(s): python -m xbench_pl weights pull clip" in blocks["clip"]
    assert "no public release" in blocks["devide"] and "weight-free" in blocks["center"]
    unwrapped = result.stdout.replace("\n  ", " ")
    assert "--model.checkpoint openai_clip_b16/open_clip_pytorch_model.bin from hub timm/vit_base_patch16_clip_224.openai@main" \
        in " ".join(unwrapped.split())
    assert f"--model.checkpoint medklip/checkpoint_final.pth from drive folder {MEDKLIP_FOLDER}" in " ".join(unwrapped.split())


@pytest.mark.parametrize("args", [["--help"], ["list"]])
def test_weights_help_and_list_load_neither_lightning_nor_torch(args):
    result, modules = imported("weights", *args)
    assert result.returncode == 0 and result.stdout
    assert not modules & {"lightning", "pytorch_lightning", "torch", "huggingface_hub", "gdown"}


def test_pull_devide_and_unknown_names_fail_in_one_line(tmp_path):
    devide = in_process("weights", "pull", "devide", "--dir", str(tmp_path))
    assert devide.returncode == 2 and devide.stderr.startswith("error: devide: no public release")
    unknown = in_process("weights", "pull", "medklp", "--dir", str(tmp_path))
    assert unknown.returncode == 2 and "unknown model 'medklp'" in said(unknown.stderr)
    assert not any(tmp_path.iterdir())


# -- pulling -----------------------------------------------------------------------------------------------------
def test_pull_places_hub_drive_and_github_files_locks_them_and_verify_names_a_changed_byte(hosts, tmp_path):
    cache = tmp_path / "cache"
    result = weights(hosts, "pull", "medklip", cache=cache)
    assert result.returncode == 0, result.stderr
    placed = {"medklip/checkpoint_final.pth": payload(1), "bio_clinicalbert/pytorch_model.bin": payload(2),
              "bio_clinicalbert/vocab.txt": b"[PAD]\n", f"medklip_knowledge/{KNOWLEDGE.split('/', 3)[3]}":
              hosts.raw[KNOWLEDGE]}
    for path, data in placed.items():
        assert (cache / path).read_bytes() == data, path
    lock = json.loads((cache / LOCK_FILE).read_text())
    assert lock["bio_clinicalbert"]["revision"] == COMMIT  # the commit "main" resolved to: later pulls ask for it
    assert lock["medklip"]["files"]["checkpoint_final.pth"] == {"sha256": sha(payload(1)), "size": 1 << 20}
    assert not any((cache / PARTIAL).rglob("*")) if (cache / PARTIAL).exists() else True
    assert weights(hosts, "verify", "medklip", cache=cache).returncode == 0
    listed = said(in_process("weights", "list", "--dir", str(cache)).stdout)
    assert "medklip: present, locked" in listed and "mavl: missing 3 of 6 file(s)" in listed  # shares Bio_ClinicalBERT
    changed = bytearray(payload(1))
    changed[1000] ^= 1
    (cache / "medklip/checkpoint_final.pth").write_bytes(changed)
    verify = weights(hosts, "verify", cache=cache)
    assert verify.returncode == 2
    assert verify.stderr.count("error:") == 1
    assert f"{cache}/medklip/checkpoint_final.pth: SHA-256" in said(verify.stderr) and sha(payload(1)) in said(verify.stderr)


@pytest.mark.parametrize("model, path", [("clip", f"/hub/{CLIP_REPO}/resolve/{COMMIT}/open_clip_pytorch_model.bin"),
                                         ("chexzero", "/drive/uc")])
def test_pull_resumes_after_a_dropped_connection(hosts, tmp_path, model, path):
    hosts.drop.add(path)
    result = weights(hosts, "pull", model, cache=tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    assert path not in hosts.drop  # the connection was dropped half way, then the rest asked for
    assert any(p == path and r and r.startswith("bytes=") and int(r[6:].split("-")[0]) > 0 for _, p, r in hosts.requests)
    placed = next((tmp_path / "cache").glob("*/*.[bp][it]*"))
    assert placed.read_bytes() == (payload(3, CLIP_SIZE) if model == "clip" else payload(4))


def test_a_changed_release_is_refused_against_the_lock(hosts, tmp_path):
    cache = tmp_path / "cache"
    assert weights(hosts, "pull", "chexzero", cache=cache).returncode == 0
    (cache / "chexzero" / CHEXZERO_FILE).unlink()
    hosts.drive_folder(CHEXZERO_FOLDER, "CheXzero_Models", {CHEXZERO_FILE: payload(5)})
    result = weights(hosts, "pull", "chexzero", cache=cache)
    assert result.returncode == 2
    assert result.stderr.count("error:") == 1 and f"chexzero/{CHEXZERO_FILE}" in said(result.stderr)
    assert f"differs from the lock's {sha(payload(4))}" in said(result.stderr)
    assert not (cache / "chexzero" / CHEXZERO_FILE).exists()  # nothing unchecked under the final name


@pytest.mark.parametrize("status", [401, 403])
def test_gated_hub_release_says_to_accept_its_licence(hosts, tmp_path, status):
    hosts.gated[CLIP_REPO] = status
    result = weights(hosts, "pull", "clip", cache=tmp_path / "cache")
    assert result.returncode == 2 and result.stderr.count("error:") == 1, result.stderr
    assert f"refused (HTTP {status})" in said(result.stderr) and "accept" in said(result.stderr)
    assert f"https://huggingface.co/{CLIP_REPO}" in said(result.stderr)


def test_missing_files_are_named_as_gone(hosts, tmp_path):
    del hosts.hub[BERT_REPO]["pytorch_model.bin"]
    hub = weights(hosts, "pull", "medklip", cache=tmp_path / "a")
    assert hub.returncode == 2 and hub.stderr.count("error:") == 1, hub.stderr
    assert "pytorch_model.bin is gone (HTTP 404)" in said(hub.stderr)
    hosts.drive_folder(CHEXZERO_FOLDER, "CheXzero_Models", {"other.pt": b"x"})
    drive = weights(hosts, "pull", "chexzero", cache=tmp_path / "b")
    assert drive.returncode == 2 and f"holds no {CHEXZERO_FILE} (it holds other.pt)" in said(drive.stderr)


def test_unwritable_cache_is_one_line(hosts, tmp_path):
    (tmp_path / "file").write_text("")
    result = weights(hosts, "pull", "clip", cache=tmp_path / "file" / "cache")
    assert result.returncode == 2 and result.stderr.count("error:") == 1
    assert result.stderr.startswith("error: weights cache") and "is a file, not a folder" in said(result.stderr)
    assert not hosts.requests


@pytest.mark.parametrize("model, path", [("clip", f"/hub/{CLIP_REPO}/resolve/{COMMIT}/open_clip_pytorch_model.bin"),
                                         ("chexzero", "/drive/uc")])
def test_pull_killed_mid_file_leaves_nothing_under_the_final_name_and_the_next_completes(hosts, tmp_path, model, path):
    cache = tmp_path / "cache"
    hosts.stall.add(path)
    environ = {**os.environ, **hosts.environ(), "HF_HOME": str(tmp_path / "hf_home"),
               "HF_HUB_DOWNLOAD_TIMEOUT": "600"}  # it waits on the stalled server until killed, not retries on its own
    process = subprocess.Popen([sys.executable, "-m", "xbench_pl", "weights", "pull", model, "--dir", str(cache), "--quiet"],
                               cwd=ROOT, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60  # the clients' partial files: huggingface_hub's *.incomplete, gdown's *.part
    while not any(p.stat().st_size > 0 for p in (cache / PARTIAL).rglob("*") if p.suffix in (".incomplete", ".part")):
        assert process.poll() is None and time.monotonic() < deadline, "no partial file appeared"
        time.sleep(0.1)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    final = cache / ("openai_clip_b16/open_clip_pytorch_model.bin" if model == "clip" else f"chexzero/{CHEXZERO_FILE}")
    assert not final.exists() and not (cache / LOCK_FILE).exists()
    hosts.stall.clear()
    result = weights(hosts, "pull", model, cache=cache)
    assert result.returncode == 0, result.stderr
    assert final.read_bytes() == (payload(3, CLIP_SIZE) if model == "clip" else payload(4))
    assert any(p == path and r and int(r[6:].split("-")[0]) > 0 for _, p, r in hosts.requests)  # resumed


# -- using them by name --------------------------------------------------------------------------------------------
def test_test_by_name_without_pulled_files_names_the_pull_command(tmp_path, monkeypatch):
    result = in_process("test", "--model", "biomedclip", "--data", "demo", XBENCH_WEIGHTS_DIR=str(tmp_path))
    assert result.returncode == 2 and result.stderr.count("error:") == 1
    assert said(result.stderr).startswith(f"error: --model biomedclip: its released files are not in the weights cache {tmp_path}")
    assert "`python -m xbench_pl weights pull biomedclip`" in said(result.stderr)
    bad = in_process("test", "--model", "kad", "--model.query_set", "all", "--data", "demo", XBENCH_WEIGHTS_DIR=str(tmp_path))
    assert said(bad.stderr) == "error: --model.query_set: expected one of 'authors', 'requested', got 'all'"  # checked first
    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(tmp_path))
    for argv in (["--model", "biomedclip", "--model.random_init", "true"], ["--model", "biomedclip", "--model.checkpoint", "X"],
                 ["--config", "run.yaml", "--model", "clip"], ["--model", "center"]):
        assert released_weights(argv).argv == argv  # random weights, an explicit path, a config's, no weights


def test_cached_files_are_given_after_the_name_and_explicit_paths_win(tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(tmp_path))
    for ref in ("mavl/checkpoint_full_40.pth", "mavl_knowledge/Zero-shot_grounding/observation explanation.json",
                "mavl_knowledge/Pretrain/concept_gen/gpt4_mimic.json", *(f"bio_clinicalbert/{n}" for n in
                                                                          ("config.json", "vocab.txt", "pytorch_model.bin"))):
        (tmp_path / ref).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / ref).write_bytes(b"")
    released = released_weights(["test", "--model", "mavl", "--model.text", "MINE", "--data", "demo"])
    assert released.problem is None and not released.missing
    assert released.argv == ["test", "--model", "mavl", "--model.checkpoint", str(tmp_path / "mavl/checkpoint_full_40.pth"),
                    "--model.knowledge", json.dumps([str(tmp_path / "mavl_knowledge/Zero-shot_grounding/observation "
                                                         "explanation.json"),
                                                     str(tmp_path / "mavl_knowledge/Pretrain/concept_gen/gpt4_mimic.json")]),
                    "--model.text", "MINE", "--data", "demo"]


def write_release_files(hosts: Hosts, tmp_path: Path) -> dict[str, str]:
    """Tiny real-architecture releases: CLIP's open_clip state dict on the hub, CheXzero's state dict in its Drive
    folder; the tiny architectures to run them (the shipped ones are full size)."""
    torch.manual_seed(0)
    clip_architecture = tmp_path / "tiny_clip.json"
    clip_architecture.write_text(json.dumps({"model_cfg": TINY_CLIP, "preprocess_cfg": PREPROCESS_CFG}))
    hosts.hub[CLIP_REPO] = {"open_clip_pytorch_model.bin": file_bytes(build_open_clip(TINY_CLIP).state_dict())}
    shipped = json.loads((Path(xbench_pl.__file__).parent / "models" / "configs" / "chexzero.json").read_text())
    chexzero_architecture = tmp_path / "tiny_chexzero.json"
    chexzero_architecture.write_text(json.dumps({"model_cfg": chexzero_reference.model_cfg("tiny"),
                                                 "preprocess_cfg": shipped["preprocess_cfg"]}))
    hosts.drive_folder(CHEXZERO_FOLDER, "CheXzero_Models", {CHEXZERO_FILE: file_bytes(chexzero_reference.state_dict("tiny"))})
    return {"clip": str(clip_architecture), "chexzero": str(chexzero_architecture)}


def file_bytes(state: dict) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def test_pulled_hub_and_drive_releases_run_by_name(hosts, tmp_path):
    architectures = write_release_files(hosts, tmp_path)
    cache = tmp_path / "cache"
    for model, architecture in architectures.items():
        assert weights(hosts, "pull", model, cache=cache).returncode == 0
        out = tmp_path / model
        result = in_process("test", "--model", model, "--model.architecture", architecture, "--data", "demo",
                            "--trainer.accelerator", "cpu", "--out", str(out), XBENCH_WEIGHTS_DIR=str(cache))
        assert result.returncode == 0, result.stderr[-3000:]
        assert "RANDOM weights" not in said(result.stderr)
        report = json.loads((out / "metrics.json").read_text())
        assert Path(report["config"]["model"]["init_args"]["checkpoint"]).parent.parent == cache
        assert report["datasets"]["demo"]["mean"]["n_regions"] == 12


def test_hf_hub_checkpoint_downloads_the_repository_folder(hosts, tmp_path, monkeypatch):
    from huggingface_hub import constants

    repo = "someone/tiny-biomedclip"
    hosts.hub[repo] = {"open_clip_config.json": b"{}", "vocab.txt": b"[PAD]\n", "open_clip_pytorch_model.bin": payload(6),
                       "pytorch_model.bin": payload(7), "README.md": b"# card"}
    monkeypatch.setenv("HF_ENDPOINT", hosts.environ()["HF_ENDPOINT"])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(tmp_path))
    released = released_weights(["--model", "biomedclip", f"--model.checkpoint=hf-hub:{repo}"])
    folder = tmp_path / "hf-hub" / repo
    assert released.problem is None and released.argv == ["--model", "biomedclip", "--model.checkpoint", str(folder)]
    assert sorted(p.name for p in folder.iterdir()) == ["open_clip_config.json", "open_clip_pytorch_model.bin", "vocab.txt"]
    assert (folder / "open_clip_pytorch_model.bin").read_bytes() == payload(6)
    served = len(hosts.requests)
    assert released_weights(["--model", "biomedclip", "--model.checkpoint", f"hf-hub:{repo}"]).argv[-1] == str(folder)
    assert len(hosts.requests) == served  # pulled once: a DDP rank or a second run asks nothing
    hosts.gated["someone/gated"] = 401
    hosts.hub["someone/gated"] = {}
    problem = released_weights(["--model", "biomedclip", "--model.checkpoint", "hf-hub:someone/gated"]).problem
    assert problem.startswith("--model.checkpoint: hf-hub:someone/gated: someone/gated is refused (HTTP 401)")
    (folder / "open_clip_pytorch_model.bin").write_bytes(payload(6)[::-1])  # changed in place: refused, not re-downloaded
    problem = released_weights(["--model", "biomedclip", "--model.checkpoint", f"hf-hub:{repo}"]).problem
    assert problem.startswith(f"--model.checkpoint: {folder}/open_clip_pytorch_model.bin changed since it was pulled (SHA-256")
    assert problem.endswith("delete it and run again to download it anew")


def test_pull_places_every_released_models_files_where_test_by_name_reads_them(tmp_path, monkeypatch):
    """Every source of weights.yaml served on the loopback hosts (placeholder bytes in each release's layout), every
    model with a release pulled in one command: each registered model's file arguments then name pulled files."""
    sources, needs = read_sources()
    served = Hosts()
    try:
        for number, source in enumerate(sources.values()):
            files = {name: payload(100 + number, 64) + name.encode() for name in source.files}
            if source.shards:  # a sharded release: its index names two shards
                files.update(sharded_release(number))
            if source.kind == "hub":
                served.hub[source.where] = files
            elif source.kind == "drive_folder":
                served.drive_folder(source.where, source.name, files)
            elif source.kind == "drive_file":
                served.drive_files[source.where] = (source.files[0], files[source.files[0]])
            else:
                served.raw.update({f"{source.where}/{source.revision}/{name}": data for name, data in files.items()})
        released = sorted(name for name, need in needs.items() if need.arguments)
        cache = tmp_path / "cache"
        result = weights(served, "pull", *released, cache=cache)
    finally:
        served.close()
    assert result.returncode == 0, result.stderr
    assert set(released) >= {"clip", "biomedclip", "biovil", "biovil_t", "radzero", "medklip", "mavl", "kad", "carzero",
                             "chexzero"}
    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(cache))
    for model in released:
        given = released_weights(["test", "--model", model, "--data", "demo"])
        assert given.problem is None and not given.missing, model
        values = dict(zip(given.argv[3:-2:2], given.argv[4:-2:2]))
        assert set(values) == {f"--model.{arg}" for arg in needs[model].arguments}, model
        for value in values.values():
            for path in (json.loads(value) if value.startswith("[") else [value]):
                assert Path(path).exists() and cache in Path(path).parents, (model, path)
    assert weights(served, "verify", cache=cache).returncode == 0


def sharded_release(seed: int) -> dict[str, bytes]:
    """A sharded release's index and its two shards (placeholder bytes), as save_pretrained lays them out."""
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    index = {"metadata": {"total_size": 128}, "weight_map": {"a.weight": shards[0], "b.weight": shards[1], "c.bias": shards[1]}}
    return {"model.safetensors.index.json": json.dumps(index).encode(), **{n: payload(seed * 10 + i, 64) for i, n in enumerate(shards)}}


def test_a_sharded_release_pulls_the_shards_its_index_names_and_locks_each(hosts, tmp_path):
    """The generative models' releases: the index first, then every shard of its weight_map, each checked and locked;
    ``verify`` names a changed shard; a gated release is refused in one line saying how to get access."""
    repo = "lingshu-medical-mllm/Lingshu-7B"
    files = {"config.json": b"{}", "tokenizer.json": b"{}", "tokenizer_config.json": b"{}", **sharded_release(7)}
    hosts.hub[repo] = files
    cache = tmp_path / "cache"
    result = weights(hosts, "pull", "lingshu", cache=cache)
    assert result.returncode == 0, result.stderr
    for name, data in files.items():
        assert (cache / "lingshu" / name).read_bytes() == data, name
    lock = json.loads((cache / "weights.lock.json").read_text())["lingshu"]["files"]
    assert set(lock) == set(files) and lock["model-00002-of-00002.safetensors"]["sha256"] == sha(files["model-00002-of-00002.safetensors"])
    shard = cache / "lingshu" / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"x" + shard.read_bytes()[1:])
    verified = weights(hosts, "verify", "lingshu", cache=cache)
    assert verified.returncode == 2 and str(shard) in said(verified.stdout + verified.stderr)
    hosts.gated["google/medgemma-4b-it"], hosts.hub["google/medgemma-4b-it"] = 403, {}
    gated = weights(hosts, "pull", "medgemma", cache=cache)
    assert gated.returncode == 2 and gated.stderr.count("error:") == 1, gated.stderr
    assert "refused (HTTP 403)" in said(gated.stderr) and "https://huggingface.co/google/medgemma-4b-it" in said(gated.stderr)


def test_an_index_that_is_not_one_is_named(hosts, tmp_path):
    hosts.hub["KrauthammerLab/RadVLM"] = {"config.json": b"{}", "tokenizer.json": b"{}", "tokenizer_config.json": b"{}",
                                          "model.safetensors.index.json": b"<html>not found</html>"}
    result = weights(hosts, "pull", "radvlm", cache=tmp_path / "cache")
    assert result.returncode == 2 and result.stderr.count("error:") == 1, result.stderr
    assert "model.safetensors.index.json: not a weights index" in said(result.stderr)


@pytest.mark.parametrize("model, variable", [("chexzero", "XBENCH_DRIVE_URL"), ("biomedclip", "HF_ENDPOINT"),
                                             ("medklip", "XBENCH_GITHUB_RAW_URL")])
def test_a_host_that_cannot_be_reached_is_said_so(tmp_path, model, variable):
    """No network (here: a loopback port nothing listens on): the one line says the host cannot be reached and why, not
    "cannot write …/.partial" (requests' ConnectionError is an OSError) nor the client's raw text."""
    import socket

    with socket.socket() as probe:  # a free port, closed again: connections to it are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = Hosts()
    try:
        if variable == "XBENCH_GITHUB_RAW_URL":  # medklip: its Drive folder and hub text served, the GitHub file not
            served.drive_folder(MEDKLIP_FOLDER, "MedKLIP", {"checkpoint_final.pth": payload(1)})
            served.hub[BERT_REPO] = {"config.json": b"{}", "vocab.txt": b"[PAD]\n", "pytorch_model.bin": payload(2)}
        environ = {**os.environ, **served.environ(), "HF_HOME": str(tmp_path / "hf_home"), variable: f"http://127.0.0.1:{port}"}
        result = subprocess.run([sys.executable, "-m", "xbench_pl", "weights", "pull", model, "--dir", str(tmp_path / "cache"),
                                 "--quiet"], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)
    finally:
        served.close()
    text = said(result.stderr)
    assert result.returncode == 2 and result.stderr.count("error:") == 1, result.stderr
    assert f"cannot reach http://127.0.0.1:{port} (the connection was refused)" in text and "cannot write" not in text
