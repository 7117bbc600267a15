"""KAD: architecture vs the released checkpoints' layouts, numerical equivalence with the authors'
code, checkpoint errors, query sets and the query cache.

The authors' outputs (``tests/data/kad_reference_{224,512}.pt``) were computed by their own code on
the deterministic checkpoint of ``tests/kad_reference.py``; here the same checkpoint, written in the
released layout, goes through ``create_model`` and ``zero_shot``. Full-size models are built only
for that comparison (one checkpoint file per architecture and session) and on the ``meta`` device;
behaviour is tested on tiny architectures of the same code (ResNet-50 at 64 px, a 2-layer BERT).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import kad_reference
import xbench_pl
from reference_common import assert_within_float32_roundoff, float64_twin
from xbench_pl.geometry import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from xbench_pl.models.checkpoints import CheckpointError
from xbench_pl.models.kad import KAD, RESNET_CHILDREN, image_layout, rename
from xbench_pl.models.layers import BertModel, BertQueryEncoder, QueryDecoder, ResNetPatches
from xbench_pl.registry import read_config

DATA = Path(__file__).resolve().parent / "data"
CXR14 = ["Atelectasis", "Cardiomegaly", "Pleural Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax",
         "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural Thickening", "Hernia"]
TINY_BERT = {"vocab_size": 512, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0}


def tiny_architecture(stage: int = 3, size: int = 64, **changes) -> dict:
    """KAD's architecture at toy width: the real ResNet-50 trunk, a 2-layer BERT, d_model 32."""
    channels = ResNetPatches.CHANNELS[stage]
    config = {
        "image": {"type": "resnet", "stage": stage},
        "projection": [channels, 32],
        "text": {"bert": TINY_BERT, "pooling": "pooler", "mlp": [32, 32], "max_length": 16, "lower_case": True},
        "decoder": {"d_model": 32, "heads": 4, "layers": 2, "ffn": 48, "dropout": 0.1, "activation": "relu",
                    "self_attn": True, "norm_queries": True, "norm_memory": True},
        "classes": 2,
        "attn_layers": [-1],
        "queries": "kad_texts.yaml",
        "preprocess": {"resize": "squash", "size": size, "interpolation": "bicubic", "antialias": True,
                       "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)},
    }
    config.update(changes)
    return config


def write_json(path: Path, config: dict) -> str:
    path.write_text(json.dumps(config))
    return str(path)


def released_layout(model: KAD, img_res: int | None = None) -> dict:
    """``model``'s weights in the layout ``A3_CLIP/main.py`` saves (the inverse of the filter):
    ResNet children twice (``resnet.*`` and ``res_features.*``, one tensor), the decoder norm twice,
    ``resnet.fc``, both ``logit_scale``, BERT ``position_ids`` and the training-only entries."""
    image, text, tqn = {}, {}, {}
    children = {name: index for index, name in RESNET_CHILDREN.items()}
    for key, value in model.state_dict().items():
        part, _, rest = key.partition(".")
        if part == "image" and isinstance(model.image, ResNetPatches):
            child, _, leaf = rest.partition(".")
            image[f"resnet.{rest}"] = value
            image[f"res_features.{children[child]}.{leaf}"] = value
        elif part == "image":
            image[f"vit.{rest}"] = value
        elif part == "project":
            index, _, leaf = rest.partition(".")
            image[f"res_l{1 if index == '0' else 2}.{leaf}"] = value
        elif part == "text":
            text[rest] = value
        else:
            tqn[key] = value
            if key.startswith("decoder.norm."):
                tqn["decoder_norm." + key[len("decoder.norm."):]] = value
    if isinstance(model.image, ResNetPatches):
        image["resnet.fc.weight"], image["resnet.fc.bias"] = torch.randn(1000, 2048), torch.randn(1000)
    positions = model.text.bert_model.embeddings.position_embeddings.num_embeddings
    text["bert_model.embeddings.position_ids"] = torch.arange(positions)[None]
    text["logit_scale"] = tqn["logit_scale"] = torch.tensor(2.6592)
    checkpoint = {"model": tqn, "image_encoder": image, "text_encoder": text,
                  "optimizer": {"state": {}, "param_groups": [{"lr": 5e-5, "params": [0, 1]}]},
                  "lr_scheduler": {"t_initial": 100, "base_values": [5e-5]}, "epoch": 3}
    if img_res is not None:
        checkpoint["config"] = {"img_res": img_res, "optimizer": {"opt": "adamW", "lr": 5e-5}}
    return checkpoint


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    return str(kad_reference.write_tokenizer(tmp_path_factory.mktemp("med_kebert")))


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> str:
    return write_json(tmp_path_factory.mktemp("arch") / "tiny_kad.json", tiny_architecture())


@pytest.fixture(scope="module")
def tiny(tiny_config, tokenizer_dir) -> KAD:
    return KAD(tiny_config, random_init=True, text=tokenizer_dir)


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "best_valid.pt"
    torch.save(released_layout(tiny, img_res=64), path)
    return path


def images(size: int = 64, batch: int = 2) -> torch.Tensor:
    return kad_reference.reference_images(size, seed=3, batch=batch)


# -- architecture vs the released checkpoints ----------------------------------------------------
@pytest.mark.parametrize("name, manifest, grid, ours_m, released_m", [
    ("kad_224", "kad_224", 14, 146.26, 163.3),
    ("kad_512", "kad_512", 16, 165.16, 167.2),
    ("kad_1024", "kad_512", 32, 165.16, 167.2),
])
def test_architecture_matches_released_checkpoint_layout(name, manifest, grid, ours_m, released_m, tokenizer_dir):
    """Every key of the released file maps to one of ours with its shape, or is a verified alias or a
    declared unused key; nothing of ours is left unloaded. Parameter counts as in models.md §1."""
    spec = json.loads((DATA / f"{manifest}_checkpoint_manifest.json").read_text())
    with torch.device("meta"):
        model = xbench_pl.create_model(name, random_init=True, text=tokenizer_dir)
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    released = {prefix + key: shape for part, prefix in (("image_encoder", "image."), ("text_encoder", "text."), ("model", ""))
                for key, (shape, _dtype) in spec["keys"][part].items()}
    mapped, aliases, ignored = {}, [], []
    for key, shape in released.items():
        twin = next((kept + key[len(dup):] for dup, kept in KAD.ALIASES.items() if key.startswith(dup)), None)
        if twin in released:
            assert released[twin] == shape
            aliases.append(key)
        elif key.endswith("position_ids"):
            ignored.append(key)
        elif any(re.search(p, key) for p in KAD.IGNORE_UNEXPECTED):
            ignored.append(key)
        else:
            mapped[rename(key)] = shape
    assert mapped == ours
    assert {k for k in ignored if not k.startswith("image.resnet.layer4.")} == {
        "logit_scale", "text.logit_scale", "text.bert_model.embeddings.position_ids", "image.resnet.fc.weight", "image.resnet.fc.bias"}
    assert any(k.startswith("image.resnet.layer4.") for k in ignored) == (name == "kad_224")  # unused at 224 only
    # the manifest's own alias table (derived from the authors' modules) is what we drop, in the other direction
    assert len(aliases) == sum(len(a) for a in spec["aliases"].values())
    n_ours = sum(int(np.prod(s)) for k, s in ours.items() if "running" not in k and "num_batches" not in k)
    assert n_ours == sum(p.numel() for p in model.parameters()) == spec["parameters"]["used_by_forward"]
    assert n_ours / 1e6 == pytest.approx(ours_m, abs=0.01)
    assert spec["parameters"]["total"] / 1e6 == pytest.approx(released_m, abs=0.05)
    tokens, native = model.image(torch.empty(1, 3, model.preprocess.size, model.preprocess.size, device="meta"))
    assert native == (grid, grid) and tokens.shape == (1, grid * grid, 2048 if grid != 14 else 1024)
    assert tuple(spec["grid"]) == (16, 16) if manifest == "kad_512" else (14, 14)


@pytest.mark.parametrize("name, size", [("kad", 512), ("kad_224", 224), ("kad_512", 512), ("kad_1024", 1024)])
def test_registered_kad_preprocesses_as_the_authors_test_scripts(name, size):
    cls, init_args = read_config("models", name)
    assert cls is KAD and init_args["query_set"] == "authors"
    config = json.loads((Path(xbench_pl.__file__).parent / "models" / "configs" / f"{init_args['architecture']}.json").read_text())
    assert Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in config["preprocess"].items()}) == Preprocess(
        resize="squash", size=size, interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD, antialias=True)
    assert "_source" in config and "591d999e" in config["_source"]


