"""Transformer relevance: attention rollout and Chefer et al.'s gradient-weighted relevance.

Attention rollout (Abnar & Zuidema, ACL 2020), on a ViT image tower: per block
``Â = 0.5 * (mean_heads(A) + I)`` with rows renormalised, ``R = Â_L ... Â_1``; the map is the class
token's row over the patch tokens. It reads no target: every finding gets the same map.

Chefer et al. (ICCV 2021, "Generic Attention-model Explainability ..."), per finding c with the
model's target ``y[:, c]`` (logits where the model exposes them, else scores):
``Ā = mean_heads(ReLU(∂y/∂A ⊙ A))`` per attention; in a ViT tower ``R_ii = I``, then per block
``R_ii += Ā R_ii`` (their rule 6). A dual encoder's map is the class token's row of ``R_ii``
over the patches. A query decoder (one query per finding or concept, cross-attending the
image tokens) carries it on from ``R_tt = I``, ``R_ti = 0`` (a ResNet tower: ``R_ii = I``), per layer:
self-attention ``R_tt += Ā R_tt``, ``R_ti += Ā R_ti`` (rules 6, 7); cross-attention
``R_ti += norm(R_tt)ᵀ Ā norm(R_ii)`` (rule 10), where ``norm(R) = (R - I)`` with rows scaled to sum
1, plus ``I`` (eqs. 8-9; a row with nothing beyond the identity stays the identity row). The
family's own query-to-finding reduction (``decoder_maps``, the one its native maps use) turns
``R_ti`` into maps. Only the decoder's first call per forward is followed: CARZero's second call
decodes the image's class token against the text, not image tokens.
"""

from __future__ import annotations

import math

import torch

from xbench_pl.explainers.cams import frozen_parameters
from xbench_pl.explainers.towers import Tower, query_decoder, recorded_attention


def rollout(probabilities: list[torch.Tensor]) -> torch.Tensor:
    """``[B, T, T]`` attention rollout of per-block probabilities ``[B, heads, T, T]`` (input to output)."""
    eye = torch.eye(probabilities[0].shape[-1], dtype=torch.float64, device=probabilities[0].device)
    relevance = eye.expand_as(probabilities[0][:, 0])
    for probs in probabilities:
        mixed = 0.5 * (probs.double().mean(dim=1) + eye)
        relevance = (mixed / mixed.sum(dim=-1, keepdim=True)) @ relevance
    return relevance


def head_relevance(probs: torch.Tensor, gradient: torch.Tensor | None) -> torch.Tensor:
    """``Ā = mean_heads(ReLU(∇A ⊙ A))`` ``[B, L, S]`` (a gradient of None: the target does not read this attention)."""
    if gradient is None:
        return torch.zeros_like(probs[:, 0], dtype=torch.float64)
    return (gradient.double() * probs.double()).clamp(min=0).mean(dim=1)


def self_relevance(probabilities: list[torch.Tensor], gradients: list[torch.Tensor | None]) -> torch.Tensor:
    """``R_ii [B, T, T]`` of a ViT tower by rule 6."""
    relevance = torch.eye(probabilities[0].shape[-1], dtype=torch.float64, device=probabilities[0].device)
    relevance = relevance.expand_as(probabilities[0][:, 0])
    for probs, gradient in zip(probabilities, gradients):
        relevance = relevance + head_relevance(probs, gradient) @ relevance
    return relevance


def normalized(relevance: torch.Tensor) -> torch.Tensor:
    """Chefer's eqs. 8-9: ``(R - I)`` with each row scaled to sum 1 (rows of zeros stay zero), plus ``I``."""
    eye = torch.eye(relevance.shape[-1], dtype=relevance.dtype, device=relevance.device)
    residual = relevance - eye
    sums = residual.sum(dim=-1, keepdim=True)
    return torch.where(sums > 0, residual / sums.clamp(min=torch.finfo(sums.dtype).tiny), 0) + eye


def decoder_relevance(image: torch.Tensor, layers: list[tuple]) -> torch.Tensor:
    """``R_ti [B, Q, M]`` through a query decoder: ``image`` = ``R_ii [B, M, M]`` over its memory tokens;
    ``layers`` = per layer ``(self_probs, self_grad, cross_probs, cross_grad)`` (self None without self-attention)."""
    batch, queries, tokens = layers[0][2].shape[0], layers[0][2].shape[2], layers[0][2].shape[3]
    text = torch.eye(queries, dtype=torch.float64, device=image.device).expand(batch, queries, queries)
    text_image = torch.zeros(batch, queries, tokens, dtype=torch.float64, device=image.device)
    image = normalized(image)
    for self_probs, self_grad, cross_probs, cross_grad in layers:
        if self_probs is not None:
            mixed = head_relevance(self_probs, self_grad)
            text, text_image = text + mixed @ text, text_image + mixed @ text_image
        text_image = text_image + normalized(text).transpose(1, 2) @ head_relevance(cross_probs, cross_grad) @ image
    return text_image


