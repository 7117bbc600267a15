"""DeViDe: the inferred architecture (ViT-B/16 in the vit-base-patch16-224-in21k layout + KAD's text
encoder and decoder), its checkpoint layout, and end-to-end runs of ``--model devide`` through the
CLI with random weights (1 process at full size, in the background lane's warm process; 1 vs 2 DDP processes on a
tiny architecture, on the session's DDP pair: never DDP inside pytest).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import kad_reference
import xbench_pl
from test_cli import ddp_ranks_started, in_process, warm_process
from test_kad import TINY_BERT, released_layout, tiny_architecture, tokenizer_dir, write_json  # noqa: F401  (fixture)
from xbench_pl.data.nih_bbox import DemoDataModule
from xbench_pl.geometry import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from xbench_pl.models import devide
from xbench_pl.models.checkpoints import CheckpointError
from xbench_pl.models.devide import DeViDe
from xbench_pl.models.kad import KAD
from xbench_pl.models.layers import ViTPatches
from xbench_pl.registry import read_config

TINY_VIT = {"image_size": 64, "patch_size": 16, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "layer_norm_eps": 1e-12, "num_channels": 3, "hidden_act": "gelu", "qkv_bias": True}
# google/vit-base-patch16-224-in21k's pytorch_model.bin (Hugging Face ViTModel, transformers 4.x names)
IN21K_LAYER_KEYS = [f"attention.attention.{p}.{w}" for p in ("query", "key", "value") for w in ("weight", "bias")] + [
    f"{m}.{w}" for m in ("attention.output.dense", "intermediate.dense", "output.dense", "layernorm_before", "layernorm_after")
    for w in ("weight", "bias")]
IN21K_KEYS = {"embeddings.cls_token", "embeddings.position_embeddings", "embeddings.patch_embeddings.projection.weight",
              "embeddings.patch_embeddings.projection.bias", "layernorm.weight", "layernorm.bias",
              *(f"encoder.layer.{i}.{k}" for i in range(12) for k in IN21K_LAYER_KEYS)}


def tiny_devide_architecture() -> dict:
    return tiny_architecture(image={"type": "vit", "config": TINY_VIT}, projection=None)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> str:
    return write_json(tmp_path_factory.mktemp("arch") / "tiny_devide.json", tiny_devide_architecture())


# -- architecture --------------------------------------------------------------------------------
def test_vit_matches_timm_vision_transformer():
    """Our plain-torch ViT = timm's pre-norm ViT with the same weights (class token dropped)."""
    torch.manual_seed(0)
    ours = ViTPatches(**TINY_VIT).eval()
    theirs = VisionTransformer(img_size=64, patch_size=16, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, qkv_bias=True,
                               norm_layer=partial(torch.nn.LayerNorm, eps=1e-12), num_classes=0, global_pool="token").eval()
    sd = ours.state_dict()
    mapped = {"cls_token": sd["embeddings.cls_token"], "pos_embed": sd["embeddings.position_embeddings"],
              "patch_embed.proj.weight": sd["embeddings.patch_embeddings.projection.weight"],
              "patch_embed.proj.bias": sd["embeddings.patch_embeddings.projection.bias"],
              "norm.weight": sd["layernorm.weight"], "norm.bias": sd["layernorm.bias"]}
    for i in range(2):
        p = f"encoder.layer.{i}."
        for w in ("weight", "bias"):
            mapped[f"blocks.{i}.attn.qkv.{w}"] = torch.cat([sd[f"{p}attention.attention.{n}.{w}"] for n in ("query", "key", "value")])
            for ours_name, timm_name in (("attention.output.dense", "attn.proj"), ("layernorm_before", "norm1"),
                                         ("layernorm_after", "norm2"), ("intermediate.dense", "mlp.fc1"), ("output.dense", "mlp.fc2")):
                mapped[f"blocks.{i}.{timm_name}.{w}"] = sd[f"{p}{ours_name}.{w}"]
    theirs.load_state_dict(mapped, strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        tokens, grid = ours(x)
        reference = theirs.forward_features(x)[:, 1:]
    assert grid == (4, 4) and torch.allclose(tokens, reference, atol=1e-5)
    with pytest.raises(ValueError, match="expects 4x4 patches"):
        ours(torch.randn(1, 3, 96, 96))


def test_devide_architecture_and_checkpoint_layout(tokenizer_dir):
    with torch.device("meta"):
        model = xbench_pl.create_model("devide", random_init=True, text=tokenizer_dir)
    assert type(model) is DeViDe and isinstance(model.project, torch.nn.Identity)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    vit = {k[len("image."):]: s for k, s in shapes.items() if k.startswith("image.")}
    assert set(vit) == IN21K_KEYS  # the ViT keys of vit-base-patch16-224-in21k, without its pooler
    assert vit["embeddings.cls_token"] == (1, 1, 768) and vit["embeddings.position_embeddings"] == (1, 197, 768)
    assert vit["embeddings.patch_embeddings.projection.weight"] == (768, 3, 16, 16)
    assert vit["encoder.layer.11.intermediate.dense.weight"] == (3072, 768)
    count = lambda prefix: sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefix))  # noqa: E731
    assert count("image.") == 85_798_656  # ViT-B/16 backbone (timm vit_base_patch16_224, no head)
    assert count("text.") == 110_663_425 - 1  # KAD's text encoder without the training-only logit_scale
    assert count("decoder.") + count("mlp_head.") == 25_219_075 - 1  # KAD's TQN without the training-only logit_scale
    assert sum(p.numel() for p in model.parameters()) == 221_681_154
    # the KAD layout of the same weights: image_encoder holds vit.*, text/model as KAD's
    checkpoint = released_layout(model)
    assert all(k.startswith("vit.") for k in checkpoint["image_encoder"])
    assert set(checkpoint["model"]) >= {"decoder_norm.weight", "decoder.norm.weight", "mlp_head.0.weight", "logit_scale"}
    tokens, grid = model.image(torch.empty(1, 3, 224, 224, device="meta"))
    assert grid == (14, 14) and tokens.shape == (1, 196, 768)


