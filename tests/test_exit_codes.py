"""One rule for every command: a user error (a bad option, a missing or bad file or folder, bad data) ends with
one ``error:`` line naming the option or file, and exit status 2. The test walks each command's error paths."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from test_cli import REPO, cli, in_process


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A prediction store of the demo, the same store with a truncated shard, a run folder and bad inputs."""
    root = tmp_path_factory.mktemp("inputs")
    store, run = root / "store", root / "run"
    assert in_process("test", "--model", "center", "--data", "demo", "--model.bootstrap", "0", "--predictions", str(store),
                      "--out", str(run), "--trainer.enable_progress_bar", "false").returncode == 0
    truncated = root / "truncated"
    shutil.copytree(store, truncated)
    shard = sorted((truncated / "shards").iterdir())[0]
    shard.write_bytes(shard.read_bytes()[:100])
    (root / "a_file").write_text("not a folder\n")
    (root / "empty").mkdir()
    (root / "nonempty").mkdir()
    (root / "nonempty" / "x").write_text("x")
    (root / "boxes.csv").write_text("image_id,finding,x_min,y_min,x_max,y_max\nphantom_000.png,Nodule,10,10,5,20\n")
    (root / "bad.yaml").write_text("method: [grid\n")
    return {"root": root, "store": store, "truncated": truncated, "shard": shard, "run": run}


def error_paths(f: dict[str, Path]) -> list[tuple[list[str], str]]:
    """(argv, what the one error line names) for every command's error paths."""
    root, out = f["root"], str(f["root"] / "out")
    demo = ["--data", "demo"]
    return [
        (["test", "--model", "no_such_model", *demo], "--model"),
        (["test", "--model", "center", "--data", "nih_bbox", "--data.root", str(root / "missing")], "--data.root"),
        (["test", "--model", "clip", "--model.checkpoint", str(root / "missing.pt"), *demo], "--model.checkpoint"),
        (["test", "--model", "center", *demo, "--model.sigma", "abc"], "--model.sigma"),
        (["test", "--model", "center", *demo, "--out", str(root / "a_file")], "--out"),
        (["test", "--model", "center", *demo, "--out", str(f["run"])], "--overwrite"),  # an earlier run's folder
        (["test", "--model", "center", *demo, "--resume", "maybe"], "--resume"),
        (["test", "--model", "center", *demo, "--columns", "bogus"], "--columns"),
        (["test", "--model", "center", *demo, "--ckpt_path", str(root / "a_file")], "--ckpt_path"),
        (["fit", "--model", "center", *demo, "--data.val_fraction", "1.5"], "--data.val_fraction"),
        (["score", "--predictions", str(root / "missing")], f"--predictions {root / 'missing'}"),
        (["score", "--predictions", str(f["truncated"]), "--out", out], str(f["shard"])),
        (["score", "--predictions", str(f["store"]), "--columns", "bogus"], "--columns"),
        (["score", "--predictions", str(f["store"]), "--normalize", "bogus"], "--normalize"),
        (["score", "--boxes", str(root / "boxes.csv"), *demo, "--out", out], f"{root / 'boxes.csv'}, row 2"),
        (["score", "--boxes", str(root / "missing.csv"), *demo], "--boxes"),
        (["score", "--boxes", str(root / "boxes.csv")], "--data"),
        (["score", "--maps", str(root / "empty"), *demo, "--out", out], str(root / "empty")),
        (["score", "--maps", str(root / "a_file"), *demo], "--maps"),
        (["score", "--maps", str(root / "empty"), "--data", "no_such_data"], "--data"),
        (["export", "--predictions", str(f["store"]), "--out", out], "--to"),
        (["export", "--predictions", str(f["store"]), "--to", "png", "--out", out], "--to"),
        (["export", "--predictions", str(f["store"]), "--to", "npy", "--out", str(root / "nonempty")], "--out"),
        (["export", "--predictions", str(f["store"]), "--to", "npy", "--size", "0", "--out", out], "--size"),
        (["export", "--predictions", str(root / "missing"), "--to", "npy", "--out", out], str(root / "missing")),
        (["export", "--predictions", str(f["truncated"]), "--to", "npy", "--out", out], str(f["shard"])),
        (["store", "upgrade", str(root / "missing")], str(root / "missing")),
        (["store", "upgrade", str(root / "empty")], str(root / "empty" / "manifest.json")),
        (["store", "convert", str(f["store"])], "store upgrade DIR"),
        (["compare", "--predictions", str(f["store"])], "--predictions"),
        (["compare", "--predictions", str(f["store"]), str(root / "missing"), "--out", out], str(root / "missing")),
        (["compare", "--predictions", str(f["store"]), str(f["truncated"]), "--out", out], str(f["shard"])),
        (["compare", "--predictions", str(f["store"]), str(f["store"]), "--bootstrap", "0"], "--bootstrap"),
        (["report", str(root / "missing"), "--out", out], str(root / "missing")),
        (["report", str(root / "empty"), "--out", out], str(root / "empty")),
        (["report", str(f["run"]), "--out", str(root / "a_file")], "--out"),
        (["report", str(f["run"]), "--bogus"], "--bogus"),
        (["describe", "--data", "no_such_data"], "--data"),
        (["describe", "--data", "nih_bbox", "--data.root", str(root / "missing")], "--data.root"),
        (["sweep", str(root / "missing.yaml")], str(root / "missing.yaml")),
        (["sweep", str(root / "bad.yaml")], str(root / "bad.yaml")),
        (["sweep", str(REPO / "sweeps" / "center_sigma.yaml"), "--out", str(root / "a_file")], "--out"),
        (["frobnicate"], "frobnicate"),
    ]


def test_every_command_s_user_errors_end_with_one_line_naming_it_and_exit_2(files):
    failures = []
    for argv, named in error_paths(files):
        result = in_process(*argv)
        lines = re.split(r"^warning: ", result.stderr, flags=re.M)[0].splitlines()  # in_process adds warnings after it
        if result.returncode != 2 or len(lines) != 1 or not lines[0].startswith("error: ") or named not in lines[0]:
            failures.append(f"{' '.join(argv)} -> {result.returncode}: {result.stderr!r}")
    assert not failures, "\n".join(failures)


def test_the_command_line_gives_the_same_status(files):
    """In a real process too (the dispatcher, the exit status of ``python -m xbench_pl``): a store error found deep in
    a command, by ``export``, which starts without Lightning (a few seconds, where ``score`` takes 12-16 s here)."""
    result = cli("export", "--predictions", str(files["truncated"]), "--to", "npy", "--out", str(files["root"] / "out"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result
    assert str(files["shard"]) in result.stderr
