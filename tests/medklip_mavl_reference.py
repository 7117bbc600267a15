"""Deterministic test data for MedKLIP and MAVL: checkpoints laid out like the released files,
stand-in query books, a tiny BERT folder, synthetic knowledge files and normalised images.

Used both by the scratch run of the authors' own code (``tests/data/make_medklip_mavl_manifests.py
reference`` / ``text``, which wrote ``tests/data/{medklip,mavl}_reference.pt`` and
``tests/data/medklip_text_reference.pt``) and by our tests, which load the same checkpoints into
``xbench_pl`` and compare with those outputs. Plain module: no pytest; only torch (``write_bert_folder``
also needs ``safetensors``).

* ``official_checkpoint("medklip")`` is laid out as ``checkpoint_final.pth`` (MediaBrain-SJTU/MedKLIP,
  ``PreTrain_MedKLIP/train_MedKLIP.py`` saves ``{model, optimizer, lr_scheduler, config, epoch}`` from an
  ``nn.DataParallel`` model: every key starts with ``module.``, ``cl_fc`` included).
* ``official_checkpoint("mavl")`` is laid out as ``checkpoint_full_40.pth`` / ``_46.pth`` (HieuPhan33/MAVL,
  ``Pretrain/train_MAVL.py``, an accelerate/DDP model: ``module.`` prefix, ``temp`` and ``location_emb``
  included).
* ``query_book`` stands in for the Bio_ClinicalBERT [CLS] vectors (real weights are not available):
  [75, 768] for MedKLIP, [675, 768] for MAVL in decoder order (query ``9 * disease + concept``, concept 0 the
  description, 1..8 the aspects in ``ASPECTS`` order).

Key names, shapes and dtypes come from ``tests/data/{medklip,mavl}_checkpoint_manifest.json`` (the
authors' classes built on the meta device, see ``tests/data/make_medklip_mavl_manifests.py``).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import torch

from reference_common import (LETTER_PIECES, LOWER, PUNCTUATION_DIGITS, SPECIAL_TOKENS, bert_specials, fill, grey_fields,
                              imagenet_normalise, seeded_tensors, write_json, write_vocab)

DATA = Path(__file__).resolve().parent / "data"

MEDKLIP_COMMIT = "8e60b035ddc160f44a389f476b596f1052f02d8f"
MAVL_COMMIT = "15970307d6a82b054f1c2da91bb6672346a40cb0"
MODELS = ("medklip", "mavl")

# The 75 entities, in the order of both repos' ``original_class`` (MedKLIP
# Sample_zero-shot_Classification_CXR14/test.py:24-32, MAVL Zero-shot_grounding/test.py:22-30).
ENTITIES = (
    "normal", "clear", "sharp", "sharply", "unremarkable", "intact", "stable", "free",
    "effusion", "opacity", "pneumothorax", "edema", "atelectasis", "tube", "consolidation", "process", "abnormality",
    "enlarge", "tip", "low", "pneumonia", "line", "congestion", "catheter", "cardiomegaly", "fracture", "air",
    "tortuous", "lead", "disease", "calcification", "prominence", "device", "engorgement", "picc", "clip",
    "elevation", "expand", "nodule", "wire", "fluid", "degenerative", "pacemaker", "thicken", "marking", "scar",
    "hyperinflate", "blunt", "loss", "widen", "collapse", "density", "emphysema", "aerate", "mass", "crowd",
    "infiltrate", "obscure", "deformity", "hernia", "drainage", "distention", "shift", "stent", "pressure", "lesion",
    "finding", "borderline", "hardware", "dilation", "chf", "redistribution", "aspiration", "tail_abnorm_obs",
    "excluded_obs",
)
# MedKLIP's own "observation explanation.json" spells the pneumonia key "eumonia" (its test code reads the
# values in file order, so the typo is harmless there); MAVL's copy spells it right and adds "covid19".
MEDKLIP_FILE_KEYS = tuple("eumonia" if e == "pneumonia" else e for e in ENTITIES)
MAVL_FILE_KEYS = ENTITIES + ("covid19",)
# The 8 aspect prefixes of MAVL's gpt4_mimic.json, in list order; three diseases write "others".
ASPECTS = ("border", "fluid", "location", "opacity", "other", "patterns", "shape", "texture")
OTHERS_SPELLING = ("shift", "tail_abnorm_obs", "excluded_obs")
GROUNDING_CONCEPTS = (0, 6, 7, 8)  # description, patterns, shape, texture (Zero-shot_grounding/test.py:202)
N_CONCEPTS = 9
MAX_LENGTH = 64
IMAGE_SIZE = 224
GRID = 14


@lru_cache(maxsize=None)
def manifest(model: str) -> dict:
    """The checkpoint manifest of ``medklip`` or ``mavl``."""
    return json.loads((DATA / f"{_model(model)}_checkpoint_manifest.json").read_text())


def _model(model: str) -> str:
    name = model.lower()
    if name not in MODELS:
        raise ValueError(f"unknown model {model!r}: use one of {MODELS}")
    return name


def _fill(key: str, shape: list[int], dtype: str, g: torch.Generator) -> torch.Tensor:
    """One tensor of the manifest: MAVL's temperatures and PReLU slope, else ``reference_common.fill``."""
    if dtype == "float32" and key.endswith("temp"):  # MAVL's learned temperatures, initialised at log(1/0.07)
        return math.log(1 / 0.07) + 0.1 * torch.randn(shape, generator=g)
    if dtype == "float32" and key.endswith("res_l1.1.weight"):  # MAVL's PReLU slope (torch's 0.25): keep it non-linear
        return 0.25 + 0.1 * torch.randn(shape, generator=g)
    return fill(key, shape, dtype, g)


