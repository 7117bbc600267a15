"""CLIP / BiomedCLIP / open_clip models: architecture vs the released checkpoints' layouts,
checkpoint formats and errors, preprocessing parity with open_clip, saliency and scores vs a
direct computation, prompt caching, mixed precision, and an end-to-end run on the demo data.

Behaviour is tested on tiny random-init instances of the real architectures (open_clip ViT with
QuickGELU; timm ``test_vit`` + Hugging Face BERT for the BiomedCLIP layout); the real sizes are
only built on the ``meta`` device.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import lightning as L
import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
import transformers
import yaml
from open_clip.tokenizer import HFTokenizer
from PIL import Image

import xbench_pl
from xbench_pl.data.io import read_image
from xbench_pl.geometry import Preprocess, eval_pixel_centres, warp_to_eval_grid
from xbench_pl.models.checkpoints import CheckpointError
from xbench_pl.models.open_clip_model import OpenCLIPModel, build_open_clip, preprocess_for, read_architecture
from xbench_pl.registry import config_path
from xbench_pl.models.prompts import PromptSet, TextEmbeddingCache, fill

DATA = Path(__file__).resolve().parent / "data"
CLASSES = ["Atelectasis", "Pleural Effusion", "Nodule"]
PREPROCESS_CFG = {"mean": list(open_clip.OPENAI_DATASET_MEAN), "std": list(open_clip.OPENAI_DATASET_STD)}

TINY_CLIP = {  # OpenAI CLIP layout at toy size: 32 px, patch 8 -> 4 x 4 grid
    "embed_dim": 16,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "no", "there", "is", "of", "a", "photo", "atelectasis",
              "pleural", "effusion", "nodule", *"abcdefghijklmnopqrstuvwxyz", *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz")]


# -- fixtures ----------------------------------------------------------------------------------
def write_config(path: Path, model_cfg: dict) -> str:
    path.write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": PREPROCESS_CFG}))
    return str(path)


@pytest.fixture(scope="module")
def tiny_clip_config(tmp_path_factory) -> str:
    return write_config(tmp_path_factory.mktemp("clip") / "tiny_clip.json", TINY_CLIP)


@pytest.fixture(scope="module")
def biomedclip_folder(tmp_path_factory) -> Path:
    """A folder laid out like the BiomedCLIP release (config, weights, tokenizer files), at toy size."""
    folder = tmp_path_factory.mktemp("biomedclip")
    bert = folder / "bert"
    transformers.BertConfig(vocab_size=len(BERT_VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64, pad_token_id=0).save_pretrained(bert)
    (folder / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    model_cfg = {
        "embed_dim": 16,
        "vision_cfg": {"timm_model_name": "test_vit", "timm_pool": "", "timm_proj": "linear", "image_size": 160},
        "text_cfg": {"hf_model_name": "bert", "hf_tokenizer_name": "bert", "hf_proj_type": "mlp",
                     "hf_pooler_type": "cls_last_hidden_state_pooler", "context_length": 16},
    }
    write_config(folder / "open_clip_config.json", model_cfg)
    torch.manual_seed(1)
    torch.save(build_open_clip(read_architecture(str(folder))[0]).state_dict(), folder / "open_clip_pytorch_model.bin")
    return folder


@pytest.fixture(scope="module")
def tiny_clip(tiny_clip_config) -> OpenCLIPModel:
    torch.manual_seed(0)
    return OpenCLIPModel(tiny_clip_config, random_init=True)


def open_clip_reference(model_cfg: dict, state: dict) -> torch.nn.Module:
    """Plain open_clip model (no xbench code in its forward) holding the same weights."""
    reference = build_open_clip(model_cfg)
    reference.load_state_dict(state)
    return reference.eval()


# -- architecture vs the released checkpoints ---------------------------------------------------
@pytest.mark.parametrize(
    "architecture, manifest, parameters_m, published_shapes",
    [
        ("clip-ViT-B-16", "clip_vit_b16", 149.6, {
            "visual.conv1.weight": [768, 3, 16, 16], "visual.class_embedding": [768],
            "visual.positional_embedding": [197, 768], "visual.proj": [768, 512], "token_embedding.weight": [49408, 512],
            "positional_embedding": [77, 512], "text_projection": [512, 512], "logit_scale": []}),
        ("biomedclip", "biomedclip", 195.9, {
            "visual.trunk.pos_embed": [1, 197, 768], "visual.head.proj.weight": [512, 768],
            "text.transformer.embeddings.word_embeddings.weight": [30522, 768],
            "text.proj.0.weight": [640, 768], "text.proj.2.weight": [512, 640], "logit_scale": []}),
    ],
)
def test_shipped_architecture_matches_released_checkpoint_layout(architecture, manifest, parameters_m, published_shapes):
    with torch.device("meta"):
        model = build_open_clip(read_architecture(architecture)[0])
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    expected = json.loads((DATA / f"{manifest}_state_dict_manifest.json").read_text())
    assert shapes == expected["keys"]
    for key, shape in published_shapes.items():  # models.md, from the authors' code and model card
        assert shapes[key] == shape, key
    assert "visual.conv1.bias" not in shapes and "visual.head.proj.bias" not in shapes
    assert not any(k.startswith("text.transformer.pooler") for k in shapes)  # BiomedCLIP's BERT has no pooler
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(parameters_m, abs=0.05)


@pytest.mark.parametrize("name", ["clip", "biomedclip"])
def test_registered_models_preprocess_as_trained_with_a_14x14_grid(name):
    architecture = yaml.safe_load(config_path("models", name).read_text())["init_args"]["architecture"]
    model_cfg, preprocess_cfg = read_architecture(architecture)
    with torch.device("meta"):
        model = build_open_clip(model_cfg)
    assert preprocess_for(model, preprocess_cfg) == Preprocess(
        resize="crop", size=224, interpolation="bicubic", mean=open_clip.OPENAI_DATASET_MEAN,
        std=open_clip.OPENAI_DATASET_STD, antialias=True)
    visual = model.visual
    grid = visual.trunk.patch_embed.grid_size if hasattr(visual, "trunk") else visual.grid_size
    assert tuple(grid) == (14, 14)


# -- preprocessing -----------------------------------------------------------------------------
def test_preprocessing_matches_open_clip_transform(real_cxr):
    """Ours (grey float, antialiased bicubic) vs open_clip's PIL transform on real X-rays, in [0, 1] pixel units."""
    with torch.device("meta"):
        model_cfg, preprocess_cfg = read_architecture("clip-ViT-B-16")
        model = build_open_clip(model_cfg)
    ours = preprocess_for(model, preprocess_cfg)
    theirs = open_clip.image_transform(224, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN, std=open_clip.OPENAI_DATASET_STD)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD).view(3, 1, 1)
    files = sorted(glob.glob(str(real_cxr / "chexlocalize" / "valid" / "**" / "*.jpg"), recursive=True))
    files += sorted(glob.glob(str(real_cxr / "nih_bbox" / "images" / "*.png")))
    assert len(files) >= 4
    shapes, worst_max, worst_mean = set(), 0.0, 0.0
    for file in files:
        grey = np.round(read_image(file) * 255).astype(np.uint8)
        shapes.add(grey.shape[0] == grey.shape[1])
        mine, _ = ours(grey.astype(np.float32) / 255)
        reference = theirs(Image.fromarray(grey).convert("RGB"))
        difference = (mine - reference).abs() * std
        worst_max, worst_mean = max(worst_max, difference.max().item()), max(worst_mean, difference.mean().item())
    print(f"preprocessing vs open_clip: max |diff| {worst_max:.4f}, worst mean |diff| {worst_mean:.5f} (pixel units)")
    assert shapes == {True, False}  # square NIH and non-square CheXpert frames (the crop path)
    assert worst_mean < 0.002  # PIL rounds its output to uint8: 0.25/255 ~ 0.001 mean on its own
    assert worst_max < 0.1


