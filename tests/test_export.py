"""``export --to npy|cheXlocalize``: a store in other tools' layouts, and back through ``score --maps``."""

import json
import pickle
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_cli import python, warm_process
from test_predictions import COMMON, MODEL, run_test, shard_of

from xbench_pl.commands import main
from xbench_pl.exports import infer_preprocess
from xbench_pl.external_maps import _MapUnpickler
from xbench_pl.geometry import Preprocess
from xbench_pl.prediction_store import StoreError


@pytest.fixture(scope="module")
def half_store(tmp_path_factory):
    """A float16 store (the default dtype) of the demo and its ``score --predictions`` tables."""
    root = tmp_path_factory.mktemp("export")
    run_test(root / "run", "--predictions", str(root / "store"), "--predictions_shard_images", "5")
    assert main(["score", "--predictions", str(root / "store"), "--out", str(root / "scored")]) == 0
    return root / "store", tables(root / "scored")


def tables(folder):
    return json.loads((folder / "metrics.json").read_text())["datasets"]


def score_maps(folder, out):
    assert main(["score", "--maps", str(folder), "--data", "demo", "--out", str(out)]) == 0
    return tables(out)


def test_npy_export_then_score_maps_gives_score_predictions_exactly(half_store, tmp_path):
    store, expected = half_store
    assert main(["export", "--predictions", str(store), "--to", "npy", "--out", str(tmp_path / "npy")]) == 0
    assert json.loads((tmp_path / "npy" / "preprocess.json").read_text()) == {"resize": "squash", "size": 56}
    scores = (tmp_path / "npy" / "scores.csv").read_text().splitlines()
    assert scores[0] == "image_id,finding,score" and len(scores) == 1 + 12 * 8
    assert len(list((tmp_path / "npy").glob("*/*.npy"))) == 12 * 8
    assert score_maps(tmp_path / "npy", tmp_path / "scored") == expected  # every table, every number


def probed_commands(folder: Path) -> subprocess.CompletedProcess:
    """The background job of the test below: a float16 store of the demo (``folder/store``, a run in the warm
    process), then one fresh process that runs the commands below one after the other and says which of Lightning,
    torchmetrics and albumentations each one imported."""
    store = folder / "store"
    run = warm_process("test", *MODEL, *COMMON, "--out", str(folder / "run"), "--predictions", str(store),
                       "--predictions_shard_images", "5")
    assert run.returncode == 0, run.stderr[-3000:]
    commands = [["describe", "--data", "demo", "--json"],
                ["export", "--predictions", str(store), "--to", "npy", "--out", str(folder / "npy")],
                ["store", "upgrade", str(store)],
                ["score", "--predictions", str(store), "--out", str(folder / "scored")],
                ["compare", "--predictions", str(store), str(store), "--bootstrap", "10", "--out", str(folder / "compared")]]
    probe = ("import sys\nfrom xbench_pl.commands import main\n"
             f"for command in {commands!r}:\n"
             "    before = set(sys.modules)\n"
             "    code = main(command)\n"
             "    loaded = sorted({'lightning', 'torchmetrics', 'albumentations'} & (set(sys.modules) - before))\n"
             "    print(f'{command[0]} exit {code} loaded {loaded}', file=sys.stderr)\n")
    return python("-c", probe)


@pytest.mark.background(job=probed_commands)
def test_commands_without_a_model_load_no_lightning(background):
    """``describe`` reads a dataset (a plain class) and preprocesses no image, so it loads none of them; ``export`` and
    ``store upgrade`` read and write store files only (``prediction_store``; an export infers the model's
    preprocessing); ``score`` and ``compare`` judge with the metrics (a plain ``Judge``): torchmetrics, never
    Lightning. The fresh process's score is this process's."""
    folder, result = background
    said = [line for line in result.stderr.splitlines() if " exit " in line]
    assert said == ["describe exit 0 loaded []", "export exit 0 loaded ['albumentations']", "store exit 0 loaded []",
                    "score exit 0 loaded ['torchmetrics']", "compare exit 0 loaded []"], result.stderr[-2000:]
    assert len(list((folder / "npy").glob("*/*.npy"))) == 12 * 8
    assert main(["score", "--predictions", str(folder / "store"), "--out", str(folder / "here")]) == 0
    assert tables(folder / "scored") == tables(folder / "here")
    assert (folder / "compared" / "compare.json").is_file()


