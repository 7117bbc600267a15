"""Stand-ins for the text files a model built with ``random_init`` runs without (smoke tests need no file).

A stand-in tokenizer has the real one's vocabulary size and its special tokens at the real ids (``LAYOUTS``,
by the hub id of the real tokenizer), so the text tower sees ids of the same range and the same ``[CLS]`` /
``[SEP]`` / padding positions; its other entries are characters and ``##`` pieces (any text tokenises, as
letters) and unreachable fillers. Text-tower configs come from the copies shipped in ``configs/hf/``. Token
ids are thus not the real model's: such a model is as meaningless as its random weights, and its warning
says both (``ZeroShotModel.warn_random_weights``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: what a stand-in tokenizer reads: characters as whole words and as ``##`` pieces
CHARACTERS = list("!\"#$%&'()*+,-./0123456789:;<=>?@[\\]^_`{|}~abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class Layout:
    """A tokenizer's vocabulary size and special tokens (transformers' role -> (token, id)); ``wordpiece``: BERT's
    ``[CLS] A [SEP]`` framing, else MPNet's ``<s> A </s>``."""

    size: int
    specials: dict[str, tuple[str, int]]
    wordpiece: bool = True


BERT = {"pad_token": ("[PAD]", 0), "unk_token": ("[UNK]", 100), "cls_token": ("[CLS]", 101), "sep_token": ("[SEP]", 102),
        "mask_token": ("[MASK]", 103)}  # bert-base's vocab.txt: [unusedN] in between
PUBMED_BERT = {"pad_token": ("[PAD]", 0), "unk_token": ("[UNK]", 1), "cls_token": ("[CLS]", 2), "sep_token": ("[SEP]", 3),
               "mask_token": ("[MASK]", 4)}  # vocabularies built from PubMed text (PubMedBERT, CXR-BERT): specials first
#: the real tokenizers, by hub id (the names the architecture configs use)
LAYOUTS = {
    "microsoft/BiomedVLP-CXR-BERT-specialized": Layout(30522, PUBMED_BERT),
    "microsoft/BiomedVLP-BioViL-T": Layout(30522, PUBMED_BERT),
    "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract": Layout(30522, PUBMED_BERT),  # BiomedCLIP's
    "xmcmic/Med-KEBERT": Layout(30522, BERT),  # bert-base-uncased's layout
    "emilyalsentzer/Bio_ClinicalBERT": Layout(28996, BERT),  # bert-base-cased's
    "Laihaoran/BioClinicalMPBERT": Layout(28996, BERT),
    "sentence-transformers/all-mpnet-base-v2": Layout(30527, {
        "bos_token": ("<s>", 0), "cls_token": ("<s>", 0), "pad_token": ("<pad>", 1), "eos_token": ("</s>", 2),
        "sep_token": ("</s>", 2), "unk_token": ("[UNK]", 104), "mask_token": ("<mask>", 30526)}, wordpiece=False),
}


def hub_id(name: str) -> str:
    """``xmcmic/Med-KEBERT`` of a config's name for it (``hf/xmcmic/Med-KEBERT``, a folder path, the hub id)."""
    return "/".join(str(name).rstrip("/").split("/")[-2:])


def stand_in_tokenizer(name: str, lower_case: bool = True, max_length: int = 512):
    """A fast tokenizer with the layout of ``name``'s (``LAYOUTS``; ``name`` as ``hub_id`` reads it)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    layout = LAYOUTS[hub_id(name)]
    vocab: list[str | None] = [None] * layout.size
    for token, index in layout.specials.values():
        vocab[index] = token
    fill = iter(CHARACTERS + [f"##{c}" for c in CHARACTERS])
    vocab = [token or next(fill, None) or f"[stand-in {i}]" for i, token in enumerate(vocab)]
    unk = layout.specials["unk_token"][0]
    tokenizer = Tokenizer(models.WordPiece({token: i for i, token in enumerate(vocab)}, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = layout.specials["cls_token"], layout.specials["sep_token"]
    pair = f"$B:1 {sep[0]}:1" if layout.wordpiece else f"{sep[0]} $B:1 {sep[0]}:1"  # MPNet: </s></s> between
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{cls[0]} $A {sep[0]}", pair=f"{cls[0]} $A {sep[0]} {pair}",
                                                             special_tokens=[cls, sep])
    tokenizer.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length,
                                   **{role: token for role, (token, _) in layout.specials.items()})
