"""The CAM explainers on tiny random models of every family, against pytorch-grad-cam itself.

For each model and method the reference is the library's own pipeline (its ``BaseCAM.__call__``
with hooks, ``loss.backward()`` and ``compute_cam_per_layer``), one finding at a time with a
``ClassifierOutputTarget``, with its min-max scaling and resize (``scale_cam_image``) switched off:
that is its ``get_cam_image`` followed by its ReLU, on the layer's own grid. The model it explains
is written here from the issue's rule (the model's logits where ``zero_shot`` gives them, else its
scores), and the ViT reshape is the library tutorial's (drop the leading tokens, lay the patches
out row by row). Grad-CAM is also checked against its textbook definition with plain autograd.
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
import torch
from pytorch_grad_cam import base_cam
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from torch import nn

import kad_reference
import medklip_mavl_reference as ref_data
import carzero_reference as cr
from test_carzero import tiny_architecture as tiny_carzero_architecture
from test_devide import tiny_devide_architecture
from test_kad import tiny_architecture as tiny_kad_architecture
from test_open_clip_models import BERT_VOCAB, TINY_CLIP, write_config
from xbench_pl.explainers.cams import CAM_METHODS, SCORECAM_CHANNELS
from xbench_pl.models.carzero import CARZero
from xbench_pl.models.devide import DeViDe
from xbench_pl.models.kad import KAD
from xbench_pl.models.medklip import MAVL, MedKLIP
from xbench_pl.models.open_clip_model import OpenCLIPModel

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["Atelectasis", "Pleural Effusion", "Nodule"]
#: ScoreCAM masks the input once per channel: on a ResNet, a 128- or 256-channel layer keeps that to seconds (KAD's
#: tiny model scores every finding alike on layer2's masks, which would leave the findings' maps nothing to tell apart)
SCORECAM_LAYER = {"medklip": "image.layer2.3.conv2", "mavl": "image.layer2.3.conv2", "kad": "image.layer3.5.conv2"}
#: and a 32 px input on those ResNets (2 x 2 and 4 x 4 grids), a quarter of the pixels to mask and forward
SCORECAM_SIZE = {"medklip": 32, "kad": 32}


def write_json(path: Path, config: dict) -> str:
    path.write_text(json.dumps(config))
    return str(path)


def small_medklip_family(name: str, size: int = 64, width: int = 32) -> dict:
    """The shipped MedKLIP/MAVL architecture at a 64 px input (4 x 4 grid) and a decoder ``width`` wide: the same
    modules, layers and queries, fewer pixels and channels (MAVL decodes its 675 queries for every forward)."""
    config = json.loads((REPO / "xbench_pl" / "models" / "configs" / f"{name}.json").read_text())
    config["preprocess"] = {**config["preprocess"], "size": size}
    config["decoder"] = {**config["decoder"], "d_model": width, "ffn": 2 * width}
    config["projection"] = {**config["projection"], "widths": [config["projection"]["widths"][0], width]}
    if "pool" in config:
        config["pool"] = {**config["pool"], "out": width}
    return config


def family_builders(root: Path):
    """name -> a function building that family's tiny random model with the given explainer options (its files under
    ``root``)."""
    root.mkdir(parents=True, exist_ok=True)
    knowledge = ref_data.write_knowledge(root / "knowledge")
    bert = str(ref_data.write_bert_folder(root / "bert", seed=0))
    med_kebert = str(kad_reference.write_tokenizer(root / "med_kebert"))
    carzero_bert = str(cr.write_text_encoder_folder(root / "carzero_bert"))
    biomedclip = root / "biomedclip"
    biomedclip.mkdir()
    import transformers

    transformers.BertConfig(vocab_size=len(BERT_VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64, pad_token_id=0).save_pretrained(biomedclip / "bert")
    (biomedclip / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    (biomedclip / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    write_config(biomedclip / "open_clip_config.json", {
        "embed_dim": 16, "vision_cfg": {"timm_model_name": "test_vit", "timm_pool": "", "timm_proj": "linear", "image_size": 160},
        "text_cfg": {"hf_model_name": "bert", "hf_tokenizer_name": "bert", "hf_proj_type": "mlp",
                     "hf_pooler_type": "cls_last_hidden_state_pooler", "context_length": 16}})
    configs = {
        "clip": write_config(root / "clip.json", TINY_CLIP),
        "kad": write_json(root / "kad.json", tiny_kad_architecture()),
        "devide": write_json(root / "devide.json", tiny_devide_architecture()),
        "carzero": write_json(root / "carzero.json", tiny_carzero_architecture()),
        "medklip": write_json(root / "medklip.json", small_medklip_family("medklip")),
        "mavl": write_json(root / "mavl.json", small_medklip_family("mavl")),
    }
    mavl_knowledge = [str(knowledge["mavl_descriptions"]), str(knowledge["mavl_aspects"])]
    for name, size in SCORECAM_SIZE.items():
        configs[name, size] = write_json(root / f"{name}_{size}.json", tiny_kad_architecture(size=size) if name == "kad"
                                         else small_medklip_family(name, size=size))

    def build(name: str, size: int | None = None, **options) -> nn.Module:
        """``size``: one of ``SCORECAM_SIZE``'s inputs instead of the family's own."""
        torch.manual_seed(0)
        config = configs.get(name) if size is None else configs[name, size]
        if name == "clip":
            return OpenCLIPModel(config, random_init=True, **options)
        if name == "biomedclip":
            return OpenCLIPModel(str(biomedclip), random_init=True, text=str(biomedclip), **options)
        if name in ("kad", "devide"):
            return (KAD if name == "kad" else DeViDe)(config, random_init=True, text=med_kebert, **options)
        if name == "carzero":
            return CARZero(config, random_init=True, text=carzero_bert, **options)
        if name == "medklip":
            return MedKLIP(config, random_init=True, knowledge=str(knowledge["medklip_descriptions"]), text=bert, **options)
        return MAVL(config, random_init=True, knowledge=mavl_knowledge, text=bert, **options)

    return build


@pytest.fixture(scope="module")
def builders(tmp_path_factory):
    """``family_builders``, once a module."""
    return family_builders(tmp_path_factory.mktemp("families"))


@functools.cache
def builders_in(root: str):
    """``family_builders(root)``, once a process (the warm process's runs: test_trust_families)."""
    return family_builders(Path(root))


FAMILIES = ["clip", "biomedclip", "medklip", "mavl", "kad", "devide", "carzero"]


def images_for(model) -> torch.Tensor:
    size = model.preprocess.size
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(5))


