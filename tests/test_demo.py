"""The synthetic demo: drawn deterministically, lesions exactly where the files say, read by the real readers."""

import functools
import subprocess
from collections import Counter
from pathlib import Path

import lightning as L
import numpy as np
import pydicom
import pytest
import torch
from test_cli import python

import xbench_pl
from xbench_pl.data import synthetic
from xbench_pl.data.dicom import read_dicom
from xbench_pl.data.io import read_image
from xbench_pl.data.nih_bbox import DemoDataModule
from xbench_pl.data.regions import Box
from xbench_pl.data.siim_pneumothorax import DemoDicomDataModule
from xbench_pl.data.synthetic import (NIH_CASES, NIH_NORMALS, SIIM_CASES, draw_case, ensure_demo, nih_cases, siim_cases,
                                      write_demo)
from xbench_pl.geometry import Preprocess
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput


@functools.cache
def cases(kind: str) -> list[synthetic.Case]:
    return nih_cases(0) if kind == "nih" else siim_cases(0)


@pytest.fixture(scope="module")
def demo() -> Path:
    return ensure_demo()  # the folder --data demo reads (generated on first use)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def drawn_again(folder: Path) -> subprocess.CompletedProcess:
    """The background job of the test below: the demo of seed 0 drawn again into ``folder/again`` by the generator's
    own command line, in a process of its own."""
    return python("-m", "xbench_pl.data.synthetic", str(folder / "again"), "--seed", "0")


@pytest.mark.background(job=drawn_again)
def test_the_same_seed_writes_byte_identical_files(demo, background):
    folder, drawn = background
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    fresh = files(folder / "again")
    assert fresh == files(demo), "the cached demo differs from what this generator writes: bump GENERATOR_VERSION"
    assert len([f for f in fresh if f.startswith("nih/images/")]) == len(NIH_CASES) + NIH_NORMALS
    assert len([f for f in fresh if f.endswith(".dcm")]) == len(SIIM_CASES)
    first = cases("nih")[0]
    assert not np.array_equal(draw_case(first.image_id, 1, 0, 0, []).pixels,  # another seed, another phantom
                              draw_case(first.image_id, 0, 0, 0, []).pixels)


@pytest.mark.parametrize("kind", ["nih", "siim"])
def test_each_lesion_changes_only_its_own_region(kind):
    stream = 0 if kind == "nih" else 1
    for index, case in enumerate(cases(kind)):
        plain = draw_case(case.image_id, 0, stream, index, [])  # the same phantom without its lesions
        changed = case.pixels != plain.pixels
        union = np.zeros_like(changed)
        for lesion in case.lesions:
            assert changed[lesion.mask].mean() > 0.5, (case.image_id, lesion.finding)  # drawn where the mask is
            x, y, w, h = lesion.box
            assert min(w, h) >= 17  # covers an eval-pixel centre on grids down to 32 (16-px cells at 512²)
            union |= lesion.mask
        assert not (changed & ~union).any(), case.image_id  # and nowhere else
    sizes = [lesion.mask.sum() for case in cases(kind) for lesion in case.lesions]
    assert max(sizes) > 4 * min(sizes)  # several sizes


def test_nih_demo_reads_back_the_drawn_boxes_and_labels(demo):
    by_id = {case.image_id: case for case in cases("nih")}
    dm = DemoDataModule()
    records = dm.prepare_records()
    assert dm.root == demo / "nih" and dm.problems == []
    assert len(records) == len(NIH_CASES) and sum(len(v) for r in records for v in r.regions.values()) == len(NIH_CASES)
    assert Counter(f for r in records for f in r.regions) == Counter(f for f, _ in NIH_CASES)
    for record in records:
        (lesion,) = by_id[record.image_id].lesions
        x, y, w, h = lesion.box
        assert record.regions == {lesion.finding: [Box(x, y, x + w, y + h)]}
        assert np.array_equal(read_image(record.path), by_id[record.image_id].pixels / np.float32(255))
        expected = {lesion.finding: 1, **({"Consolidation": 1} if lesion.finding == "Pneumonia" else {})}
        assert record.labels == expected  # from Data_Entry: the boxed finding, and what else is drawn
    with_normals = DemoDataModule(negatives=NIH_NORMALS).prepare_records()
    assert [r.labels for r in with_normals[len(NIH_CASES):]] == [{}] * NIH_NORMALS


