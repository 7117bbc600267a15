"""CARZero: equality with the authors' code on the seeded released-layout checkpoint, the checkpoint
manifest and parameter counts, the Lightning file read without omegaconf / pytorch_lightning and
without running anything, wrong files, prompts, preprocessing, random_init smoke runs and the CLI.

The full-size model is built once (session fixture ``official``); everything else uses a tiny
architecture. ``tests/data/carzero_reference.pt`` holds the authors' outputs on the checkpoint that
``carzero_reference.write_lightning_checkpoint(seed=0)`` writes (see ``make_carzero_reference.md``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest
import torch

import carzero_reference as cr
import xbench_pl
from reference_common import assert_within_float32_roundoff, float64_twin
from test_cli import in_process
from xbench_pl.models.carzero import CARZero, checkpoint_filter_fn, clean_caption, word_groups
from xbench_pl.models.checkpoints import CheckpointError, read_checkpoint
from xbench_pl.registry import read_config

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
# canonical finding names whose shipped prompts are the authors' 14 ChestX-ray14 prompts, in order
CXR14 = ["Atelectasis", "Cardiomegaly", "Pleural Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax",
         "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural Thickening", "Hernia"]
EXTRA = {"Report A": cr.EXTRA_PROMPTS[0], "Report B": cr.EXTRA_PROMPTS[1]}


# -- the full-size model, once ----------------------------------------------------------------------
@pytest.fixture(scope="session")
def official_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("carzero")
    checkpoint = cr.write_lightning_checkpoint(folder / "CARZero_best_model.ckpt", seed=0)
    tokenizer = cr.write_text_encoder_folder(folder / "BioClinicalMPBERT")
    return {"checkpoint": checkpoint, "tokenizer": tokenizer}


@pytest.fixture(scope="session")
def official(official_files):
    torch.manual_seed(123)  # weights come from the file: the global seed must not matter
    model = xbench_pl.create_model("carzero", checkpoint=str(official_files["checkpoint"]),
                                   text=str(official_files["tokenizer"]), texts=EXTRA)
    reference = torch.load(DATA / "carzero_reference.pt", weights_only=True)
    images = cr.reference_images(seed=0, batch=2)
    ours, exact = forward(model, images, reference), forward(float64_twin(model), images.double(), reference)
    return {"model": model, "reference": reference, "ours": ours, "exact": exact}


def forward(model: CARZero, images: torch.Tensor, reference: dict) -> dict:
    """What the reference records, by our model: text embeddings, and the image tower's features and the similarities
    that one ``zero_shot`` pass computes on its way to the output (recorded as it calls them)."""
    seen = {}

    def recording(name: str, method: Callable) -> Callable:
        def record(*args):
            seen[name] = method(*args)
            return seen[name]
        return record

    with torch.no_grad(), mock.patch.object(model.image, "forward_features", recording("features", model.image.forward_features)), \
            mock.patch.object(model, "similarities", recording("parts", model.similarities)):
        output = model.zero_shot(images, CXR14 + list(EXTRA))
        sentences, words, merged = model.encode_text(list(reference["prompts"]))
    patches = seen["features"][:, 1:]
    return {"sentences": sentences, "words": words, "merged": merged, "image_global": seen["features"][:, 0],
            "image_local_mean_std": torch.stack([patches.mean(), patches.std()]), "parts": seen["parts"], "output": output}


def within_float32_roundoff(official: dict, name: str, ours: Callable[[dict], torch.Tensor], reference: torch.Tensor) -> None:
    """``ours(forward)`` in float32 and float64 against ``reference`` (see ``assert_within_float32_roundoff``)."""
    assert_within_float32_roundoff(name, ours(official["ours"]), ours(official["exact"]), reference)


def test_shipped_prompts_are_the_authors(official):
    model, reference = official["model"], official["reference"]
    assert [model.prompt_for(c) for c in CXR14 + list(EXTRA)] == list(reference["prompts"])
    tokens = model.tokenize(list(reference["prompts"]))
    assert torch.equal(tokens["input_ids"], reference["input_ids"])
    assert torch.equal(tokens["attention_mask"], reference["attention_mask"])
    assert official["ours"]["merged"] == official["exact"]["merged"] == [list(w) for w in reference["words"]]


def test_text_embeddings_equal_the_authors(official):
    reference = official["reference"]
    within_float32_roundoff(official, "word embeddings", lambda f: f["words"], reference["word_embeddings"])
    within_float32_roundoff(official, "sentence embeddings", lambda f: f["sentences"], reference["sentence_embeddings"])


def test_image_embeddings_equal_the_authors(official):
    reference = official["reference"]
    for key in ("image_global", "image_local_mean_std"):
        within_float32_roundoff(official, key, lambda f: f[key], reference[key])


def test_scores_logits_and_maps_equal_the_authors(official):
    reference, output = official["reference"], official["ours"]["output"]
    for key in ("i2t", "t2i"):
        within_float32_roundoff(official, key, lambda f: f["parts"][key], reference[key])
    within_float32_roundoff(official, "i2t attention", lambda f: f["parts"]["attn"], reference["i2t_attention"])
    # through the public contract: create_model + zero_shot with canonical finding names
    within_float32_roundoff(official, "logits", lambda f: f["output"].logits, reference["score"])
    within_float32_roundoff(official, "scores", lambda f: f["output"].scores, torch.sigmoid(reference["score"]))
    within_float32_roundoff(official, "maps", lambda f: f["output"].saliency, reference["maps"])
    assert output.saliency.shape == (2, 16, 14, 14) and output.scores.shape == (2, 16)
    assert ((output.scores > 0) & (output.scores < 1)).all()
    # the mapping is monotone: the order of images per class (AUROC) is the raw score's
    assert torch.equal(output.scores.argsort(dim=0), reference["score"].argsort(dim=0))


def test_scores_do_not_depend_on_the_batch(official):
    # the second image alone against the pair's float32 and float64 passes: how a batch of 1 rounds differs from a
    # batch of 2 on some CPUs' kernels (AMX), so the bound is the pair's own float32 round-off measured here
    single = official["model"].zero_shot(cr.reference_images(seed=0, batch=2)[1:], CXR14 + list(EXTRA))
    for key in ("logits", "saliency"):
        within_float32_roundoff(official, f"{key} of one image alone", lambda f: getattr(f["output"], key)[1:],
                                getattr(single, key))


# -- the released file: manifest, parameter counts, safe reading ------------------------------------
def test_manifest_layout_and_parameter_counts(official, official_files):
    manifest = cr.manifest()
    assert manifest["parameters"]["total"] == 220_770_306
    model = official["model"]
    checkpoint = read_checkpoint(official_files["checkpoint"], safe_globals=CARZero.SAFE_GLOBALS)
    assert list(checkpoint["state_dict"]) == list(manifest["keys"])
    state = checkpoint_filter_fn(checkpoint, model, "file")
    expected = model.state_dict()
    used = {k: v for k, v in state.items() if k in expected}
    ignored = {k: v for k, v in state.items() if k not in expected}
    assert used.keys() == expected.keys()  # strict on every tensor the model uses
    assert all(used[k].shape == expected[k].shape for k in used)
    assert all(any(re.search(p, k) for p in CARZero.IGNORE_UNEXPECTED) for k in ignored), sorted(ignored)
    counts = manifest["parameters"]
    assert sum(p.numel() for p in model.parameters()) == counts["used_by_zero_shot"] == 210_724_097
    assert sum(v.numel() for v in ignored.values()) == counts["unused_by_zero_shot"] == 10_046_209
    # the decoder norm is stored twice (one module, two keys): counted once, as the authors' model counts it
    assert sum(p.numel() for p in model.parameters()) + sum(v.numel() for v in ignored.values()) == counts["total"]
    # every unused key of the authors' model is accounted for by name, nothing else is ignored
    unused = {k[len("CARZero."):] for k in manifest["unused_by_zero_shot"]}
    renamed_unused = {k.replace("fusion_module.decoder.", "decoder.").replace("text_encoder.model.", "text.") for k in unused}
    assert renamed_unused == set(ignored)


def test_lightning_file_is_read_without_omegaconf_lightning_or_code(official_files):
    """The file references OmegaConf and Lightning classes; they are inert stand-ins here."""
    before = set(sys.modules)
    checkpoint = read_checkpoint(official_files["checkpoint"], safe_globals=CARZero.SAFE_GLOBALS)
    assert not {m for m in set(sys.modules) - before if m.startswith(("omegaconf", "pytorch_lightning"))}
    hyper = checkpoint["hyper_parameters"]
    assert type(hyper).__module__ == "omegaconf.dictconfig" and type(hyper).__mro__[1].__name__ == "InertRecord"
    assert sorted(f"{c.__module__}.{c.__qualname__}" for c in checkpoint["callbacks"]) == [
        "pytorch_lightning.callbacks.early_stopping.EarlyStopping", "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint"]
    # without the allow-list the same file is refused, naming the classes and the opt-in
    with pytest.raises(CheckpointError, match=r"omegaconf\.dictconfig\.DictConfig.*pytorch_lightning.*trust_checkpoint=True"):
        read_checkpoint(official_files["checkpoint"])


# -- tiny architecture ---------------------------------------------------------------------------
TINY_BERT = {"vocab_size": len(cr.vocabulary()), "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 128, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
             "pad_token_id": 0}


def tiny_architecture() -> dict:
    config = json.loads((REPO / "xbench_pl/models/configs/carzero.json").read_text())
    config["image"] = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "intermediate_size": 64, "layer_norm_eps": 1e-6}
    config["text"] = {"bert": TINY_BERT, "max_length": 97, "last_layers": 4}
    config["decoder"] = {**config["decoder"], "d_model": 32, "heads": 2, "layers": 2, "ffn": 48}
    config["head"] = [24, 16, 8, 1]
    config["attn_layers"] = [-2, -1]
    config["preprocess"] = {**config["preprocess"], "canvas": 36, "size": 32}
    return config


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "carzero-tiny.json"
    path.write_text(json.dumps(tiny_architecture()))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    return str(cr.write_text_encoder_folder(tmp_path_factory.mktemp("bert")))


@pytest.fixture(scope="module")
def tiny(tiny_config, tokenizer_dir) -> CARZero:
    return CARZero(tiny_config, random_init=True, text=tokenizer_dir)


def authors_layout(model: CARZero, seed: int = 0) -> dict[str, torch.Tensor]:
    """The tiny model's weights in the released file's layout (``CARZero.`` keys, timm ViT names,
    packed qkv, the decoder norm twice, the unused self-attention/norm1, logit_scale, BERT pooler)."""
    g = torch.Generator().manual_seed(seed)
    state = model.state_dict()
    out = {}
    for key, value in state.items():
        if key.startswith("image."):
            inner = key[len("image."):]
            m = re.match(r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$", inner)
            if m:
                if m.group(2) == "query":
                    parts = [state[f"image.encoder.layer.{m.group(1)}.attention.attention.{p}.{m.group(3)}"] for p in ("query", "key", "value")]
                    out[f"img_encoder.model.blocks.{m.group(1)}.attn.qkv.{m.group(3)}"] = torch.cat(parts)
                continue
            for old, new in (("embeddings.cls_token", "cls_token"), ("embeddings.position_embeddings", "pos_embed"),
                             ("embeddings.patch_embeddings.projection.", "patch_embed.proj."), ("layernorm.", "norm.")):
                if inner.startswith(old):
                    inner = new + inner[len(old):]
            inner = re.sub(r"^encoder\.layer\.(\d+)\.", r"blocks.\1.", inner)
            for old, new in (("layernorm_before.", "norm1."), ("layernorm_after.", "norm2."), ("attention.output.dense.", "attn.proj."),
                             ("intermediate.dense.", "mlp.fc1."), ("output.dense.", "mlp.fc2.")):
                inner = inner.replace(old, new)
            out[f"img_encoder.model.{inner}"] = value
        elif key.startswith("text."):
            out["text_encoder.model." + key[len("text."):]] = value
        elif key.startswith("decoder."):
            out["fusion_module." + key] = value
        else:
            out["fusion_module." + key] = value
    d = model.decoder.layers[0].linear2.out_features
    for i in range(len(model.decoder.layers)):
        layer = f"fusion_module.decoder.layers.{i}."
        out[layer + "self_attn.in_proj_weight"] = torch.randn(3 * d, d, generator=g)
        out[layer + "self_attn.in_proj_bias"] = torch.randn(3 * d, generator=g)
        out[layer + "self_attn.out_proj.weight"] = torch.randn(d, d, generator=g)
        out[layer + "self_attn.out_proj.bias"] = torch.randn(d, generator=g)
        out[layer + "norm1.weight"], out[layer + "norm1.bias"] = torch.ones(d), torch.zeros(d)
    out["fusion_module.decoder_norm.weight"] = out["fusion_module.decoder.norm.weight"].clone()
    out["fusion_module.decoder_norm.bias"] = out["fusion_module.decoder.norm.bias"].clone()
    out["fusion_module.logit_scale"] = torch.tensor(2.6593)
    width = model.text.hidden_size
    out["text_encoder.model.pooler.dense.weight"] = torch.randn(width, width, generator=g)
    out["text_encoder.model.pooler.dense.bias"] = torch.randn(width, generator=g)
    return {f"CARZero.{k}": v for k, v in out.items()}


def write_tiny_lightning(path: Path, state: dict[str, torch.Tensor], extra: dict | None = None) -> str:
    """A Lightning 1.1.4-style file of ``state`` whose pickle references OmegaConf and Lightning classes."""
    with cr._importable_classes({**cr.CALLBACK_CLASSES, **cr.OMEGACONF_CLASSES}) as classes:
        checkpoint = {"epoch": 0, "global_step": 1, "pytorch-lightning_version": cr.PL_VERSION,
                      "callbacks": {classes["model_checkpoint"]: {"monitor": "val_loss", "best_model_score": torch.tensor(1.0)}},
                      "state_dict": state, "hparams_name": "cfg",
                      "hyper_parameters": cr._omegaconf_image(cr.HYPER_PARAMETERS, classes),
                      "hparams_type": classes["DictConfig"], **(extra or {})}
        torch.save(checkpoint, path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny, tmp_path_factory) -> str:
    return write_tiny_lightning(tmp_path_factory.mktemp("ckpt") / "tiny.ckpt", authors_layout(tiny))


def test_tiny_lightning_checkpoint_round_trip(tiny, tiny_config, tiny_checkpoint, tokenizer_dir):
    torch.manual_seed(7)
    loaded = CARZero(tiny_config, checkpoint=tiny_checkpoint, text=tokenizer_dir)
    for key, value in tiny.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    images = torch.randn(2, 3, 32, 32)
    a, b = tiny.zero_shot(images, ["Nodule", "Pneumothorax", "Edema"]), loaded.zero_shot(images, ["Nodule", "Pneumothorax", "Edema"])
    assert torch.equal(a.logits, b.logits) and torch.equal(a.saliency, b.saliency)
    assert a.saliency.shape == (2, 3, 4, 4) and a.logits.shape == (2, 3)
    assert torch.equal(a.scores, torch.sigmoid(a.logits)) and not loaded.random_weights


def test_trust_checkpoint_only_widens_what_is_refused(tiny, tiny_config, tiny_checkpoint, tokenizer_dir):
    """trust_checkpoint is used only for files the safe read refuses: the released layout is still
    read safely with it (no omegaconf needed), with the same weights."""
    loaded = CARZero(tiny_config, checkpoint=tiny_checkpoint, text=tokenizer_dir, trust_checkpoint=True)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in tiny.state_dict().items())
    assert "omegaconf" not in sys.modules


@pytest.mark.parametrize("edit, pattern", [
    (lambda s: s.pop("CARZero.fusion_module.mlp_head.9.bias"), r"1 missing keys: \[mlp_head\.9\.bias\]"),
    (lambda s: s.__setitem__("CARZero.fusion_module.extra.weight", torch.zeros(2)), r"1 unexpected keys: \[fusion_module\.extra\.weight\]"),
    (lambda s: s.__setitem__("CARZero.fusion_module.decoder_norm.bias", torch.ones(32)),
     r"differ: \[fusion_module\.decoder_norm\.bias != fusion_module\.decoder\.norm\.bias\]"),
    (lambda s: s.__setitem__("CARZero.text_encoder.model.embeddings.word_embeddings.weight", torch.zeros(28996, 32)),
     r"text\.embeddings\.word_embeddings\.weight \(28996, 32\) != \(\d+, 32\)"),
    (lambda s: s.__setitem__("CARZero.img_encoder.model.blocks.0.attn.qkv.weight", torch.zeros(97, 32)), r"qkv\.weight has 97 rows"),
])
def test_bad_checkpoints_name_the_file_and_the_key(edit, pattern, tiny, tiny_config, tokenizer_dir, tmp_path):
    state = authors_layout(tiny)
    edit(state)
    path = write_tiny_lightning(tmp_path / "bad.ckpt", state)
    with pytest.raises(CheckpointError, match=pattern) as error:
        CARZero(tiny_config, checkpoint=path, text=tokenizer_dir)
    assert path in str(error.value)


def test_wrong_files(tiny, tiny_config, tiny_checkpoint, tokenizer_dir, tmp_path):
    # a KAD checkpoint
    kad = tmp_path / "best_valid.pt"
    torch.save({"model": {"decoder.layers.0.linear1.weight": torch.zeros(2, 2)}, "image_encoder": {"res_features.0.weight": torch.zeros(1)},
                "text_encoder": {"bert_model.embeddings.word_embeddings.weight": torch.zeros(1)}, "epoch": 3}, kad)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(kad))} is not a CARZero checkpoint.*image_encoder.*CARZero_best_model\.ckpt"):
        CARZero(tiny_config, checkpoint=str(kad), text=tokenizer_dir)
    # a CLIP state dict
    clip = tmp_path / "clip.pt"
    torch.save({"visual.conv1.weight": torch.zeros(1), "visual.proj": torch.zeros(1)}, clip)
    with pytest.raises(CheckpointError, match=r"lack the 'CARZero\.' prefix.*looks like a CLIP"):
        CARZero(tiny_config, checkpoint=str(clip), text=tokenizer_dir)
    # a truncated download
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(Path(tiny_checkpoint).read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=rf"cannot read checkpoint {re.escape(str(truncated))}.*truncated"):
        CARZero(tiny_config, checkpoint=str(truncated), text=tokenizer_dir)
    # no checkpoint, a missing file, a download
    with pytest.raises(ValueError, match=r"needs checkpoint=.*CARZero_best_model\.ckpt"):
        CARZero(tiny_config, text=tokenizer_dir)
    with pytest.raises(FileNotFoundError, match=r"checkpoint file not found: .*nowhere\.ckpt"):
        CARZero(tiny_config, checkpoint=str(tmp_path / "nowhere.ckpt"), text=tokenizer_dir)
    with pytest.raises(ValueError, match="would download"):
        CARZero(tiny_config, checkpoint="https://example.org/CARZero_best_model.ckpt", text=tokenizer_dir)


def test_tokenizer_folder_is_required_and_named(tiny_config, tmp_path):
    (tmp_path / "weights.ckpt").write_bytes(b"")  # with a checkpoint the text folder is required (random_init: a stand-in)
    with pytest.raises(FileNotFoundError, match=r"needs the BioClinicalMPBERT tokenizer.*vocab\.txt.*text=None"):
        CARZero(tiny_config, checkpoint=str(tmp_path / "weights.ckpt"))
    with pytest.raises(FileNotFoundError, match=r"no such folder"):
        CARZero(tiny_config, random_init=True, text=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"lacks \[.vocab\.txt or tokenizer\.json.\] \(holds \['config\.json'\]\).*Laihaoran/BioClinicalMPBERT"):
        CARZero(tiny_config, random_init=True, text=str(tmp_path / "empty"))


def test_pickle_needing_unknown_classes_is_refused(tiny, tiny_config, tokenizer_dir, tmp_path):
    path = write_tiny_lightning(tmp_path / "extra.ckpt", authors_layout(tiny), extra={"when": __import__("datetime").date(2024, 1, 1)})
    with pytest.raises(CheckpointError, match=r"datetime\.date.*Nothing from the file was run.*--model\.trust_checkpoint true"):
        CARZero(tiny_config, checkpoint=path, text=tokenizer_dir)


# -- text and preprocessing -------------------------------------------------------------------------
def test_clean_caption_as_the_authors():
    assert clean_caption("There is Atelectasis") == "there is atelectasis"
    assert clean_caption("Atelectasis") == ""  # one-word sentences are dropped
    assert clean_caption(cr.EXTRA_PROMPTS[0]) == "small left pleural effusion no pneumothorax 2 nodules seen"
    assert clean_caption("1. Mild edema.\n2. No café effusion") == "mild edema no caf effusion"
    groups, words = word_groups(["[CLS]", "there", "at", "##ele", "##ct", "[SEP]", "[PAD]"])
    assert groups == [[0], [1], [2, 3, 4], [5]] and words == ["[CLS]", "there", "atelect", "[SEP]"]


def test_preprocessing_as_trained():
    model_cfg = json.loads((REPO / "xbench_pl/models/configs/carzero.json").read_text())["preprocess"]
    assert model_cfg == {"resize": "letterbox", "canvas": 256, "size": 224, "interpolation": "area",
                         "mean": [0.4978] * 3, "std": [0.2449] * 3}
    cls, init = read_config("models", "carzero")
    assert cls is CARZero and init["architecture"] == "carzero" and init["trust_checkpoint"] is False
    import numpy as np

    from xbench_pl.geometry import Preprocess

    pre = Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in model_cfg.items()})
    image = np.zeros((512, 400), dtype=np.float32)
    image[:, :] = 0.4978
    x, affine = pre(image)
    assert x.shape == (3, 224, 224)
    # 512 x 400 -> 256 x 200, padded 28 px each side to 256 x 256, centre 224 crop: 16 px off each side
    assert abs(x[0, 100, 100].item()) < 1e-6 and x[0, 100, 5].item() == pytest.approx(-0.4978 / 0.2449, abs=1e-6)
    torch.testing.assert_close(affine, torch.tensor([0.5, 0.5, 12.0, -16.0], dtype=torch.float64))


# -- random_init and the CLI ------------------------------------------------------------------------
def test_random_init_is_deterministic_and_flagged(tiny, tiny_config, tokenizer_dir):
    again = CARZero(tiny_config, random_init=True, text=tokenizer_dir)
    assert tiny.random_weights and again.random_weights
    for key, value in tiny.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    out = tiny.zero_shot(torch.randn(3, 3, 32, 32), ["Pneumonia", "Cardiomegaly"])
    assert out.scores.shape == out.logits.shape == (3, 2) and out.saliency.shape == (3, 2, 4, 4)
    assert torch.isfinite(out.saliency).all() and ((out.scores >= 0) & (out.scores <= 1)).all()
    assert (out.saliency >= 0).all() and (out.saliency.sum(dim=(-2, -1)) <= 1 + 1e-6).all()


def test_bert_runs_on_the_columns_up_to_the_longest_caption(tiny):
    """Nothing after a caption's [SEP] counts: BERT sees the columns up to the longest caption's last token; the
    word embeddings keep their ``max_length`` rows (zero after the words), as the authors' (equality above)."""
    prompts = ["small left pleural effusion", "no pneumothorax"]
    lengths = []
    handle = tiny.text.embeddings.register_forward_hook(lambda module, inputs, output: lengths.append(inputs[0].shape[1]))
    try:
        with torch.no_grad():
            _, words, _ = tiny.encode_text(prompts)
    finally:
        handle.remove()
    longest = int(tiny.tokenize(prompts)["attention_mask"].sum(dim=1).max())
    assert lengths == [longest] and longest < tiny.max_length
    assert words.shape[1] == tiny.max_length and not words[:, longest:].any()