@pytest.mark.parametrize("pooling", BertQueryEncoder.POOLINGS)
def test_the_text_tower_skips_the_padding_after_the_longest_text(pooling):
    """Padded to 32, texts of at most 7 tokens reach BERT as 7 columns and give the embeddings of the whole padded
    run (KAD pads its texts to 256); left padding (real tokens last) is kept whole."""
    torch.manual_seed(0)
    encoder = BertQueryEncoder(TINY_BERT, pooling, mlp=[16, 8]).eval()
    ids = torch.zeros(3, 32, dtype=torch.long)
    mask = torch.zeros(3, 32, dtype=torch.long)
    for row, length in enumerate((7, 3, 5)):
        ids[row, :length] = torch.randint(1, 512, (length,))
        mask[row, :length] = 1
    lengths = []
    encoder.bert_model.embeddings.register_forward_hook(lambda module, inputs, output: lengths.append(inputs[0].shape[1]))
    with torch.no_grad():
        trimmed = encoder(ids, mask)
        padded = encoder.bert_model(ids, mask)
        full = encoder.mlp_embed(padded[1] if pooling == "pooler" else padded[0][:, 0])
        encoder(ids.flip(1), mask.flip(1))
    assert lengths == [7, 32, 32]  # the trimmed run, the whole padded run, the left-padded run
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-6)