def test_saliency_maps_back_onto_the_original_frame():
    """A map equal to the model input, warped back through the affine, reproduces the original image."""
    with torch.device("meta"):
        model_cfg, preprocess_cfg = read_architecture("clip-ViT-B-16")
        preprocess = preprocess_for(build_open_clip(model_cfg), preprocess_cfg)
    height, width = 300, 420  # landscape: the crop drops the left and right margins
    yy, xx = np.mgrid[0:height, 0:width] + 0.5
    image = (0.5 + 0.25 * np.sin(xx / 37.0) * np.cos(yy / 23.0)).astype(np.float32)
    pixels, affine = preprocess(image)
    grey = pixels[0] * preprocess.std[0] + preprocess.mean[0]
    eval_size = 60
    warped = warp_to_eval_grid(grey[None], affine[None], preprocess.size, torch.tensor([[height, width]]), eval_size)[0]
    xs, ys = eval_pixel_centres(torch.tensor([[height, width]]), eval_size)
    truth = 0.5 + 0.25 * np.sin(xs[0].numpy()[None, :] / 37.0) * np.cos(ys[0].numpy()[:, None] / 23.0)
    margin = (width - height) / 2
    seen = (xs[0] > margin + 2) & (xs[0] < width - margin - 2)
    assert np.abs(warped.numpy() - truth)[:, seen.numpy()].max() < 0.01
    assert (warped[:, ~seen.numpy() & ((xs[0] < margin - 2) | (xs[0] > width - margin + 2)).numpy()] == grey.min()).all()


