"""Phrase grounding through the one model contract: ``Batch.queries`` give each sample its own texts, and
``ZeroShotModel.grounded`` runs the model once per distinct text list, rows back in batch order."""

from __future__ import annotations

import json
from pathlib import Path

import chexzero_reference
import pytest
import torch
from test_cli import in_process, one_and_two_processes
from test_open_clip_models import tiny_clip, tiny_clip_config  # noqa: F401 (fixtures)

import xbench_pl
from xbench_pl.data.base import Batch
from xbench_pl.data.ms_cxr import MS_CXR_CLASSES

CLASSES = ["Pneumothorax", "Pleural Effusion"]


def phrase_batch(queries: list[dict[str, str]], size: int = 32) -> Batch:
    n = len(queries)
    gen = torch.Generator().manual_seed(len(queries))
    return Batch(images=torch.randn(n, 3, size, size, generator=gen), image_ids=[f"img{i}" for i in range(n)],
                 datasets=["phrases"] * n, classes=CLASSES, original_size=torch.full((n, 2), size),
                 affine=torch.tensor([[1.0, 1.0, 0.0, 0.0]] * n, dtype=torch.float64), labels=torch.zeros(n, 2),
                 region_masks=torch.zeros(0, 8, 8, dtype=torch.bool), region_index=torch.zeros(0, 2, dtype=torch.long),
                 index=torch.arange(n), counted=torch.ones(n, dtype=torch.bool), queries=queries)


def test_query_texts_group_samples_by_their_texts_in_order_of_first_appearance():
    batch = phrase_batch([{"Pneumothorax": "small left apical pneumothorax"}, {}, {"Pneumothorax": "small left apical pneumothorax"},
                          {"Pleural Effusion": "large right effusion"}])
    groups = batch.query_texts()
    assert [texts for texts, _ in groups] == [("small left apical pneumothorax", "Pleural Effusion"), tuple(CLASSES),
                                              ("Pneumothorax", "large right effusion")]
    assert [samples.tolist() for _, samples in groups] == [[0, 2], [1], [3]]
    assert phrase_batch([{}, {}]).query_texts()[0][0] == tuple(CLASSES)


def test_each_sample_is_scored_and_mapped_with_its_own_phrases(tiny_clip):
    queries = [{"Pneumothorax": "small left apical pneumothorax"}, {}, {"Pleural Effusion": "large right effusion"},
               {"Pneumothorax": "small left apical pneumothorax"}]
    batch = phrase_batch(queries)
    out = tiny_clip.batch_output(batch)
    for b, own in enumerate(queries):
        alone = tiny_clip.zero_shot(batch.images[b : b + 1], [own.get(c, c) for c in CLASSES])
        assert torch.allclose(out.scores[b], alone.scores[0], atol=1e-6)
        assert torch.allclose(out.saliency[b], alone.saliency[0], atol=1e-6)
    # the phrase batch's texts are cached one by one: the two class names and the two phrases, once each
    assert sorted(texts for (_, texts), _ in tiny_clip.text_cache if len(texts) == 1) == sorted(
        [("Pneumothorax",), ("Pleural Effusion",), ("small left apical pneumothorax",), ("large right effusion",)])
    # the phrase, not the class name, was grounded where a sample has one
    by_name = tiny_clip.zero_shot(batch.images, CLASSES)
    assert not torch.allclose(out.saliency[0, 0], by_name.saliency[0, 0])
    assert torch.allclose(out.saliency[1], by_name.saliency[1], atol=1e-6)  # a sample without phrases: by name


def test_a_class_name_batch_is_one_unchanged_call(tiny_clip):
    batch = phrase_batch([{}, {}, {}])
    calls = []

    def forward(images, texts):
        calls.append((images.shape[0], texts))
        return tiny_clip.zero_shot(images, texts)

    out = tiny_clip.grounded(batch, forward)
    assert calls == [(3, CLASSES)]
    reference = tiny_clip.zero_shot(batch.images, CLASSES)
    assert torch.equal(out.scores, reference.scores) and torch.equal(out.saliency, reference.saliency)


