"""Patch-token image encoders: ``forward(images) -> (tokens [B, N, C], grid (h, w))``.

Tokens are in row-major raster order (token ``y * w + x``), so ``tokens.unflatten(1, grid)``
is an image-like ``[B, h, w, C]`` with row = y. Both encoders are built with random weights;
a family's checkpoint fills them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from xbench_pl.models.layers.hf_blocks import Dense, SelfAttention


class ResNetPatches(nn.Module):
    """torchvision ResNet-50 trunk up to ``stage`` 3 (stride 16, 1024 channels) or 4 (stride 32,
    2048 channels); the feature map's pixels are the tokens.

    Submodules keep torchvision's names (``conv1``, ``bn1``, ``layer1`` ...), so a torchvision
    state dict of the used stages loads as is; the classifier (``fc``) and the stages past
    ``stage`` are not built into the module.
    """

    CHANNELS = {3: 1024, 4: 2048}

    def __init__(self, stage: int = 4):
        super().__init__()
        if stage not in self.CHANNELS:
            raise ValueError(f"ResNetPatches stage must be 3 or 4, got {stage!r}")
        net = torchvision.models.resnet50(weights=None)  # never downloads
        self.stage = stage
        self.channels = self.CHANNELS[stage]
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        for index in range(1, stage + 1):
            setattr(self, f"layer{index}", getattr(net, f"layer{index}"))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        for index in range(1, self.stage + 1):
            x = getattr(self, f"layer{index}")(x)
        return x.flatten(2).transpose(1, 2).contiguous(), (x.shape[-2], x.shape[-1])


# -- ViT-B/16 in the Hugging Face ViTModel layout of google/vit-base-patch16-224-in21k ----------
class _Attention(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.attention = SelfAttention(width)
        self.output = Dense(width, width)


class _ViTLayer(nn.Module):
    def __init__(self, width: int, heads: int, mlp: int, eps: float):
        super().__init__()
        self.heads = heads
        self.attention = _Attention(width)
        self.intermediate = Dense(width, mlp)
        self.output = Dense(mlp, width)
        self.layernorm_before = nn.LayerNorm(width, eps=eps)
        self.layernorm_after = nn.LayerNorm(width, eps=eps)
        # set by an explainer (explainers.towers.recorded_attention): attention computed explicitly, its
        # probabilities passed through this callable; None: the fused kernel
        self.explicit_attention = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layernorm_before(x)
        qkv = self.attention.attention
        q, k, v = (proj(h).unflatten(-1, (self.heads, -1)).transpose(1, 2) for proj in (qkv.query, qkv.key, qkv.value))
        if self.explicit_attention is None:
            attended = F.scaled_dot_product_attention(q, k, v)
        else:
            attended = self.explicit_attention(((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)) @ v
        attended = attended.transpose(1, 2).flatten(2)
        x = x + self.attention.output.dense(attended)
        return x + self.output.dense(F.gelu(self.intermediate.dense(self.layernorm_after(x))))


class _ViTEncoder(nn.Module):
    def __init__(self, layers: int, **kwargs):
        super().__init__()
        self.layer = nn.ModuleList(_ViTLayer(**kwargs) for _ in range(layers))


class _PatchEmbeddings(nn.Module):
    def __init__(self, patch: int, width: int, channels: int):
        super().__init__()
        self.projection = nn.Conv2d(channels, width, kernel_size=patch, stride=patch)


class _ViTEmbeddings(nn.Module):
    def __init__(self, image_size: int, patch: int, width: int, channels: int):
        super().__init__()
        self.grid = (image_size // patch, image_size // patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.position_embeddings = nn.Parameter(torch.zeros(1, self.grid[0] * self.grid[1] + 1, width))
        self.patch_embeddings = _PatchEmbeddings(patch, width, channels)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.position_embeddings, std=0.02)


class ViTPatches(nn.Module):
    """ViT (pre-norm, class token, learned absolute positions, GELU MLP) with the state-dict
    layout of Hugging Face's ``ViTModel`` as released for ``google/vit-base-patch16-224-in21k``
    (``embeddings.*``, ``encoder.layer.{i}.attention.attention.query`` ..., ``layernorm``;
    no pooler). Tokens: the final-layernormed hidden states without the class token,
    ``last_hidden_state[:, 1:]``, on a ``image_size / patch_size`` square grid.

    Args follow the Hugging Face ``ViTConfig`` names, so a ``config.json`` can be passed as is.
    """

    def __init__(self, image_size: int = 224, patch_size: int = 16, hidden_size: int = 768, num_hidden_layers: int = 12,
                 num_attention_heads: int = 12, intermediate_size: int = 3072, layer_norm_eps: float = 1e-12,
                 num_channels: int = 3, hidden_act: str = "gelu", qkv_bias: bool = True, **_ignored):
        super().__init__()
        if hidden_act != "gelu" or not qkv_bias:
            raise ValueError("ViTPatches implements hidden_act='gelu' with qkv_bias=True (the ViT-B/16 in21k release)")
        if image_size % patch_size:
            raise ValueError(f"ViT image_size {image_size} is not a multiple of patch_size {patch_size}")
        self.channels = hidden_size
        self.embeddings = _ViTEmbeddings(image_size, patch_size, hidden_size, num_channels)
        self.encoder = _ViTEncoder(num_hidden_layers, width=hidden_size, heads=num_attention_heads,
                                   mlp=intermediate_size, eps=layer_norm_eps)
        self.layernorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """All final-layernormed hidden states, class token first: ``[B, 1 + N, C]``."""
        grid = self.embeddings.grid
        if images.shape[-2] // self.embeddings.patch_embeddings.projection.stride[0] != grid[0] or images.shape[-2] != images.shape[-1]:
            raise ValueError(f"ViTPatches expects {grid[0]}x{grid[1]} patches (a square input of its image_size), "
                             f"got an input of {tuple(images.shape[-2:])}")
        x = self.embeddings.patch_embeddings.projection(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.embeddings.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.embeddings.position_embeddings
        for layer in self.encoder.layer:
            x = layer(x)
        return self.layernorm(x)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        return self.forward_features(images)[:, 1:], self.embeddings.grid