# -- saliency and scores -------------------------------------------------------------------------
def test_clip_saliency_and_scores_equal_direct_computation(tiny_clip):
    reference = open_clip_reference(TINY_CLIP, tiny_clip.model.state_dict())
    images = torch.randn(3, 3, 32, 32)
    out = tiny_clip.zero_shot(images, CLASSES)
    assert out.scores.shape == (3, 3) and out.saliency.shape == (3, 3, 4, 4)

    with torch.no_grad():
        visual = reference.visual
        x = visual.conv1(images).flatten(2).transpose(1, 2)
        x = torch.cat([visual.class_embedding.expand(3, 1, -1), x], dim=1) + visual.positional_embedding
        x = visual.ln_post(visual.transformer(visual.ln_pre(x)))
        patches = F.normalize(x[:, 1:] @ visual.proj, dim=-1)
        image = reference.encode_image(images, normalize=True)
        positive = reference.encode_text(open_clip.tokenize(CLASSES), normalize=True)
        negative = reference.encode_text(open_clip.tokenize([f"no {c}" for c in CLASSES]), normalize=True)
    expected_maps = torch.einsum("bnd,cd->bcn", patches, positive).reshape(3, 3, 4, 4)  # row-major: row = y
    torch.testing.assert_close(out.saliency, expected_maps, atol=1e-5, rtol=1e-5)
    logits = reference.logit_scale.exp() * torch.stack((image @ positive.T, image @ negative.T), dim=-1)
    torch.testing.assert_close(out.scores, logits.softmax(-1)[..., 0], atol=1e-5, rtol=1e-5)
    assert ((out.scores >= 0) & (out.scores <= 1)).all()


