"""Error messages that lead somewhere: a refused explainer names the explainers the model takes (each of which it
then takes), and an error about a model's argument names that argument's option (``--model.ARG``)."""

from __future__ import annotations

import re

import pytest
import torch
from test_explainers import TinyViTModel

from xbench_pl.commands.errors import user_error_message
from xbench_pl.explainers import EXPLAINERS
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.models.layers.image_encoders import ResNetPatches
from xbench_pl.models.layers.query_decoder import QueryDecoder


class TinyResNetModel(ZeroShotModel):
    """A ResNet image tower, with or without a query decoder (as MedKLIP and KAD have, BioViL has not)."""

    IMAGE_TOWER = "image"

    def __init__(self, decoder: bool = False, **kwargs):
        super().__init__(**kwargs)
        with torch.device("meta"):  # what an explainer takes follows the modules, not their weights: none are made
            self.image = ResNetPatches(stage=3)
        if decoder:
            self.decoder = QueryDecoder(d_model=16, heads=2, layers=1, ffn=32)
        self.attach_explainer()

    def zero_shot(self, images, classes):
        tokens, grid = self.image(images)
        return ZeroShotOutput(torch.sigmoid(tokens[:, : len(classes), 0]), tokens[..., : len(classes)].transpose(1, 2).unflatten(-1, grid))


def refusal(build, explainer: str) -> str:
    """The one line the command line prints when ``build(explainer=...)`` refuses, as ``test --model ...`` does."""
    with pytest.raises(ValueError) as raised:
        build(explainer=explainer)
    return user_error_message(raised.value, "test")


@pytest.mark.parametrize("build, refused, left_out", [
    (TinyResNetModel, "rollout", {"rollout", "chefer"}),  # a ResNet dual encoder: no attention at all
    (lambda **kw: TinyResNetModel(decoder=True, **kw), "rollout", {"rollout"}),  # chefer follows the decoder
])
def test_a_refused_explainer_names_only_explainers_the_model_takes(build, refused, left_out):
    line = refusal(build, refused)
    assert line.startswith(f"--model.explainer: {refused} follows a ViT's self-attention; this model's image tower is a ResNet: ")
    offered = re.search(r"it takes (.+)$", line).group(1).split(", ")
    assert offered == [name for name in EXPLAINERS if name not in left_out]
    for name in offered[1:]:  # each hint leads somewhere: the model takes it
        assert build(explainer=name).explainer == name


def test_chefer_refused_by_a_resnet_dual_encoder_offers_no_attention_method():
    line = refusal(TinyResNetModel, "chefer")
    assert line.startswith("--model.explainer: chefer follows attention; this model has neither a ViT image tower nor "
                           "a query decoder: it takes native, gradcam")
    assert "rollout" not in line and line.count("chefer") == 1


def test_an_error_about_a_model_argument_names_its_option():
    with pytest.raises(ValueError) as raised:
        TinyViTModel(explainer="gradcam", explainer_layer="image.nowhere")
    assert user_error_message(raised.value, "test").startswith(
        "--model.explainer_layer: 'image.nowhere' is not a module of TinyViTModel")
    with pytest.raises(ValueError) as raised:
        TinyViTModel(explainer_layer="image")
    assert user_error_message(raised.value, "test").startswith("--model.explainer_layer: 'image' needs an explainer")
