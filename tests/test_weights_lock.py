"""A run by name trusts only the cached files the lock vouches for: a file changed since it was pulled stops the run in
one line; a file a pull found in the cache rather than downloaded is recorded, listed, verified and run as placed by
hand, unverified. In process, on hand-made caches: nothing is downloaded (the hosts point at a closed port)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from test_cli import in_process
from test_weights import CHEXZERO_FILE, payload, said, sha
from xbench_pl import weights
from xbench_pl.commands.early import released_weights
from xbench_pl.weights import LOCK_FILE, check_cached, read_sources, record

PULL = "`python -m xbench_pl weights pull chexzero`"
#: a file's mtime old enough for its hash to be remembered by it (``weights.SETTLED_NS``)
LONG_AGO_NS = 1_700_000_000 * 10**9


@pytest.fixture
def nowhere() -> dict[str, str]:
    """The hosts' settings pointed at a loopback port nothing listens on: a pull that tried to download would fail."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    return {"XBENCH_DRIVE_URL": closed, "XBENCH_GITHUB_RAW_URL": closed, "HF_ENDPOINT": closed}


def cached_chexzero(cache: Path) -> Path:
    """CheXzero's checkpoint in ``cache``, written long ago (its hash may be remembered by its mtime), not locked."""
    path = cache / "chexzero" / CHEXZERO_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(payload(4))
    os.utime(path, ns=(LONG_AGO_NS, LONG_AGO_NS))
    return path


def pulled_chexzero(cache: Path) -> Path:
    """``cached_chexzero`` locked as a pull locks the file it downloaded."""
    path = cached_chexzero(cache)
    record(cache, read_sources()[0]["chexzero"], CHEXZERO_FILE, path, None, sha(payload(4)))
    return path


def locked(cache: Path) -> dict:
    return json.loads((cache / LOCK_FILE).read_text())["chexzero"]["files"][CHEXZERO_FILE]


def flip_one_byte(path: Path) -> None:
    changed = bytearray(path.read_bytes())
    changed[1000] ^= 1
    path.write_bytes(changed)


def check_problem(cache: Path) -> str:
    with pytest.raises(weights.WeightsError) as error:
        check_cached(read_sources()[1]["chexzero"], cache)
    return str(error.value)


def test_a_run_by_name_refuses_a_cached_file_changed_since_it_was_pulled(tmp_path, nowhere):
    cache = tmp_path / "cache"
    path = pulled_chexzero(cache)
    flip_one_byte(path)
    result = in_process("test", "--model", "chexzero", "--data", "demo", XBENCH_WEIGHTS_DIR=str(cache), **nowhere)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"error: --model chexzero: {path} changed since it was pulled (SHA-256 {weights.sha256(path)} "
                             f"differs from the lock's {sha(payload(4))}); delete it and run {PULL} again\n")
    path.write_bytes(payload(4) + b"x")
    assert (f"{path} changed since it was pulled (size {(1 << 20) + 1} bytes differs from the lock's {1 << 20}); "
            f"delete it and run {PULL} again") in check_problem(cache)


def just_pulled_chexzero(cache: Path) -> Path:
    """CheXzero's checkpoint locked as a pull locks the file it has just downloaded."""
    path = cache / "chexzero" / CHEXZERO_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(payload(4))
    record(cache, read_sources()[0]["chexzero"], CHEXZERO_FILE, path, None, sha(payload(4)))
    return path


def test_the_hash_is_remembered_by_size_and_mtime_so_a_second_run_reads_nothing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    path = just_pulled_chexzero(cache)
    assert "mtime_ns" not in locked(cache)  # just written: a write within the same clock tick would keep its mtime
    hashed = []
    monkeypatch.setattr(weights, "sha256", lambda p: hashed.append(p) or sha(Path(p).read_bytes()))
    os.utime(path, ns=(LONG_AGO_NS, LONG_AGO_NS))
    needs = read_sources()[1]["chexzero"]
    assert check_cached(needs, cache) is None and hashed == [path]
    assert locked(cache) == {"sha256": sha(payload(4)), "size": 1 << 20, "mtime_ns": LONG_AGO_NS}
    assert check_cached(needs, cache) is None and hashed == [path]  # the second run: size and mtime match, no hashing
    os.utime(path, ns=(LONG_AGO_NS + 1, LONG_AGO_NS + 1))  # touched, not changed: hashed once more, then remembered
    assert check_cached(needs, cache) is None and len(hashed) == 2 and locked(cache)["mtime_ns"] == LONG_AGO_NS + 1
    flip_one_byte(path)  # same size, new mtime
    assert "changed since it was pulled (SHA-256" in check_problem(cache) and len(hashed) == 3


