"""Explainers (``--model.explainer``): each method against an independent computation of its definition.

* rollout and Chefer's relevance against a direct loop over a tiny ViT (and a query decoder on it),
  whose attention the test recomputes from the weights, image by image;
* refusals: baselines, rollout on a ResNet tower, an unknown layer, a layer with native maps.

The CAMs against pytorch-grad-cam's own per-layer CAM, for every family, are in
``test_explainers_families.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xbench_pl
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.models.layers.image_encoders import ViTPatches
from xbench_pl.models.layers.query_decoder import QueryDecoder

CLASSES = ["a", "b", "c"]
GRID = (4, 4)


class TinyViTModel(ZeroShotModel):
    """A ViT dual encoder (scores from the class token) or, with ``decoder``, a query decoder over its patches."""

    IMAGE_TOWER = "image"

    def __init__(self, decoder: bool = False, **kwargs):
        super().__init__(**kwargs)
        torch.manual_seed(0)
        self.image = ViTPatches(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                intermediate_size=32)
        if decoder:
            self.decoder = QueryDecoder(d_model=16, heads=2, layers=2, ffn=32)
            self.queries = nn.Parameter(torch.randn(len(CLASSES), 16))
        self.head = nn.Linear(16, 1 if decoder else len(CLASSES))
        for p in self.parameters():  # large enough weights that no gradient vanishes
            nn.init.normal_(p, std=0.5)
        self.eval()
        self.attach_explainer()

    def zero_shot(self, images, classes):
        tokens = self.image.forward_features(images)
        if hasattr(self, "decoder"):
            out, attn = self.decoder(self.queries, tokens[:, 1:])
            scores = torch.sigmoid(self.head(out)[..., 0])
            return ZeroShotOutput(scores, self.decoder_maps(attn.mean(0), classes, GRID))
        scores = torch.sigmoid(self.head(tokens[:, 0]))
        return ZeroShotOutput(scores, tokens[:, 1:, :len(classes)].transpose(1, 2).unflatten(-1, GRID))

    def decoder_maps(self, per_query, classes, grid):
        return per_query.unflatten(-1, grid)


# -- the direct computation: explicit attention from the weights, one image at a time ---------------
def explicit_attention(q_proj, k_proj, v_proj, heads, queries, keys):
    """``[L, D]`` x ``[S, D]`` -> (probabilities ``[heads, L, S]``, attended ``[L, D]``)."""
    q, k, v = (proj(x).unflatten(-1, (heads, -1)).transpose(0, 1) for proj, x in ((q_proj, queries), (k_proj, keys), (v_proj, keys)))
    probs = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)
    probs.retain_grad()
    return probs, (probs @ v).transpose(0, 1).flatten(1)


def vit_direct(vit: ViTPatches, image: torch.Tensor):
    """The tiny ViT's final tokens ``[T, D]`` and each block's probabilities ``[heads, T, T]``."""
    x = vit.embeddings.patch_embeddings.projection(image[None]).flatten(2).transpose(1, 2)[0]
    x = torch.cat([vit.embeddings.cls_token[0], x]) + vit.embeddings.position_embeddings[0]
    every = []
    for layer in vit.encoder.layer:
        h = layer.layernorm_before(x)
        qkv = layer.attention.attention
        probs, attended = explicit_attention(qkv.query, qkv.key, qkv.value, layer.heads, h, h)
        every.append(probs)
        x = x + layer.attention.output.dense(attended)
        x = x + layer.output.dense(F.gelu(layer.intermediate.dense(layer.layernorm_after(x))))
    return vit.layernorm(x), every


def mha_direct(mha: nn.MultiheadAttention, queries, keys):
    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)
    b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
    probs, attended = explicit_attention(lambda x: F.linear(x, w_q, b_q), lambda x: F.linear(x, w_k, b_k),
                                         lambda x: F.linear(x, w_v, b_v), mha.num_heads, queries, keys)
    return probs, mha.out_proj(attended)


def decoder_direct(decoder: QueryDecoder, queries, memory):
    """Per layer (self probabilities, cross probabilities), and the decoded queries ``[Q, D]``."""
    every = []
    for layer in decoder.layers:
        x = layer.norm1(queries)
        self_probs, out = mha_direct(layer.self_attn, x, x)
        queries = queries + out
        cross_probs, out = mha_direct(layer.multihead_attn, layer.norm2(queries), memory)
        queries = queries + out
        queries = queries + layer.linear2(F.relu(layer.linear1(layer.norm3(queries))))
        every.append((self_probs, cross_probs))
    return decoder.norm(queries), every


def direct_targets(model: TinyViTModel, image: torch.Tensor):
    tokens, tower = vit_direct(model.image, image.requires_grad_())
    if not hasattr(model, "decoder"):
        return torch.sigmoid(model.head(tokens[0])), tower, []
    out, decoder = decoder_direct(model.decoder, model.queries, tokens[1:])
    return torch.sigmoid(model.head(out)[:, 0]), tower, decoder


def mixed(probs: torch.Tensor) -> torch.Tensor:
    return (probs.grad * probs).clamp(min=0).mean(0).double()


def normalized(relevance: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(len(relevance), dtype=relevance.dtype)
    rows = []
    for row in relevance - eye:  # a row with nothing beyond the identity stays the identity row
        rows.append(row / row.sum() if row.sum() > 0 else row)
    return torch.stack(rows) + eye


def direct_rollout(model, image):
    _, tower, _ = direct_targets(model, image)
    relevance = torch.eye(tower[0].shape[-1], dtype=torch.float64)
    for probs in tower:
        step = 0.5 * (probs.detach().double().mean(0) + torch.eye(len(relevance), dtype=torch.float64))
        relevance = (step / step.sum(-1, keepdim=True)) @ relevance
    return relevance[0, 1:].reshape(GRID)


def direct_chefer(model, image, finding):
    targets, tower, decoder = direct_targets(model, image)
    targets[finding].backward()
    relevance = torch.eye(tower[0].shape[-1], dtype=torch.float64)
    for probs in tower:
        relevance = relevance + mixed(probs) @ relevance
    if not decoder:
        return relevance[0, 1:].reshape(GRID)
    image_relevance = normalized(relevance[1:, 1:])
    text = torch.eye(len(CLASSES), dtype=torch.float64)
    text_image = torch.zeros(len(CLASSES), image_relevance.shape[0], dtype=torch.float64)
    for self_probs, cross_probs in decoder:
        text_image = text_image + mixed(self_probs) @ text_image
        text = text + mixed(self_probs) @ text
        text_image = text_image + normalized(text).T @ mixed(cross_probs) @ image_relevance
    return text_image[finding].reshape(GRID)


@pytest.fixture(scope="module")
def images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("decoder", [False, True], ids=["dual-encoder", "decoder"])
def test_rollout_equals_the_direct_loop(images, decoder):
    model = TinyViTModel(decoder=decoder, explainer="rollout")
    with torch.inference_mode():  # as Lightning tests
        maps = model.explained(images, CLASSES).saliency
    assert maps.shape == (2, 3, *GRID)
    for b in range(2):
        expected = direct_rollout(model, images[b].clone())
        for c in range(3):  # no target: one map for every finding
            torch.testing.assert_close(maps[b, c].double(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("decoder", [False, True], ids=["dual-encoder", "decoder"])
def test_chefer_equals_the_direct_loop(images, decoder):
    model = TinyViTModel(decoder=decoder, explainer="chefer")
    with torch.inference_mode():
        maps = model.explained(images, CLASSES).saliency
    assert maps.shape == (2, 3, *GRID)
    for b in range(2):
        for c in range(3):
            expected = direct_chefer(model, images[b].clone(), c)
            assert expected.abs().max() > 0
            torch.testing.assert_close(maps[b, c].double(), expected, rtol=1e-4, atol=1e-6 * float(expected.detach().abs().max()))
    assert not torch.allclose(maps[:, 0], maps[:, 1])  # per-finding relevance differs


def test_explainers_leave_scores_and_parameters_as_they_were(images):
    native = TinyViTModel()
    explained = TinyViTModel(explainer="chefer")
    with torch.inference_mode():
        assert torch.equal(native.zero_shot(images, CLASSES).scores, explained.explained(images, CLASSES).scores)
    assert all(p.requires_grad for p in explained.parameters()) and all(p.grad is None for p in explained.parameters())


def test_explainer_info_records_name_layer_target_and_library():
    from importlib.metadata import version

    info = TinyViTModel(explainer="gradcam").explainer_info
    assert info == {"name": "gradcam", "target_layer": "image.encoder.layer.2.layernorm_before", "target": "scores",
                    "library": "pytorch-grad-cam", "version": version("grad-cam")}
    assert TinyViTModel(explainer="rollout").explainer_info["target"] is None
    assert TinyViTModel().explainer_info["name"] == "native"
    layer = TinyViTModel(explainer="layercam", explainer_layer="image.encoder.layer.0.layernorm_after").explainer_info
    assert layer["target_layer"] == "image.encoder.layer.0.layernorm_after"


@pytest.mark.parametrize("kwargs, message", [
    ({"explainer": "gradcam", "explainer_layer": "image.nowhere"}, "explainer_layer 'image.nowhere' is not a module of TinyViTModel"),
    ({"explainer_layer": "image"}, "explainer_layer 'image' needs an explainer"),
    ({"explainer": "rollout", "explainer_layer": "image"}, "explainer_layer 'image': a layer is for the CAMs only; rollout follows"),
])
def test_bad_explainer_settings_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TinyViTModel(**kwargs)


def test_a_baseline_refuses_an_explainer():
    with pytest.raises(ValueError, match="explainer 'gradcam': UniformBaseline has no network to explain; it takes 'native' only"):
        xbench_pl.create_model("uniform", explainer="gradcam")