# -- equivalence with the authors' code ---------------------------------------------------------
@pytest.fixture(scope="module", params=["kad_224", "kad_512"])
def official(request, tmp_path_factory, tokenizer_dir):
    """The reference checkpoint in the released layout, written once; our model loaded from it."""
    arch = request.param
    path = tmp_path_factory.mktemp(arch) / "best_valid.pt"
    torch.save(kad_reference.official_checkpoint(arch, seed=0), path)
    reference = torch.load(DATA / f"kad_reference_{arch[4:]}.pt", weights_only=True)
    model = xbench_pl.create_model(arch, checkpoint=str(path), text=tokenizer_dir)
    return arch, path, model, reference


def test_scores_and_maps_equal_the_authors_code(official):
    arch, _, model, reference = official
    assert reference["arch"] == arch and reference["seed"] == 0
    texts, index = model.query_texts(CXR14)
    assert texts == tuple(reference["texts"]) == kad_reference.CXR14_TEXTS and index == list(range(14))
    tokens = model.tokenize(texts)
    assert torch.equal(tokens["input_ids"], reference["input_ids"])
    assert torch.equal(tokens["attention_mask"], reference["attention_mask"])
    assert tokens["input_ids"].shape == (14, 256)  # padded to max_length although transformers 5 ignores pad_to_max_length
    images = kad_reference.reference_images(reference["image_size"])
    out = model.zero_shot(images, CXR14)
    exact = float64_twin(model)
    out64 = exact.zero_shot(images.double(), CXR14)
    assert_within_float32_roundoff("text features", model.query_embeddings(texts), exact.query_embeddings(texts),
                                   reference["text_features"])
    assert_within_float32_roundoff("scores", out.scores, out64.scores, reference["scores"])
    assert out.saliency.shape == reference["maps"].shape
    assert_within_float32_roundoff("maps", out.saliency, out64.saliency, reference["maps"])
    assert torch.allclose(out.saliency.sum(dim=(-1, -2)), torch.ones(2, 14))  # attention rows sum to 1


@pytest.mark.parametrize("official", ["kad_512"], indirect=True)
def test_released_file_checks(official, tmp_path):
    """The trained resolution is read from the file's config; a 512 file given to kad_224 says so."""
    arch, path, _, _ = official
    with pytest.raises(CheckpointError, match=r"trained at img_res 512 .* 'kad-1024' feeds 1024 px"):
        xbench_pl.create_model("kad_1024", checkpoint=str(path), text=_tok(tmp_path))
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["config"]
    stripped = tmp_path / "no_config.pt"
    torch.save(checkpoint, stripped)
    del checkpoint
    with pytest.raises(CheckpointError) as error:
        xbench_pl.create_model("kad_224", checkpoint=str(stripped), text=_tok(tmp_path))
    message = str(error.value)
    assert str(stripped) in message and "image.project" not in message
    assert "project.0.weight (2048, 2048) != (1024, 1024)" in message
    assert "kad_512 / kad_1024 layout" in message and "expects a ResNet-50 to layer3" in message
    assert "unexpected keys" in message and "image.layer4." in message


