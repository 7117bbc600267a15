"""Weight-free baselines: chance for the uniform map, the NIH box statistics for location_prior."""

import lightning as L
import numpy as np
import pytest
import torch

import xbench_pl
import xbench_pl.models.baselines
from xbench_pl.data.base import collate
from xbench_pl.data.errors import DataError
from xbench_pl.data.nih_bbox import NIH_BOX_CLASSES
from xbench_pl.models.baselines import box_occupancy, read_prior


def run(model, datamodule):
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.test(model, datamodule=datamodule, verbose=False)
    return model.results


def test_uniform_scores_chance_on_pointing_game():
    datamodule = xbench_pl.create_datamodule("demo")
    results = run(xbench_pl.create_model("uniform"), datamodule)["demo"]
    # chance = mean area fraction of the regions, per class, on the eval grid
    batch = collate([datamodule.test_set[i] for i in range(len(datamodule.test_set))])
    area = batch.region_masks.flatten(1).double().mean(1)
    for c, name in enumerate(datamodule.classes):
        selected = batch.region_index[:, 1] == c
        expected = area[selected].mean().item() if selected.any() else None
        assert results["classes"][name]["pointing_game"] == (pytest.approx(expected) if expected is not None else None)
    assert results["mean"]["auroc"] == 0.5


def test_location_prior_is_the_mean_box_occupancy_of_its_table(tmp_path):
    table = tmp_path / "boxes.csv"
    table.write_text("Image Index,Finding Label,Bbox [x,y,w,h],,,\n"
                     "a.png,Nodule,0,0,512,512\n"
                     "b.png,Nodule,512,512,512,512\n"
                     "b.png,Nodule,0,0,256,256\n"
                     "c.png,Mass,0,0,1024,1024\n")
    model = xbench_pl.create_model("location_prior", table=str(table), exclude=["c.png"], grid=4)
    nodule = model.class_map("Nodule")
    expected = torch.tensor([[1.0, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5], [0, 0, 0.5, 0.5]])
    assert torch.allclose(nodule, expected)
    with pytest.warns(UserWarning, match="no boxes of 'Mass'"):  # c.png excluded: Mass falls back
        assert torch.allclose(model.class_map("Mass"), nodule)


def test_stored_location_prior_is_the_whole_nih_table(real_cxr):
    table = real_cxr / "tables" / "BBox_List_2017.csv.gz"  # the public NIH box list (984 boxes, 880 images)
    stored, recomputed = read_prior(), box_occupancy(table)
    assert stored.keys() == recomputed.keys() == set(NIH_BOX_CLASSES)
    for finding, (counts, images) in recomputed.items():
        assert np.array_equal(stored[finding][0], counts) and stored[finding][1] == images
    model = xbench_pl.create_model("location_prior")
    assert torch.equal(model.class_map("Nodule"), xbench_pl.create_model("location_prior", table=str(table)).class_map("Nodule"))


def test_stored_location_prior_without_the_table():
    prior = read_prior()
    assert set(prior) == set(NIH_BOX_CLASSES) and sum(images for _, images in prior.values()) >= 880
    assert all(counts.shape == (64, 64) and 0 < counts.max() <= images for counts, images in prior.values())
    heart = xbench_pl.create_model("location_prior").class_map("Cardiomegaly")
    row, col = divmod(int(heart.argmax()), 64)
    assert 32 <= row < 56 and 24 <= col < 48  # where hearts are: lower middle of the 1024² frame
    with pytest.raises(ValueError, match="pass table="):
        xbench_pl.create_model("location_prior", grid=32)


def test_center_baseline_peaks_in_the_middle_and_beats_nothing_on_scores():
    model = xbench_pl.create_model("center", sigma=0.2)
    out = model.zero_shot(torch.zeros(2, 3, 32, 32), ["Nodule", "Mass"])
    assert out.scores.shape == (2, 2) and torch.all(out.scores == 0.5)
    grid = out.saliency[0, 0]
    peak = torch.nonzero(grid == grid.max())
    assert peak.float().mean(0).tolist() == pytest.approx([31.5, 31.5])


def test_a_model_emitting_nan_saliency_is_named_with_the_image():
    class Broken(xbench_pl.models.baselines.UniformBaseline):
        def class_map(self, name):
            return torch.full((2, 2), float("nan")) if name == "Mass" else torch.ones(2, 2)

    with pytest.raises(ValueError, match=r"Broken gave a saliency map with NaN or inf for image 'phantom_\d+.png' of demo, finding 'Mass'"):
        run(Broken(), xbench_pl.create_datamodule("demo"))


def test_location_prior_names_the_file_and_row_of_a_malformed_box(tmp_path):
    table = tmp_path / "boxes.csv"
    table.write_text("Image Index,Finding Label,Bbox [x,y,w,h],,,\na.png,Nodule,0,0,512,512\nb.png,Nodule,10,10,abc,5\n")
    with pytest.raises(DataError, match=r"boxes.csv, row 3: box xywh .* is not numeric"):
        xbench_pl.create_model("location_prior", table=str(table), exclude=[])


def test_one_datamodule_serves_models_with_different_preprocessing():
    from fixture_models import IntensityModel

    shared = xbench_pl.create_datamodule("demo")
    run(xbench_pl.create_model("uniform"), shared)
    assert shared.test_set.preprocess.size == 32
    second = run(IntensityModel(), shared)["demo"]
    assert shared.test_set.preprocess == IntensityModel().preprocess
    assert second == run(IntensityModel(), xbench_pl.create_datamodule("demo"))["demo"]
