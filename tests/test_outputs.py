"""Output folders: every command checks where it will write before any model or data is loaded, and a
run whose results cannot be written at the end saves them to a fallback folder that the error names."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_cli import REPO, cli, in_process
from test_disk_full import FullDisk

from xbench_pl.commands import main
from xbench_pl.outputs import OutputError, check_writable


def run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a folder\n")
    return path


def test_an_unwritable_out_fails_within_seconds_before_any_model_is_built(tmp_path, a_file):
    # a model that could not be built (its checkpoint is absent): the --out check comes first
    model = ["--model", "open_clip", "--model.checkpoint", str(tmp_path / "absent.pt"), "--data", "demo"]
    started = time.monotonic()
    under_a_file = cli("test", *model, "--out", str(a_file / "results"))
    assert (under_a_file.returncode, under_a_file.stderr) == (
        2, f"error: --out {a_file / 'results'}: cannot create it: {a_file} is a file, not a folder; choose another folder\n")
    assert time.monotonic() - started < 60  # Python and Lightning's imports, no benchmark
    is_a_file = in_process("fit", *model, "--out", str(a_file))
    assert (is_a_file.returncode, is_a_file.stderr) == (2, f"error: --out {a_file}: it is a file, not a folder; choose another folder\n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only (0o500) folder: no permission to deny")
def test_a_folder_without_write_permission_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = cli("test", "--model", "center", "--data", "demo", "--out", str(locked / "run"))
    assert (result.returncode, result.stderr) == (
        2, f"error: --out {locked / 'run'}: cannot write there: permission denied; choose another folder\n")


def test_the_check_names_the_reason_and_leaves_nothing_behind(tmp_path, monkeypatch):
    check_writable({"--out": tmp_path / "new" / "deeper"})
    assert list(tmp_path.iterdir()) == []  # the folders made for the probe are gone again
    write_bytes = Path.write_bytes

    def denied_in_store(self, data):  # what a folder without write permission answers a non-root user
        if self.parent.name == "store":
            raise OSError(errno.EACCES, "Permission denied", str(self))
        return write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", denied_in_store)
    (tmp_path / "store").mkdir()
    with pytest.raises(OutputError, match=rf"^--predictions {tmp_path / 'store'}: cannot write there: permission denied; "):
        check_writable({"--out": tmp_path, "--predictions": tmp_path / "store"})
    with pytest.raises(OutputError, match=rf"^--out {tmp_path / 'store' / 'new'}: cannot write there: permission denied "
                                          rf"\({tmp_path / 'store'}\); "):
        check_writable({"--out": tmp_path / "store" / "new"})  # it would be created in store


def test_ranks_started_at_once_check_the_same_new_out_without_tripping_on_each_other(tmp_path):
    """torchrun and SLURM start every rank at once, and each checks ``--out`` before Lightning loads: one rank's
    probe folder must not make another's check fail ("file exists", "directory not empty")."""
    loop = ("import sys, time; from pathlib import Path; from xbench_pl.outputs import check_writable\n"
            "base = Path(sys.argv[1])\n"
            "while not (base / 'go').exists(): time.sleep(0.001)\n"
            "for i in range(300): check_writable({'--out': base / f'run{i}' / 'out'})\n")
    ranks = [subprocess.Popen([sys.executable, "-c", loop, str(tmp_path)], stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(1)
    (tmp_path / "go").touch()
    errors = [rank.communicate(timeout=60)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(error[-1500:] for error in errors)


def test_every_command_checks_its_out_first(tmp_path, a_file, capsys):
    out = str(a_file / "out")
    line = f"error: --out {out}: cannot create it: {a_file} is a file, not a folder; choose another folder\n"
    run_folder = tmp_path / "run"  # what report reads: a run folder with its metrics.json
    run_folder.mkdir()
    (run_folder / "metrics.json").write_text(json.dumps({"model": "m", "datasets": {}}))
    store = tmp_path / "store"  # a prediction store's manifest (score reads no shard before the check)
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps({"config": {"data": {
        "class_path": "xbench_pl.data.nih_bbox.DemoDataModule", "init_args": {}}}, "metrics": {}}))
    maps = tmp_path / "maps"
    maps.mkdir()
    commands = [["report", str(run_folder), "--out", out],
                ["sweep", str(REPO / "sweeps" / "center_sigma.yaml"), "--out", out],
                ["score", "--predictions", str(store), "--out", out],
                ["score", "--maps", str(maps), "--data", "demo", "--out", out],
                ["compare", "--predictions", str(store), str(store), "--out", out]]
    for argv in commands:
        assert run(capsys, *argv) == (2, line), argv[0]


def test_wandb_writes_under_wandb_dir_when_set(tmp_path, a_file, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(a_file / "wandb"))
    code, err = run(capsys, "test", "--model", "center", "--data", "demo", "--config", str(REPO / "callbacks" / "wandb.yaml"),
                    "--out", str(tmp_path / "out"))
    assert (code, err) == (2, f"error: --trainer.logger WandbLogger.save_dir {a_file / 'wandb'}: cannot create it: "
                              f"{a_file} is a file, not a folder; choose another folder\n")


def test_results_that_cannot_be_written_go_to_a_fallback_folder(tmp_path, capsys, monkeypatch):
    argv = ["test", "--model", "center", "--model.bootstrap", "0", "--data", "demo", "--trainer.accelerator", "cpu",
            "--trainer.enable_progress_bar", "false"]
    assert main([*argv, "--out", str(tmp_path / "written")]) == 0
    capsys.readouterr()
    out = tmp_path / "full_disk"
    monkeypatch.setattr(os, "write", FullDisk(out, at=1))  # the disk fills up after the run, when the results are written
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the fallback's folder
    code, err = run(capsys, *argv, "--out", str(out))
    fallback = next(tmp_path.glob("xbench-full_disk-*"))
    assert (code, err) == (2, f"error: cannot write {out / 'metrics.json'}: no space left on device; "
                              f"every output of this run is saved in {fallback}\n")
    saved, written = (json.loads((p / "metrics.json").read_text()) for p in (fallback, tmp_path / "written"))
    assert saved.pop("provenance") and written.pop("provenance")  # start and wall times differ
    assert saved == written and saved["datasets"]["demo"]["mean"]["pointing_game"] is not None
    assert (fallback / "metrics.md").read_text() == (tmp_path / "written" / "metrics.md").read_text()
    assert list(out.iterdir()) == []  # nor half a file


def test_test_over_an_earlier_run_is_refused_before_any_model_unless_overwrite(tmp_path, capsys):
    """An ``--out`` that holds a run's metrics.json: one line naming it and the fix, exit 2, before any model is built
    (the model here could not be: its checkpoint is absent), from the command line or a ``--config``. ``--overwrite``
    (bare or ``true``) replaces its files and says so. A folder without metrics.json (a sweep's run folder after a
    failed run: params.json, log.txt) is not an earlier run."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "metrics.json").write_text('{"earlier": true}\n')
    unbuildable = ["--model", "open_clip", "--model.checkpoint", str(tmp_path / "absent.pt"), "--data", "demo"]
    line = (f"error: --out {earlier}: holds an earlier run (its metrics.json); choose another --out, or add --overwrite "
            "to replace its files\n")
    assert run(capsys, "test", *unbuildable, "--out", str(earlier)) == (2, line)
    assert run(capsys, "test", *unbuildable, "--out", str(earlier), "--overwrite", "false") == (2, line)
    config = tmp_path / "out.yaml"
    config.write_text(f"out: {earlier}\n")
    assert run(capsys, "test", *unbuildable, "--config", str(config)) == (2, line)
    assert (earlier / "metrics.json").read_text() == '{"earlier": true}\n'

    argv = ["test", "--model", "center", "--model.bootstrap", "0", "--data", "demo", "--trainer.enable_progress_bar", "false",
            "--out", str(earlier)]
    for overwrite in (["--overwrite"], ["--overwrite", "true"]):
        code = main([*argv, *overwrite])
        out = " ".join(capsys.readouterr().out.split())
        assert code == 0 and json.loads((earlier / "metrics.json").read_text())["model"] == "center"
        assert f"wrote {earlier / 'metrics.json'} and {earlier / 'metrics.md'}, replacing the earlier run's (--overwrite)" in out

    swept = tmp_path / "runs" / "0123456789"  # sweep re-runs a folder without metrics.json, without --overwrite
    swept.mkdir(parents=True)
    (swept / "params.json").write_text("{}\n")
    (swept / "log.txt").write_text("an earlier attempt\n")
    assert main([*argv[:-1], str(swept)]) == 0
    assert "replacing" not in capsys.readouterr().out and (swept / "metrics.json").is_file()


def test_the_guard_sees_a_file_written_into_the_tree():
    from conftest import TREE

    TREE.entries()  # listed: the guard now walks again only where a folder's mtime moved
    folder = REPO / "results"
    made = not folder.exists()
    probe = folder / "guard-probe.txt"
    probe.parent.mkdir(exist_ok=True)
    try:
        probe.write_text("x")
        assert "results/guard-probe.txt" in TREE.entries()  # writes_nothing_into_the_tree would fail a test leaving it
    finally:
        probe.unlink()
        if made:
            folder.rmdir()
