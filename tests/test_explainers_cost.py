"""The explainers against their floor (issue 44), on tiny random models of every family: what was cut leaves every map
bit for bit, and the floor ``bench_explainers`` times computes what the methods read.

* Rollout and Chefer against their rules as computed before the cuts (every product with an identity or zero done,
  one backward per finding), kept here: ``torch.equal``.
* Chefer through a ResNet tower (only the decoder's attention made explicit) runs the model once: its forward's scores
  are the native forward's, bit for bit; through a ViT tower the native forward runs again. Rollout observes the
  native forward: the tower runs once.
* The floor's one batched backward gives each finding's gradient of what the method reads.
* EigenCAM's projection with the reduced SVD is pytorch-grad-cam's (full SVD), bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection

from test_explainers_families import CLASSES, FAMILIES, family_builders, images_for
from xbench_pl.explainers.cams import SCORECAM_CHANNELS, first_component_projection
from xbench_pl.explainers.towers import observable, observed_attention, recorded_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_explainers import floor  # noqa: E402

#: families whose image tower is a ResNet: Chefer follows their query decoder alone
RESNET_TOWERS = ("medklip", "mavl", "kad")


@pytest.fixture(scope="module")
def builders(tmp_path_factory):
    return family_builders(tmp_path_factory.mktemp("families"))


# -- the rules as computed before: every product done, each operand in float64 ---------------------------------
def head_relevance(probs, gradient):
    if gradient is None:
        return torch.zeros_like(probs[:, 0], dtype=torch.float64)
    return (gradient.double() * probs.double()).clamp(min=0).mean(dim=1)


def normalized(relevance):
    eye = torch.eye(relevance.shape[-1], dtype=relevance.dtype)
    residual = relevance - eye
    sums = residual.sum(dim=-1, keepdim=True)
    return torch.where(sums > 0, residual / sums.clamp(min=torch.finfo(sums.dtype).tiny), 0) + eye


def full_rollout(probabilities):
    eye = torch.eye(probabilities[0].shape[-1], dtype=torch.float64)
    relevance = eye.expand_as(probabilities[0][:, 0])
    for probs in probabilities:
        mixed = 0.5 * (probs.double().mean(dim=1) + eye)
        relevance = (mixed / mixed.sum(dim=-1, keepdim=True)) @ relevance
    return relevance


def full_self_relevance(probabilities, gradients):
    relevance = torch.eye(probabilities[0].shape[-1], dtype=torch.float64).expand_as(probabilities[0][:, 0])
    for probs, gradient in zip(probabilities, gradients):
        relevance = relevance + head_relevance(probs, gradient) @ relevance
    return relevance


def full_decoder_relevance(image, layers):
    batch, queries, tokens = layers[0][2].shape[0], layers[0][2].shape[2], layers[0][2].shape[3]
    text = torch.eye(queries, dtype=torch.float64).expand(batch, queries, queries)
    text_image = torch.zeros(batch, queries, tokens, dtype=torch.float64)
    image = normalized(image)
    for self_probs, self_grad, cross_probs, cross_grad in layers:
        if self_probs is not None:
            mixed = head_relevance(self_probs, self_grad)
            text, text_image = text + mixed @ text, text_image + mixed @ text_image
        text_image = text_image + normalized(text).transpose(1, 2) @ head_relevance(cross_probs, cross_grad) @ image
    return text_image


def reference_maps(model, images: torch.Tensor) -> torch.Tensor:
    """``[B, C, h, w]``: the explainer's recorded attention through the full rules, one backward per finding."""
    explainer = model.explainer_method
    with torch.inference_mode(False):
        model.thaw_caches()
        tower_probs, decoder_probs, _, targets = explainer.recorded(model, images.clone(), CLASSES)
        if explainer.name == "rollout":
            return explainer.class_token_map(full_rollout(tower_probs), len(CLASSES))
        wanted = tower_probs + [p for pair in decoder_probs for p in pair if p is not None]
        maps = []
        for finding in range(len(CLASSES)):
            gradients = torch.autograd.grad(targets[:, finding].sum(), wanted, retain_graph=True, allow_unused=True)
            by_tensor = {id(p): g for p, g in zip(wanted, gradients)}
            plain = [p.detach() for p in tower_probs]
            tower = full_self_relevance(plain, gradients[:len(tower_probs)]) if tower_probs else None
            if not decoder_probs:
                maps.append(explainer.class_token_map(tower, 1)[:, 0])
                continue
            layers = [(None if s is None else s.detach(), by_tensor.get(id(s)), c.detach(), by_tensor[id(c)])
                      for s, c in decoder_probs]
            tokens = decoder_probs[0][1].shape[-1]
            if tower is None:
                tower = torch.eye(tokens, dtype=torch.float64).expand(images.shape[0], tokens, tokens)
            relevance = full_decoder_relevance(tower[:, -tokens:, -tokens:], layers)
            maps.append(model.decoder_maps(relevance, CLASSES, explainer.patch_grid(tokens))[:, finding])
    return torch.stack(maps, dim=1).float()


