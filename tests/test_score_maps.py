"""``score --maps DIR``: maps made elsewhere (.npy / .pt / CheXlocalize pickles) scored like a test run."""

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from chexlocalize_reference import REAL_GRID, SEED, TASKS, make_maps
from test_chexlocalize_mode import check_table, real_regions, run_stored, same

from xbench_pl.metrics.chexlocalize import CXL_KEYS
from xbench_pl.commands.score import main as score


def write_maps(folder: Path, maps: dict, pickled: set = frozenset(), sizes: dict | None = None) -> Path:
    """Image ids in ``pickled`` as CheXlocalize pickles, the others as DIR/<image_id>/<task>.npy (or .pt)."""
    for n, (image_id, per_task) in enumerate(sorted(maps.items())):
        for task, native in per_task.items():
            if image_id in pickled:
                height, width = sizes[image_id]
                info = {"map": native[None, None], "prob": 0.5, "task": task, "gt": 0, "cxr_dims": (width, height)}
                with open(folder / f"{image_id}_{task}_map.pkl", "wb") as handle:
                    pickle.dump(info, handle, protocol=2)
            else:
                (folder / image_id).mkdir(parents=True, exist_ok=True)
                if n % 2:
                    torch.save(native, folder / image_id / f"{task}.pt")
                else:
                    np.save(folder / image_id / f"{task}.npy", native.numpy())
    return folder


def run(folder: Path, root: Path, out: Path, *extra: str) -> int:
    return score(["--maps", str(folder), "--data", "chexlocalize", "--data.root", str(root), "--data.split", "val",
                  "--out", str(out), "--bootstrap", "0", *extra])


def test_npy_maps_and_pickles_reproduce_their_code_and_a_test_run(real_cxr, tmp_path):
    regions = real_regions(real_cxr)
    maps = make_maps(regions, SEED, REAL_GRID)
    sizes = {i: next(iter(r.values())).shape for i, r in regions.items()}
    folder = write_maps(tmp_path / "maps", maps, pickled={sorted(maps)[1]}, sizes=sizes)
    (folder / "scores.csv").write_text("image_id,finding,score\n" + "".join(f"{sorted(maps)[0]},{t},0.5\n" for t in TASKS))
    root = real_cxr / "chexlocalize"
    assert run(folder, root, tmp_path / "out", "--cxl", "true", "--data.eval_size", "64") == 0
    table = json.loads((tmp_path / "out" / "metrics.json").read_text())["datasets"]["chexlocalize"]
    check_table(table, "real")
    assert table["problems"] == []
    live = run_stored(maps, root, cxl=True)  # the same maps answered by a model in a test run
    for name, row in live["classes"].items():  # (class order differs: compare by name)
        assert table["classes"][name] == row
    assert "cxl_miou" in (tmp_path / "out" / "metrics.md").read_text()


def test_without_scores_grounding_only_and_missing_maps_are_listed(real_cxr, tmp_path):
    regions = real_regions(real_cxr)
    maps = make_maps(regions, SEED, REAL_GRID)
    folder = write_maps(tmp_path / "maps", maps)
    first, second = sorted(maps)
    for path in (folder / second).glob("Edema.*"):  # .pt for the second image
        path.unlink()
    (folder / "not_an_image_of_the_set").mkdir()
    np.save(folder / "not_an_image_of_the_set" / "Edema.npy", np.ones((3, 3), np.float32))
    assert run(folder, real_cxr / "chexlocalize", tmp_path / "out") == 0
    report = json.loads((tmp_path / "out" / "metrics.json").read_text())["datasets"]["chexlocalize"]
    reasons = [p["reason"] for p in report["problems"]]
    assert any("no map for Edema" in r for r in reasons) and any("match no evaluated image" in r for r in reasons)
    assert report["mean"]["auroc"] is None and report["mean"]["pointing_game"] is not None
    assert report["mean"]["n_pos"] + report["mean"]["n_neg"] == 10  # the second image was left out
    assert not set(CXL_KEYS) & set(report["mean"])


def test_a_map_with_nan_is_named(real_cxr, tmp_path, capsys):
    maps = make_maps(real_regions(real_cxr), SEED, REAL_GRID)
    folder = write_maps(tmp_path / "maps", maps)
    bad = folder / sorted(maps)[0] / "Edema.npy"
    array = np.load(bad)
    array[1, 1] = np.nan
    np.save(bad, array)
    assert run(folder, real_cxr / "chexlocalize", tmp_path / "out") == 2
    assert str(bad) in capsys.readouterr().err
    assert score(["--maps", str(folder)]) == 2  # no --data


def test_their_gradcam_pickles_end_to_end(real_cxr, tmp_path):
    path = os.environ.get("XBENCH_CHEXLOCALIZE")
    if not path or not (Path(path) / "sample" / "gradcam_maps_val").is_dir():
        pytest.skip("set XBENCH_CHEXLOCALIZE to a checkout of rajpurkarlab/cheXlocalize (its Grad-CAM sample)")
    assert run(Path(path) / "sample" / "gradcam_maps_val", real_cxr / "chexlocalize", tmp_path / "out", "--cxl", "true") == 0
    table = json.loads((tmp_path / "out" / "metrics.json").read_text())["datasets"]["chexlocalize"]
    check_table(table, "gradcam")
    assert table["mean"]["auroc"] is not None  # their pickles carry the model's probability
    assert same(table["mean"]["cxl_hit_rate"], 0.5)
