"""CheXzero through ``OpenCLIPModel`` (``configs/models/chexzero.yaml``, ``models/configs/chexzero.json``).

The shipped architecture against the authors' layout (``tests/data/chexzero_state_dict_manifest.json``,
their ``model.py`` on the meta device); scores, maps, tokens and model input against the authors' own
code on a seeded checkpoint of a tiny model of the same code (``tests/data/chexzero_reference.pt``, made
by ``tests/data/make_chexzero_reference.py``; see ``make_chexzero_reference.md``); loading a
released-style file (fp16/fp32 ``state_dict`` of OpenAI's ``clip`` model); bad input; the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

import chexzero_reference as ref
import xbench_pl
from test_cli import in_process
from xbench_pl.geometry import Preprocess
from xbench_pl.models.checkpoints import CheckpointError, load_weights
from xbench_pl.models.open_clip_model import OpenCLIPModel, build_open_clip, preprocess_for, read_architecture
from xbench_pl.registry import config_path

DATA = Path(__file__).resolve().parent / "data"
LABELS = list(ref.LABELS)


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(DATA / "chexzero_reference.pt", weights_only=True)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> tuple[str, str]:
    """(architecture JSON, checkpoint): the tiny model with the shipped preprocessing, and its seeded
    released-style checkpoint (``state_dict()`` with fp16 weights, as ``torch.save`` wrote it)."""
    folder = tmp_path_factory.mktemp("chexzero")
    shipped = json.loads((Path(xbench_pl.__file__).parent / "models" / "configs" / "chexzero.json").read_text())
    config = folder / "chexzero_tiny.json"
    config.write_text(json.dumps({"model_cfg": ref.model_cfg("tiny"), "preprocess_cfg": shipped["preprocess_cfg"]}))
    checkpoint = folder / "best_tiny.pt"
    torch.save(ref.state_dict("tiny", seed=0), checkpoint)
    return str(config), str(checkpoint)


@pytest.fixture(scope="module")
def tiny(tiny_files) -> OpenCLIPModel:
    architecture, checkpoint = tiny_files
    return xbench_pl.create_model("chexzero", architecture=architecture, checkpoint=checkpoint)


def model_input(model: OpenCLIPModel, grey_0_255: np.ndarray) -> torch.Tensor:
    return torch.stack([model.preprocess(image / 255)[0] for image in grey_0_255])


# -- architecture ----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["vit_b32", "tiny"])
def test_architecture_has_the_authors_layout(size):
    expected = ref.manifest()[size]
    model_cfg = read_architecture("chexzero")[0] if size == "vit_b32" else ref.model_cfg(size)
    with torch.device("meta"):
        model = build_open_clip(model_cfg)
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == {k: v[0] for k, v in expected["keys"].items()}
    assert sum(p.numel() for p in model.parameters()) == expected["parameters"]
    # a released file as is (meta tensors of the manifest's shapes and fp16/fp32 dtypes) passes the strict loader
    load_weights(model, {k: torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
                         for k, (shape, dtype) in expected["keys"].items()}, "best_64.pt")


def test_full_size_layout_is_a_vit_b32_with_a_7x7_grid_and_the_authors_preprocessing():
    keys = ref.manifest()["vit_b32"]["keys"]
    assert len(keys) == 302 and ref.manifest()["vit_b32"]["parameters"] == 151_277_313  # CLIP ViT-B/32
    assert keys["visual.conv1.weight"] == [[768, 3, 32, 32], "float16"]
    assert keys["token_embedding.weight"] == [[49408, 512], "float32"]
    init_args = yaml.safe_load(config_path("models", "chexzero").read_text())["init_args"]
    assert init_args["architecture"] == "chexzero" and init_args["score"] == "softmax_cosine"
    assert (init_args["positive"], init_args["negative"]) == ref.PAIR_TEMPLATE
    model_cfg, preprocess_cfg = read_architecture("chexzero")
    with torch.device("meta"):
        model = build_open_clip(model_cfg)
    assert model.visual.grid_size == (7, 7)
    assert preprocess_for(model, preprocess_cfg) == Preprocess(
        resize="letterbox_resize", size=224, canvas=320, interpolation="bicubic",
        mean=(ref.MEAN / 255,) * 3, std=(ref.STD / 255,) * 3, antialias=True)


# -- equal to the authors' code ----------------------------------------------------------------------
def test_checkpoint_loads_as_released(tiny):
    state = ref.state_dict("tiny", seed=0)
    assert {v.dtype for v in state.values()} == {torch.float16, torch.float32}
    loaded = tiny.model.state_dict()
    for key, value in state.items():
        assert loaded[key].dtype == torch.float32 and torch.equal(loaded[key], value.float()), key


def test_tokens_and_model_input_equal_the_authors(tiny, reference):
    assert list(reference["labels"]) == LABELS
    assert torch.equal(tiny.tokenizer(list(reference["prompts"])), reference["tokens"])
    pixels = model_input(tiny, ref.canvases(seed=0))
    assert pixels.shape == (2, 3, 224, 224) and torch.equal(pixels[:, 0], pixels[:, 2])
    # theirs: Normalize, then the bicubic resize; ours: resize, then normalise (equal up to float32 rounding)
    torch.testing.assert_close(pixels[:, 0], reference["model_input"], atol=2e-6, rtol=0)


def test_scores_and_maps_equal_the_authors(tiny, reference):
    out = tiny.zero_shot(model_input(tiny, ref.canvases(seed=0)), LABELS)
    scores_error = (out.scores - reference["scores"]).abs().max().item()
    maps_error = (out.saliency - reference["maps"]).abs().max().item()
    print(f"CheXzero vs the authors: scores {scores_error:.2e}, maps {maps_error:.2e}")
    assert out.saliency.shape == (2, len(LABELS), 7, 7)
    assert scores_error <= 1e-5 and maps_error <= 1e-6
    assert reference["scores"].std() > 0.01 and reference["maps"].std() > 0.05  # the comparison can fail
    # raw cosines: the model's logit scale (exp ~ 14) would give very different scores
    image, _ = tiny.encode_image(model_input(tiny, ref.canvases(seed=0)))
    torch.testing.assert_close(image, reference["image_embedding"], atol=1e-5, rtol=1e-5)
    scaled = (tiny.model.logit_scale.exp() * torch.einsum("bd,cpd->bcp", F.normalize(image, dim=-1),
                                                           tiny.text_embeddings(LABELS))).softmax(-1)[..., 0]
    assert (scaled - reference["scores"]).abs().max() > 0.05


def test_letterbox_of_an_original_is_close_to_the_authors_pil_step(tiny, reference):
    """Their 320 canvas: PIL LANCZOS on 8 bits, size ``int(x * ratio)``; ours: antialiased bicubic in float,
    ``round``. Same geometry here (400 x 300 -> 320 x 240, 40 rows of padding above and below)."""
    ours = model_input(tiny, ref.original()[None].astype(np.float32))[0, 0]
    theirs = model_input(tiny, reference["original_canvas"].numpy()[None].astype(np.float32))[0, 0]
    difference = (ours - theirs).abs() * ref.STD  # in 0-255 grey levels
    print(f"letterbox vs PIL: max {difference.max():.2f}, mean {difference.mean():.3f} grey levels")
    assert difference.mean() < 0.5 and difference.max() < 4
    assert tiny.preprocess.plan(*ref.ORIGINAL_SIZE)[1] == pytest.approx((0.56, 0.56, 0.0, 28.0))  # 0.8 to the canvas, x 0.7


# -- options and bad input -------------------------------------------------------------------------------
def test_softmax_cosine_needs_a_negative_prompt_and_is_listed(tiny_files):
    with pytest.raises(ValueError, match="score='softmax_cosine' needs negative"):
        OpenCLIPModel(tiny_files[0], random_init=True, negative=None, score="softmax_cosine")
    with pytest.raises(ValueError, match=r"score must be one of \['softmax', 'softmax_cosine', 'cosine'\]"):
        OpenCLIPModel(tiny_files[0], random_init=True, score="logits")


def test_unsupported_image_size_is_refused():
    with pytest.raises(ValueError, match=r"image_size=100: chexzero takes a positive multiple of its patch size \(32\)"):
        xbench_pl.create_model("chexzero", random_init=True, image_size=100)


def test_wrong_checkpoints_are_refused_naming_the_file(tiny_files, tmp_path):
    architecture, checkpoint = tiny_files
    with pytest.raises(ValueError, match="needs checkpoint="):
        xbench_pl.create_model("chexzero")
    state = ref.state_dict("tiny", seed=0)
    state["visual.proj"] = state["visual.proj"][:, :16]
    del state["logit_scale"]
    wrong = tmp_path / "best_wrong.pt"
    torch.save(state, wrong)
    with pytest.raises(CheckpointError, match=rf"checkpoint {wrong} does not fit.*missing keys: \[logit_scale\]"
                                              r".*visual.proj \(128, 16\) != \(128, 32\)"):
        xbench_pl.create_model("chexzero", architecture=architecture, checkpoint=str(wrong))
    not_weights = tmp_path / "best_64.pt"
    not_weights.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=str(not_weights)):
        xbench_pl.create_model("chexzero", architecture=architecture, checkpoint=str(not_weights))


def test_gradcam_explains_the_tiny_model(tiny_files):
    architecture, checkpoint = tiny_files
    model = xbench_pl.create_model("chexzero", architecture=architecture, checkpoint=checkpoint, explainer="gradcam")
    images = model_input(model, ref.canvases(seed=0))
    native = model.zero_shot(images, LABELS[:3])
    explained = model.explained(images, LABELS[:3])
    assert explained.saliency.shape == (2, 3, 7, 7) and torch.isfinite(explained.saliency).all()
    torch.testing.assert_close(explained.scores, native.scores)
    assert not torch.allclose(explained.saliency, native.saliency)


def test_random_init_builds_without_weights_and_warns(tiny_files, tiny):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="RANDOM weights"):
        model = xbench_pl.create_model("chexzero", architecture=tiny_files[0], random_init=True)
    assert model.random_weights and model.score == "softmax_cosine"
    assert not torch.equal(model.model.visual.proj, tiny.model.visual.proj)


def test_cli_runs_random_init_on_the_demo_data(tiny_files, tmp_path):
    """The registered name from the command line; the tiny architecture spares building ViT-B/32 (seconds)."""
    result = in_process("test", "--model", "chexzero", "--model.random_init", "true", "--model.architecture",
                        tiny_files[0], "--data", "demo", "--trainer.accelerator", "cpu", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RANDOM weights" in result.stderr
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["model"] == "chexzero" and report["config"]["model"]["init_args"]["score"] == "softmax_cosine"
    demo = report["datasets"]["demo"]
    assert demo["problems"] == [] and demo["mean"]["n_regions"] == 12
    for key in ("pointing_game", "auroc"):
        assert np.isfinite(demo["mean"][key]), key