RELEVANCE = [(family, "chefer") for family in FAMILIES] + [(family, "rollout") for family in FAMILIES
                                                             if family not in RESNET_TOWERS]


@pytest.mark.parametrize("family, explainer", RELEVANCE)
def test_relevance_maps_equal_the_full_rules_bit_for_bit(builders, family, explainer):
    model = builders(family, explainer=explainer)
    images = images_for(model)
    with torch.inference_mode():
        maps = model.explained(images, CLASSES).saliency
    expected = reference_maps(model, images)
    assert float(expected.abs().max()) > 0, f"{family} {explainer}: the reference map is zero everywhere"
    assert torch.equal(maps, expected), f"{family} {explainer}: max |diff| {float((maps - expected).abs().max()):.3g}"


@pytest.mark.parametrize("family", FAMILIES)
def test_chefer_through_a_resnet_tower_runs_the_model_once(builders, family):
    """The scores of a run are the native forward's, bit for bit, either way; the native forward runs again only
    after a ViT tower's explicit attention."""
    model = builders(family, explainer="chefer")
    images = images_for(model)
    with torch.inference_mode():
        native = model.zero_shot(images, CLASSES)
        with mock.patch.object(model, "zero_shot", wraps=model.zero_shot) as rerun:
            explained = model.explained(images, CLASSES)
    assert rerun.call_count == (0 if family in RESNET_TOWERS else 1)
    assert torch.equal(explained.scores, native.scores)
    assert (explained.logits is None) == (native.logits is None)
    if native.logits is not None:
        assert torch.equal(explained.logits, native.logits)


@pytest.mark.parametrize("family", [family for family in FAMILIES if family not in RESNET_TOWERS])
def test_rollout_observes_the_native_forward(builders, family):
    """Rollout's probabilities are computed beside the native forward: the tower's first block runs once, the scores are the
    native ones bit for bit, and the first block's probabilities (the same input either way) are the explicit ones'."""
    model = builders(family, explainer="rollout")
    images = images_for(model)
    tower = model.explainer_method.tower
    calls = []
    handle = tower.blocks[0].register_forward_hook(lambda module, inputs, output: calls.append(1))
    try:
        with torch.inference_mode():
            native = model.zero_shot(images, CLASSES)
            calls.clear()
            explained = model.explained(images, CLASSES)
    finally:
        handle.remove()
    assert len(calls) == 1
    assert torch.equal(explained.scores, native.scores)
    if native.logits is not None:
        assert torch.equal(explained.logits, native.logits)
    explicit = []
    with torch.no_grad(), recorded_attention(tower.blocks, lambda site: lambda probs: explicit.append(probs) or probs):
        model.zero_shot(images.clone(), CLASSES)
    with torch.inference_mode(False):
        model.thaw_caches()
        observed = model.explainer_method.recorded(model, images.clone(), CLASSES)[0]
    assert len(observed) == len(explicit) == len(tower.blocks)
    assert torch.equal(observed[0], explicit[0])
    for seen, computed in zip(observed, explicit):
        torch.testing.assert_close(seen, computed, rtol=1e-4, atol=1e-6)


def test_rollout_computes_the_attention_explicitly_where_a_block_is_not_observable(builders):
    """timm's attention relatives with their own biases or rotary embeddings (EVA's) are not observable: rollout then
    records the explicit attention and the native forward runs again, as before observation."""
    from timm.layers import Attention
    from timm.models.eva import EvaAttention

    assert observable(Attention(16, 2)) and not observable(EvaAttention(16, 2, scale_norm=False))
    model = builders("biomedclip", explainer="rollout")
    images = images_for(model)
    with torch.inference_mode():
        native = model.zero_shot(images, CLASSES)
        observed = model.explained(images, CLASSES)
        model.explainer_method.observes = False  # as for a tower of EvaAttention blocks
        with mock.patch.object(model, "zero_shot", wraps=model.zero_shot) as rerun:
            explicit = model.explained(images, CLASSES)
    assert rerun.call_count == 2  # the explicit forward (explainer_forward without autograd), then the native one
    assert torch.equal(explicit.scores, native.scores)
    torch.testing.assert_close(explicit.saliency, observed.saliency, rtol=1e-4, atol=1e-7)