def test_a_cache_the_user_cannot_write_is_checked_all_the_same(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    os.utime(just_pulled_chexzero(cache), ns=(LONG_AGO_NS, LONG_AGO_NS))

    def read_only(*_):
        raise PermissionError(13, "Read-only file system", str(cache / LOCK_FILE))

    monkeypatch.setattr(weights, "write_lock", read_only)
    assert check_cached(read_sources()[1]["chexzero"], cache) is None  # checked, not remembered
    assert "mtime_ns" not in locked(cache)


def test_a_file_placed_by_hand_is_locked_listed_verified_and_run_as_unverified(tmp_path, nowhere, monkeypatch, capsys):
    cache = tmp_path / "cache"
    path = cached_chexzero(cache)
    pulled = in_process("weights", "pull", "chexzero", "--dir", str(cache), "--quiet", **nowhere)
    assert pulled.returncode == 0, pulled.stderr
    assert said(pulled.stdout) == (f"chexzero: 1 file(s) in {cache}; 1 placed by hand, not downloaded: unverified "
                                   f"(chexzero/{CHEXZERO_FILE}; delete and pull again to verify)")
    assert locked(cache) == {"sha256": sha(payload(4)), "size": 1 << 20, "mtime_ns": LONG_AGO_NS, "placed": "hand"}
    listed = said(in_process("weights", "list", "--dir", str(cache)).stdout)
    assert "chexzero: present, placed by hand (unverified);" in listed
    verified = in_process("weights", "verify", "chexzero", "--dir", str(cache))
    assert verified.returncode == 0 and verified.stderr.count("warning:") == 1 and "error:" not in verified.stderr
    assert said(verified.stderr) == (f"warning: {path}: placed by hand, not downloaded: unverified (it is as it was found; "
                                     "delete it and pull again to verify)")
    assert said(verified.stdout) == f"0 pulled file(s) match the lock in {cache}; 1 placed by hand, unverified"

    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(cache))
    capsys.readouterr()
    released = released_weights(["test", "--model", "chexzero", "--data", "demo"])
    assert released.problem is None and str(path) in released.argv  # runs may use it ...
    warned = said(capsys.readouterr().err)
    assert warned.count("warning:") == 1 and warned == (  # ... saying so once
        f"warning: --model chexzero: unverified: {path} placed in the weights cache by hand, not downloaded by "
        f"`weights pull` (to verify, delete and run {PULL})")
    flip_one_byte(path)
    changed = released_weights(["test", "--model", "chexzero", "--data", "demo"])
    assert changed.problem.startswith(f"--model chexzero: {path} changed since it was placed by hand (SHA-256")
    verified = in_process("weights", "verify", "--dir", str(cache))
    assert verified.returncode == 2 and verified.stderr.count("error:") == 1
    assert f"{path}: SHA-256" in said(verified.stderr) and "(changed since it was placed by hand;" in said(verified.stderr)


def test_a_run_warns_of_a_cached_file_the_lock_does_not_know(tmp_path, monkeypatch, capsys):
    path = cached_chexzero(tmp_path)
    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(tmp_path))
    released = released_weights(["test", "--model", "chexzero", "--data", "demo"])
    assert released.problem is None and str(path) in released.argv
    assert said(capsys.readouterr().err).startswith(f"warning: --model chexzero: unverified: {path} placed in the weights "
                                                    "cache by hand")
    assert not (tmp_path / LOCK_FILE).exists()  # only a pull records files
