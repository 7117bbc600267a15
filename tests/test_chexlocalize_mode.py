"""CheXlocalize-comparable mode (``cxl_hit_rate``, ``cxl_miou``, ``cxl_miou_all``): equal to
CheXlocalize's own evaluation code run on the same maps and ground truth
(``tests/data/chexlocalize_reference.json``, made by ``tests/data/make_chexlocalize_reference.py``:
see ``make_chexlocalize_reference.md``), through the functions, the metric class and a whole test run;
geometry, full-resolution regions, split invariance and 1 vs 2 DDP processes."""

import json
import math
import os
import pickle
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from chexlocalize_reference import REAL_GRID, REAL_IDS, SEED, TASKS, make_maps, synthetic_regions
from PIL import Image, ImageDraw

from xbench_pl.data.annotations import RLEMask
from xbench_pl.data.chexlocalize import CheXlocalizeDataModule
from xbench_pl.data.errors import DataError
from xbench_pl.data.io import read_image_size
from xbench_pl.data.regions import Box, Mask, Polygon, rasterize_original
from xbench_pl.data.vocabulary import canonical
from xbench_pl.external_maps import parse_chexlocalize_name, read_chexlocalize_pickle
from xbench_pl.geometry import Preprocess
from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.chexlocalize import (
    CXL_KEYS,
    CheXlocalizeMode,
    cxl_means,
    cxl_pair,
    full_resolution_map,
    region_mask,
)
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput

REFERENCE = json.loads((Path(__file__).parent / "data" / "chexlocalize_reference.json").read_text())


def same(ours: float, theirs: float | None, tol: float = 1e-12) -> bool:
    return math.isnan(ours) if theirs is None else abs(ours - theirs) <= tol


def real_regions(real_cxr) -> dict[str, dict[str, np.ndarray]]:
    """The real sample's ground truth at full resolution, by their task names (from our reader)."""
    records = CheXlocalizeDataModule(root=str(real_cxr / "chexlocalize"), split="val").load_records()
    out = {}
    for record in records:
        height, width = read_image_size(record.path)
        out[record.image_id] = {}
        for task in TASKS:
            mask = region_mask(record.regions.get(canonical(task, "chexlocalize")), height, width)
            out[record.image_id][task] = np.zeros((height, width), bool) if mask is None else mask
    return out


def check_case(case: str, maps: dict, regions: dict) -> None:
    """Every pair equal to their per-image CSVs to 1e-12, and the per-task means of the metric class
    (int64 fixed point) and of the direct loop equal to theirs to 1e-6 / 1e-12."""
    theirs = REFERENCE["cases"][case]
    assert sorted(theirs) == sorted(maps)
    metric, fulls, masks, classes = CheXlocalizeMode(len(TASKS)), [], [], []
    for image_id in sorted(maps):
        for c, task in enumerate(TASKS):
            region = regions[image_id][task]
            full = full_resolution_map(maps[image_id][task], *region.shape)
            region = region if region.any() else None
            ours = cxl_pair(full, region)
            for key, a, b in zip(CXL_KEYS, ours, theirs[image_id][task]):
                assert same(a, b), (case, image_id, task, key, a, b)
            fulls.append(full), masks.append(region), classes.append(c)
    metric.update(zip(fulls, masks, classes))
    table, direct = metric.compute(), cxl_means(fulls, masks, classes, len(TASKS))
    for c, task in enumerate(TASKS):
        for k, key in enumerate(CXL_KEYS):
            expected = REFERENCE["means"][case][task][k]
            assert same(float(table[key][c]), expected, 1e-6), (case, task, key)
            assert same(float(direct[key][c]), expected), (case, task, key)


def test_synthetic_maps_and_regions_match_their_code():
    regions = synthetic_regions(SEED)
    check_case("synthetic", make_maps(regions, SEED), regions)


def test_real_sample_with_seeded_maps_matches_their_code(real_cxr):
    regions = real_regions(real_cxr)
    assert sorted(regions) == list(REAL_IDS)
    check_case("real", make_maps(regions, SEED, REAL_GRID), regions)


def their_repo() -> Path:
    """A checkout of rajpurkarlab/cheXlocalize (``XBENCH_CHEXLOCALIZE``): its Grad-CAM sample is not ours to ship."""
    path = os.environ.get("XBENCH_CHEXLOCALIZE")
    if not path or not (Path(path) / "sample" / "gradcam_maps_val").is_dir():
        pytest.skip("CheXlocalize's Grad-CAM sample not found: set XBENCH_CHEXLOCALIZE to a checkout of "
                    "rajpurkarlab/cheXlocalize (its sample/gradcam_maps_val/*_map.pkl)")
    return Path(path)