def test_observed_attention_refuses_a_masked_call_in_one_line():
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 3, 8)
    seen = []
    with torch.no_grad(), observed_attention([attention], lambda site: seen.append):
        attention(x, x, x, need_weights=False)
        with pytest.raises(ValueError, match="without masks; this nn.MultiheadAttention attention is masked"):
            attention(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.bool))
    assert len(seen) == 1 and seen[0].shape == (1, 2, 3, 3)
    torch.testing.assert_close(seen[0].mean(1), attention(x, x, x)[1])  # nn.MultiheadAttention's own averaged weights


@pytest.mark.parametrize("family, explainer", [("clip", "gradcam"), ("medklip", "gradcam"), ("carzero", "chefer"),
                                               ("kad", "chefer")])
def test_the_floor_gives_each_findings_gradient_of_what_the_method_reads(builders, family, explainer):
    """One batched backward (``[C, B, ...]`` per tensor read) = a backward per finding, to float32 round-off."""
    model = builders(family, explainer=explainer)
    images = images_for(model)
    batched = floor(model, images, CLASSES)
    method = model.explainer_method
    with torch.inference_mode(False):
        model.thaw_caches()
        if explainer == "gradcam":
            activation, _, targets = method.activations(model, images, CLASSES)
            read = [activation]
        else:
            tower, decoder, _, targets = method.recorded(model, images, CLASSES)
            read = tower + [p for pair in decoder for p in pair if p is not None]
        assert len(batched) == len(read) and len(read) > 0
        for finding in range(len(CLASSES)):
            each = torch.autograd.grad(targets[:, finding].sum(), read, retain_graph=True, allow_unused=True)
            for one, all_findings in zip(each, batched):
                assert (one is None) == (all_findings is None)
                if one is not None:
                    assert all_findings.shape == (len(CLASSES), *one.shape)
                    torch.testing.assert_close(all_findings[finding], one, rtol=1e-4, atol=1e-6 * float(one.abs().max()))


@pytest.mark.parametrize("explainer", ["eigencam", "rollout"])
def test_a_method_without_a_target_has_a_forward_for_floor(builders, explainer):
    model = builders("clip", explainer=explainer)
    assert floor(model, images_for(model), CLASSES) == ()


def test_scorecams_floor_is_a_forward_per_channel_in_its_chunks(builders):
    model = builders("clip", explainer="scorecam")
    images = images_for(model)
    with mock.patch.object(model, "explainer_forward", wraps=model.explainer_forward) as forwards:
        assert floor(model, images, CLASSES) == ()
    channels = model.get_submodule(model.explainer_info["target_layer"]).normalized_shape[0]  # ln_1's width
    sizes = [len(call.args[0]) for call in forwards.call_args_list]
    assert sizes == [len(images)] + [min(SCORECAM_CHANNELS, channels)] * (len(images) * -(-channels // SCORECAM_CHANNELS))


@pytest.mark.parametrize("family", FAMILIES)
def test_eigencam_with_the_reduced_svd_is_the_librarys_projection_bit_for_bit(builders, family):
    model = builders(family, explainer="eigencam")
    images = images_for(model)
    method = model.explainer_method
    with torch.inference_mode(False):
        model.thaw_caches()
        features = method.as_map(method.activations(model, images.clone(), CLASSES)[0])
    assert not features.flags["C_CONTIGUOUS"] or family in RESNET_TOWERS  # a ViT's tokens laid out on the grid: a view
    assert np.array_equal(first_component_projection(features), get_2d_projection(features))


@pytest.mark.parametrize("shape", [(1024, 14, 14), (2048, 7, 7), (768, 14, 14), (512, 28, 28)],
                         ids=["resnet50-layer3", "resnet50-layer4", "vit-b16", "more-positions-than-channels"])
def test_eigencam_projection_equals_the_librarys_at_full_size(shape):
    """At the released towers' layer shapes too (post-ReLU-like activations with a NaN, which the library zeroes)."""
    generator = np.random.default_rng(sum(shape))
    features = np.maximum(generator.standard_normal((2, *shape)), 0).astype(np.float32)
    features[0, 0, 0, 0] = np.nan
    assert np.array_equal(first_component_projection(features), get_2d_projection(features))
