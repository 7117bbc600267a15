"""RadZero: the released layout (full size, meta device) against the authors' classes, equality with the authors'
code on seeded tiny towers, the pinned DINOv2 position interpolation, prompts and free text, wrong files,
refused sizes, random_init and the CLI.

``tests/data/radzero_reference.pt`` holds the authors' outputs on ``radzero_reference.state_dict(seed=0)``
(tiny DINOv2, tiny MPNet, tiny alignment layers; see ``make_radzero_reference.md``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings

import radzero_reference as rr
from test_cli import in_process
from xbench_pl.models.checkpoints import CheckpointError
from xbench_pl.models.radzero import RadZero, checkpoint_filter_fn
from xbench_pl.data.base import Phrase
from xbench_pl.registry import read_config

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SCORE_TOLERANCE, MAP_TOLERANCE = 1e-5, 1e-6


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The tiny architecture JSON, and a Deepnoid/RadZero-like folder: seeded weights + tokenizer files."""
    root = tmp_path_factory.mktemp("radzero")
    architecture = root / "radzero-tiny.json"
    architecture.write_text(json.dumps(rr.tiny_architecture(rr.write_tower_folders(root / "towers"))))
    release = rr.write_tokenizer_folder(root / "RadZero")
    save_file(rr.state_dict(seed=0), str(release / "model.safetensors"))
    return {"architecture": str(architecture), "release": str(release), "weights": str(release / "model.safetensors")}


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(DATA / "radzero_reference.pt", weights_only=True)


@pytest.fixture(scope="module")
def model(files) -> RadZero:
    torch.manual_seed(123)  # the weights come from the file: the global seed must not matter
    return RadZero(files["architecture"], checkpoint=files["release"])  # tokenizer: the checkpoint folder


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


# -- the released layout, full size ----------------------------------------------------------------
def test_full_size_layout_is_the_authors(files):
    """Every key and shape of the authors' CxrAlignModel (radzero.yaml, built on meta by their classes) maps onto
    the shipped architecture; only the MPNet pooler is left out, as declared."""
    spec = rr.manifest("radzero_checkpoint_manifest.json")
    assert spec["versions"]["transformers"] == "4.39.3" and spec["parameters"]["total"] == 209_392_513
    with torch.device("meta"):
        full = RadZero(random_init=True, text=files["release"])
    released = {k: torch.empty(shape, dtype=getattr(torch, dtype), device="meta") for k, (shape, dtype) in spec["keys"].items()}
    state = checkpoint_filter_fn(released, "manifest")
    ours = full.state_dict()
    ignored = sorted(state.keys() - ours.keys())
    assert state.keys() >= ours.keys(), sorted(ours.keys() - state.keys())
    assert ignored == ["text.pooler.dense.bias", "text.pooler.dense.weight"]
    assert all(any(re.search(p, k) for p in RadZero.IGNORE_UNEXPECTED) for k in ignored)
    assert [k for k in ours if state[k].shape != ours[k].shape] == []
    pooler = sum(state[k].numel() for k in ignored)
    assert sum(p.numel() for p in full.parameters()) == spec["parameters"]["total"] - pooler == 208_801_921
    assert full.grid == (37, 37) and full.image.embeddings.position_embeddings.shape[1] == 16 * 16 + 1


# -- equality with the authors' code (tiny towers) --------------------------------------------------
def test_tokens_and_embeddings_equal_the_authors(model, reference):
    classes = list(rr.CLASSES)
    assert [model.prompt_for(c) for c in classes] == reference["prompts"]
    tokens = model.tokenize(reference["prompts"])
    assert torch.equal(tokens["input_ids"], reference["input_ids"])
    assert torch.equal(tokens["attention_mask"], reference["attention_mask"])
    with torch.no_grad():
        assert max_diff(model.encode_text(reference["prompts"]), reference["text_features"]) <= SCORE_TOLERANCE
        assert max_diff(model.image_tokens(rr.reference_images(seed=0)), reference["vision_tokens"]) <= SCORE_TOLERANCE
    assert max_diff(model.log_temperature.exp(), reference["temperature"]) == 0


