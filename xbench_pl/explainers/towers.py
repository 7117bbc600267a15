"""What explainers need to know of a model's image tower and query decoder, whatever its family.

A tower is found by type under the model's ``IMAGE_TOWER`` path: xbench_pl's ``ResNetPatches``
(MedKLIP, MAVL, KAD) and ``ViTPatches`` (CARZero, DeViDe), open_clip's ``VisionTransformer`` (CLIP)
open_clip's ``TimmModel`` around a timm ViT (BiomedCLIP) and transformers' ``Dinov2Model`` (RadZero, MAIRA-2) and
``SiglipVisionModel`` where a model sends it one view per image (MedGemma; ``SIGLIP_ONE_VIEW``); CAMs only for these
two: their attention sites are not recorded, so rollout and chefer refuse them. Qwen2.5-VL's windowed tower (tokens
without a batch dimension) and LLaVA-OneVision's (a base view and tiles per image) are refused. ``Tower`` gives the default CAM layer
(the last ResNet stage; a ViT's last block's first norm, whose tokens every later step reads),
the patch grid, and, for ViTs, each block's attention probabilities ``[B, heads, T, T]`` (the fused kernels the
towers use for inference return none) two ways: ``recorded_attention`` computes the attention explicitly in their
place, so that the probabilities are part of the autograd graph (Chefer); ``observed_attention`` leaves the forward
native and computes them beside it from each block's own queries and keys (rollout: the attention of the very
forward that scores, for two projections and a softmax per block). Token 0 of every supported ViT is its class
token; patch tokens are the last ``h * w``.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from open_clip.timm_model import TimmModel
from open_clip.transformer import VisionTransformer
from timm.layers import Attention as TimmAttention
from torch import nn
from transformers import Dinov2Model, SiglipVisionModel

from xbench_pl.models.layers.image_encoders import ResNetPatches, ViTPatches
from xbench_pl.models.layers.query_decoder import QueryDecoder

#: called with each attention probability tensor as it is computed; returns the tensor used onwards
Recorder = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Tower:
    """The image tower at ``path`` of a model: ``kind`` ``"resnet"`` or ``"vit"``."""

    path: str
    module: nn.Module
    kind: str
    cam_layer: str
    grid: tuple[int, int] | None  # a ViT's patch grid
    blocks: list[nn.Module]  # a ViT's attention sites, input to output (empty for a ResNet)


def image_tower(model: nn.Module) -> Tower:
    """The ``Tower`` of ``model`` (at its ``IMAGE_TOWER`` path)."""
    path = getattr(model, "IMAGE_TOWER", None)
    module = model.get_submodule(path) if path else None
    if isinstance(module, ResNetPatches):
        return Tower(path, module, "resnet", f"{path}.layer{module.stage}", None, [])  # a feature map carries its grid
    if isinstance(module, ViTPatches):
        layers = list(module.encoder.layer)
        return Tower(path, module, "vit", f"{path}.encoder.layer.{len(layers) - 1}.layernorm_before",
                     tuple(module.embeddings.grid), layers)
    if isinstance(module, VisionTransformer):
        blocks = list(module.transformer.resblocks)
        return Tower(path, module, "vit", f"{path}.transformer.resblocks.{len(blocks) - 1}.ln_1", tuple(module.grid_size),
                     [block.attn for block in blocks])
    if isinstance(module, TimmModel) and hasattr(module.trunk, "blocks"):
        blocks = list(module.trunk.blocks)
        return Tower(path, module, "vit", f"{path}.trunk.blocks.{len(blocks) - 1}.norm1",
                     tuple(module.trunk.patch_embed.grid_size), [block.attn for block in blocks])
    if isinstance(module, Dinov2Model):  # RadZero, MAIRA-2: its attention is transformers' own, not recorded (CAMs only)
        side = model.preprocess.size // module.config.patch_size
        return Tower(path, module, "vit", f"{path}.encoder.layer.{len(module.encoder.layer) - 1}.norm1", (side, side), [])
    if isinstance(module, SiglipVisionModel) and getattr(model, "SIGLIP_ONE_VIEW", False):
        # MedGemma's SigLIP: one view per image, patches only (no class token); CAMs only, as DINOv2
        side = module.config.image_size // module.config.patch_size
        return Tower(path, module, "vit", f"{path}.encoder.layers.{len(module.encoder.layers) - 1}.layer_norm1", (side, side), [])
    raise ValueError(f"{type(model).__name__} has no image tower an explainer knows (ResNetPatches, ViTPatches, open_clip "
                     f"VisionTransformer, timm ViT trunk, transformers Dinov2Model or a one-view SiglipVisionModel) at {path!r}: "
                     "use --model.explainer native")


def query_decoder(model: nn.Module) -> QueryDecoder | None:
    decoder = getattr(model, "decoder", None)
    return decoder if isinstance(decoder, QueryDecoder) else None


def attention_probabilities(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``softmax(q kᵀ / sqrt(d))`` ``[B, heads, L, S]`` of queries ``[B, heads, L, d]`` and keys ``[B, heads, S, d]``, as
    ``nn.MultiheadAttention``'s need_weights path and timm's unfused path compute it."""
    return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)