def test_biomedclip_layout_saliency_and_scores_equal_direct_computation(biomedclip_folder):
    model = OpenCLIPModel(str(biomedclip_folder), checkpoint=str(biomedclip_folder))  # config, weights, tokenizer: one folder
    assert model.preprocess.size == 160
    reference = open_clip_reference(read_architecture(str(biomedclip_folder))[0], model.model.state_dict())
    images = torch.randn(2, 3, 160, 160)
    out = model.zero_shot(images, CLASSES)
    assert out.saliency.shape == (2, 3, 10, 10)

    tokenizer = HFTokenizer(str(biomedclip_folder), context_length=16)
    with torch.no_grad():
        tokens = reference.visual.trunk.forward_features(images)  # normed by the trunk
        patches = F.normalize(tokens[:, 1:] @ reference.visual.head.proj.weight.T, dim=-1)
        image = reference.encode_image(images, normalize=True)
        positive = reference.encode_text(tokenizer(CLASSES), normalize=True)
        negative = reference.encode_text(tokenizer([f"no {c}" for c in CLASSES]), normalize=True)
    expected_maps = torch.einsum("bnd,cd->bcn", patches, positive).reshape(2, 3, 10, 10)
    torch.testing.assert_close(out.saliency, expected_maps, atol=1e-5, rtol=1e-5)
    logits = reference.logit_scale.exp() * torch.stack((image @ positive.T, image @ negative.T), dim=-1)
    torch.testing.assert_close(out.scores, logits.softmax(-1)[..., 0], atol=1e-5, rtol=1e-5)


def test_cosine_score_mode(tiny_clip_config, tiny_clip):
    model = OpenCLIPModel(tiny_clip_config, random_init=True, negative=None, score="cosine")
    model.model.load_state_dict(tiny_clip.model.state_dict())
    images = torch.randn(2, 3, 32, 32)
    image, _ = model.encode_image(images)
    expected = (1 + F.normalize(image, dim=-1) @ model.text_embeddings(CLASSES)[:, 0].T) / 2
    torch.testing.assert_close(model.zero_shot(images, CLASSES).scores, expected)
    with pytest.raises(ValueError, match="needs negative"):
        OpenCLIPModel(tiny_clip_config, random_init=True, negative=None)


def test_mixed_precision_matches_float32(tiny_clip):
    images = torch.randn(2, 3, 32, 32)
    full = tiny_clip.zero_shot(images, CLASSES)
    tiny_clip.text_cache.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = tiny_clip.zero_shot(images, CLASSES)
    tiny_clip.text_cache.clear()
    assert half.scores.dtype == half.saliency.dtype == torch.float32
    torch.testing.assert_close(half.scores, full.scores, atol=0.03, rtol=0)
    torch.testing.assert_close(half.saliency, full.saliency, atol=0.05, rtol=0)


# -- prompts and the text-embedding cache --------------------------------------------------------
def test_prompt_templates():
    assert fill("{}", "Nodule") == "Nodule" and fill("There is no {finding}", "Nodule") == "There is no Nodule"
    with pytest.raises(ValueError, match="template"):
        PromptSet(("{name} here",))
    prompts = PromptSet(("{}", "a {}"), ("no {}",))
    assert prompts.texts(["A", "B"]) == ["A", "a A", "no A", "B", "a B", "no B"]


def test_text_embedding_cache_encodes_each_prompt_once_in_batches():
    calls: list[list[str]] = []

    def encode(texts: list[str]) -> torch.Tensor:
        calls.append(texts)
        return torch.stack([torch.tensor([len(t), t.count("a"), 1.0]) for t in texts])

    cache, prompts = TextEmbeddingCache(batch_size=4), PromptSet(("{}", "a {}"), ("no {}",))
    first = cache.get(prompts, ["x", "yy", "zzz"], torch.device("cpu"), encode)
    again = cache.get(prompts, ["x", "yy", "zzz"], torch.device("cpu"), encode)
    assert again is first and [len(c) for c in calls] == [4, 4, 1]  # 9 prompts, batches of 4, encoded once
    assert first.shape == (3, 2, 3)
    ensemble = F.normalize(encode(["yy"]), dim=-1) + F.normalize(encode(["a yy"]), dim=-1)
    torch.testing.assert_close(first[1, 0], F.normalize(ensemble, dim=-1)[0])
    cache.get(PromptSet(("There is {}",), ("There is no {}",)), ["x", "yy", "zzz"], torch.device("cpu"), encode)
    assert len(cache) == 2