def test_scores_logits_and_maps_equal_the_authors(model, reference):
    images = rr.reference_images(seed=0)
    out = model.zero_shot(images, list(rr.CLASSES))
    assert out.scores.shape == out.logits.shape == (2, 5) and out.saliency.shape == (2, 5, rr.GRID, rr.GRID)
    assert max_diff(out.logits, reference["logits"]) <= SCORE_TOLERANCE
    assert max_diff(out.scores, torch.sigmoid(reference["logits"])) <= SCORE_TOLERANCE
    # the map on the patch grid: their similarity_scores through the sigmoid their map functions apply
    their_grid = torch.sigmoid(reference["similarity_scores"]).unflatten(-1, (rr.GRID, rr.GRID))
    assert max_diff(out.saliency, their_grid) <= MAP_TOLERANCE
    # their pixel map (interpolate_similarity_scores to the image, then sigmoid) from our grid: same orientation
    scores = model.similarities(images, tuple(reference["prompts"]))["scores"].unflatten(-1, (rr.GRID, rr.GRID))
    pixels = torch.sigmoid(F.interpolate(scores, size=(rr.IMAGE_SIZE,) * 2, mode="bilinear", align_corners=False))
    assert max_diff(pixels, reference["pixel_maps"]) <= MAP_TOLERANCE
    assert out.scores.std() > 1e-2 and (their_grid.amax((-2, -1)) - their_grid.amin((-2, -1))).min() > 1e-2  # not flat


def test_position_grid_is_resized_as_the_authors_pin(model, reference):
    """transformers 4.39 resizes DINOv2's position grid by a scale factor, today's by a target size: the maps
    differ, and only the pinned resize matches the authors'."""
    images = rr.reference_images(seed=0)
    stock = Dinov2Embeddings(model.image.config)
    stock.load_state_dict(model.image.embeddings.state_dict())
    pinned = model.image.embeddings
    try:
        model.image.embeddings = stock
        model._text_cache.clear()
        today = model.zero_shot(images, list(rr.CLASSES)).saliency
    finally:
        model.image.embeddings = pinned
    their_grid = torch.sigmoid(reference["similarity_scores"]).unflatten(-1, (rr.GRID, rr.GRID))
    assert max_diff(today, their_grid) > 100 * MAP_TOLERANCE
    assert max_diff(model.zero_shot(images, list(rr.CLASSES)).saliency, their_grid) <= MAP_TOLERANCE


def test_outputs_do_not_depend_on_the_batch(model):
    images = rr.reference_images(seed=0)
    both = model.zero_shot(images, list(rr.CLASSES))
    one = model.zero_shot(images[1:], list(rr.CLASSES[::-1]))
    torch.testing.assert_close(one.logits, both.logits[1:].flip(-1), rtol=0, atol=SCORE_TOLERANCE)
    torch.testing.assert_close(one.saliency, both.saliency[1:].flip(1), rtol=0, atol=MAP_TOLERANCE)


