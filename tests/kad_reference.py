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
import math
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

DATA = Path(__file__).resolve().parent / "data"

# A3_CLIP/test_chestxray14.py (xiaoman-zhang/KAD@591d999e): the 14 ChestX-ray14 prompts, in order.
CXR14_TEXTS = (
    "atelectasis", "cardiomegaly", "pleural effusion", "infiltration", "lung mass", "lung nodule", "pneumonia",
    "pneumothorax", "consolidation", "edema", "emphysema", "fibrosis", "pleural thicken", "hernia",
)
IMAGE_SIZE = {"kad_224": 224, "kad_512": 512, "kad_1024": 1024}
MANIFEST = {"kad_224": "kad_224", "kad_512": "kad_512", "kad_1024": "kad_512"}  # 1024 has the 512 layout
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SUBDICTS = ("image_encoder", "model", "text_encoder")  # generation order (sorted)
NUM_BATCHES_TRACKED = 100_000
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
    """One tensor of the manifest; the rule depends only on the key's name and shape."""
    if dtype == "int64":
        if key.endswith("num_batches_tracked"):
            return torch.tensor(NUM_BATCHES_TRACKED, dtype=torch.int64)
        if key.endswith("position_ids"):
            return torch.arange(shape[-1], dtype=torch.int64).expand(shape).clone()
        raise ValueError(f"no fill rule for int64 key {key!r}")
    if dtype != "float32":
        raise ValueError(f"no fill rule for {dtype} key {key!r}")
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "logit_scale":
        return math.log(1 / 0.07) + 0.1 * torch.randn(shape, generator=g)
    if leaf == "running_var":
        return 0.5 + torch.rand(shape, generator=g)
    if leaf == "running_mean":
        return 0.1 * torch.randn(shape, generator=g)
    if len(shape) == 1:  # LayerNorm / BatchNorm weights, biases (incl. in_proj_bias)
        noise = 0.1 * torch.randn(shape, generator=g)
        return 1 + noise if leaf == "weight" else noise
    fan_in = math.prod(shape[1:])
    gain = ATTENTION_GAIN if key.endswith(_ATTENTION_KEYS) else 1.0
    return torch.randn(shape, generator=g) * (gain * fan_in ** -0.5)


def state_dicts(architecture: str, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """``{"image_encoder", "text_encoder", "model"}`` state dicts, in the manifest's key order.

    Every non-alias tensor is drawn from one ``torch.Generator(seed)``, sub-dicts and keys in sorted
    order; an alias key (``res_features.*``, ``decoder.norm.*``) holds the very tensor of its source.
    """
    spec = manifest(architecture)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in SUBDICTS:
        keys, aliases = spec["keys"][name], spec["aliases"][name]
        made = {k: _fill(k, *keys[k], g) for k in sorted(keys) if k not in aliases}
        out[name] = {k: made[aliases.get(k, k)] for k in keys}
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
    specials = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list("!\"#$%&'()*+,-./0123456789:;<=>?@[\\]^_`{|}~") + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = sorted(set(_WORDS.split()) | {w for t in CXR14_TEXTS for w in t.split()})
    pieces = [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"] + [f"##{p}" for p in _PIECES]
    vocab = specials + chars + [w for w in words if w not in chars] + pieces
    assert len(vocab) == len(set(vocab)) and len(vocab) < 30522
    return vocab


def write_tokenizer(folder: str | Path) -> Path:
    """Write ``vocab.txt``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocabulary()) + "\n")
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                "mask_token": "[MASK]"}
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "do_basic_tokenize": True,
              "never_split": None, "strip_accents": None, "tokenize_chinese_chars": True,
              "model_max_length": 512, **specials}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=1) + "\n")
    return folder


def reference_images(size: int, seed: int = 0, batch: int = 2) -> torch.Tensor:
    """``[batch, 3, size, size]`` ImageNet-normalised inputs: smooth grey fields (two scales of
    up-sampled noise through a sigmoid, a chest-X-ray-like grey image in [0, 1]) repeated on RGB."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(batch, 1, 6, 6, generator=g)
    fine = torch.randn(batch, 1, 24, 24, generator=g)
    field = (F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
             + 0.5 * F.interpolate(fine, size=(size, size), mode="bilinear", align_corners=False))
    grey = torch.sigmoid(1.5 * field).expand(batch, 3, size, size)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return ((grey - mean) / std).contiguous()