def test_model_caches_text_embeddings(tiny_clip_config, monkeypatch):
    model = OpenCLIPModel(tiny_clip_config, random_init=True, positive=["{}", "There is {finding}"], negative="There is no {}")
    encoded: list[int] = []
    original = model.encode_text
    monkeypatch.setattr(model, "encode_text", lambda texts: encoded.append(len(texts)) or original(texts))
    for _ in range(3):
        model.zero_shot(torch.randn(2, 3, 32, 32), CLASSES)
    assert encoded == [9]  # 3 classes x (2 positive + 1 negative) prompts, one batch, once


# -- checkpoints ---------------------------------------------------------------------------------
def outputs_equal(a: OpenCLIPModel, b: OpenCLIPModel) -> None:
    images = torch.randn(2, 3, 32, 32)
    first, second = a.zero_shot(images, CLASSES), b.zero_shot(images, CLASSES)
    torch.testing.assert_close(first.scores, second.scores)
    torch.testing.assert_close(first.saliency, second.saliency)


@pytest.mark.parametrize("layout", ["state_dict", "training_checkpoint", "safetensors", "folder"])
def test_checkpoint_round_trip(tiny_clip, tiny_clip_config, tmp_path, layout):
    state = tiny_clip.model.state_dict()
    if layout == "state_dict":
        path = tmp_path / "model.pt"
        torch.save(state, path)
    elif layout == "training_checkpoint":  # open_clip's training script: DDP prefix, epoch, optimizer
        path = tmp_path / "epoch_1.pt"
        torch.save({"epoch": 1, "name": "run", "state_dict": {f"module.{k}": v for k, v in state.items()}}, path)
    elif layout == "safetensors":
        from safetensors.torch import save_file

        path = tmp_path / "open_clip_model.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, tmp_path / "open_clip_pytorch_model.bin")
        path = tmp_path
    loaded = OpenCLIPModel(tiny_clip_config, checkpoint=str(path))
    for key, value in state.items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    outputs_equal(tiny_clip, loaded)


@pytest.mark.filterwarnings("ignore:`torch.jit.(script|save)` is deprecated")  # OpenAI's archives are TorchScript
def test_openai_torchscript_archive(tiny_clip, tiny_clip_config, tmp_path):
    """A JIT archive with OpenAI's layout: fp16 weights plus input_resolution/context_length/vocab_size entries.

    OpenAI's own archive cannot be rebuilt here; this one is scripted from open_clip's CLIP, whose
    parameter names are OpenAI's, so it exercises the same loader path (torch.jit.load -> state_dict).
    """
    jit_model = open_clip_reference(TINY_CLIP, tiny_clip.model.state_dict())
    for name, value in (("input_resolution", 32), ("context_length", 77), ("vocab_size", 49408)):
        vars(jit_model).pop(name, None)  # open_clip keeps two of them as plain ints
        jit_model.register_buffer(name, torch.tensor(value))
    path = tmp_path / "ViT-B-16.pt"
    torch.jit.save(torch.jit.script(jit_model.half()), str(path))
    loaded = OpenCLIPModel(tiny_clip_config, checkpoint=str(path))
    for key, value in tiny_clip.model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[key], value.half().float(), msg=key)
    assert loaded.model.visual.proj.dtype == torch.float32


def test_wrong_checkpoint_lists_missing_unexpected_and_misshaped_keys(tiny_clip, tiny_clip_config, tmp_path):
    state = dict(tiny_clip.model.state_dict())
    del state["visual.proj"]
    state["visual.extra_head.weight"] = torch.zeros(2)
    state["token_embedding.weight"] = torch.zeros(100, 32)
    path = tmp_path / "wrong.bin"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as error:
        OpenCLIPModel(tiny_clip_config, checkpoint=str(path))
    message = str(error.value)
    assert str(path) in message
    assert "1 missing keys: [visual.proj]" in message
    assert "1 unexpected keys: [visual.extra_head.weight]" in message
    assert "token_embedding.weight (100, 32) != (49408, 32)" in message


def test_other_architectures_weights_are_rejected(biomedclip_folder, tiny_clip_config):
    with pytest.raises(CheckpointError, match=r"61 missing keys: \[ln_final.bias.*118 unexpected keys: \[text.proj.0.weight"
                                               r".*another architecture"):
        OpenCLIPModel(tiny_clip_config, checkpoint=str(biomedclip_folder / "open_clip_pytorch_model.bin"))