def test_text_cache_and_overrides(tiny_config, tokenizer_dir):
    model = CARZero(tiny_config, random_init=True, text=tokenizer_dir, texts={"Nodule": "Small nodule in the left lung"})
    assert model.prompt_for("Nodule") == "Small nodule in the left lung" and model.prompt_for("Mass") == "There is Pulmonary Mass"
    assert model.prompt_for("Lung Opacity") == "There is Lung Opacity"
    model.zero_shot(torch.randn(1, 3, 32, 32), ["Nodule", "Mass"])
    assert len(model._text_cache) == 1
    model.load_state_dict(model.state_dict())
    assert not model._text_cache


def test_cli_random_init_end_to_end(tiny_config, tokenizer_dir, tmp_path):
    result = in_process("test", "--model", "carzero", "--model.random_init", "true", "--model.text", tokenizer_dir,
                        "--model.architecture", tiny_config, "--model.trust_checkpoint", "false", "--data", "demo", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["random_weights"] is True
    assert report["config"]["model"]["class_path"] == "xbench_pl.models.carzero.CARZero"
    assert report["config"]["model"]["init_args"]["trust_checkpoint"] is False
    mean = report["datasets"]["demo"]["mean"]
    assert 0.0 <= mean["auroc"] <= 1.0 and 0.0 <= mean["pointing_game"] <= 1.0
    assert "RANDOM weights" in result.stdout + result.stderr


def test_cli_needs_a_local_tokenizer(tmp_path):
    (tmp_path / "CARZero.ckpt").write_bytes(b"")  # weights given: the tokenizer folder is too (random_init without both: a stand-in)
    result = in_process("test", "--model", "carzero", "--model.checkpoint", str(tmp_path / "CARZero.ckpt"), "--data", "demo",
                        "--out", str(tmp_path))
    assert result.returncode != 0 and "vocab.txt" in result.stderr and "BioClinicalMPBERT" in result.stderr
