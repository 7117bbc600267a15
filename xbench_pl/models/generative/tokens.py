"""A stand-in chat tokenizer for a generative model built with ``random_init`` (no tokenizer files): every printable
character a token of its own, the family's special tokens (image, chat turns, box syntax) and its two answer words as
single tokens, padding on the left. Ids are not the release's: such a model is as meaningless as its random weights,
and its warning says both (``ZeroShotModel.warn_random_weights``)."""

from __future__ import annotations

import string

PAD, EOS = "<pad>", "<eos>"


def chat_stand_in(special_tokens: tuple[str, ...], answers: tuple[str, str]):
    """A ``PreTrainedTokenizerFast``: ``<pad>`` 0, ``<eos>`` 1, the characters of ``string.printable``, then
    ``special_tokens`` and ``answers`` as added tokens (matched whole, never split)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1}
    for character in string.printable:
        vocab.setdefault(character, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, padding_side="left")
    out.add_special_tokens({"additional_special_tokens": [t for t in special_tokens if t not in vocab]})
    out.add_tokens(list(answers))
    return out