def test_truncated_and_missing_checkpoints(tiny_clip, tiny_clip_config, tmp_path):
    path = tmp_path / "open_clip_pytorch_model.bin"
    torch.save(tiny_clip.model.state_dict(), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint {path}.*truncated"):
        OpenCLIPModel(tiny_clip_config, checkpoint=str(path))
    with pytest.raises(FileNotFoundError, match="checkpoint not found: .*nowhere.bin"):
        OpenCLIPModel(tiny_clip_config, checkpoint=str(tmp_path / "nowhere.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint in folder .*empty.*open_clip_pytorch_model.bin"):
        OpenCLIPModel(tiny_clip_config, checkpoint=str(tmp_path / "empty"))


def test_nothing_downloads(biomedclip_folder, tiny_clip_config, tmp_path):
    with pytest.raises(ValueError, match="would download.*ViT-B-16.pt.*open_clip_pytorch_model.bin.*vocab.txt"):
        xbench_pl.create_model("clip", checkpoint="openai")
    with pytest.raises(ValueError, match="would download"):
        OpenCLIPModel("hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224", random_init=True)
    with pytest.raises(ValueError, match="needs checkpoint=.*ViT-B-16.pt"):
        xbench_pl.create_model("clip")
    with pytest.raises(FileNotFoundError, match="tokenizer of .*vocab.txt"):  # weights alone: the tokenizer is missing
        OpenCLIPModel(str(biomedclip_folder), checkpoint=str(biomedclip_folder / "open_clip_pytorch_model.bin"))
    config = json.loads((biomedclip_folder / "open_clip_config.json").read_text())
    config["model_cfg"]["text_cfg"]["hf_model_name"] = "someone/unknown-bert"
    (tmp_path / "open_clip_config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="'someone/unknown-bert'.*config.json"):
        OpenCLIPModel(str(tmp_path), random_init=True)
    with pytest.raises(ValueError, match="unknown architecture 'ViT-Nope'"):
        OpenCLIPModel("ViT-Nope", random_init=True)


def test_registered_configs_build(tiny_clip, tiny_clip_config, tmp_path):
    torch.save(tiny_clip.model.state_dict(), tmp_path / "model.pt")
    for name in ("clip", "open_clip"):
        model = xbench_pl.create_model(name, architecture=tiny_clip_config, checkpoint=str(tmp_path / "model.pt"))
        assert isinstance(model, OpenCLIPModel) and model.prompts == PromptSet(("{}",), ("no {}",))
        outputs_equal(tiny_clip, model)


# -- end to end ----------------------------------------------------------------------------------
def test_trainer_test_on_demo(tiny_clip_config):
    torch.manual_seed(0)
    model = xbench_pl.create_model("clip", architecture=tiny_clip_config, random_init=True)
    datamodule = xbench_pl.create_datamodule("demo", batch_size=6)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    trainer.test(model, datamodule=datamodule, verbose=False)
    table = model.results["demo"]
    assert table["classes"] and table["mean"]["n_regions"] == 12
    for key in ("pointing_game", "dice_best", "auroc"):
        assert table["mean"][key] is not None and np.isfinite(table["mean"][key]), key
    # the table's recognition numbers are those of the model's own scores on the dataset
    from torchmetrics.functional.classification import binary_auroc

    batches = list(datamodule.test_dataloader())
    scores = torch.cat([model.zero_shot(b.images, b.classes).scores for b in batches])
    labels = torch.cat([b.labels for b in batches]).long()
    checked = 0
    for c, name in enumerate(datamodule.classes):
        if 0 < labels[:, c].sum() < len(labels):
            assert table["classes"][name]["auroc"] == pytest.approx(binary_auroc(scores[:, c], labels[:, c]).item(), abs=1e-6)
            checked += 1
    assert checked >= 5