# -- prompts, cache ----------------------------------------------------------------------------------
def test_prompts_finding_names_and_free_text(files):
    model = RadZero(files["architecture"], random_init=True, text=files["release"], texts={"Mass": "A large mass"})
    assert model.prompt_for("Effusion") == "There is Pleural Effusion"  # canonical name, their ChestX-Det10 spelling
    assert model.prompt_for("Calcification") == "There is Tissue Calcification"
    assert model.prompt_for("Pneumothorax") == "There is Pneumothorax"
    assert model.prompt_for("Mass") == "A large mass"
    assert model.prompt_for("left basal opacity") == "left basal opacity"  # a phrase: embedded as it is
    assert model.prompt_for(Phrase("opacity")) == "opacity"  # a dataset's phrase, though it spells a finding
    assert model.prompt_for("opacity") == "There is COVID-19 Opacity"  # a finding's name (COVID-R LabelMe's spelling)
    images = torch.randn(2, 3, rr.IMAGE_SIZE, rr.IMAGE_SIZE, generator=torch.Generator().manual_seed(1))
    phrased = model.zero_shot(images, ["Nodule", Phrase("left basal opacity")])  # a phrase set: cached text by text
    assert {texts for texts, _ in model._text_cache} >= {(model.prompt_for("Nodule"),), ("left basal opacity",)}
    plain = model.zero_shot(images, ["Nodule", "left basal opacity"])
    torch.testing.assert_close(phrased.saliency, plain.saliency, rtol=0, atol=1e-6)
    model._text_cache.clear()
    out = model.zero_shot(torch.randn(1, 3, rr.IMAGE_SIZE, rr.IMAGE_SIZE), ["Nodule", "left basal opacity"])
    assert len(model._text_cache) == 1
    again = model.zero_shot(torch.randn(1, 3, rr.IMAGE_SIZE, rr.IMAGE_SIZE), ["Nodule", "left basal opacity"])
    assert len(model._text_cache) == 1 and out.scores.shape == again.scores.shape == (1, 2)
    model.load_state_dict(model.state_dict())
    assert not model._text_cache


# -- files and sizes -----------------------------------------------------------------------------------
def test_checkpoint_file_or_folder_and_round_trip(files, model):
    from_file = RadZero(files["architecture"], checkpoint=files["weights"], text=files["release"])
    for key, value in model.state_dict().items():
        assert torch.equal(from_file.state_dict()[key], value), key
    assert not from_file.random_weights


