"""Phrase grounding through the one model contract: ``Batch.queries`` give each sample its own texts, and
``ZeroShotModel.grounded`` runs the model once per distinct text list, rows back in batch order."""

from __future__ import annotations

import pytest
import torch
from test_open_clip_models import tiny_clip, tiny_clip_config  # noqa: F401 (fixtures)

from xbench_pl.data.base import Batch

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
