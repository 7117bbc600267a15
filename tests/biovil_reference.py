"""Deterministic test data for BioViL / BioViL-T: image checkpoints laid out like the released
``biovil_image_resnet50_proj_size_128.pt`` / ``biovil_t_image_model_proj_size_128.pt`` (a bare state
dict of the authors' ``ImageModel``), a tiny CXR-BERT hub folder (``config.json``, ``vocab.txt``,
``tokenizer_config.json``, ``special_tokens_map.json``, ``pytorch_model.bin`` of their
``CXRBertModel`` layout), reference images and prompts.

Used both by the scratch run of the authors' own code (``tests/data/make_biovil_reference.py
reference``, which wrote ``tests/data/biovil_reference.pt``) and by ``tests/test_biovil.py``, which
loads the same files into ``xbench_pl.models.biovil`` and compares. Plain module: only torch.

Layout facts (keys, shapes, dtypes, aliases) come from ``tests/data/biovil_manifest.json``, derived
from the authors' classes on the meta device (``tests/data/make_biovil_reference.py manifests``).
The image tower is the real ResNet-50 (its size does not depend on the input); the text tower is a
tiny BERT with the real 128-wide projection, and a vocabulary laid out as CXR-BERT's own (special
tokens first: ``[PAD]``=0, ``[UNK]``=1, ``[CLS]``=2, ``[SEP]``=3, ``[MASK]``=4), not bert-base's.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from reference_common import LETTER_PIECES, LOWER, PUNCTUATION_DIGITS, fill, grey_fields, seeded_tensors, write_json, write_vocab

DATA = Path(__file__).resolve().parent / "data"
MANIFEST = DATA / "biovil_manifest.json"

HIML_COMMIT = "b67c1d27c6b17d8e8ff01f8c507f3cabdb307388"  # microsoft/hi-ml, hi-ml-multimodal 0.2.2
VARIANTS = ("biovil", "biovil_t")
IMAGE_WEIGHTS = {"biovil": "biovil_image_resnet50_proj_size_128.pt", "biovil_t": "biovil_t_image_model_proj_size_128.pt"}
REFERENCE_SIZE = 192  # the reference inputs: a 6 x 6 feature grid (ResNet-50 stride 32), smaller than the smoothing kernel
JOINT = 128

CXR_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = "no small left right apical pleural effusion pneumothorax heart size is normal there the of and"
# the classes as zero_shot gets them; the prompts are "{}" and "no {}" of each (CheXzero's pair). The last two
# are free-text phrases (phrase grounding): capitals, an unknown word (split into ## pieces), final "." and "!"
CLASSES = ("Pleural Effusion", "Pneumothorax", "Small left apical pneumothoraces.", "Heart size is normal!")

# config.json of the hub folder (CXRBertConfig fields), BERT shrunk; the projection keeps the joint 128
TINY_TEXT_CONFIG = {
    "architectures": ["CXRBertModel"], "model_type": "cxr-bert", "attention_probs_dropout_prob": 0.25,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.25, "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 64, "layer_norm_eps": 1e-12, "max_position_embeddings": 64, "num_attention_heads": 2,
    "num_hidden_layers": 2, "pad_token_id": 0, "position_embedding_type": "absolute", "projection_size": JOINT,
    "type_vocab_size": 2, "vocab_size": None,  # set to the vocabulary's length
}
TOKENIZER_CONFIG = {"do_lower_case": True, "model_max_length": 512, "tokenizer_class": "CXRBertTokenizer"}
SPECIAL_TOKENS_MAP = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"}


@lru_cache(maxsize=1)
def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def vocabulary() -> list[str]:
    """CXR-BERT-like WordPiece vocabulary: its five special tokens first, punctuation, digits, letters, words, ## pieces."""
    chars = PUNCTUATION_DIGITS + LOWER
    vocab = CXR_BERT_SPECIALS + chars + [w for w in sorted(set(_WORDS.split())) if w not in chars] + LETTER_PIECES
    assert len(vocab) == len(set(vocab))
    return vocab


def tiny_text_config() -> dict:
    return {**TINY_TEXT_CONFIG, "vocab_size": len(vocabulary())}


def image_state_dict(variant: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """The authors' ``ImageModel`` state dict of ``variant`` (every key of the released file), seeded."""
    entry = manifest()["image"][variant]
    return seeded_tensors(entry["keys"], entry["aliases"], fill, torch.Generator().manual_seed(seed))


def write_image_checkpoint(path: str | Path, variant: str, seed: int = 0) -> Path:
    path = Path(path)
    torch.save(image_state_dict(variant, seed), path)
    return path


def text_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """The tiny ``CXRBertModel`` (``bert.*``, MLM head ``cls.predictions.*``, ``cls_projection_head.*``), seeded;
    the tied MLM decoder holds the word embeddings' very tensor, as a saved file does."""
    entry = manifest()["text"]["tiny"]
    return seeded_tensors(entry["keys"], entry["aliases"], fill, torch.Generator().manual_seed(seed + 1))


def write_text_folder(folder: str | Path, seed: int = 0, weights: bool = True) -> Path:
    """A local hub folder like ``microsoft/BiomedVLP-CXR-BERT-specialized``'s, with the tiny config."""
    folder = write_vocab(folder, vocabulary())
    write_json(folder / "config.json", tiny_text_config(), indent=2)
    write_json(folder / "tokenizer_config.json", TOKENIZER_CONFIG, indent=2)
    write_json(folder / "special_tokens_map.json", SPECIAL_TOKENS_MAP, indent=2)
    if weights:
        torch.save(text_state_dict(seed), folder / "pytorch_model.bin")
    return folder


def reference_images(seed: int = 0, batch: int = 2, size: int = REFERENCE_SIZE) -> torch.Tensor:
    """``[batch, 3, size, size]`` model inputs as their transform leaves them: grey in [0, 1] on three equal
    channels, no mean/std."""
    return grey_fields(size, torch.Generator().manual_seed(seed), batch).contiguous()