def test_registered_devide_config_and_provenance():
    cls, init_args = read_config("models", "devide")
    assert cls is DeViDe and issubclass(DeViDe, KAD) and init_args["architecture"] == "devide"
    config = json.loads((Path(xbench_pl.__file__).parent / "models" / "configs" / "devide.json").read_text())
    assert Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in config["preprocess"].items()}) == Preprocess(
        resize="squash", size=224, interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD, antialias=True)
    assert "2404.03618" in config["_source"] and "Inferred (unverified)" in config["_source"]
    doc = devide.__doc__
    assert "From the paper" in doc and "Inferred (unverified)" in doc and "No released DeViDe" in doc.replace("\n    ", " ")


# -- weights -------------------------------------------------------------------------------------
def test_tiny_devide_checkpoint_round_trip_and_errors(tiny_config, tokenizer_dir, tmp_path):
    model = DeViDe(tiny_config, random_init=True, text=tokenizer_dir)
    assert model.random_weights
    checkpoint = released_layout(model)
    checkpoint["image_encoder"]["vit.pooler.dense.weight"] = torch.zeros(32, 32)  # HF ViT pooler: tolerated, unused
    checkpoint["image_encoder"]["vit.pooler.dense.bias"] = torch.zeros(32)
    path = tmp_path / "devide.pt"
    torch.save(checkpoint, path)
    loaded = DeViDe(tiny_config, checkpoint=str(path), text=tokenizer_dir)
    x = kad_reference.reference_images(64, seed=5)
    a, b = model.zero_shot(x, ["Pneumothorax", "Fracture"]), loaded.zero_shot(x, ["Pneumothorax", "Fracture"])
    assert torch.equal(a.scores, b.scores) and torch.equal(a.saliency, b.saliency) and a.saliency.shape == (2, 2, 4, 4)
    # a ResNet (KAD) checkpoint given to DeViDe names both layouts
    resnet = KAD(write_json(tmp_path / "kad.json", tiny_architecture()), random_init=True, text=tokenizer_dir)
    torch.save(released_layout(resnet), tmp_path / "kad.pt")
    with pytest.raises(CheckpointError, match=r"looks like a checkpoint with a ResNet-50 to layer3.*expects a ViT-B/16 image encoder"):
        DeViDe(tiny_config, checkpoint=str(tmp_path / "kad.pt"), text=tokenizer_dir)


