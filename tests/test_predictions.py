"""The prediction store (test --predictions DIR), --resume after SIGKILL, and score, end to end.

Runs that test the process (SIGKILL, DDP, which inside pytest would re-run the session) are
subprocesses; the others run in this process (``test_cli.in_process``). The model is
``fixture_store.StoppableIntensityModel`` (weight-free, pixel-dependent scores and 14 x 14
maps) on the synthetic demo (12 boxed images, 8 findings), batches of 3.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cli import cli_env, ddp_ranks, in_process

from xbench_pl.data.base import XBenchDataset
from xbench_pl.data.nih_bbox import DemoDataModule
from xbench_pl.prediction_store import Store, decode_shard, differences, encode_shard

REPO = Path(__file__).resolve().parents[1]
MODEL = ["--model", "fixture_store.StoppableIntensityModel"]
COMMON = ["--data", "demo", "--data.batch_size", "3", "--trainer.accelerator", "cpu"]


def run_test(out: Path, *extra, **environ):
    result = in_process("test", *MODEL, *COMMON, "--out", str(out), *extra, **environ)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def metrics(folder: Path) -> str:
    """metrics.json without provenance (times, world size, host), as text: compared byte for byte."""
    report = json.loads((folder / "metrics.json").read_text())
    report.pop("provenance")
    return json.dumps(report, indent=2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run writing a float32 store, 3 images a shard: (its out folder, its store)."""
    root = tmp_path_factory.mktemp("reference")
    run_test(root / "run", "--predictions", str(root / "store"), "--predictions_dtype", "float32",
             "--predictions_shard_images", "3")
    return root / "run", root / "store"


# -- shard files ------------------------------------------------------------------------------
def shard_of(dtype=torch.float16) -> dict:
    return {"dataset": "demo", "classes": ["Mass", "Nodule"], "image_ids": ["a", "b"], "input_size": 56,
            "scores": torch.tensor([[0.25, 0.75], [0.5, 0.125]], dtype=torch.float64),
            "saliency": torch.rand(2, 2, 14, 14, generator=torch.Generator().manual_seed(0)).to(dtype),
            "affine": torch.tensor([[0.25, 0.5, 0.0, -3.0]] * 2, dtype=torch.float64),
            "original_size": torch.tensor([[224, 112], [200, 100]]), "labels": torch.tensor([[1, 0], [0, 0]], dtype=torch.uint8)}