def gradcam_maps(root: Path) -> dict[str, dict[str, torch.Tensor]]:
    maps = {}
    for path in sorted((root / "sample" / "gradcam_maps_val").glob("*_map.pkl")):
        image_id, task = parse_chexlocalize_name(path)
        maps.setdefault(image_id, {})[task] = read_chexlocalize_pickle(path)["map"]
    return maps


def test_their_gradcam_sample_matches_their_code(real_cxr):
    check_case("gradcam", gradcam_maps(their_repo()), real_regions(real_cxr))


# -- through a whole test run ----------------------------------------------------------------------------
class StoredMapsModel(ZeroShotModel):
    """Answers with given native maps per image id (squash: each map spans its whole image, as theirs)."""

    def __init__(self, maps: dict[str, torch.Tensor], **kwargs):
        super().__init__(**kwargs)
        self.maps, self.ids = maps, []
        self.preprocess = Preprocess(resize="squash", size=32)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.ids = batch.image_ids
        return super().test_step(batch, batch_idx, dataloader_idx)

    def zero_shot(self, images, classes):
        saliency = torch.stack([self.maps[i] for i in self.ids])
        return ZeroShotOutput(scores=torch.full(saliency.shape[:2], 0.5), saliency=saliency)


def run_stored(maps: dict[str, dict[str, torch.Tensor]], root: Path, **kwargs) -> dict:
    dm = CheXlocalizeDataModule(root=str(root), split="val", batch_size=1, eval_size=64,
                                classes=[canonical(t, "chexlocalize") for t in TASKS])  # their (sorted) task order
    by_class = {i: torch.stack([per_task[t] for t in TASKS]) for i, per_task in maps.items()}
    model = StoredMapsModel(by_class, bootstrap=0, **kwargs)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False)
    trainer.test(model, datamodule=dm, verbose=False)
    return model.results["chexlocalize"]


def check_table(table: dict, case: str) -> None:
    for task in TASKS:
        row = table["classes"][canonical(task, "chexlocalize")]
        for k, key in enumerate(CXL_KEYS):
            assert same(float("nan") if row[key] is None else row[key], REFERENCE["means"][case][task][k], 1e-6), (case, task, key)


def test_a_test_run_with_cxl_reproduces_their_means_on_the_real_sample(real_cxr):
    maps = make_maps(real_regions(real_cxr), SEED, REAL_GRID)
    table = run_stored(maps, real_cxr / "chexlocalize", cxl=True)
    check_table(table, "real")
    assert set(CXL_KEYS) <= set(table["mean"])
    plain = run_stored(maps, real_cxr / "chexlocalize")
    assert not set(CXL_KEYS) & set(plain["mean"])  # off by default: no keys, no cost
    assert {k: v for k, v in table["mean"].items() if k not in CXL_KEYS} == plain["mean"]


def test_a_test_run_on_their_gradcam_maps_reproduces_their_means(real_cxr):
    check_table(run_stored(gradcam_maps(their_repo()), real_cxr / "chexlocalize", cxl=True), "gradcam")


# -- pieces ----------------------------------------------------------------------------------------------
def loop_bilinear(native: np.ndarray, u: float, v: float, size: int) -> float:
    """Bilinear sample (align_corners=False, border-clamped) of a map covering ``size x size`` at (u, v)."""
    h, w = native.shape
    py = min(max(v * h / size - 0.5, 0), h - 1)
    px = min(max(u * w / size - 0.5, 0), w - 1)
    y0, x0 = min(int(py), h - 2) if h > 1 else 0, min(int(px), w - 2) if w > 1 else 0
    fy, fx = (py - y0 if h > 1 else 0), (px - x0 if w > 1 else 0)
    y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
    return ((1 - fy) * ((1 - fx) * native[y0, x0] + fx * native[y0, x1]) + fy * ((1 - fx) * native[y1, x0] + fx * native[y1, x1]))


@pytest.mark.parametrize("resize", ["squash", "crop", "letterbox"])
def test_full_resolution_map_follows_the_preprocessing(resize):
    native = torch.rand(7, 9, generator=torch.Generator().manual_seed(3))
    height, width = 45, 61
    pre = Preprocess(resize=resize, size=32, canvas=40 if resize == "letterbox" else None)
    affine = torch.tensor(pre.plan(height, width)[1], dtype=torch.float64)
    full = full_resolution_map(native, height, width, affine, 32)
    assert full.shape == (height, width) and full.dtype == torch.float32
    if resize == "squash":  # spans the image: exactly CheXlocalize's resize
        expected = F.interpolate(native[None, None], size=(height, width), mode="bilinear", align_corners=False)[0, 0]
        assert torch.equal(full, expected)
        return
    sx, sy, tx, ty = affine.tolist()
    for y in range(0, height, 4):
        for x in range(0, width, 5):
            u, v = sx * (x + 0.5) + tx, sy * (y + 0.5) + ty
            inside = 0 <= u <= 32 and 0 <= v <= 32
            want = loop_bilinear(native.double().numpy(), u, v, 32) if inside else float(native.min())
            assert abs(float(full[y, x]) - want) < 1e-5, (y, x)