def followed(mha: nn.MultiheadAttention) -> None:
    """Explainers follow an ``nn.MultiheadAttention`` with packed projections, no bias_k/v and no zero attention."""
    if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError("explainers take nn.MultiheadAttention with packed projections, no bias_k/v, no zero attention")


def unmasked(kind: str, *masks) -> None:
    """Attention is followed without masks: a masked call is refused."""
    if any(mask is not None and mask is not False for mask in masks):
        raise ValueError(f"explainers follow attention without masks; this {kind} attention is masked")


def multihead_projections(mha: nn.MultiheadAttention, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """``mha``'s queries, keys (and values) ``[B, heads, L, d]`` of its sequence-first inputs ``[L, B, E]``, in that order."""
    weights = mha.in_proj_weight.chunk(3)
    biases = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None,) * 3
    return [F.linear(x, w, b).unflatten(-1, (mha.num_heads, -1)).permute(1, 2, 0, 3)
            for x, w, b in zip(inputs, weights, biases)]


def explicit_multihead_forward(mha: nn.MultiheadAttention, record: Recorder) -> Callable:
    """A forward for ``mha`` (batch-first or sequence-first, self- or cross-attention, no masks) that computes
    its attention explicitly through ``record``; it returns what ``nn.MultiheadAttention.forward`` returns, and
    for a sequence-first module (never fused) the same bits on the CPU (test_explainers_cost: Chefer's scores)."""
    followed(mha)

    def forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True,
                is_causal=False):
        unmasked("nn.MultiheadAttention", key_padding_mask, attn_mask, is_causal)
        if mha.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        length, batch, width = query.shape
        q, k, v = multihead_projections(mha, query, key, value)
        probs = record(attention_probabilities(q, k))
        out = mha.out_proj((probs @ v).permute(2, 0, 1, 3).reshape(length, batch, width))
        if mha.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, probs.mean(dim=1) if average_attn_weights else probs

    return forward


@contextmanager
def recorded_attention(sites: list[nn.Module], recorder: Callable[[nn.Module], Recorder]) -> Iterator[None]:
    """While open, every attention site (a ``ViTPatches`` layer, an ``nn.MultiheadAttention`` or a timm
    ``Attention``) computes its attention explicitly and passes the probabilities through ``recorder(site)``."""
    with ExitStack() as stack:
        for site in sites:
            record = recorder(site)
            if isinstance(site, nn.MultiheadAttention):
                site.forward = explicit_multihead_forward(site, record)
                stack.callback(delattr, site, "forward")
            elif hasattr(site, "explicit_attention"):  # ViTPatches' layers
                site.explicit_attention = record
                stack.callback(setattr, site, "explicit_attention", None)
            elif hasattr(site, "fused_attn") and hasattr(site, "attn_drop"):  # timm: its own explicit path
                fused = site.fused_attn
                site.fused_attn = False
                stack.callback(setattr, site, "fused_attn", fused)
                # record bound now: a closure would read the loop's last one
                handle = site.attn_drop.register_forward_hook(lambda module, inputs, output, record=record: record(output))
                stack.callback(handle.remove)
            else:
                raise ValueError(f"explainers cannot record the attention of {type(site).__name__}")
        yield


