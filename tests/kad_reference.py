"""Deterministic test data for KAD: a checkpoint laid out like the released ``best_valid.pt``,
a small BERT WordPiece tokenizer folder, and normalised reference images.

Used both by the scratch run of the authors' own code (``tests/data/make_kad_manifests.py
reference``, which wrote ``tests/data/kad_reference_{224,512}.pt``) and by our tests, which load
the same checkpoint into ``xbench_pl.models.kad`` and compare with those outputs. Plain module: no
pytest, no transformers; only torch.

The layout (keys, shapes, dtypes, aliases) is read from ``tests/data/kad_{224,512}_checkpoint_manifest.json``
(derived from the authors' architecture on the meta device; see ``tests/data/make_kad_manifests.py``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from reference_common import (LETTER_PIECES, LOWER, PUNCTUATION_DIGITS, SPECIAL_TOKENS, bert_specials, fan_in_std, fill,
                              grey_fields, imagenet_normalise, seeded_tensors, write_json, write_vocab)

DATA = Path(__file__).resolve().parent / "data"

# A3_CLIP/test_chestxray14.py (xiaoman-zhang/KAD@591d999e): the 14 ChestX-ray14 prompts, in order.
CXR14_TEXTS = (
    "atelectasis", "cardiomegaly", "pleural effusion", "infiltration", "lung mass", "lung nodule", "pneumonia",
    "pneumothorax", "consolidation", "edema", "emphysema", "fibrosis", "pleural thicken", "hernia",
)
IMAGE_SIZE = {"kad_224": 224, "kad_512": 512, "kad_1024": 1024}
MANIFEST = {"kad_224": "kad_224", "kad_512": "kad_512", "kad_1024": "kad_512"}  # 1024 has the 512 layout
SUBDICTS = ("image_encoder", "model", "text_encoder")  # generation order (sorted)
MAX_LENGTH = 256  # the authors' --max_length
# Query/key projections (the decoder's packed ``in_proj_weight``, BERT's ``attention.self.{query,key}``)
# are drawn 3x wider than 1/sqrt(fan_in) so the attention softmaxes are peaked, not near-uniform:
# the cross-attention maps then depend clearly on the image and the scores on image and text.
ATTENTION_GAIN = 3.0
_ATTENTION_KEYS = ("in_proj_weight", "attention.self.query.weight", "attention.self.key.weight")

# Lower-case words of KAD's query sets (ChestX-ray14, CheXpert, ChestX-Det10, training queries) and
# other common finding names; every one is a whole word in the vocabulary.
_WORDS = """
abnormal abscess adenopathy aerate air airspace aortic arch artery aspiration atelectasis azygos
basal blunt blunting bone breast bronchiectasis bulla calcification calcified cardiac cardiomediastinum
cardiomegaly catheter cavitation cavity central changes chest chronic collapse congestion consolidation
copd covid cyst deformity density device devices diaphragm dilation disease distention drain drainage
edema effusion elevation emphysema engorgement enlarged enlargement fibrosis finding fissure fluid
focal foreign fracture granuloma ground glass heart hernia hiatal hilar hyperinflate hyperinflation
hypertension increased infiltrate infiltrates infiltration interstitial lesion line lobe lower lung
lungs marking markings mass mediastinal mediastinum metal nodule nodules no normal obscure opacity
other pacemaker pattern pleural pneumonia pneumothorax prosthesis pulmonary right left rib scar
shift small stent support thicken thickening tip trachea tube tuberculosis upper vascular venous wire
with without
"""
_PIECES = "es ed ing ation al ic ity ness ia is".split()


@lru_cache(maxsize=None)
def manifest(architecture: str) -> dict:
    """The checkpoint manifest of ``kad_224``, ``kad_512`` or ``kad_1024`` (same as 512)."""
    name = MANIFEST[_arch(architecture)]
    return json.loads((DATA / f"{name}_checkpoint_manifest.json").read_text())


def _arch(architecture: str) -> str:
    arch = architecture.replace("-", "_").lower()
    if arch not in MANIFEST:
        raise ValueError(f"unknown KAD architecture {architecture!r}: use one of {sorted(MANIFEST)}")
    return arch


def _fill(key: str, shape: list[int], dtype: str, g: torch.Generator) -> torch.Tensor:
    """One tensor of the manifest: ``reference_common.fill``, query/key projections widened."""
    if dtype == "float32" and len(shape) > 1 and key.endswith(_ATTENTION_KEYS):
        return torch.randn(shape, generator=g) * (ATTENTION_GAIN * fan_in_std(shape))
    return fill(key, shape, dtype, g)


def state_dicts(architecture: str, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """``{"image_encoder", "text_encoder", "model"}`` state dicts, in the manifest's key order.

    Every non-alias tensor is drawn from one ``torch.Generator(seed)``, sub-dicts and keys in sorted
    order; an alias key (``res_features.*``, ``decoder.norm.*``) holds the very tensor of its source.
    """
    spec = manifest(architecture)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in SUBDICTS:
        out[name] = seeded_tensors(spec["keys"][name], spec["aliases"][name], _fill, g)
    return {name: out[name] for name in ("model", "image_encoder", "text_encoder")}


def official_checkpoint(architecture: str, seed: int = 0) -> dict:
    """A dict laid out as ``A3_CLIP/main.py`` saves ``best_valid.pt`` (float32, ~165 M values)."""
    arch = _arch(architecture)
    sd = state_dicts(arch, seed)
    n_params = sum(1 for k in sd["model"]) + sum(1 for k in sd["image_encoder"]) + sum(1 for k in sd["text_encoder"])
    return {
        **sd,
        "optimizer": {
            "state": {0: {"step": 7, "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}},
            "param_groups": [
                {"lr": 5e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "initial_lr": 5e-5,
                 "params": list(range(0, n_params // 2))},
                {"lr": 5e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.02, "initial_lr": 5e-5,
                 "params": list(range(n_params // 2, n_params))},
            ],
        },
        "lr_scheduler": {
            "param_group_field": "lr", "_initial_param_group_field": "initial_lr", "base_values": [5e-5, 5e-5],
            "metric": None, "noise_range_t": None, "noise_pct": 0.67, "noise_type": "normal", "noise_std": 1.0,
            "noise_seed": 42, "t_initial": 100, "t_mul": 1.0, "lr_min": 1e-6, "decay_rate": 1.0,
            "cycle_limit": 1, "warmup_t": 20, "warmup_lr_init": 1e-6, "warmup_prefix": False,
            "t_in_epochs": True, "warmup_steps": [2.45e-6, 2.45e-6],
        },
        "config": {
            "img_res": IMAGE_SIZE[arch], "batch_size": 64, "test_batch_size": 64, "num_classes": 40, "temp": 0.07,
            "optimizer": {"opt": "adamW", "lr": 5e-5, "weight_decay": 0.02},
            "schedular": {"sched": "cosine", "lr": 5e-5, "epochs": 100, "min_lr": 1e-6, "decay_rate": 1,
                          "warmup_lr": 1e-6, "warmup_epochs": 20, "cooldown_epochs": 0},
        },
        "epoch": 37,
    }


def vocabulary() -> list[str]:
    """BERT-uncased-like WordPiece vocabulary: ``[PAD]``=0, ``[unusedN]``, ``[UNK]``=100,
    ``[CLS]``=101, ``[SEP]``=102, ``[MASK]``=103, then punctuation, digits, letters, words, ## pieces."""
    chars = PUNCTUATION_DIGITS + LOWER
    words = sorted(set(_WORDS.split()) | {w for t in CXR14_TEXTS for w in t.split()})
    pieces = LETTER_PIECES + [f"##{p}" for p in _PIECES]
    vocab = bert_specials() + chars + [w for w in words if w not in chars] + pieces
    assert len(vocab) == len(set(vocab)) and len(vocab) < 30522
    return vocab


def write_tokenizer(folder: str | Path) -> Path:
    """Write ``vocab.txt``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into ``folder``."""
    folder = write_vocab(folder, vocabulary())
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "do_basic_tokenize": True,
              "never_split": None, "strip_accents": None, "tokenize_chinese_chars": True,
              "model_max_length": 512, **SPECIAL_TOKENS}
    write_json(folder / "tokenizer_config.json", config)
    write_json(folder / "special_tokens_map.json", SPECIAL_TOKENS)
    return folder


def reference_images(size: int, seed: int = 0, batch: int = 2) -> torch.Tensor:
    """``[batch, 3, size, size]`` ImageNet-normalised inputs: smooth grey fields (two scales of
    up-sampled noise through a sigmoid, a chest-X-ray-like grey image in [0, 1]) repeated on RGB."""
    return imagenet_normalise(grey_fields(size, torch.Generator().manual_seed(seed), batch))
