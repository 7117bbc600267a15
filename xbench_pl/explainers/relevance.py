"""Transformer relevance: attention rollout and Chefer et al.'s gradient-weighted relevance.

Attention rollout (Abnar & Zuidema, ACL 2020), on a ViT image tower: per block
``Â = 0.5 * (mean_heads(A) + I)`` with rows renormalised, ``R = Â_L ... Â_1``; the map is the class
token's row over the patch tokens. It reads no target: every finding gets the same map. ``A`` is the
attention of the native forward (fused kernels and all), computed beside it from each block's queries and keys.

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
from contextlib import ExitStack

import torch

from xbench_pl.explainers.cams import frozen_parameters
from xbench_pl.explainers.towers import Tower, observable, observed_attention, query_decoder, recorded_attention


def rollout(probabilities: list[torch.Tensor]) -> torch.Tensor:
    """``[B, T, T]`` attention rollout of per-block probabilities ``[B, heads, T, T]`` (input to output). The first
    block's product with the identity is skipped (exact: one term per sum), here and in ``self_relevance``."""
    eye = torch.eye(probabilities[0].shape[-1], dtype=torch.float64, device=probabilities[0].device)
    relevance = None
    for probs in probabilities:
        mixed = 0.5 * (probs.double().mean(dim=1) + eye)
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        relevance = mixed if relevance is None else mixed @ relevance
    return relevance


def head_relevance(probs: torch.Tensor, gradient: torch.Tensor | None) -> torch.Tensor:
    """``Ā = mean_heads(ReLU(∇A ⊙ A))`` ``[B, L, S]`` (a gradient of None: the target does not read this attention).
    The product in float64, exact for float32 factors, in place on the gradient's float64 copy (``probs`` is promoted
    inside the kernel, not copied): no other tensor of the attention's size is made."""
    if gradient is None:
        return torch.zeros_like(probs[:, 0], dtype=torch.float64)
    return gradient.to(torch.float64, copy=True).mul_(probs).clamp_(min=0).mean(dim=1)


def self_relevance(probabilities: list[torch.Tensor], gradients: list[torch.Tensor | None]) -> torch.Tensor:
    """``R_ii [B, T, T]`` of a ViT tower by rule 6."""
    relevance = None
    for probs, gradient in zip(probabilities, gradients):
        mixed = head_relevance(probs, gradient)
        if relevance is None:
            relevance = torch.eye(mixed.shape[-1], dtype=torch.float64, device=mixed.device) + mixed
        else:
            relevance = relevance + mixed @ relevance
    return relevance


def normalized(relevance: torch.Tensor) -> torch.Tensor:
    """Chefer's eqs. 8-9: ``(R - I)`` with each row scaled to sum 1 (rows of zeros stay zero), plus ``I``."""
    eye = torch.eye(relevance.shape[-1], dtype=relevance.dtype, device=relevance.device)
    residual = relevance - eye
    sums = residual.sum(dim=-1, keepdim=True)
    return torch.where(sums > 0, residual / sums.clamp(min=torch.finfo(sums.dtype).tiny), 0) + eye