def test_training_sees_the_phrases_too(tiny_clip):
    batch = phrase_batch([{"Pneumothorax": "small left apical pneumothorax"}, {}])
    batch.labels[0, 0] = 1
    tiny_clip.log = lambda *args, **kwargs: None  # no trainer attached
    loss = tiny_clip.training_step(batch, 0)
    logits = torch.cat([tiny_clip.training_logits(tiny_clip.zero_shot_with_grad(batch.images[b : b + 1], texts))
                        for b, texts in enumerate([["small left apical pneumothorax", "Pleural Effusion"], CLASSES])])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


# -- MS-CXR end to end: phrases through the CLI, CNR per category, 1 vs 2 processes -------------------
@pytest.mark.ddp_pair
def test_ms_cxr_demo_grounds_phrases_with_cnr_per_category_and_is_ddp_exact(tmp_path):
    """CheXzero (tiny, a seeded checkpoint in the released layout) grounds each phrase of the synthetic MS-CXR: the
    table has a region per phrase and cnr per category; 2 DDP processes give the same metrics.json; querying the
    category names instead (``--data.queries names``) gives other maps."""
    shipped = json.loads((Path(xbench_pl.__file__).parent / "models" / "configs" / "chexzero.json").read_text())
    architecture = tmp_path / "chexzero_tiny.json"
    architecture.write_text(json.dumps({"model_cfg": chexzero_reference.model_cfg("tiny"), "preprocess_cfg": shipped["preprocess_cfg"]}))
    checkpoint = tmp_path / "best_tiny.pt"
    torch.save(chexzero_reference.state_dict("tiny", seed=0), checkpoint)
    args = ("test", "--model", "chexzero", "--model.architecture", str(architecture), "--model.checkpoint", str(checkpoint),
            "--data", "ms_cxr_demo", "--data.batch_size", "3", "--model.bootstrap", "50")
    one, two, _ = one_and_two_processes(tmp_path, *args)
    assert one == two
    table = one["datasets"]["ms_cxr_demo"]
    assert list(table["classes"]) == list(MS_CXR_CLASSES)
    assert sum(row["n_regions"] for row in table["classes"].values()) == 13  # one region per phrase
    assert all(row["cnr"] is not None and row["cnr"] >= 0 for row in table["classes"].values())
    assert table["ci"]["mean"]["cnr"] is not None
    names = in_process(*args, "--data.queries", "names", "--out", str(tmp_path / "names"))
    assert names.returncode == 0, names.stderr[-3000:]
    by_name = json.loads((tmp_path / "names" / "metrics.json").read_text())["datasets"]["ms_cxr_demo"]
    assert by_name["mean"]["n_regions"] == table["mean"]["n_regions"] and by_name["mean"]["cnr"] != table["mean"]["cnr"]


def test_heatmap_samples_name_the_phrase_they_ground(tmp_path):
    """The heatmap callback on MS-CXR: each sample's table row and caption carry its phrase beside the category (two
    categories: each draws its own figures)."""
    import csv

    result = in_process("test", "--model", "center", "--data", "ms_cxr_demo",
                        "--data.classes", "[Cardiomegaly, Pneumothorax]",
                        "--config", str(Path(__file__).resolve().parents[1] / "callbacks" / "png.yaml"), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    with (tmp_path / "run" / "heatmaps" / "samples.csv").open() as f:
        rows = list(csv.DictReader(f))
    records = {r.image_id: r for r in xbench_pl.create_datamodule("ms_cxr_demo").prepare_records()}
    assert {row["finding"] for row in rows} == {"Cardiomegaly", "Pneumothorax"}
    assert all(row["query"] == records[row["image_id"]].queries[row["finding"]] for row in rows)