# -- the CLI ---------------------------------------------------------------------------------------
def devide_on_four_images(folder: Path):
    """The background job of the test below: the registered full-size model, random weights, on 4 of the demo images
    (full-size forwards are slow), in the warm process; its output in ``folder/out``."""
    ids = sorted(r.image_id for r in DemoDataModule().load_records())[:4]
    (folder / "split.csv").write_text("image_id\n" + "\n".join(ids) + "\n")
    return warm_process("test", "--model", "devide", "--model.random_init", "true",
                        "--model.text", str(kad_reference.write_tokenizer(folder / "med_kebert")), "--data", "demo",
                        "--data.split_file", str(folder / "split.csv"), "--out", str(folder / "out"))


@pytest.mark.background(job=devide_on_four_images)
def test_cli_devide_random_init_end_to_end(background):
    folder, result = background
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((folder / "out" / "metrics.json").read_text())
    assert report["model"] == "devide" and report["random_weights"] is True
    init = report["config"]["model"]["init_args"]
    assert report["config"]["model"]["class_path"] == "xbench_pl.models.devide.DeViDe"
    assert init["random_init"] is True and init["checkpoint"] is None and init["query_set"] == "authors"
    mean = report["datasets"]["demo"]["mean"]
    assert mean["n_pos"] + mean["n_neg"] == 4 * 8 and mean["n_regions"] == 4
    assert 0.0 <= mean["auroc"] <= 1.0 and 0.0 <= mean["pointing_game"] <= 1.0 and 0.0 <= mean["dice_best"] <= 1.0
    assert "RANDOM weights" in result.stdout + result.stderr


def test_cli_devide_needs_a_local_tokenizer(tmp_path):
    (tmp_path / "devide.pt").write_bytes(b"")  # weights given: the tokenizer folder is too (random_init without both: a stand-in)
    result = in_process("test", "--model", "devide", "--model.checkpoint", str(tmp_path / "devide.pt"), "--data", "demo",
                        "--out", str(tmp_path))
    assert result.returncode != 0 and "vocab.txt" in result.stderr and "Med-KEBERT" in result.stderr


@pytest.mark.ddp_pair
def test_cli_devide_one_and_two_process_ddp_give_identical_metrics(tokenizer_dir, tmp_path):
    """1 process with random_init weights vs 2 DDP processes loading the same weights from a
    KAD-style checkpoint file (random_init draws from a fixed seed): identical metrics."""
    architecture = write_json(tmp_path / "tiny_devide.json", tiny_devide_architecture())
    checkpoint = tmp_path / "devide_tiny.pt"
    torch.save(released_layout(DeViDe(architecture, random_init=True, text=tokenizer_dir)), checkpoint)
    common = ["test", "--model", "devide", "--model.architecture", architecture, "--model.text", tokenizer_dir,
              "--data", "demo", "--data.batch_size", "3", "--trainer.accelerator", "cpu"]
    pair = ddp_ranks_started(*common, "--model.checkpoint", str(checkpoint), "--out", str(tmp_path / "two"))
    one, two = in_process(*common, "--model.random_init", "true", "--out", str(tmp_path / "one")), pair()
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = (json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("one", "two"))
    assert a["random_weights"] is True and b["random_weights"] is False
    assert b["config"]["model"]["init_args"]["checkpoint"] == str(checkpoint) and b["provenance"]["world_size"] == 2
    assert json.dumps(a["datasets"], sort_keys=True) == json.dumps(b["datasets"], sort_keys=True)
    mean = a["datasets"]["demo"]["mean"]
    assert mean["n_pos"] + mean["n_neg"] == 12 * 8