def multihead_observer(site: nn.MultiheadAttention, observe: Callable[[torch.Tensor], None]) -> Callable:
    """A forward pre-hook (with kwargs) on ``site`` that passes its probabilities to ``observe``."""
    followed(site)
    names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights", "is_causal")

    def hook(module, args, kwargs):
        given = {**dict(zip(names, args)), **kwargs}
        unmasked("nn.MultiheadAttention", given.get("key_padding_mask"), given.get("attn_mask"), given.get("is_causal"))
        query, key = given["query"], given["key"]
        if site.batch_first:
            query, key = query.transpose(0, 1), key.transpose(0, 1)
        observe(attention_probabilities(*multihead_projections(site, query, key)))

    return hook


def timm_observer(site: nn.Module, observe: Callable[[torch.Tensor], None]) -> Callable:
    """A forward pre-hook (with kwargs) on a timm ``Attention`` that passes its probabilities to ``observe``: its
    queries and keys are the first two thirds of its ``qkv`` projection, then its ``q_norm`` and ``k_norm``."""
    def hook(module, args, kwargs):
        given = {**dict(zip(("x", "attn_mask", "is_causal"), args)), **kwargs}
        unmasked("timm", given.get("attn_mask"), given.get("is_causal"))
        x = given["x"]
        width = 2 * site.num_heads * site.head_dim
        bias = site.qkv.bias[:width] if site.qkv.bias is not None else None
        q, k = F.linear(x, site.qkv.weight[:width], bias).unflatten(-1, (2, site.num_heads, -1)).permute(2, 0, 3, 1, 4)
        observe(attention_probabilities(site.q_norm(q), site.k_norm(k)))

    return hook


def vit_layer_observer(site: nn.Module, observe: Callable[[torch.Tensor], None]) -> Callable:
    """A forward hook on a ``ViTPatches`` layer's ``layernorm_before`` that passes the layer's probabilities to ``observe``."""
    def hook(module, inputs, normed):
        projections = site.attention.attention
        observe(attention_probabilities(*(proj(normed).unflatten(-1, (site.heads, -1)).transpose(1, 2)
                                          for proj in (projections.query, projections.key))))

    return hook


def observable(site: nn.Module) -> bool:
    """Whether ``observed_attention`` knows how ``site`` computes its queries and keys: ``nn.MultiheadAttention``,
    ``ViTPatches``' layers and timm's plain ``Attention`` (not its relatives with their own biases or rotary
    embeddings, e.g. EVA's, which ``recorded_attention`` follows through their unfused path)."""
    return isinstance(site, nn.MultiheadAttention) or hasattr(site, "explicit_attention") or type(site) is TimmAttention


@contextmanager
def observed_attention(sites: list[nn.Module], observer: Callable[[nn.Module], Callable[[torch.Tensor], None]]) -> Iterator[None]:
    """While open, every attention site (each ``observable``) runs its own forward, fused kernels and all, and
    ``observer(site)`` is shown its attention probabilities ``[B, heads, T, T]``, computed beside that forward from the
    site's own inputs: the forward's outputs are the native ones, bit for bit."""
    with ExitStack() as stack:
        for site in sites:
            observe = observer(site)
            if isinstance(site, nn.MultiheadAttention):
                handle = site.register_forward_pre_hook(multihead_observer(site, observe), with_kwargs=True)
            elif hasattr(site, "explicit_attention"):  # ViTPatches' layers
                handle = site.layernorm_before.register_forward_hook(vit_layer_observer(site, observe))
            elif type(site) is TimmAttention:
                handle = site.register_forward_pre_hook(timm_observer(site, observe), with_kwargs=True)
            else:
                raise ValueError(f"explainers cannot observe the attention of {type(site).__name__}")
            stack.callback(handle.remove)
        yield


def token_grid(activation: torch.Tensor, grid: tuple[int, int] | None, layer: str) -> torch.Tensor:
    """A target layer's output as a feature map ``[B, K, h, w]``: a feature map as it is; ViT tokens
    ``[B, T, D]`` without their leading class/register tokens, patches laid out on ``grid`` (row = y)."""
    if activation.dim() == 4:
        return activation
    if activation.dim() == 3 and grid is not None and activation.shape[1] >= grid[0] * grid[1]:
        patches = activation[:, activation.shape[1] - grid[0] * grid[1]:]
        return patches.transpose(1, 2).unflatten(2, grid)
    raise ValueError(f"explainer layer {layer!r} gives {tuple(activation.shape)}: a CAM needs a feature map [B, K, h, w] or "
                     f"batch-first patch tokens [B, T, D] of the image tower ({grid} patches)")