def test_shard_round_trip_and_damage_is_detected(tmp_path):
    shard = shard_of()
    data = encode_shard(shard)
    back = decode_shard(data)
    assert back["image_ids"] == ["a", "b"] and torch.equal(back["saliency"], shard["saliency"])
    assert encode_shard(shard) == data  # one shard, one byte string
    with pytest.raises(ValueError, match="truncated"):
        decode_shard(data[:-10])
    flipped = bytearray(data)
    flipped[-100] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        decode_shard(bytes(flipped))
    renamed = data.replace(b'\\"a\\"', b'\\"z\\"', 1)  # an image id altered in the metadata
    assert renamed != data
    with pytest.raises(ValueError, match="checksum"):
        decode_shard(renamed)
    with pytest.raises(ValueError, match="bad header"):
        decode_shard(b"\x10" + bytes(7) + b"{not json}      " + bytes(8))
    store = Store(tmp_path)
    path = store.write_shard("demo-x", shard)
    assert path.suffix == ".safetensors"
    assert [p.name for p in store.shards_dir.iterdir()] == [path.name]  # no temporary file left behind
    path.write_bytes(data[: len(data) // 2])
    good, bad = store.load()
    assert good == [] and "truncated" in bad[0].reason


def test_manifest_differences_name_the_keys():
    a = {"format": 1, "config": {"model": {"init_args": {"normalize": "minmax"}}}, "dtype": "float16"}
    b = {"format": 1, "config": {"model": {"init_args": {"normalize": "max"}}}, "dtype": "float32"}
    assert differences(a, b) == ["config.model.init_args.normalize: 'minmax' -> 'max'", "dtype: 'float16' -> 'float32'"]
    assert differences(a, a) == []


def test_skip_ids_leave_the_rest_or_one_uncounted_stand_in():
    dm = DemoDataModule(batch_size=5)
    records = dm.prepare_records()
    dm.test_set = XBenchDataset(dm.name, records, dm.classes, _preprocess(), dm.eval_size)
    dm.skip_ids = {r.image_id for r in records[:7]}
    batches = list(dm.test_dataloader())
    assert [i for b in batches for i in b.image_ids] == [r.image_id for r in records[7:]]
    dm.skip_ids = {r.image_id for r in records}
    (only,) = list(dm.test_dataloader())
    assert only.counted.tolist() == [False]  # the loop still runs (its epoch end computes the metrics) but counts nothing


def _preprocess():
    from xbench_pl.geometry import Preprocess

    return Preprocess(resize="crop", size=56)


# -- end to end --------------------------------------------------------------------------------
def test_store_layout_and_score_equals_test(reference, tmp_path):
    run, store = reference
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["dtype"] == "float32" and manifest["model_name"] == MODEL[1]
    assert manifest["config"] == json.loads((run / "metrics.json").read_text())["config"]
    good, bad = Store(store).load()
    assert bad == [] and [len(s["image_ids"]) for s in good] == [3, 3, 3, 3]
    assert good[0]["saliency"].shape == (3, 8, 14, 14) and good[0]["saliency"].dtype == torch.float32
    assert good[0]["scores"].dtype == torch.float64 and good[0]["affine"].shape == (3, 4) and good[0]["input_size"] == 56
    scored = in_process("score", "--predictions", str(store), "--out", str(tmp_path / "score"))
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert metrics(tmp_path / "score") == metrics(run)  # no model: the store and the regions alone, bit-identical
    # new metric settings without the model: another normalisation changes the thresholded numbers, not the Pointing Game
    other = in_process("score", "--predictions", str(store), "--normalize", "max", "--columns", "pointing_game,dice@0.5",
                       "--out", str(tmp_path / "max"))
    assert other.returncode == 0, other.stderr[-3000:]
    assert next(line for line in other.stdout.splitlines() if line.startswith("|")).split() == ["|", "dataset", "|", "pointing_game", "|", "dice@0.5", "|"]
    a, b = (json.loads((f / "metrics.json").read_text()) for f in (run, tmp_path / "max"))
    assert b["config"]["model"]["init_args"]["normalize"] == "max"
    assert a["datasets"]["demo"]["mean"]["pointing_game"] == b["datasets"]["demo"]["mean"]["pointing_game"]
    assert a["datasets"]["demo"]["mean"]["dice@0.5"] != b["datasets"]["demo"]["mean"]["dice@0.5"]


def killed_run(folder: Path) -> tuple[list[str], int]:
    """The background job of the test below: a run storing its predictions in ``folder/store``, killed (SIGKILL) in
    its third batch; (its options, its exit status)."""
    store, ready = folder / "store", folder / "ready"
    args = ["test", *MODEL, *COMMON, "--out", str(folder / "resumed"), "--predictions", str(store),
            "--predictions_dtype", "float32", "--predictions_shard_images", "3"]
    killed = subprocess.Popen([sys.executable, "-m", "xbench_pl", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env=cli_env(XBENCH_TEST_HANG_AFTER="2", XBENCH_TEST_READY=str(ready)))
    try:
        wait_until_ready(killed, ready)
        assert ready.exists(), killed.stderr.read().decode()[-3000:]
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
    finally:
        if killed.poll() is None:
            killed.kill()
        killed.stderr.close()
    return args, killed.returncode


@pytest.mark.background(job=killed_run)
def test_sigkill_then_resume_equals_an_uninterrupted_run(reference, background):
    run, _ = reference
    folder, (args, returncode) = background
    store, log = folder / "store", folder / "computed.txt"
    assert returncode == -signal.SIGKILL
    good, bad = Store(store).load()
    stored = sorted(i for s in good for i in s["image_ids"])
    assert bad == [] and len(stored) == 6 and not (folder / "resumed" / "metrics.json").exists()
    resumed = in_process(*args, "--resume", "true", XBENCH_TEST_LOG=str(log))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    computed = log.read_text().split()
    assert len(computed) == 6 and not set(computed) & set(stored)  # only the rest was computed
    assert metrics(folder / "resumed") == metrics(run)  # byte for byte
    assert sum(len(s["image_ids"]) for s in Store(store).load()[0]) == 12


def wait_until_ready(process: subprocess.Popen, ready: Path) -> None:
    """Until the model reaches its third batch (``ready`` appears) or the run ends early (a failure); 5 min at most."""
    for _ in range(3000):
        if ready.exists() or process.poll() is not None:
            return
        try:
            process.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass


def interrupted_run(folder: Path) -> tuple[list[str], subprocess.CompletedProcess]:
    """The background job of the test below: ``killed_run``'s run, sent SIGINT (Ctrl-C) in its third batch instead;
    (its options, the run)."""
    store, ready = folder / "store", folder / "ready"
    args = ["test", *MODEL, *COMMON, "--out", str(folder / "out"), "--predictions", str(store),
            "--predictions_dtype", "float32", "--predictions_shard_images", "3"]
    stopped = subprocess.Popen([sys.executable, "-m", "xbench_pl", *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env=cli_env(XBENCH_TEST_HANG_AFTER="2", XBENCH_TEST_READY=str(ready)))
    try:
        wait_until_ready(stopped, ready)
        if ready.exists():
            stopped.send_signal(signal.SIGINT)
        out, err = stopped.communicate(timeout=120)
    finally:
        if stopped.poll() is None:
            stopped.kill()
            stopped.communicate()
    return args, subprocess.CompletedProcess(stopped.args, stopped.returncode, out, err)


@pytest.mark.background(job=interrupted_run)
def test_ctrl_c_says_what_is_safe_and_the_command_that_continues(reference, background):
    """Exit 130 (128 + SIGINT) and one line: interrupted, the images safe in the store (the two shards written before
    the third batch) and the command to continue with ``--resume``, which then completes the run as if never stopped."""
    run, _ = reference
    folder, (args, stopped) = background
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    command = f"python -m xbench_pl {shlex.join(args)} --resume"
    assert errors == [f"error: interrupted (Ctrl-C): 6 of 12 images are safe in the prediction store {folder / 'store'}; "
                      f"continue with: {command}"], stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and not (folder / "out" / "metrics.json").exists()
    resumed = in_process(*shlex.split(command)[3:])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "--resume: 6 of 12 images from the prediction store" in " ".join(resumed.stderr.split())
    assert metrics(folder / "out") == metrics(run)  # byte for byte


def test_a_damaged_shard_is_never_trusted_and_its_images_are_redone(reference, tmp_path):
    run, reference_store = reference
    store = tmp_path / "store"
    subprocess.run(["cp", "-r", str(reference_store), str(store)], check=True)
    shards = Store(store).shard_paths()
    shards[1].write_bytes(shards[1].read_bytes()[:-50])  # truncated
    data = bytearray(shards[2].read_bytes())
    data[len(data) // 2] ^= 0xFF  # altered
    shards[2].write_bytes(bytes(data))
    scored = in_process("score", "--predictions", str(store), "--out", str(tmp_path / "score"))
    assert scored.returncode == 2 and shards[1].name in scored.stderr and "--resume" in scored.stderr
    log = tmp_path / "computed.txt"
    resumed = run_test(tmp_path / "resumed", "--predictions", str(store), "--predictions_dtype", "float32",
                       "--predictions_shard_images", "3", "--resume", "true", XBENCH_TEST_LOG=str(log))
    assert "2 unreadable shard(s) set aside" in resumed.stderr
    assert len(log.read_text().split()) == 6  # the damaged shards' images, computed again
    assert sorted(p.name for p in (store / "corrupt").iterdir()) == sorted(p.name for p in shards[1:3])
    assert metrics(tmp_path / "resumed") == metrics(run)
    rescored = in_process("score", "--predictions", str(store), "--out", str(tmp_path / "score"))
    assert rescored.returncode == 0, rescored.stderr[-3000:]
    assert metrics(tmp_path / "score") == metrics(run)


def test_a_store_refuses_another_config_and_an_unasked_resume(reference, tmp_path):
    _, store = reference
    other = in_process("test", "--model", "center", *COMMON, "--out", str(tmp_path), "--predictions", str(store),
                       "--predictions_dtype", "float32", "--resume", "true")
    assert other.returncode == 2 and "written by another configuration" in other.stderr and "model_name" in other.stderr
    again = in_process("test", *MODEL, *COMMON, "--out", str(tmp_path), "--predictions", str(store), "--predictions_dtype", "float32")
    assert again.returncode == 2 and "already holds 12 image(s); pass --resume" in again.stderr
    half = in_process("test", *MODEL, *COMMON, "--out", str(tmp_path), "--predictions", str(store), "--resume", "true")
    assert half.returncode == 2 and "dtype: 'float32' -> 'float16'" in half.stderr
    no_store = in_process("test", *MODEL, *COMMON, "--out", str(tmp_path), "--resume", "true")
    assert no_store.returncode == 2 and "--resume continues a prediction store" in no_store.stderr
    missing = in_process("score", "--predictions", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "no such folder" in missing.stderr


@pytest.mark.ddp_pair
def test_two_process_ddp_resumes_a_store_and_it_rescores_to_the_same_numbers(reference, tmp_path):
    run, reference_store = reference
    store = tmp_path / "store"
    subprocess.run(["cp", "-r", str(reference_store), str(store)], check=True)
    for shard in Store(store).shard_paths()[1::2]:
        shard.unlink()  # 6 of the 12 images left, as after a crash
    before = set(Store(store).shard_paths())
    log = tmp_path / "computed.txt"
    ddp = ddp_ranks("test", *MODEL, *COMMON, "--out", str(tmp_path / "ddp"), "--predictions", str(store), "--predictions_dtype",
                    "float32", "--resume", "true", XBENCH_TEST_LOG=str(log))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    new = set(Store(store).shard_paths()) - before
    assert sorted(p.name.split("-")[1] for p in new) == ["rank0", "rank1"]  # each rank wrote its own shard
    assert len(log.read_text().split()) == 6  # the two ranks computed only the missing images, once each
    assert metrics(tmp_path / "ddp") == metrics(run)  # stored images replayed over both ranks: byte for byte
    scored = in_process("score", "--predictions", str(store), "--out", str(tmp_path / "score"))
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert metrics(tmp_path / "score") == metrics(run)
