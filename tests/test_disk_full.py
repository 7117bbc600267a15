"""A disk that fills up at any write: every file is written whole or not at all, and a command's files all go to
one fallback folder that its one error line names (exit status 2)."""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import tempfile
from pathlib import Path

import pytest
from test_cli import REPO, in_process
from test_demo import files

from xbench_pl.outputs import OutputError, OutputFolder, atomic_write
from xbench_pl.prediction_store import Store


class FullDisk:
    """``os.write`` into a file under ``under``: from the ``at``-th such write on, the disk is full (the write
    puts down half its bytes, then fails with ENOSPC, as a disk that runs out does); ``count`` the writes and keep
    the ``names`` of their files."""

    def __init__(self, under: Path, at: int | None = None):
        self.under, self.at, self.count, self.real, self.names = under, at, 0, os.write, []

    def __call__(self, fd, data):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if self.under in path.parents:
            self.count += 1
            file = path.with_name(re.sub(r"^\.(.+)\.\d+-[0-9a-f]{8}\.tmp$", r"\1", path.name))  # the temporary's
            self.names.append(file.relative_to(self.under).as_posix())
            if self.at is not None and self.count >= self.at:
                self.real(fd, bytes(data)[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data)


def test_atomic_write_leaves_the_old_file_or_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    atomic_write(path, '{"old": 1}\n')
    monkeypatch.setattr(os, "write", FullDisk(tmp_path, at=1))
    with pytest.raises(OSError, match="No space left on device") as raised:
        atomic_write(path, json.dumps({"new": list(range(1000))}))
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)  # the file, not its temporary name
    assert files(tmp_path) == {"metrics.json": b'{"old": 1}\n'}  # nor a temporary file left


@pytest.mark.parametrize("at", [1, 2, 3])
def test_an_output_folder_moves_every_file_to_one_fallback(tmp_path, monkeypatch, at):
    out, wanted = tmp_path / "out", {"metrics.json": b'{"a": 1}\n', "calibration/demo/metrics.csv": b"x,y\r\n",
                                     "heatmaps/a.png": bytes(range(256)) * 4}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(os, "write", FullDisk(out, at=at))
    folder = OutputFolder(out)
    for name, data in wanted.items():
        folder.write(name, data)
    with pytest.raises(OutputError) as raised:
        folder.close()
    fallback = next((tmp_path / "tmp").iterdir())
    assert str(raised.value) == (f"cannot write {out / list(wanted)[at - 1]}: no space left on device; "
                                 f"every output of this run is saved in {fallback}")
    assert files(fallback) == wanted
    assert files(out) == dict(list(wanted.items())[: at - 1])  # whole files only, no temporary file


def check_run(out: Path, tmp: Path, code: int, stderr: str, complete: dict[str, bytes], at: int,
              linking: tuple[str, ...] = ()):
    """A command whose ``at``-th write failed: one error line naming the file and the fallback folder, which holds
    every file ``complete`` (a run without failure) holds, the same bytes (but ``metrics.json``'s times and the
    relative links of the ``linking`` files); under ``out`` only whole files of them."""
    stderr = re.split(r"^warning: ", stderr, flags=re.M)[0]  # in_process adds the warnings after it
    fallbacks = list(tmp.glob(f"xbench-{out.name}-*"))
    assert len(fallbacks) == 1, (at, stderr)
    failed = stderr.removeprefix("error: cannot write ").partition(":")[0]
    assert (code, stderr) == (2, f"error: cannot write {failed}: no space left on device; "
                                 f"every output of this run is saved in {fallbacks[0]}\n"), at
    saved, left = files(fallbacks[0]), files(out) if out.exists() else {}
    assert set(saved) == set(complete) and Path(failed).relative_to(out).as_posix() in saved, at
    for name, data in saved.items():
        if name == "metrics.json":  # its provenance: start and wall time
            assert json.loads(data)["datasets"] == json.loads(complete[name])["datasets"], at
        elif name in linking:
            assert data.endswith(complete[name][-8:]), (at, name)
        else:
            assert data == complete[name], (at, name)
    assert all(left[name] == saved[name] for name in left), at  # only whole files, as in the fallback
    assert not any(name.endswith(".tmp") for name in [*left, *saved])