class Explained(nn.Module):
    """The model as the issue defines the explained target: ``zero_shot``'s logits where it gives them, else its scores."""

    def __init__(self, model, classes):
        super().__init__()
        self.model, self.classes = model, classes

    def forward(self, images):
        output = self.model.zero_shot_with_grad(images, self.classes)
        return output.logits if output.logits is not None else output.scores


def library_reshape(grid):
    """pytorch-grad-cam's ViT tutorial reshape: the last ``h * w`` tokens (the patches) as ``[B, D, h, w]``."""
    if grid is None:
        return None

    def reshape(tensor):
        patches = tensor[:, tensor.shape[1] - grid[0] * grid[1]:]
        return patches.reshape(tensor.size(0), grid[0], grid[1], tensor.size(2)).permute(0, 3, 1, 2)

    return reshape


@contextmanager
def unscaled():
    """The library's pipeline without its min-max scaling and resize: its CAM after its ReLU, on the layer's grid."""
    with mock.patch.object(base_cam, "scale_cam_image", lambda cam, target_size=None: cam):
        yield


def library_maps(model, method: str, layer: str, images: torch.Tensor, classes: list[str]) -> tuple[torch.Tensor, float]:
    """``[B, C, h, w]``: pytorch-grad-cam's own per-layer CAM of each finding, computed by the library's ``__call__``;
    and the largest activation of the layer (ScoreCAM's map is a convex sum of them: its round-off scales with them)."""
    explained = Explained(model, classes)
    cam = CAM_METHODS[method](explained, [model.get_submodule(layer)], reshape_transform=library_reshape(model.explainer_method.grid))
    if method == "scorecam":
        cam.batch_size = SCORECAM_CHANNELS  # the same batches as ours: float32 sums depend on the batch
    maps = []
    with unscaled():
        for c in range(len(classes)):
            maps.append(torch.from_numpy(cam(images, targets=[ClassifierOutputTarget(c)] * len(images))))
    activation_scale = float(cam.activations_and_grads.activations[0].abs().max())
    cam.activations_and_grads.release()
    return torch.stack(maps, dim=1), activation_scale


def explained_maps(model, images, classes):
    with torch.inference_mode():  # as Lightning's test loop runs it
        return model.explained(images, classes).saliency


def assert_maps_close(ours: torch.Tensor, expected: torch.Tensor, method: str, scale: float = 0.0):
    """Within float32 round-off of the larger of the map's and ``scale``."""
    assert float(expected.abs().max()) > 0, f"{method}: the reference map is zero everywhere: the test would prove nothing"
    scale = max(scale, float(expected.abs().max()))
    torch.testing.assert_close(ours.float(), expected.float(), rtol=1e-4, atol=1e-5 * scale)


# MAVL's ScoreCAM is MedKLIP's (one class, one tower and decoder; MAVL differs in its query reduction, which the
# other CAMs cover) and costs minutes here: MAVL decodes 600 queries per masked input
CASES = [(family, method) for family in FAMILIES for method in CAM_METHODS if (family, method) != ("mavl", "scorecam")]