def test_wrong_checkpoints_name_the_file(files, tmp_path):
    clip = tmp_path / "clip.safetensors"
    save_file({"visual.conv1.weight": torch.zeros(1), "visual.proj": torch.zeros(1)}, str(clip))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(clip))} is not a RadZero checkpoint.*looks like a CLIP.*Deepnoid/RadZero"):
        RadZero(files["architecture"], checkpoint=str(clip), text=files["release"])
    state = rr.state_dict(seed=0)
    del state["loss_fns.RadZeroLoss.layer_norm.bias"]
    state["vision_model.embeddings.position_embeddings"] = torch.zeros(1, 50, 32)
    bad = tmp_path / "bad.safetensors"
    save_file(state, str(bad))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(bad))} does not fit.*missing keys: \[norm\.bias\].*"
                                              r"image\.embeddings\.position_embeddings \(1, 50, 32\) != \(1, 17, 32\)"):
        RadZero(files["architecture"], checkpoint=str(bad), text=files["release"])
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(Path(files["weights"]).read_bytes()[:3000])
    with pytest.raises(CheckpointError, match=rf"cannot read checkpoint {re.escape(str(truncated))}"):
        RadZero(files["architecture"], checkpoint=str(truncated), text=files["release"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds none of \['model\.safetensors', 'pytorch_model\.bin'\]"):
        RadZero(files["architecture"], checkpoint=str(tmp_path / "empty"), text=files["release"])
    with pytest.raises(ValueError, match=r"needs checkpoint=.*Deepnoid/RadZero"):
        RadZero(files["architecture"], text=files["release"])
    with pytest.raises(ValueError, match="would download"):
        RadZero(files["architecture"], checkpoint="https://huggingface.co/Deepnoid/RadZero", text=files["release"])


def test_tokenizer_folder_is_required(files, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")  # with a checkpoint the text folder is required (random_init: a stand-in)
    with pytest.raises(FileNotFoundError, match=r"needs the MPNet tokenizer.*text=None"):
        RadZero(files["architecture"], checkpoint=str(tmp_path / "model.safetensors"))
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"lacks \[.vocab\.txt or tokenizer\.json.\]"):
        RadZero(files["architecture"], random_init=True, text=str(tmp_path / "cfg"))


def test_unsupported_sizes_are_refused(files):
    with pytest.raises(ValueError, match=r"RadZero cannot run at image_size=512: it exists at \[518\] px only"):
        RadZero(random_init=True, text=files["release"], image_size=512)
    model = RadZero(files["architecture"], random_init=True, text=files["release"])
    with pytest.raises(ValueError, match=r"expects 28 x 28 inputs, got \(32, 32\)"):
        model.zero_shot(torch.randn(1, 3, 32, 32), ["Nodule"])


def test_registered_preprocessing():
    cls, init = read_config("models", "radzero")
    assert cls is RadZero and init["architecture"] == "radzero" and init["checkpoint"] is None
    config = json.loads((REPO / "xbench_pl/models/configs/radzero.json").read_text())
    assert config["preprocess"] == {"resize": "squash", "size": 518, "interpolation": "bicubic", "antialias": True,
                                    "mean": list(rr.CLIP_MEAN), "std": list(rr.CLIP_STD)}
    assert config["prompt"] == "There is {}"


# -- random_init and the CLI -----------------------------------------------------------------------
def test_random_init_is_deterministic_and_flagged(files):
    a = RadZero(files["architecture"], random_init=True, text=files["release"])
    b = RadZero(files["architecture"], random_init=True, text=files["release"])
    assert a.random_weights and all(torch.equal(b.state_dict()[k], v) for k, v in a.state_dict().items())
    out = a.zero_shot(torch.randn(3, 3, rr.IMAGE_SIZE, rr.IMAGE_SIZE), ["Pneumonia", "Cardiomegaly"])
    assert out.scores.shape == (3, 2) and out.saliency.shape == (3, 2, rr.GRID, rr.GRID)
    assert ((out.saliency > 0) & (out.saliency < 1)).all() and torch.equal(out.scores, torch.sigmoid(out.logits))


def test_cli_random_init_on_the_demo(files, tmp_path):
    result = in_process("test", "--model", "radzero", "--model.random_init", "true", "--model.architecture", files["architecture"],
                        "--model.text", files["release"], "--data", "demo", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["random_weights"] is True
    assert report["config"]["model"]["class_path"] == "xbench_pl.models.radzero.RadZero"
    mean = report["datasets"]["demo"]["mean"]
    assert 0.0 <= mean["auroc"] <= 1.0 and 0.0 <= mean["pointing_game"] <= 1.0
    assert "RANDOM weights" in result.stdout + result.stderr


def test_cli_refuses_other_sizes_in_one_line(files, tmp_path):
    result = in_process("test", "--model", "radzero", "--model.random_init", "true", "--model.text", files["release"],
                        "--model.image_size", "224", "--data", "demo", "--out", str(tmp_path))
    assert result.returncode != 0 and "RadZero cannot run at image_size=224" in result.stderr


# -- explainers ------------------------------------------------------------------------------------
def test_gradcam_explains_the_dinov2_tower_and_rollout_refuses_in_one_line(files):
    model = RadZero(files["architecture"], checkpoint=files["release"], explainer="gradcam")
    assert model.explainer_info["target_layer"] == f"image.encoder.layer.{len(model.image.encoder.layer) - 1}.norm1"
    images = torch.randn(2, 3, model.preprocess.size, model.preprocess.size, generator=torch.Generator().manual_seed(0))
    classes = ["Pneumothorax", "small left apical pneumothorax"]
    native = model.zero_shot(images, classes)
    explained = model.explained(images, classes)
    assert explained.saliency.shape == (2, 2, *model.grid)
    assert torch.allclose(explained.scores, native.scores, atol=1e-5)
    assert not torch.allclose(explained.saliency, native.saliency)
    for name in ("rollout", "chefer"):
        with pytest.raises(ValueError, match="do not record in this model's ViT"):
            RadZero(files["architecture"], checkpoint=files["release"], explainer=name)
