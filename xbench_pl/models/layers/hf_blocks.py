"""Key-level blocks of the Hugging Face BERT and ViT state-dict layouts, shared by the text and image towers."""

from __future__ import annotations

from torch import nn


class Dense(nn.Module):
    """One ``dense`` Linear (Hugging Face's ``*.dense`` key level), and its ``LayerNorm`` when ``eps`` is given."""

    def __init__(self, fan_in: int, fan_out: int, eps: float | None = None):
        super().__init__()
        self.dense = nn.Linear(fan_in, fan_out)
        if eps is not None:
            self.LayerNorm = nn.LayerNorm(fan_out, eps=eps)


class SelfAttention(nn.Module):
    """The ``query``, ``key`` and ``value`` projections of one attention layer (its owner does the attention)."""

    def __init__(self, width: int):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