@pytest.mark.parametrize("family, method", CASES)
def test_every_cam_equals_pytorch_grad_cams_own(builders, family, method):
    scorecam = method == "scorecam"
    model = builders(family, size=SCORECAM_SIZE.get(family) if scorecam else None, explainer=method,
                     explainer_layer=SCORECAM_LAYER.get(family) if scorecam else None)
    images = images_for(model)
    classes = CLASSES[:2] if method == "scorecam" else CLASSES  # the library masks once per channel and finding
    ours = explained_maps(model, images, classes)
    expected, activation_scale = library_maps(model, method, model.explainer_info["target_layer"], images, classes)
    assert ours.shape == expected.shape == (2, len(classes), *expected.shape[-2:])
    assert_maps_close(ours, expected, f"{family} {method}", activation_scale if method == "scorecam" else 0.0)
    if method != "eigencam":  # a target: the findings' maps differ
        assert not torch.allclose(ours[:, 0], ours[:, 1]), f"{family} {method}: one map for every finding"


def textbook_gradcam(model, layer: str, images: torch.Tensor, classes: list[str], grid) -> torch.Tensor:
    """``ReLU(sum_k mean_ij(dy/dA_kij) * A_k)`` with plain autograd, one finding at a time."""
    maps = []
    for c in range(len(classes)):
        kept = []
        handle = model.get_submodule(layer).register_forward_hook(lambda module, inputs, output: kept.append(output))
        try:
            explained = Explained(model, classes)(images)
        finally:
            handle.remove()
        activation = kept[0]
        gradient, = torch.autograd.grad(explained[:, c].sum(), activation)
        if grid is not None:  # ViT tokens -> [B, D, h, w]
            activation, gradient = (library_reshape(grid)(t) for t in (activation, gradient))
        weights = gradient.mean(dim=(2, 3), keepdim=True)
        maps.append((weights * activation).sum(dim=1).clamp(min=0).detach())
    return torch.stack(maps, dim=1)


@pytest.mark.parametrize("family", ["clip", "medklip", "carzero"])
def test_gradcam_equals_its_textbook_definition(builders, family):
    model = builders(family, explainer="gradcam")
    images = images_for(model)
    expected = textbook_gradcam(model, model.explainer_info["target_layer"], images, CLASSES, model.explainer_method.grid)
    assert_maps_close(explained_maps(model, images, CLASSES), expected, f"{family} gradcam")


@pytest.mark.parametrize("family", FAMILIES)
def test_native_maps_are_unchanged_and_scores_are_the_native_forwards(builders, family):
    """Native: byte-identical. A CAM's scores come from its own forward, the native operations with autograd from
    its layer on (a kernel may differ: float32 round-off); rollout and Chefer rerun the native forward."""
    native = builders(family)
    explained = builders(family, explainer="gradcam++")
    images = images_for(native)
    with torch.inference_mode():
        plain = native.zero_shot(images, CLASSES)
        same = native.explained(images, CLASSES)
        other = explained.explained(images, CLASSES)
    assert torch.equal(plain.saliency, same.saliency) and torch.equal(plain.scores, same.scores)
    torch.testing.assert_close(other.scores, plain.scores, rtol=1e-5, atol=1e-6)
    if plain.logits is not None:
        torch.testing.assert_close(other.logits, plain.logits, rtol=1e-5, atol=1e-5)
    assert native.explainer_info["name"] == "native"
    assert explained.explainer_info["target"] == ("logits" if plain.logits is not None else "scores")


def probabilities_by_hooks(model, images: torch.Tensor) -> list[torch.Tensor]:
    """Each block's attention probabilities ``[B, heads, T, T]`` of the plain model, by the libraries' own means:
    ``nn.MultiheadAttention(need_weights=True, average_attn_weights=False)`` on the block's inputs (open_clip), the
    non-fused path's ``attn_drop`` input (timm)."""
    visual, kept, handles = model.model.visual, [], []
    if hasattr(visual, "trunk"):
        for block in visual.trunk.blocks:
            block.attn.fused_attn = False
            handles.append(block.attn.attn_drop.register_forward_hook(lambda module, inputs, output: kept.append(inputs[0])))
    else:
        for block in visual.transformer.resblocks:
            handles.append(block.attn.register_forward_hook(lambda module, inputs, output: kept.append(
                nn.MultiheadAttention.forward(module, *inputs, need_weights=True, average_attn_weights=False)[1])))
    try:
        with torch.no_grad():
            model.zero_shot(images, CLASSES)
    finally:
        for handle in handles:
            handle.remove()
    return kept


@pytest.mark.parametrize("family", ["clip", "biomedclip"])
def test_rollout_through_open_clip_and_timm_towers_equals_a_direct_loop(builders, family):
    model = builders(family, explainer="rollout")
    images = images_for(model)
    probabilities = probabilities_by_hooks(builders(family), images)
    tokens = probabilities[0].shape[-1]
    relevance = torch.eye(tokens, dtype=torch.float64).expand(len(images), tokens, tokens)
    for probs in probabilities:
        step = 0.5 * (probs.double().mean(1) + torch.eye(tokens, dtype=torch.float64))
        relevance = (step / step.sum(-1, keepdim=True)) @ relevance
    grid = model.explainer_method.tower.grid
    expected = relevance[:, 0, tokens - grid[0] * grid[1]:].unflatten(-1, grid)
    maps = explained_maps(model, images, CLASSES)
    for c in range(len(CLASSES)):
        torch.testing.assert_close(maps[:, c].double(), expected, rtol=1e-4, atol=1e-7)