def test_rasterize_original_matches_direct_fills():
    height, width = 23, 31
    box = Box(2.5, 3.0, 10.2, 12.0)
    want = np.zeros((height, width), bool)
    for y in range(height):
        for x in range(width):
            want[y, x] = 2.5 <= x + 0.5 < 10.2 and 3.0 <= y + 0.5 < 12.0
    assert np.array_equal(rasterize_original([box], height, width), want)
    points = ((20.0, 2.0), (29.5, 9.0), (22.0, 18.5))
    canvas = Image.new("1", (width, height))
    ImageDraw.Draw(canvas).polygon(points, outline=1, fill=1)
    drawn = np.asarray(canvas, dtype=bool)
    assert np.array_equal(rasterize_original([Polygon(points)], height, width), drawn)
    assert np.array_equal(rasterize_original([box, Polygon(points)], height, width), want | drawn)
    flat = drawn.T.ravel()  # column-major runs, 0-run first
    counts = np.diff(np.concatenate(([0], np.flatnonzero(np.diff(flat.astype(np.int8))) + 1, [flat.size]))).tolist()
    rle = RLEMask(tuple(([0] if flat[0] else []) + counts), (height, width))
    assert np.array_equal(rasterize_original([rle], height, width), drawn)
    with pytest.raises(ValueError, match="image size"):
        rasterize_original([Mask(np.ones((3, 3), bool))], height, width)


def test_metric_is_split_invariant_and_sums_exactly():
    """Two halves in two metrics, states summed (what DDP does), give the one-metric table bit for bit."""
    regions = synthetic_regions(SEED)
    maps = make_maps(regions, SEED)
    pairs = [(full_resolution_map(maps[i][t], *regions[i][t].shape), regions[i][t] if regions[i][t].any() else None, c)
             for i in sorted(maps) for c, t in enumerate(TASKS)]
    whole, first, second = CheXlocalizeMode(10), CheXlocalizeMode(10), CheXlocalizeMode(10)
    whole.update(iter(pairs))
    first.update(iter(pairs[::2]))
    second.update(iter(pairs[1::2]))
    for name in first._defaults:
        setattr(first, name, getattr(first, name) + getattr(second, name))
    a, b = whole.compute(), first.compute()
    for key in CXL_KEYS:
        assert torch.equal(torch.nan_to_num(a[key], nan=-1), torch.nan_to_num(b[key], nan=-1))


def test_benchmark_metrics_rows_carry_the_keys_only_when_asked():
    assert not set(CXL_KEYS) & set(BenchmarkMetrics(["A", "B"]).keys)
    metrics = BenchmarkMetrics(["A", "B"], cxl=True, bootstrap=0)
    assert metrics.keys[-3:] == CXL_KEYS
    with pytest.raises(ValueError, match="cxl=True"):
        BenchmarkMetrics(["A"]).update_cxl([])


def test_constant_map_has_an_empty_segmentation_and_hits_the_first_pixel():
    """A map exactly constant at full resolution. (A constant native map picks up float rounding in the
    bilinear resize, theirs as ours, and is then binarised like any other map.)"""
    region = np.zeros((20, 30), bool)
    region[0, 0] = True
    hit, iou, iou_all = cxl_pair(torch.full((20, 30), 0.3), region)
    assert (hit, math.isnan(iou), iou_all) == (1.0, True, 0.0)
    assert math.isnan(cxl_pair(torch.full((20, 30), 0.3), None)[2])


def test_map_pickle_reader_refuses_foreign_globals(tmp_path):
    path = tmp_path / "patient1_study1_view1_frontal_Edema_map.pkl"
    with open(path, "wb") as handle:
        pickle.dump({"map": torch.ones(1, 1, 3, 3), "prob": 0.2, "task": "Edema", "cxr_dims": (30, 20)}, handle, protocol=2)
    info = read_chexlocalize_pickle(path)
    assert info["size"] == (20, 30) and info["map"].shape == (3, 3) and info["prob"] == 0.2
    assert parse_chexlocalize_name(path) == ("patient1_study1_view1_frontal", "Edema")
    bad = tmp_path / "bad_Edema_map.pkl"
    bad.write_bytes(b"cos\nsystem\n(S'echo hi'\ntR.")
    with pytest.raises(DataError, match="refused global os.system"):
        read_chexlocalize_pickle(bad)