def state_dict(model: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """The ``model`` entry of the released checkpoint (``module.`` keys, manifest order).

    Every tensor is drawn from one ``torch.Generator(seed)``, keys in sorted order."""
    return seeded_tensors(manifest(model)["keys"], {}, _fill, torch.Generator().manual_seed(seed))


def official_checkpoint(model: str, seed: int = 0) -> dict:
    """A dict laid out as the authors' training scripts save it (float32; MedKLIP ~14.5 M values,
    MAVL ~20 M). Loads with ``torch.load(..., weights_only=True)``."""
    name = _model(model)
    sd = state_dict(name, seed)
    n = len(sd)
    config = {
        "image_res": 224, "d_model": 256, "num_queries": 75, "dropout": 0.1, "attribute_set_size": 2, "N": 4, "H": 4,
        "text_encoder": "emilyalsentzer/Bio_ClinicalBERT", "no_cl": False, "exclude_class": False,
        "optimizer": {"opt": "adamW", "lr": 1e-4, "weight_decay": 0.02},
        "schedular": {"sched": "cosine", "lr": 1e-4, "epochs": 100 if name == "medklip" else 60, "min_lr": 1e-5,
                      "decay_rate": 1, "warmup_lr": 1e-5, "warmup_epochs": 5, "cooldown_epochs": 0},
    }
    if name == "medklip":
        config.update(res_base_model="resnet50")
    else:
        config.update(base_model="resnet50", pretrained=True, decoder="cross", self_attention=True, cl_global=0.1,
                      concept_book="concept_gen/gpt4_mimic.json")
    return {
        "model": sd,
        "optimizer": {
            "state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}},
            "param_groups": [
                {"lr": 1e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
                 "initial_lr": 1e-4, "params": list(range(0, n // 2))},
                {"lr": 1e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.02, "amsgrad": False,
                 "initial_lr": 1e-4, "params": list(range(n // 2, n))},
            ],
        },
        "lr_scheduler": {
            "param_group_field": "lr", "_initial_param_group_field": "initial_lr", "base_values": [1e-4, 1e-4],
            "metric": None, "noise_range_t": None, "noise_pct": 0.67, "noise_type": "normal", "noise_std": 1.0,
            "noise_seed": 42, "t_initial": config["schedular"]["epochs"], "t_mul": 1.0, "lr_min": 1e-5,
            "decay_rate": 1.0, "cycle_limit": 1, "warmup_t": 5, "warmup_lr_init": 1e-5, "warmup_prefix": False,
            "t_in_epochs": True, "warmup_steps": [1.8e-5, 1.8e-5],
        },
        "config": config,
        "epoch": 99 if name == "medklip" else 40,
    }


def query_book(model: str, seed: int = 0) -> torch.Tensor:
    """Stand-in for the Bio_ClinicalBERT [CLS] embeddings, in decoder order: [75, 768] for MedKLIP,
    [675, 768] for MAVL (row ``9 * i + j``: entity ``i``, concept ``j``; ``j = 0`` the description).

    Drawn from ``torch.Generator(10_000 + seed)`` (never the checkpoint's stream): N(0, 1) plus a
    per-row offset, so rows differ in norm as real [CLS] vectors do."""
    n = len(ENTITIES) * (N_CONCEPTS if _model(model) == "mavl" else 1)
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randn(n, 768, generator=g) + 0.5 * torch.randn(n, 1, generator=g)


def reference_images(seed: int = 0, batch: int = 2) -> torch.Tensor:
    """``[batch, 3, 224, 224]`` ImageNet-normalised inputs: smooth grey fields (two scales of
    up-sampled noise through a sigmoid, a chest-X-ray-like grey image in [0, 1]) repeated on RGB."""
    return imagenet_normalise(grey_fields(IMAGE_SIZE, torch.Generator().manual_seed(20_000 + seed), batch))


# --- synthetic knowledge files (made-up text in the authors' JSON shapes) -------------------------

_FILLER = ("synthetic", "shadow", "region", "near", "the", "lung", "base", "with", "small", "bright", "dark",
           "patch", "line", "border", "smooth", "irregular", "left", "right", "upper", "lower", "zone", "heart",
           "edge", "fluid", "air", "pattern", "texture", "shape", "of", "and", "a", "in", "on", "no")


def _sentence(rank: int, words: int) -> str:
    """A made-up, deterministic sentence of ``words`` filler words (vocabulary words only)."""
    return " ".join(_FILLER[(rank * 7 + 3 * i + i * i) % len(_FILLER)] for i in range(words))


def description(entity: str) -> str:
    """A made-up description of an entity (the authors' real descriptions are never shipped)."""
    i = ENTITIES.index(entity) if entity in ENTITIES else len(ENTITIES)
    name = entity.replace("_", " ")
    return f"{name} is a {_sentence(i, 6 + i % 9)}."


def aspects(entity: str) -> list[str]:
    """Eight made-up aspect sentences ``"<aspect>: <text>"`` in MAVL's order; obscure/opacity is long
    (more than 64 tokens, as one of the authors' sentences is)."""
    i = ENTITIES.index(entity) if entity in ENTITIES else len(ENTITIES)
    out = []
    for j, aspect in enumerate(ASPECTS):
        if aspect == "other" and entity in OTHERS_SPELLING:
            aspect = "others"
        words = 80 if (entity, j) == ("obscure", 3) else 4 + (i + j) % 11
        out.append(f"{aspect}: {_sentence(i * 8 + j, words)}.")
    return out


def write_knowledge(folder: str | Path) -> dict[str, Path]:
    """Write synthetic knowledge files shaped as the authors':

    * ``medklip/observation explanation.json``: the 75 entity keys in order ("eumonia" typo kept),
      one description string each (MedKLIP ``PreTrain_MedKLIP/data_file/observation explanation.json``);
    * ``mavl/observation explanation.json``: the 75 keys (pneumonia spelled right) + ``covid19``
      (MAVL ``Zero-shot_grounding/observation explanation.json``);
    * ``mavl/gpt4_mimic.json``: the same 76 keys, each a list of 8 ``"<aspect>: text"`` strings
      (MAVL ``Pretrain/concept_gen/gpt4_mimic.json``).
    """
    folder = Path(folder)
    (folder / "medklip").mkdir(parents=True, exist_ok=True)
    (folder / "mavl").mkdir(parents=True, exist_ok=True)
    names = ENTITIES + ("covid19",)
    medklip = {key: description(e) for key, e in zip(MEDKLIP_FILE_KEYS, ENTITIES)}
    mavl = {e: description(e) for e in names}
    concepts = {e: aspects(e) for e in names}
    paths = {
        "medklip_descriptions": folder / "medklip" / "observation explanation.json",
        "mavl_descriptions": folder / "mavl" / "observation explanation.json",
        "mavl_aspects": folder / "mavl" / "gpt4_mimic.json",
    }
    for key, data in (("medklip_descriptions", medklip), ("mavl_descriptions", mavl), ("mavl_aspects", concepts)):
        write_json(paths[key], data, indent=4)
    return paths


# --- tiny BERT folder ---------------------------------------------------------------------------

BERT_CONFIG = {
    "architectures": ["BertModel"], "model_type": "bert", "hidden_size": 768, "num_hidden_layers": 2,
    "num_attention_heads": 12, "intermediate_size": 128, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 128, "type_vocab_size": 2,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute",
}
# Sentences for the BERT/tokenizer check: upper case and accents (lower-cased and stripped by the
# authors' tokenizer), punctuation, word pieces, an unknown word, and one longer than 64 tokens.
TEXT_SAMPLES = (
    "Pneumonia is an infection of the lung.",
    "Édema: fluid in the lung, near the heart.",
    "small bright nodules and irregular patches",
    "a zzqx shadow §",
    "effusion",
    " ".join(["upper lung zone with small bright patch"] * 10) + ".",
)
_TEXT_WORDS = ("pneumonia is an infection edema nodule nodules effusion patches patch small bright irregular "
               "lung heart near fluid in of the a shadow upper zone with and").split()
_CASED = ("Pneumonia", "Edema", "The", "Lung")  # present only so that a non-lower-casing tokenizer differs


def vocabulary() -> list[str]:
    """A cased-looking WordPiece vocabulary laid out like Bio_ClinicalBERT's (``[PAD]``=0,
    ``[unusedN]``, ``[UNK]``=100, ``[CLS]``=101, ``[SEP]``=102, ``[MASK]``=103), then punctuation,
    digits, letters, words of the synthetic texts, a few capitalised words and ## pieces."""
    chars = PUNCTUATION_DIGITS + LOWER + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    words = set(_FILLER) | set(_TEXT_WORDS) | set(ASPECTS) | {"others", "is", "covid19"}
    for e in ENTITIES:
        words.update(e.replace("_", " ").split())
    words = sorted(w for w in words if w not in chars and not any(ch.isdigit() for ch in w)) + ["covid", "19"]
    pieces = LETTER_PIECES + [f"##{p}" for p in ("es", "ing", "ed")]
    vocab = bert_specials() + chars + [w for w in words if w not in chars] + list(_CASED) + pieces
    assert len(vocab) == len(set(vocab))
    return vocab


def _bert_parameters(config: dict) -> dict[str, list[int]]:
    """BertModel parameter names and shapes (stable across transformers 4.x and 5; no buffers)."""
    h, ffn, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    shapes = {
        "embeddings.word_embeddings.weight": [v, h],
        "embeddings.position_embeddings.weight": [config["max_position_embeddings"], h],
        "embeddings.token_type_embeddings.weight": [config["type_vocab_size"], h],
        "embeddings.LayerNorm.weight": [h], "embeddings.LayerNorm.bias": [h],
        "pooler.dense.weight": [h, h], "pooler.dense.bias": [h],
    }
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[p + name + ".weight"] = [h, h]
            shapes[p + name + ".bias"] = [h]
        shapes.update({
            p + "attention.output.LayerNorm.weight": [h], p + "attention.output.LayerNorm.bias": [h],
            p + "intermediate.dense.weight": [ffn, h], p + "intermediate.dense.bias": [ffn],
            p + "output.dense.weight": [h, ffn], p + "output.dense.bias": [h],
            p + "output.LayerNorm.weight": [h], p + "output.LayerNorm.bias": [h],
        })
    return shapes


def write_bert_folder(folder: str | Path, seed: int = 0, tokenizer_config: bool = True) -> Path:
    """Write a tiny random BERT (hidden 768 as Bio_ClinicalBERT, 2 layers, FFN 128): ``config.json``,
    ``model.safetensors`` (parameters from ``torch.Generator(30_000 + seed)``, sorted-key order; embeddings
    std 1, matrices std 1/sqrt(fan_in)), ``vocab.txt`` and, unless ``tokenizer_config=False``,
    ``tokenizer_config.json`` with ``do_lower_case: true`` (what Bio_ClinicalBERT's tokenizer does:
    its folder has no tokenizer_config.json and BertTokenizer lower-cases by default)."""
    from safetensors.torch import save_file

    vocab = vocabulary()
    folder = write_vocab(folder, vocab)
    config = {**BERT_CONFIG, "vocab_size": len(vocab)}
    g = torch.Generator().manual_seed(30_000 + seed)
    tensors = {}
    shapes = _bert_parameters(config)
    for key in sorted(shapes):
        shape = shapes[key]
        if key.startswith("embeddings.") and key.endswith("embeddings.weight"):
            tensors[key] = torch.randn(shape, generator=g)
        else:
            tensors[key] = _fill(key, shape, "float32", g)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_json(folder / "config.json", config)
    if tokenizer_config:
        tok = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512, **SPECIAL_TOKENS}
        write_json(folder / "tokenizer_config.json", tok)
    return folder


def text_samples() -> dict[str, list[str]]:
    """The texts of ``tests/data/medklip_text_reference.pt``: free sentences for MedKLIP's book code,
    and for MAVL's two descriptions with 8 aspects each (concept book of 18 rows)."""
    return {
        "medklip": list(TEXT_SAMPLES),
        "mavl_descriptions": [description("pneumonia"), description("obscure")],
        "mavl_aspects": aspects("pneumonia") + aspects("obscure"),
    }
