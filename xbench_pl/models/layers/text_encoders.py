"""BERT text towers in plain torch, in the Hugging Face ``BertModel`` state-dict layout.

``BertModel`` is the post-norm BERT encoder of Devlin et al. with the classic Hugging Face key
names (``embeddings.word_embeddings``, ``encoder.layer.{i}.attention.self.query`` ...,
``pooler.dense``), configured by the fields of a Hugging Face ``config.json``; the layout does
not move with the installed ``transformers`` version. ``BertQueryEncoder`` turns tokenised
texts into one embedding each (queries of a query decoder).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from xbench_pl.models.layers.hf_blocks import Dense, SelfAttention


def without_trailing_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` without the columns after the last real token of every text. A padding key
    gets softmax weight exactly 0, so the states of the real tokens are those of the whole padded batch (up to float32
    round-off): for a caller that reads no padding position, the columns only cost work (texts of a few tokens padded
    to 97 or 256)."""
    kept = attention_mask.any(dim=0).nonzero()
    length = int(kept.max()) + 1 if len(kept) else attention_mask.shape[1]
    return input_ids[:, :length], attention_mask[:, :length]


class _Attention(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.self = SelfAttention(width)
        self.output = Dense(width, width, eps)


class _BertLayer(nn.Module):
    def __init__(self, width: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.heads = heads
        self.attention = _Attention(width, eps)
        self.intermediate = Dense(width, intermediate)
        self.output = Dense(intermediate, width, eps)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        attn = self.attention.self
        q, k, v = (proj(x).unflatten(-1, (self.heads, -1)).transpose(1, 2) for proj in (attn.query, attn.key, attn.value))
        # the explicit ("eager") arithmetic of Hugging Face's BertSelfAttention, in its order: texts are
        # encoded once per query set, so matching the original numerics beats a fused kernel here
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + additive_mask
        context = torch.matmul(scores.softmax(dim=-1), v).transpose(1, 2).flatten(2)
        out = self.attention.output
        x = out.LayerNorm(x + out.dense(context))
        return self.output.LayerNorm(x + self.output.dense(F.gelu(self.intermediate.dense(x))))


class _Embeddings(nn.Module):
    def __init__(self, vocab: int, width: int, positions: int, types: int, eps: float, pad: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, width, padding_idx=pad)
        self.position_embeddings = nn.Embedding(positions, width)
        self.token_type_embeddings = nn.Embedding(types, width)
        self.LayerNorm = nn.LayerNorm(width, eps=eps)
        self.register_buffer("position_ids", torch.arange(positions)[None], persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids[:, : input_ids.shape[1]]
        types = torch.zeros_like(input_ids)  # one segment, as when no token_type_ids are passed
        return self.LayerNorm(self.word_embeddings(input_ids) + self.token_type_embeddings(types) + self.position_embeddings(positions))


class _Encoder(nn.Module):
    def __init__(self, layers: int, **kwargs):
        super().__init__()
        self.layer = nn.ModuleList(_BertLayer(**kwargs) for _ in range(layers))


class BertModel(nn.Module):
    """BERT encoder (+ ``pooler``: tanh of a Linear on the [CLS] state) from ``config.json`` fields.

    ``forward(input_ids, attention_mask) -> (last_hidden_state [N, T, H], pooled [N, H] or None)``.
    Padding keys get an additive ``finfo.min`` mask, as Hugging Face's BERT does.
    """

    def __init__(self, vocab_size: int = 30522, hidden_size: int = 768, num_hidden_layers: int = 12,
                 num_attention_heads: int = 12, intermediate_size: int = 3072, max_position_embeddings: int = 512,
                 type_vocab_size: int = 2, layer_norm_eps: float = 1e-12, pad_token_id: int = 0,
                 hidden_act: str = "gelu", position_embedding_type: str = "absolute", add_pooling_layer: bool = True,
                 **_ignored):
        super().__init__()
        if hidden_act != "gelu" or position_embedding_type != "absolute":
            raise ValueError("BertModel implements hidden_act='gelu' with absolute position embeddings "
                             f"(got {hidden_act!r}, {position_embedding_type!r})")
        if hidden_size % num_attention_heads:
            raise ValueError(f"BERT hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}")
        self.hidden_size = hidden_size
        self.embeddings = _Embeddings(vocab_size, hidden_size, max_position_embeddings, type_vocab_size, layer_norm_eps, pad_token_id)
        self.encoder = _Encoder(num_hidden_layers, width=hidden_size, heads=num_attention_heads,
                                intermediate=intermediate_size, eps=layer_norm_eps)
        self.pooler = Dense(hidden_size, hidden_size) if add_pooling_layer else None
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:  # BERT's initialisation: N(0, 0.02), zero biases (random_init only)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            elif module.padding_idx is not None:
                nn.init.zeros_(module.weight[module.padding_idx])

    @classmethod
    def from_config_file(cls, path: str | Path, **overrides) -> "BertModel":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"BERT config not found: {path} (a Hugging Face config.json)")
        return cls(**{**json.loads(path.read_text()), **overrides})

    def check_tokenizer(self, tokenizer, source: str, fix: str) -> None:
        """Refuse a tokenizer with more tokens than the word embeddings (its ids would index past them):
        ``source`` names the tokenizer in the error, ``fix`` says what to do."""
        vocabulary = self.embeddings.word_embeddings.num_embeddings
        if len(tokenizer) > vocabulary:
            raise ValueError(f"{source} has {len(tokenizer)} tokens, more than the text encoder's vocabulary ({vocabulary}): {fix}")

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """The embedding output and every layer's output (``num_hidden_layers + 1`` tensors ``[N, T, H]``),
        as Hugging Face's ``output_hidden_states=True`` gives them."""
        x = self.embeddings(input_ids)
        additive = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        states = [x]
        for layer in self.encoder.layer:
            x = layer(x, additive)
            states.append(x)
        return states

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.hidden_states(input_ids, attention_mask)[-1]
        pooled = None if self.pooler is None else torch.tanh(self.pooler.dense(x[:, 0]))
        return x, pooled


class BertQueryEncoder(nn.Module):
    """One embedding per text: a BERT, pooled, optionally through ``Linear -> GELU -> Linear``.

    Args:
        bert: the ``BertModel`` config (a dict of ``config.json`` fields).
        pooling: ``"pooler"`` (BERT's tanh pooler on [CLS]) or ``"cls"`` (the [CLS] hidden state).
        mlp: output widths ``[hidden, out]`` of the MLP (``mlp_embed.0``, ``mlp_embed.2``), or
            ``None`` for the pooled state itself.

    Submodules are named ``bert_model`` and ``mlp_embed`` (KAD's text-encoder layout).
    """

    POOLINGS = ("pooler", "cls")

    def __init__(self, bert: dict, pooling: str = "pooler", mlp: list[int] | None = None):
        super().__init__()
        if pooling not in self.POOLINGS:
            raise ValueError(f"BertQueryEncoder pooling must be one of {self.POOLINGS}, got {pooling!r}")
        self.pooling = pooling
        self.bert_model = BertModel(**{**bert, "add_pooling_layer": pooling == "pooler"})
        width = self.bert_model.hidden_size
        if mlp is not None:
            if len(mlp) != 2:
                raise ValueError(f"BertQueryEncoder mlp takes [hidden, out] widths, got {mlp!r}")
            self.mlp_embed = nn.Sequential(nn.Linear(width, mlp[0]), nn.GELU(), nn.Linear(mlp[0], mlp[1]))
            width = mlp[1]
        else:
            self.mlp_embed = None
        self.width = width

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden, pooled = self.bert_model(*without_trailing_padding(input_ids, attention_mask))  # only [CLS] is read
        embedding = pooled if self.pooling == "pooler" else hidden[:, 0]
        return embedding if self.mlp_embed is None else self.mlp_embed(embedding)