def test_dicom_demo_reads_back_the_drawn_masks(demo):
    by_id = {case.image_id: case for case in cases("siim")}
    dm = DemoDicomDataModule()
    records = dm.prepare_records()
    assert dm.root == demo / "siim" and dm.problems == [] and len(records) == len(SIIM_CASES)
    assert sum(r.labels["Pneumothorax"] for r in records) == sum(1 for c in SIIM_CASES if c)
    for record in records:
        case = by_id[record.image_id]
        assert pydicom.dcmread(record.path).file_meta.TransferSyntaxUID == pydicom.uid.JPEGBaseline8Bit
        stored = case.pixels.astype(np.float64)
        shown = (stored - stored.min()) / (stored.max() - stored.min())  # read_dicom's min-max
        assert np.abs(read_dicom(record.path) - shown).mean() < 2 / 255  # JPEG q95: near-lossless
        regions = record.regions.get("Pneumothorax", [])
        assert len(regions) == len(case.lesions)
        for region, lesion in zip(regions, case.lesions):
            assert np.array_equal(region.decode(512, 512), lesion.mask)


class Oracle(ZeroShotModel):
    """Knows the drawn lesions: its map is each lesion's region (box or mask), its score the label."""

    def __init__(self, truth: dict[str, dict[str, np.ndarray]]):
        super().__init__()
        self.truth, self.preprocess = truth, Preprocess(resize="squash", size=512)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.image_ids = batch.image_ids
        return super().test_step(batch, batch_idx, dataloader_idx)

    def zero_shot(self, images, classes):
        empty = np.zeros((512, 512), np.float32)
        maps = [[self.truth[i].get(c, empty) for c in classes] for i in self.image_ids]
        saliency = torch.from_numpy(np.array(maps, np.float32)).to(images.device)
        return ZeroShotOutput(scores=saliency.flatten(2).amax(2), saliency=saliency)


def box_mask(lesion) -> np.ndarray:
    x, y, w, h = lesion.box
    out = np.zeros_like(lesion.mask, dtype=np.float32)
    out[y : y + h, x : x + w] = 1
    return out


@pytest.mark.parametrize("name, kind, region", [("demo", "nih", box_mask), ("demo_dicom", "siim", None)])
def test_a_model_whose_map_is_the_region_scores_one(name, kind, region):
    truth = {}
    for case in cases(kind):
        for lesion in case.lesions:
            drawn = region(lesion) if region else lesion.mask.astype(np.float32)
            truth.setdefault(case.image_id, {})[lesion.finding] = np.maximum(truth.get(case.image_id, {}).get(lesion.finding, 0), drawn)
        truth.setdefault(case.image_id, {})
    model = Oracle(truth)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.test(model, datamodule=xbench_pl.create_datamodule(name), verbose=False)
    mean = model.results[name]["mean"]
    assert mean["pointing_game"] == mean["dice@0.5"] == mean["iou@0.5"] == mean["dice_best"] == mean["auroc"] == 1.0


def test_ensure_demo_generates_once_and_atomically(tmp_path, monkeypatch):
    calls = []

    def rival_wins(folder, seed):  # another process finishes first, while this one writes its own copy
        calls.append(folder)
        (Path(folder) / "README.md").write_text("mine")
        (tmp_path / "demo").mkdir()
        (tmp_path / "demo" / "README.md").write_text("theirs")

    monkeypatch.setattr(synthetic, "write_demo", rival_wins)
    root = ensure_demo(tmp_path / "demo")
    assert root == tmp_path / "demo" and (root / "README.md").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]  # the losing copy is gone
    ensure_demo(root)
    assert len(calls) == 1  # an existing demo is used as it is
    with pytest.raises(FileExistsError, match="not empty"):
        write_demo(root)


@pytest.mark.parametrize("data", ["demo", "ms_cxr_demo"])
def test_a_demo_cache_that_cannot_be_written_is_one_line_naming_the_setting(tmp_path, data):
    """``XBENCH_DEMO_DIR`` where no folder can be made (read-only for a user; here below a file, which root cannot write
    either): one error naming the folder and the setting, exit 2, no traceback."""
    from test_cli import in_process

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = in_process("test", "--model", "center", "--data", data, "--out", str(tmp_path / "out"),
                        XBENCH_DEMO_DIR=str(blocker / "demos"))
    assert result.returncode == 2 and result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
    assert f"{blocker / 'demos'}: cannot write the synthetic" in " ".join(result.stderr.split()) and "XBENCH_DEMO_DIR" in result.stderr