def test_a_run_that_finds_the_disk_full_at_any_write(tmp_path, monkeypatch):
    """test with heatmaps and calibration plots, its replicates, then report and export of its store."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    callbacks = tmp_path / "png.yaml"  # callbacks/png.yaml with one heatmap per finding: fewer figures to draw
    callbacks.write_text((REPO / "callbacks" / "png.yaml").read_text().replace("per_finding: 4", "per_finding: 1"))
    argv = ["test", "--model", "center", "--data", "demo", "--data.classes", "[Nodule, Mass]", "--model.bootstrap", "2",
            "--config", str(callbacks), "--trainer.enable_progress_bar", "false"]  # two findings: every kind of file, fewer figures
    whole = tmp_path / "whole"
    count = FullDisk(whole)
    monkeypatch.setattr(os, "write", count)
    assert in_process(*argv, "--out", str(whole), "--predictions", str(tmp_path / "store")).returncode == 0
    complete = files(whole)
    assert {"metrics.json", "metrics.md", "replicates.json", "heatmaps/samples.csv"} <= set(complete)
    assert count.count == len(complete) > 10 and count.names[-3:] == ["metrics.json", "metrics.md", "replicates.json"]
    # the first file (nothing to copy yet), metrics.json (after the callbacks' files), replicates.json (the last)
    for at in (1, count.count - 2, count.count):
        out = tmp_path / f"test{at}"
        monkeypatch.setattr(os, "write", FullDisk(out, at))
        result = in_process(*argv, "--out", str(out))
        assert result.stderr.startswith(f"error: cannot write {out / count.names[at - 1]}: "), at
        check_run(out, tmp, result.returncode, result.stderr, complete, at)

    report, export = tmp_path / "report", tmp_path / "export"
    monkeypatch.setattr(os, "write", FullDisk(tmp_path, None))
    assert in_process("report", str(whole), "--out", str(report)).returncode == 0
    assert in_process("export", "--predictions", str(tmp_path / "store"), "--to", "npy", "--out", str(export)).returncode == 0
    for command, complete in (("report", files(report)), ("export", files(export))):
        out = tmp_path / f"{command}2"
        monkeypatch.setattr(os, "write", FullDisk(out, 2))
        result = (in_process("report", str(whole), "--out", str(out)) if command == "report" else
                  in_process("export", "--predictions", str(tmp_path / "store"), "--to", "npy", "--out", str(out)))
        check_run(out, tmp, result.returncode, result.stderr, complete, 2, ("report.md", "report.html"))


@pytest.mark.parametrize("at, kept", [(1, 0), (3, 4)])
def test_a_store_on_a_full_disk_keeps_the_metrics_and_says_what_was_lost(tmp_path, monkeypatch, at, kept):
    """The store on a full disk, ``--out`` elsewhere with room: the manifest (the 1st write) or the second shard (the
    3rd) fails. The run goes on without the store: metrics.json and metrics.md in ``--out`` (the numbers of a run
    without a store), one error line naming the store, what it kept and lost and the command that stores the rest;
    exit 2. That command completes the store."""
    store, out = tmp_path / "store", tmp_path / "out"
    argv = ["test", "--model", "center", "--data", "demo", "--model.bootstrap", "0", "--data.batch_size", "4",
            "--trainer.enable_progress_bar", "false"]
    stored = [*argv, "--predictions", str(store), "--predictions_shard_images", "4", "--out", str(out)]
    monkeypatch.setattr(os, "write", FullDisk(store, at))
    result = in_process(*stored)
    monkeypatch.undo()
    failed = store / ("manifest.json" if at == 1 else "shards")
    lines = re.split(r"^warning: ", result.stderr, flags=re.M)[0].splitlines()  # in_process adds warnings after it
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    command = f"python -m xbench_pl test {shlex.join(stored[1:])} --resume --overwrite"
    assert lines[0].startswith(f"error: --predictions {store}: cannot write {failed}"), lines[0]
    assert lines[0].endswith(f": no space left on device; the store kept {kept} of the 12 images, the other {12 - kept} were "
                             f"computed but not stored (metrics.json and metrics.md are in {out}); make room, then store "
                             f"the rest with: {command}"), lines[0]
    assert f"wrote {out / 'metrics.json'} and {out / 'metrics.md'}" in " ".join(result.stdout.split())
    plain = in_process(*argv, "--out", str(tmp_path / "plain"))
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert json.loads((out / "metrics.json").read_text())["datasets"] == json.loads(
        (tmp_path / "plain" / "metrics.json").read_text())["datasets"]
    assert (out / "metrics.md").is_file() and not any(p.name.endswith(".tmp") for p in store.rglob("*"))
    good, bad = Store(store).load()
    assert bad == [] and sum(len(s["image_ids"]) for s in good) == kept
    rest = in_process(*shlex.split(command)[3:])  # with room again
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert sum(len(s["image_ids"]) for s in Store(store).load()[0]) == 12
