"""RSNA, SIIM and VinDr: parsers on the full real tables, and end to end on synthetic
native-layout folders (DICOMs written by pydicom) with regions checked on the eval grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic_dicom import make_rsna, make_siim, make_vindr

from xbench_pl import create_datamodule
from xbench_pl.data.io import read_table
from xbench_pl.data.rsna_pneumonia import parse_rsna_labels
from xbench_pl.data.siim_pneumothorax import parse_siim_rle
from xbench_pl.data.vindr_cxr import VINDR_CLASSES, parse_vindr_boxes
from xbench_pl.geometry import Preprocess


def evaluate(name: str, root: Path, eval_size: int, **kwargs):
    """All batches of a datamodule: ``{image_id: labels}``, ``{(image_id, class): mask}`` and the datamodule."""
    dm = create_datamodule(name, root=str(root), preprocess=Preprocess(size=32), eval_size=eval_size, batch_size=2, **kwargs)
    dm.setup("test")
    labels, masks = {}, {}
    for batch in dm.test_dataloader():
        assert batch.images.shape[1:] == (3, 32, 32)
        for b, image_id in enumerate(batch.image_ids):
            labels[image_id] = dict(zip(batch.classes, batch.labels[b].tolist()))
        for (b, c), mask in zip(batch.region_index.tolist(), batch.region_masks):
            masks[batch.image_ids[b], batch.classes[c]] = mask.numpy()
    return labels, masks, dm


# -- the full real tables ----------------------------------------------------------------------
def test_rsna_real_table_counts(real_cxr):
    table_path = real_cxr / "tables" / "kaggle_stage_2_train_labels.csv.zip"
    assert len(read_table(table_path, ["patientId"])) == 30_227
    records = parse_rsna_labels(table_path, "/nonexistent")
    assert len(records) == 26_684
    assert sum(r.labels["Pneumonia"] for r in records) == 6_012
    assert sum(len(r.regions.get("Pneumonia", [])) for r in records) == 9_555
    assert all(r.path == Path("/nonexistent") / f"{r.image_id}.dcm" and r.patient_id == r.image_id for r in records[:10])
    largest = max(b.x1 for r in records for b in r.regions.get("Pneumonia", []))
    assert largest <= 1024  # xywh -> xyxy stays in the 1024 frame


def test_siim_real_table_counts_and_orientation(real_cxr):
    table_path = real_cxr / "tables" / "siim-pneumothorax-train-rle.csv.gz"
    assert len(read_table(table_path, ["ImageId", "EncodedPixels"])) == 12_954
    records = parse_siim_rle(table_path, lambda image_id: Path(f"{image_id}.dcm"))
    assert len(records) == 12_047
    positives = [r for r in records if r.labels["Pneumothorax"]]
    assert len(positives) == 2_669
    assert sum(len(r.regions["Pneumothorax"]) for r in positives) == 12_954 - (12_047 - 2_669)
    # decoded with the transpose, pneumothoraces are apical and mostly on the image's left
    centroids = []
    for record in positives[:150]:
        mask = np.logical_or.reduce([m.decode(1024, 1024) for m in record.regions["Pneumothorax"]])
        ys, xs = np.nonzero(mask)
        centroids.append((ys.mean(), xs.mean()))
    ys, xs = np.array(centroids).T
    assert np.median(ys) < 400 and np.mean(xs < 512) > 0.5


def test_vindr_box_parser_on_the_kaggle_train_layout(real_cxr):
    table_path = real_cxr / "tables" / "vinbigdata-train.csv.gz"
    boxes = parse_vindr_boxes(table_path)
    raw = pd.read_csv(table_path)
    assert len(boxes) == raw["image_id"].nunique() == 15_000
    parsed = pd.Series([f for image_boxes in boxes.values() for f, _, _ in image_boxes]).value_counts()
    expected = raw[raw["class_name"] != "No finding"]["class_name"].value_counts()
    spelling = {"Aortic enlargement": "Aortic Enlargement", "Pleural effusion": "Pleural Effusion",
                "Pleural thickening": "Pleural Thickening", "Pulmonary fibrosis": "Fibrosis", "Other lesion": "Other Lesion"}
    assert parsed.to_dict() == {spelling.get(k, k): v for k, v in expected.items()}
    one = raw.dropna().iloc[0]
    first = {(f, b) for f, b, _ in boxes[one["image_id"]]}
    assert any(b.x0 == one["x_min"] and b.y1 == one["y_max"] for _, b in first)


# -- synthetic native folders, end to end -----------------------------------------------------
def test_rsna_end_to_end(tmp_path):
    labels, masks, dm = evaluate("rsna_pneumonia", make_rsna(tmp_path / "rsna"), eval_size=32)
    assert labels == {"pos": {"Pneumonia": 1.0}, "neg": {"Pneumonia": 0.0}}
    mask = masks["pos", "Pneumonia"]
    # 96 x 128 image on a 32 grid: centres x = 4j + 2, y = 3i + 1.5
    # box x[10, 40) y[20, 60): j 2..9, i 7..19 (104 px); box x[80, 100) y[50, 60): j 20..24, i 17..19 (15 px)
    assert mask.sum() == 104 + 15
    assert mask[7, 2] and mask[19, 9] and not mask[6, 2] and not mask[7, 10]
    assert mask[17, 20] and mask[19, 24] and not mask[16, 20] and not mask[17, 25]
    assert ("neg", "Pneumonia") not in masks and dm.problems == []


def test_rsna_split_file(tmp_path):
    root = make_rsna(tmp_path / "rsna")
    (tmp_path / "split.csv").write_text("image_id\nneg\n")
    labels, _, _ = evaluate("rsna_pneumonia", root, eval_size=8, split_file=str(tmp_path / "split.csv"))
    assert list(labels) == ["neg"]


def test_siim_end_to_end(tmp_path):
    labels, masks, dm = evaluate("siim_pneumothorax", make_siim(tmp_path / "siim"), eval_size=16)
    assert labels == {"1.2.4.1": {"Pneumothorax": 1.0}, "1.2.4.2": {"Pneumothorax": 0.0}}
    mask = masks["1.2.4.1", "Pneumothorax"]
    # 48 x 64 on a 16 grid samples rows 3i + 1 and columns 4j + 2: instance 1 (y 10..19, x 5..24)
    # is i 3..6, j 1..5; instance 2 (y 30..39, x 40..59) is i 10..12, j 10..14
    expected = np.zeros((16, 16), bool)
    expected[3:7, 1:6] = True
    expected[10:13, 10:15] = True
    np.testing.assert_array_equal(mask, expected)
    assert dm.problems == []


def test_vindr_end_to_end(tmp_path):
    labels, masks, dm = evaluate("vindr_cxr", make_vindr(tmp_path / "vindr"), eval_size=40)
    assert list(dm.classes) == list(VINDR_CLASSES) and len(VINDR_CLASSES) == 21 and "Other Lesion" not in VINDR_CLASSES
    assert {c for c, v in labels["aaa"].items() if v} == {"Cardiomegaly", "Pleural Effusion"}
    assert not any(labels["bbb"].values())
    # 80 x 120 on a 40 grid: centres x = 3j + 1.5, y = 2i + 1
    heart = masks["aaa", "Cardiomegaly"]  # x[30.5, 90.5) y[40, 70): j 10..29, i 20..34
    assert heart.sum() == 20 * 15 and heart[20, 10] and heart[34, 29] and not heart[20, 9] and not heart[35, 10]
    effusion = masks["aaa", "Pleural Effusion"]  # x[100, 130) y[60, 85) clipped to the image: j 33..39, i 30..39
    assert effusion.sum() == 7 * 10 and effusion[39, 39]
    assert [(p.action, p.row) for p in dm.problems] == [("clipped", "3")]
    assert "Pleural Effusion box (100, 60, 130, 85)" in dm.problems[0].reason


def test_vindr_other_lesion_can_be_asked_for(tmp_path):
    classes = list(VINDR_CLASSES) + ["Other Lesion"]
    labels, masks, _ = evaluate("vindr_cxr", make_vindr(tmp_path / "vindr"), eval_size=40, classes=classes)
    assert labels["aaa"]["Other Lesion"] == 1 and masks["aaa", "Other Lesion"].any()
    with pytest.raises(ValueError, match="unknown classes"):
        create_datamodule("vindr_cxr", root=str(tmp_path), classes=["Pneumonia"])