def test_chexlocalize_export_is_their_layout_and_scores_back(half_store, tmp_path):
    store, expected = half_store
    assert main(["export", "--predictions", str(store), "--to", "cheXlocalize", "--out", str(tmp_path / "cxl")]) == 0
    files = sorted((tmp_path / "cxl").glob("*_map.pkl"))
    assert len(files) == 12 * 8
    asked = set()

    class Recording(_MapUnpickler):  # external_maps' unpickler: tensors (storages read with weights_only), nothing else
        def find_class(self, module, name):
            asked.add(f"{module}.{name}")
            return super().find_class(module, name)

    with open(files[0], "rb") as handle:
        info = Recording(handle).load()
    # tensors as torch pickles them, as in their files (their tools call F.interpolate on the map); no other global
    assert asked <= {"torch._utils._rebuild_tensor_v2", "torch.storage._load_from_bytes", "collections.OrderedDict"}
    assert type(info) is dict and sorted(info) == ["cxr_dims", "gt", "map", "prob", "task"]
    # a squash model's native map spans the whole image, as theirs: stored as it is, not on the 512² eval grid
    assert info["map"].shape == (1, 1, 14, 14) and info["map"].dtype == torch.float32  # the model's 14² map
    assert sum(f.stat().st_size for f in files) < 3e6  # (on the 512² eval grid: 97 MB)
    assert type(info["prob"]) is float and type(info["gt"]) is int and files[0].name.endswith(f"_{info['task']}_map.pkl")
    width, height = info["cxr_dims"]
    with open(files[0], "rb") as handle:  # as their heatmap_to_segmentation.py reads it
        theirs = pickle.load(handle)
    resized = F.interpolate(theirs["map"], size=(height, width), mode="bilinear", align_corners=False)
    assert resized.shape == (1, 1, height, width)
    assert score_maps(tmp_path / "cxl", tmp_path / "scored") == expected  # the native maps: every number


def test_chexlocalize_export_on_a_grid_scores_back(half_store, tmp_path):
    store, expected = half_store
    assert main(["export", "--predictions", str(store), "--to", "cheXlocalize", "--out", str(tmp_path / "cxl"),
                 "--size", "512"]) == 0
    with open(next((tmp_path / "cxl").glob("*_map.pkl")), "rb") as handle:
        assert pickle.load(handle)["map"].shape == (1, 1, 512, 512)  # the run's eval grid
    scored = score_maps(tmp_path / "cxl", tmp_path / "scored")["demo"]
    for row in ("mean", *expected["demo"]["classes"]):
        got = scored["mean"] if row == "mean" else scored["classes"][row]
        want = expected["demo"]["mean"] if row == "mean" else expected["demo"]["classes"][row]
        # the maps were resampled onto the eval grid: only the native maps' similarity moves
        assert {k: v for k, v in got.items() if k != "map_similarity"} == {k: v for k, v in want.items() if k != "map_similarity"}
        assert got["map_similarity"] == pytest.approx(want["map_similarity"], abs=1e-3)


def test_the_preprocess_is_found_from_the_affines():
    def shards_for(preprocess, sizes):
        shard = shard_of()
        shard["input_size"] = preprocess.size
        shard["original_size"] = torch.tensor(sizes)
        shard["affine"] = torch.tensor([preprocess.plan(*s)[1] for s in sizes], dtype=torch.float64)
        return [(shard, [0, 1])]

    sizes = [[300, 200], [250, 410]]
    for config in ({"resize": "crop", "size": 56}, {"resize": "letterbox", "size": 56, "canvas": 64},
                   {"resize": "squash", "size": 224}, {"resize": "crop", "size": 48, "canvas": 60}):
        assert infer_preprocess(shards_for(Preprocess(**config), sizes)) == config
    # CheXzero's letterbox_resize: its canvas cancels in the affine but for rounding; the one found gives every affine
    shards = shards_for(Preprocess("letterbox_resize", 56, 80), sizes)
    found = infer_preprocess(shards)
    assert found["resize"] == "letterbox_resize" and found["canvas"] <= 80
    assert [list(Preprocess(**found).plan(*s)[1]) for s in sizes] == shards[0][0]["affine"].tolist()
    mixed = shards_for(Preprocess("crop", 56), sizes)
    mixed[0][0]["affine"][1] = torch.tensor(Preprocess("squash", 56).plan(250, 410)[1])
    with pytest.raises(StoreError, match="no single squash, crop, letterbox or letterbox_resize"):
        infer_preprocess(mixed)


def test_export_refuses_a_used_folder_a_bad_option_and_a_damaged_store(half_store, tmp_path, capsys):
    store, _ = half_store
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    assert main(["export", "--predictions", str(store), "--to", "npy", "--out", str(tmp_path / "used")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert main(["export", "--predictions", str(store), "--to", "png", "--out", str(tmp_path / "a")]) == 2
    assert main(["export", "--predictions", str(store), "--out", str(tmp_path / "a")]) == 2
    assert "--to required" in capsys.readouterr().err
    damaged = tmp_path / "damaged"
    (damaged / "shards").mkdir(parents=True)
    (damaged / "manifest.json").write_text((store / "manifest.json").read_text())
    first = sorted((store / "shards").iterdir())[0]
    (damaged / "shards" / first.name).write_bytes(first.read_bytes()[:-9])
    assert main(["export", "--predictions", str(damaged), "--to", "npy", "--out", str(tmp_path / "b")]) == 2
    assert "--resume" in capsys.readouterr().err