def decoder_relevance(image: torch.Tensor | None, layers: list[tuple]) -> torch.Tensor:
    """``R_ti [B, Q, M]`` through a query decoder: ``image`` = ``R_ii [B, M, M]`` over its memory tokens (None: the
    identity, a ResNet's tokens); ``layers`` = per layer ``(self_probs, self_grad, cross_probs, cross_grad)`` (self None
    without self-attention). A product with ``R_tt`` while it is the identity, with ``R_ti`` while it is zero, or with
    an identity ``R_ii`` is skipped: each of its sums has one term, so the result is the full rules' bit for bit."""
    batch, queries, tokens = layers[0][2].shape[0], layers[0][2].shape[2], layers[0][2].shape[3]
    text = None  # R_tt, the identity until the first self-attention
    text_image = torch.zeros(batch, queries, tokens, dtype=torch.float64, device=layers[0][2].device)
    image = None if image is None else normalized(image)
    for self_probs, self_grad, cross_probs, cross_grad in layers:
        if self_probs is not None:
            mixed = head_relevance(self_probs, self_grad)
            if text is None:  # Ā R_tt = Ā; Ā R_ti = 0
                text = torch.eye(queries, dtype=torch.float64, device=mixed.device) + mixed
            else:
                text, text_image = text + mixed @ text, text_image + mixed @ text_image
        cross = head_relevance(cross_probs, cross_grad)
        if text is not None:  # norm(I) = I
            cross = normalized(text).transpose(1, 2) @ cross
        text_image = text_image + (cross if image is None else cross @ image)
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
        #: rollout beside the native forward (``observed_attention``), where the tower's every block is observable
        self.observes = name == "rollout" and all(observable(site) for site in tower.blocks)

    def decoder_sites(self, model) -> list[tuple]:
        """``(self_attn, multihead_attn)`` per layer of the query decoder that ``chefer`` follows (none for ``rollout``)."""
        decoder = query_decoder(model) if self.name == "chefer" else None
        return [] if decoder is None else [(layer.self_attn, layer.multihead_attn) for layer in decoder.layers]

    def recorded(self, model, images: torch.Tensor, classes: list[str]) -> tuple[list, list, object, torch.Tensor]:
        """The forward that shows the attention: the tower's probabilities ``[B, heads, T, T]`` (input to output), the
        decoder's ``(self, cross)`` per layer (self None without self-attention), the model's output and the targets
        ``[B, C]``. For ``chefer`` the attention is explicit and every probability in the graph of the targets (a leaf
        where nothing before it needs a gradient); ``rollout`` observes the native forward (``observed_attention``)
        where every block is ``observable``, else it too computes the attention explicitly."""
        decoder_sites = self.decoder_sites(model)
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

        with ExitStack() as stack:
            if self.observes:  # the parameters as they are: whether a weight needs a gradient decides how matmul
                # folds a transposed input, and with it the bits of the native scores
                stack.enter_context(torch.no_grad())
                stack.enter_context(observed_attention(sites, recorder))
            else:
                stack.enter_context(frozen_parameters(model))
                stack.enter_context(recorded_attention(sites, recorder))
            output, targets = model.explainer_forward(images, classes, grad=differentiable)
        return [first(site) for site in self.tower.blocks], [(first(s), first(c)) for s, c in decoder_sites], output, targets

    def saliency(self, model, images: torch.Tensor, classes: list[str]) -> tuple[torch.Tensor, object | None]:
        """``[B, C, h, w]`` on the tower's patch grid (the decoder's token grid for ``chefer`` through a decoder), and the
        model's output where the forward was the native one: rollout's where it observes; Chefer's with a ResNet tower,
        where only the decoder's attention is made explicit and ``explicit_multihead_forward`` gives what
        ``nn.MultiheadAttention``'s need_weights path gives, bit for bit (tests). Explicit attention in a ViT tower
        replaces a fused kernel, so the native forward runs again."""
        tower_probs, decoder_probs, output, targets = self.recorded(model, images, classes)
        if not self.observes and tower_probs:  # not the native forward: its output (and graph) is not kept
            output = None
        if self.name == "rollout":
            return self.class_token_map(rollout(tower_probs), len(classes)), output
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
            if not decoder_probs:
                maps.append(self.class_token_map(tower, 1)[:, 0])
                continue
            layers = [(plain_s, by_tensor.get(id(s)), plain_c, by_tensor[id(c)])
                      for (s, c), (plain_s, plain_c) in zip(decoder_probs, plain_decoder)]
            tokens = decoder_probs[0][1].shape[-1]
            # memory: the tower's last tokens (a ResNet's are its own: R_ii = I)
            relevance = decoder_relevance(None if tower is None else tower[:, -tokens:, -tokens:], layers)
            maps.append(model.decoder_maps(relevance, classes, self.patch_grid(tokens))[:, finding])
        # the graph goes before the maps are stacked (but for the native output's, which explain() detaches)
        del targets, wanted, tower_probs, decoder_probs
        return torch.stack(maps, dim=1).float(), output

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
