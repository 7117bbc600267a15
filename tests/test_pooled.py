import json

import lightning as L
import numpy as np
import pytest
from PIL import Image

import xbench_pl
from xbench_pl.data.chestx_det10 import ChestXDet10Data
from xbench_pl.data.nih_bbox import DemoData
from xbench_pl.data.pooled import PooledDataModule
from xbench_pl.geometry import Preprocess
from xbench_pl.data.vocabulary import NATIVE_CLASSES

DET10 = ["Atelectasis", "Calcification", "Consolidation", "Pleural Effusion", "Emphysema",
         "Fibrosis", "Fracture", "Mass", "Nodule", "Pneumothorax"]
DEMO = ["Atelectasis", "Cardiomegaly", "Pleural Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax"]


@pytest.fixture
def det10_root(tmp_path):
    entries = [{"file_name": f"{i}.png", "syms": ["Nodule"] if i % 2 else [], "boxes": [[8, 8, 20, 20]] if i % 2 else []}
               for i in range(5)]
    (tmp_path / "chestx_det10").mkdir()
    (tmp_path / "chestx_det10" / "test.json").write_text(json.dumps(entries))
    for entry in entries:
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 48), np.uint8)).save(tmp_path / "chestx_det10" / entry["file_name"])
    return tmp_path


def test_batches_from_each_dataset_with_its_classes(det10_root):
    pooled = PooledDataModule(["demo", {"name": "chestx_det10", "init_args": {"root": str(det10_root / "chestx_det10")}}],
                              batch_size=3, eval_size=32, preprocess=Preprocess(resize="squash", size=32))
    assert [(s.name, s.classes) for s in pooled.dataset_specs] == [("demo", DEMO), ("chestx_det10", DET10)]
    assert all(child.batch_size == 3 and child.eval_size == 32 for child in pooled.datamodules)  # shared settings win
    pooled.setup("test")
    loaders = pooled.test_dataloader()
    seen = {}
    for loader in loaders:
        for batch in loader:
            assert len(set(batch.datasets)) == 1 and batch.images.shape[1:] == (3, 32, 32)
            seen.setdefault(batch.dataset, [batch.classes, 0])[1] += len(batch.image_ids)
    assert seen == {"demo": [DEMO, 12], "chestx_det10": [DET10, 5]}


def test_uniform_baseline_fills_results_for_every_dataset(det10_root):
    pooled = PooledDataModule(["demo", "chestx_det10"], root=str(det10_root), batch_size=4, eval_size=32)
    assert isinstance(pooled.datamodules[1], ChestXDet10Data) and pooled.datamodules[1].root == det10_root / "chestx_det10"
    assert isinstance(pooled.datamodules[0], DemoData)  # no demo folder under root: its own default
    model = xbench_pl.create_model("uniform")
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.test(model, datamodule=pooled, verbose=False)
    assert set(model.results) == {"demo", "chestx_det10"}
    det10 = model.results["chestx_det10"]
    assert det10["classes"]["Nodule"]["n_pos"] == 2 and det10["classes"]["Nodule"]["n_neg"] == 3
    assert det10["classes"]["Nodule"]["n_regions"] == 2
    assert sum(row["n_regions"] for row in model.results["demo"]["classes"].values()) == 12


def test_entries_and_config(det10_root):
    child = PooledDataModule([{"class_path": "xbench_pl.data.chestx_det10.ChestXDet10DataModule", "init_args": {"split": "train"}}],
                             root=str(det10_root)).datamodules[0]
    assert child.split == "train" and child.root == det10_root / "chestx_det10"
    with pytest.raises(ValueError, match="given twice"):
        PooledDataModule(["demo", "demo"])
    with pytest.raises(ValueError, match="dataset entry"):
        PooledDataModule([{"root": "x"}])
    with pytest.raises(KeyError, match="unknown dataset"):
        PooledDataModule(["no_such_dataset"])
    pooled = xbench_pl.create_datamodule("pooled", root=str(det10_root))  # the seven XBench datasets
    assert sorted(c.name for c in pooled.datamodules) == sorted(NATIVE_CLASSES)
    assert [s.classes for s in pooled.dataset_specs] == [list(c.default_classes) for c in pooled.datamodules]


def test_missing_child_folder_is_named(det10_root):
    """--data.root holds chestx_det10/ but no rsna_pneumonia/: that folder is named, not 'root not set'."""
    from xbench_pl.data.errors import DataError

    pooled = PooledDataModule(["demo", "chestx_det10", "rsna_pneumonia"], root=str(det10_root), eval_size=32,
                              preprocess=Preprocess(resize="squash", size=32))
    with pytest.raises(DataError, match=r"rsna_pneumonia: dataset folder not found \(the pooled "
                                        r"--data.root .* needs one folder per dataset") as caught:
        pooled.setup("test")
    assert caught.value.problem.file == str(det10_root / "rsna_pneumonia")
    assert [len(child.prepare_records()) > 0 for child in pooled.datamodules[:2]] == [True, True]  # demo needs no folder
