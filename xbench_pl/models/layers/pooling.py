"""Global pooling of patch tokens: ``forward(tokens [B, N, C]) -> [B, out]``.

``AttentionPool2d`` is CLIP's ResNet attention pooling (Radford et al. 2021, the "modified
ResNet" head): the mean token is prepended to the patch tokens, learned absolute positions are
added, and the mean token's multi-head attention over all ``N + 1`` tokens, projected by
``c_proj``, is the global feature. Key names (``positional_embedding``, ``q_proj``, ``k_proj``,
``v_proj``, ``c_proj``) follow that layout, which MAVL reuses. Only the mean token's query is
computed (the other tokens' outputs are never used), which gives the same feature.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AttentionPool2d(nn.Module):
    """Attention pooling over a fixed ``grid x grid`` of ``width``-channel tokens.

    Args:
        grid: side of the token grid (the positional embedding has ``grid**2 + 1`` rows, so the
            input size is fixed).
        width: token channels; heads: attention heads; out: output width (``c_proj``).
    """

    def __init__(self, grid: int, width: int, heads: int, out: int | None = None):
        super().__init__()
        if width % heads:
            raise ValueError(f"AttentionPool2d width {width} is not a multiple of heads {heads}")
        self.heads = heads
        self.positional_embedding = nn.Parameter(torch.randn(grid * grid + 1, width) / width ** 0.5)
        self.k_proj = nn.Linear(width, width)
        self.q_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.c_proj = nn.Linear(width, out or width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, N, C]`` (row-major patches) -> global feature ``[B, out]``."""
        if tokens.shape[1] + 1 != self.positional_embedding.shape[0]:
            raise ValueError(f"AttentionPool2d was built for {self.positional_embedding.shape[0] - 1} tokens, got "
                             f"{tokens.shape[1]}: the input image size is fixed by the positional embedding")
        x = torch.cat([tokens.mean(dim=1, keepdim=True), tokens], dim=1) + self.positional_embedding.to(tokens.dtype)
        split = lambda t: t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # noqa: E731  [B, heads, T, C/heads]
        q, k, v = split(self.q_proj(x[:, :1])), split(self.k_proj(x)), split(self.v_proj(x))
        pooled = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)  # [B, 1, C]
        return self.c_proj(pooled[:, 0])
