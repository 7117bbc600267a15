"""DETR-style transformer decoder over patch tokens, one query per finding.

Each pre-norm layer (``normalize_before=True`` in DETR's ``TransformerDecoderLayer``):

    q = q + self_attn(norm1(q))                     # queries attend to each other (optional)
    q = q + multihead_attn(norm2(q), memory)        # queries attend to the patch tokens
    q = q + linear2(dropout(act(linear1(norm3(q)))))

with no positional encodings; ``norm`` is applied after the last layer. KAD also applies that
same ``norm`` once to the queries and to the memory before the first layer (``norm_queries``,
``norm_memory``). Attention is ``nn.MultiheadAttention`` (packed ``in_proj``, DETR's key names)
and the cross-attention weights of every layer are returned averaged over heads:
``attn [L, B, Q, N]``, each row a softmax over the N patch tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class QueryDecoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn: int, dropout: float = 0.1, activation: str = "relu", self_attn: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if self_attn:
            self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout)
            self.norm1 = nn.LayerNorm(d_model)
            self.dropout1 = nn.Dropout(dropout)
        else:
            self.self_attn = None
        self.multihead_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout)
        self.linear1 = nn.Linear(d_model, ffn)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(ffn, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.activation = ACTIVATIONS[activation]

    def forward(self, queries: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``queries [Q, B, D]``, ``memory [N, B, D]`` (sequence first, as DETR) -> (queries, head-averaged
        cross-attention ``[B, Q, N]``)."""
        if self.self_attn is not None:
            x = self.norm1(queries)
            # need_weights=True keeps the reference (non-fused) attention path of the original code
            queries = queries + self.dropout1(self.self_attn(x, x, x, need_weights=True)[0])
        x = self.norm2(queries)
        attended, attn = self.multihead_attn(x, memory, memory, need_weights=True, average_attn_weights=True)
        queries = queries + self.dropout2(attended)
        x = self.linear2(self.dropout(self.activation(self.linear1(self.norm3(queries)))))
        return queries + self.dropout3(x), attn


class QueryDecoder(nn.Module):
    """``layers`` pre-norm decoder layers plus a final ``norm``.

    Args:
        d_model, heads, layers, ffn: width, attention heads, depth, feed-forward width.
        dropout, activation: as DETR (inactive in eval mode).
        self_attn: queries self-attend in each layer (a query's output then depends on the
            other queries decoded with it).
        norm_queries, norm_memory: apply the final ``norm`` to the queries / the memory once
            before the first layer (KAD).
    """

    def __init__(self, d_model: int, heads: int, layers: int, ffn: int, dropout: float = 0.1, activation: str = "relu",
                 self_attn: bool = True, norm_queries: bool = False, norm_memory: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(QueryDecoderLayer(d_model, heads, ffn, dropout, activation, self_attn) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.norm_queries, self.norm_memory = norm_queries, norm_memory

    def forward(self, queries: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``queries [B, Q, D]`` (or ``[Q, D]``, shared by the batch), ``memory [B, N, D]`` ->
        (``out [B, Q, D]`` after the final norm, ``attn [L, B, Q, N]``)."""
        # sequence-first contiguous tensors inside, as DETR and KAD lay them out: the same GEMM
        # shapes and strides, so the same floating-point results as the original code
        batch = memory.shape[0]
        memory = memory.transpose(0, 1)
        queries = queries.unsqueeze(1).repeat(1, batch, 1) if queries.dim() == 2 else queries.transpose(0, 1).contiguous()
        memory = self.norm(memory) if self.norm_memory else memory.contiguous()
        if self.norm_queries:
            queries = self.norm(queries)
        maps = []
        for layer in self.layers:
            queries, attn = layer(queries, memory)
            maps.append(attn)
        return self.norm(queries).transpose(0, 1), torch.stack(maps)