def refusal(name: str, tower: Tower, has_decoder: bool) -> str | None:
    """Why ``rollout`` or ``chefer`` (``name``) cannot follow the attention of a model with ``tower`` (and a query
    decoder, ``has_decoder``), or None where it can."""
    if name == "rollout" and tower.kind != "vit":
        return "rollout follows a ViT's self-attention; this model's image tower is a ResNet"
    if name == "chefer" and tower.kind != "vit" and not has_decoder:
        return "chefer follows attention; this model has neither a ViT image tower nor a query decoder"
    if tower.kind == "vit" and not tower.blocks and not (name == "chefer" and has_decoder):
        return f"{name} follows attention, which explainers do not record in this model's ViT ({type(tower.module).__name__})"
    return None


class RelevanceExplainer:
    """``rollout`` or ``chefer`` over ``tower`` (and the model's query decoder, for ``chefer``), where ``refusal``
    finds nothing against it."""

    def __init__(self, name: str, tower: Tower, has_decoder: bool):
        self.name, self.tower = name, tower
        self.layer = "decoder" if name == "chefer" and has_decoder else tower.path

    def saliency(self, model, images: torch.Tensor, classes: list[str]) -> tuple[torch.Tensor, None]:
        """``[B, C, h, w]`` on the tower's patch grid (the decoder's token grid for ``chefer`` through a decoder); no
        output: the explicit attention's forward is not the native one."""
        decoder = query_decoder(model) if self.name == "chefer" else None
        decoder_sites = [] if decoder is None else [(layer.self_attn, layer.multihead_attn) for layer in decoder.layers]
        recorded: dict[int, list[torch.Tensor]] = {}
        differentiable = self.name == "chefer"

        def recorder(site):
            def keep(probs: torch.Tensor) -> torch.Tensor:
                if differentiable and not probs.requires_grad:
                    probs.requires_grad_()  # a leaf: the rules need dy/dA of every attention
                recorded.setdefault(id(site), []).append(probs)
                return probs
            return keep

        sites = list(self.tower.blocks) + [m for pair in decoder_sites for m in pair if m is not None]

        def first(site):  # a site's probabilities in its first call (a decoder may run twice)
            return recorded[id(site)][0] if site is not None else None

        with frozen_parameters(model), recorded_attention(sites, recorder):
            targets = model.explainer_forward(images, classes, grad=differentiable)[1]
        tower_probs = [first(site) for site in self.tower.blocks]
        if self.name == "rollout":
            return self.class_token_map(rollout(tower_probs), len(classes)), None
        decoder_probs = [(first(s), first(c)) for s, c in decoder_sites]
        wanted = tower_probs + [p for pair in decoder_probs for p in pair if p is not None]
        # the rules read the probabilities as values: detached, no graph grows through 14 findings' relevance
        plain_tower = [p.detach() for p in tower_probs]
        plain_decoder = [(None if s is None else s.detach(), c.detach()) for s, c in decoder_probs]
        maps = []
        for finding in range(len(classes)):
            gradients = torch.autograd.grad(targets[:, finding].sum(), wanted, retain_graph=finding < len(classes) - 1,
                                            allow_unused=True)
            by_tensor = {id(p): g for p, g in zip(wanted, gradients)}
            tower = self_relevance(plain_tower, gradients[:len(tower_probs)]) if tower_probs else None
            if decoder is None:
                maps.append(self.class_token_map(tower, 1)[:, 0])
                continue
            layers = [(plain_s, by_tensor.get(id(s)), plain_c, by_tensor[id(c)])
                      for (s, c), (plain_s, plain_c) in zip(decoder_probs, plain_decoder)]
            tokens = decoder_probs[0][1].shape[-1]
            if tower is None:  # a ResNet's tokens are its own
                tower = torch.eye(tokens, dtype=torch.float64, device=images.device).expand(images.shape[0], tokens, tokens)
            relevance = decoder_relevance(tower[:, -tokens:, -tokens:], layers)  # memory: the tower's last tokens
            maps.append(model.decoder_maps(relevance, classes, self.patch_grid(tokens))[:, finding])
        del targets, wanted, tower_probs, decoder_probs, recorded  # the graph goes before the maps are stacked
        return torch.stack(maps, dim=1).float(), None

    def patch_grid(self, tokens: int) -> tuple[int, int]:
        """The grid of a decoder's image memory: the ViT's patch grid, else the (square) feature map of ``tokens``."""
        if self.tower.grid is not None:
            return self.tower.grid
        side = math.isqrt(tokens)
        return side, side

    def class_token_map(self, relevance: torch.Tensor, count: int) -> torch.Tensor:
        """The class token's row (token 0) over the patch tokens, ``[B, count, h, w]``."""
        patches = self.tower.grid[0] * self.tower.grid[1]
        return relevance[:, 0, -patches:].unflatten(-1, self.tower.grid)[:, None].expand(-1, count, -1, -1).float()