def _tok(tmp_path: Path) -> str:
    return str(kad_reference.write_tokenizer(tmp_path / "tok"))


# -- towers vs their references ----------------------------------------------------------------
def test_bert_equals_transformers_bert_model():
    torch.manual_seed(0)
    ours = BertModel(**TINY_BERT).eval()
    theirs = transformers.BertModel(transformers.BertConfig(**TINY_BERT, attn_implementation="eager")).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    ids = torch.randint(1, 512, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    with torch.no_grad():
        hidden, pooled = ours(ids, mask)
        reference = theirs(input_ids=ids, attention_mask=mask)
    assert torch.allclose(hidden, reference.last_hidden_state, atol=1e-5)
    assert torch.allclose(pooled, reference.pooler_output, atol=1e-5)


def test_decoder_layer_equals_torch_pre_norm_decoder_layer():
    """Each of our layers is torch's norm_first TransformerDecoderLayer (same key names); the map is
    the head-averaged softmax(q k^T / sqrt(d_head)) of the cross-attention."""
    torch.manual_seed(0)
    decoder = QueryDecoder(32, 4, 2, 48, self_attn=True, norm_queries=True, norm_memory=True).eval()
    queries, memory = torch.randn(5, 32), torch.randn(2, 9, 32)
    reference = torch.nn.TransformerDecoderLayer(32, 4, 48, dropout=0.1, batch_first=True, norm_first=True).eval()
    with torch.no_grad():
        out, attn = decoder(queries, memory)
        x, m = decoder.norm(queries).expand(2, -1, -1), decoder.norm(memory)
        for index, layer in enumerate(decoder.layers):
            h = layer.norm1(x).transpose(0, 1)  # the layers take sequence-first tensors
            h = x + layer.self_attn(h, h, h)[0].transpose(0, 1)
            q = layer.norm2(h) @ layer.multihead_attn.in_proj_weight[:32].T + layer.multihead_attn.in_proj_bias[:32]
            k = m @ layer.multihead_attn.in_proj_weight[32:64].T + layer.multihead_attn.in_proj_bias[32:64]
            logits = q.unflatten(-1, (4, 8)).transpose(1, 2) @ k.unflatten(-1, (4, 8)).permute(0, 2, 3, 1) / 8 ** 0.5
            assert torch.allclose(attn[index], logits.softmax(-1).mean(1), atol=1e-6)
            reference.load_state_dict(layer.state_dict(), strict=True)
            x = reference(x, m)
    assert torch.allclose(out, decoder.norm(x), atol=1e-6)
    assert attn.shape == (2, 2, 5, 9) and torch.allclose(attn.sum(-1), torch.ones(2, 2, 5))


def test_resnet_tokens_are_row_major():
    torch.manual_seed(0)
    trunk = ResNetPatches(stage=3).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        tokens, grid = trunk(x)
        features = trunk.layer3(trunk.layer2(trunk.layer1(trunk.maxpool(trunk.relu(trunk.bn1(trunk.conv1(x)))))))
    assert grid == (4, 6) and "fc" not in dict(trunk.named_children()) and not hasattr(trunk, "layer4")
    assert torch.equal(tokens.unflatten(1, grid), features.permute(0, 2, 3, 1))  # token y * w + x


# -- loading a KAD-style checkpoint --------------------------------------------------------------
def test_tiny_checkpoint_round_trip(tiny, tiny_config, tiny_checkpoint, tokenizer_dir):
    loaded = KAD(tiny_config, checkpoint=str(tiny_checkpoint), text=tokenizer_dir)
    assert not loaded.random_weights
    for key, value in tiny.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    a, b = tiny.zero_shot(images(), ["Atelectasis", "Fracture"]), loaded.zero_shot(images(), ["Atelectasis", "Fracture"])
    assert torch.equal(a.scores, b.scores) and torch.equal(a.saliency, b.saliency)
    assert a.scores.shape == (2, 2) and ((a.scores >= 0) & (a.scores <= 1)).all()
    assert a.saliency.shape == (2, 2, 4, 4)  # 64 px, stride 16


def edit_checkpoint(source: Path, target: Path, edit) -> str:
    checkpoint = torch.load(source, weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, target)
    return str(target)


@pytest.mark.parametrize("edit, pattern", [
    (lambda c: c["image_encoder"].__setitem__("res_features.0.weight", c["image_encoder"]["res_features.0.weight"] + 1),
     r"should be identical copies differ: \[image\.resnet\.conv1\.weight != image\.res_features\.0\.weight\]"),
    (lambda c: c["model"].__setitem__("decoder_norm.bias", c["model"]["decoder_norm.bias"] + 1), r"decoder_norm\.bias != decoder\.norm\.bias"),
    (lambda c: c["model"].pop("mlp_head.0.weight"), r"1 missing keys: \[mlp_head\.0\.weight\]"),
    (lambda c: c["text_encoder"].__setitem__("extra.weight", torch.zeros(2)), r"1 unexpected keys: \[text\.extra\.weight\]"),
    (lambda c: c["text_encoder"].__setitem__("mlp_embed.2.bias", torch.zeros(7)), r"text\.mlp_embed\.2\.bias \(7,\) != \(32,\)"),
    (lambda c: c.pop("text_encoder"), r"not a KAD-style checkpoint: it has no \['text_encoder'\]"),
    (lambda c: c["text_encoder"].__setitem__("bert_model.embeddings.position_ids", torch.arange(64)[None].flip(-1)), r"position_ids is not 0, 1, 2"),
    (lambda c: c["config"].__setitem__("img_res", 224), r"trained at img_res 224 .* feeds 64 px"),
    (lambda c: c["config"].__setitem__("scale", np.float64(2.0)), r"weights_only=True: it pickles a type that is not plain data .*numpy"),
])
def test_bad_checkpoints_name_the_file_and_the_problem(edit, pattern, tiny_config, tiny_checkpoint, tokenizer_dir, tmp_path):
    path = edit_checkpoint(tiny_checkpoint, tmp_path / "bad.pt", edit)
    with pytest.raises(CheckpointError, match=pattern) as error:
        KAD(tiny_config, checkpoint=path, text=tokenizer_dir)
    assert path in str(error.value)


def test_clip_weights_given_to_kad(tiny_config, tokenizer_dir, tmp_path):
    path = tmp_path / "ViT-B-16.bin"
    torch.save({"visual.conv1.weight": torch.zeros(8, 3, 16, 16), "visual.proj": torch.zeros(8, 4),
                "text_projection": torch.zeros(4, 4), "logit_scale": torch.zeros(())}, path)
    with pytest.raises(CheckpointError, match=r"not a KAD-style checkpoint.*flat state dict of 4 tensors.*looks like a CLIP"):
        KAD(tiny_config, checkpoint=str(path), text=tokenizer_dir)


def test_truncated_checkpoint(tiny_config, tiny_checkpoint, tokenizer_dir, tmp_path):
    path = tmp_path / "truncated.pt"
    path.write_bytes(tiny_checkpoint.read_bytes()[: tiny_checkpoint.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"cannot read checkpoint {re.escape(str(path))}.*truncated"):
        KAD(tiny_config, checkpoint=str(path), text=tokenizer_dir)


def test_stage_4_checkpoint_given_to_a_stage_3_architecture(tiny_config, tokenizer_dir, tmp_path):
    wide = KAD(write_json(tmp_path / "stage4.json", tiny_architecture(stage=4)), random_init=True, text=tokenizer_dir)
    path = tmp_path / "stage4.pt"
    torch.save(released_layout(wide), path)
    with pytest.raises(CheckpointError) as error:
        KAD(tiny_config, checkpoint=str(path), text=tokenizer_dir)
    message = str(error.value)
    assert "project.0.weight (2048, 2048) != (1024, 1024)" in message and "image.layer4.0.conv1.weight" in message
    assert "this looks like a checkpoint with a ResNet-50 to layer4, 2048-channel tokens (kad_512 / kad_1024 layout)" in message


def test_missing_files_and_downloads_are_refused(tiny_config, tokenizer_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"vocab\.txt \(required\).*xmcmic/Med-KEBERT.*no such folder"):
        KAD(tiny_config, random_init=True, text=str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"text folder .*empty lacks \[.vocab\.txt or tokenizer\.json.\]"):
        KAD(tiny_config, random_init=True, text=str(tmp_path / "empty"))
    (tmp_path / "weights.pt").write_bytes(b"")  # with a checkpoint the text folder is required (random_init: a stand-in)
    with pytest.raises(FileNotFoundError, match=r"text=None"):
        KAD(tiny_config, checkpoint=str(tmp_path / "weights.pt"))
    with pytest.raises(FileNotFoundError, match=r"checkpoint file not found: .*best_valid\.pt \(no such file\)"):
        KAD(tiny_config, checkpoint=str(tmp_path / "best_valid.pt"), text=tokenizer_dir)
    with pytest.raises(ValueError, match="would download"):
        KAD(tiny_config, checkpoint="https://example.org/best_valid.pt", text=tokenizer_dir)
    with pytest.raises(ValueError, match="needs checkpoint="):
        KAD(tiny_config, text=tokenizer_dir)
    with pytest.raises(ValueError, match="unknown architecture 'kad-999'"):
        KAD("kad-999", random_init=True, text=tokenizer_dir)
    with pytest.raises(ValueError, match="query_set must be one of"):
        KAD(tiny_config, random_init=True, text=tokenizer_dir, query_set="all")


# -- queries ---------------------------------------------------------------------------------------
def test_authors_query_set_appends_other_findings(tiny):
    texts, index = tiny.query_texts(["Fracture", "Mass", "Calcification", "Pleural Thickening"])
    assert texts == (*kad_reference.CXR14_TEXTS, "fracture", "calcification")
    assert index == [14, 4, 15, 12]


def test_scores_depend_on_the_decoded_set_not_on_the_request(tiny_config, tokenizer_dir):
    """Self-attention across queries: under the authors' set a finding's score is the same whatever
    else is requested from that set; decoding only the requested findings changes it."""
    model = KAD(tiny_config, random_init=True, text=tokenizer_dir)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # spread the weights: BERT's N(0, 0.02) init makes every query alike
        for p in [*model.text.parameters(), *model.decoder.parameters(), *model.mlp_head.parameters()]:
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    x = images()
    full = model.zero_shot(x, CXR14)
    some = model.zero_shot(x, ["Nodule", "Atelectasis"])
    assert torch.allclose(some.scores, full.scores[:, [5, 0]], atol=1e-6)
    assert torch.allclose(some.saliency, full.saliency[:, [5, 0]], atol=1e-7)
    model.query_set = "requested"
    assert model.query_texts(["Nodule", "Atelectasis"]) == (("lung nodule", "atelectasis"), [0, 1])
    alone = model.zero_shot(x, ["Nodule", "Atelectasis"])
    assert (alone.scores - some.scores).abs().max() > 1e-3
    assert (alone.saliency - some.saliency).abs().max() > 1e-4


def test_text_override_and_duplicates(tiny_config, tokenizer_dir):
    model = KAD(tiny_config, random_init=True, text=tokenizer_dir, query_set="requested",
                texts={"Mass": "mass", "Nodule/Mass": "mass"})
    assert model.query_texts(["Mass", "Nodule/Mass", "Lung Opacity"]) == (("mass", "lung opacity"), [0, 0, 1])
    out = model.zero_shot(images(), ["Mass", "Nodule/Mass"])
    assert torch.equal(out.scores[:, 0], out.scores[:, 1])


def test_query_embeddings_cached_per_texts_and_device_and_cleared_on_load(tiny, monkeypatch):
    calls = []
    forward = type(tiny.text).forward
    monkeypatch.setattr(type(tiny.text), "forward", lambda self, *a: calls.append(1) or forward(self, *a))
    tiny._query_cache.clear()
    tiny.zero_shot(images(), ["Atelectasis"])
    tiny.zero_shot(images(), ["Atelectasis", "Edema"])  # same authors' set: no new encoding
    assert len(calls) == 1 and list(tiny._query_cache) == [(kad_reference.CXR14_TEXTS, "cpu")]
    tiny.zero_shot(images(), ["Fracture"])
    assert len(calls) == 2
    tiny.load_state_dict(tiny.state_dict())
    assert not tiny._query_cache


def test_random_init_is_reproducible_and_flagged(tiny, tiny_config, tokenizer_dir):
    again = KAD(tiny_config, random_init=True, text=tokenizer_dir)
    assert tiny.random_weights and again.random_weights
    assert all(torch.equal(a, b) for a, b in zip(tiny.state_dict().values(), again.state_dict().values()))


def test_image_layout_names():
    assert "kad_224" in image_layout({"image.res_features.6.0.conv1.weight": None})
    assert "kad_512 / kad_1024" in image_layout({"image.layer4.0.conv1.weight": None})
    assert "devide" in image_layout({"image.vit.embeddings.cls_token": None})
