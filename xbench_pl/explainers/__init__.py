"""Where a model's saliency maps come from: ``--model.explainer NAME`` (``ZeroShotModel``'s ``explainer``).

``native`` is the map the model's authors' code exposes (cross-attention, patch-text similarity).
The others explain the model's target for each finding (its logits where it exposes them, else its
scores) with the field's methods: the CAMs of pytorch-grad-cam on a target layer (``cams``), and
attention rollout and Chefer et al.'s relevance through the transformer attention (``relevance``).
Every map comes out on its layer's own grid, raw: the benchmark warps and normalises it as it does
native maps. Scores are the model's native forward's: a CAM's forward is that forward (with autograd from
its layer on, equal to float32 round-off), so is rollout's (the probabilities computed beside it), so is Chefer's
through a ResNet tower (only the query decoder's attention made explicit, bit for bit what ``nn.MultiheadAttention``
computes), and after Chefer through a ViT tower (explicit attention in place of fused kernels) the native forward
runs again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, get_args

import torch

from xbench_pl.options import ExplainerName

if TYPE_CHECKING:
    from xbench_pl.explainers.cams import CAMExplainer
    from xbench_pl.explainers.relevance import RelevanceExplainer

EXPLAINERS: tuple[str, ...] = get_args(ExplainerName)
#: explainers whose maps read no target (the same map for every finding, or none at all)
TARGETLESS = ("native", "eigencam", "rollout")


def build_explainer(model, name: str, layer: str | None) -> CAMExplainer | RelevanceExplainer:
    """The explainer ``name`` of ``model`` (built, with its towers), checked: an unknown layer, or a method
    the model's architecture has nothing for, is a one-line ``ValueError``."""
    # here, not at the top: a native run (every run's explainer_info) never loads pytorch-grad-cam, open_clip, transformers
    from xbench_pl.explainers.cams import CAM_METHODS, CAMExplainer
    from xbench_pl.explainers.relevance import RelevanceExplainer, refusal
    from xbench_pl.explainers.towers import image_tower, query_decoder

    if name not in EXPLAINERS or name == "native":
        raise ValueError(f"explainer must be one of {list(EXPLAINERS[1:])} here, got {name!r}")
    tower = image_tower(model)
    if name in CAM_METHODS:
        layer = layer or tower.cam_layer
        try:
            model.get_submodule(layer)
        except AttributeError as error:
            raise ValueError(f"explainer_layer {layer!r} is not a module of {type(model).__name__} ({error}); "
                             f"its default for CAMs is {tower.cam_layer!r}") from None
        return CAMExplainer(name, layer, tower.grid)
    if layer is not None:
        raise ValueError(f"explainer_layer {layer!r}: a layer is for the CAMs only; {name} follows every attention layer")
    has_decoder = query_decoder(model) is not None
    problem = refusal(name, tower, has_decoder)
    if problem:
        taken = [n for n in EXPLAINERS if n in ("native", *CAM_METHODS) or refusal(n, tower, has_decoder) is None]
        raise ValueError(f"explainer {problem}: it takes {', '.join(taken)}")
    return RelevanceExplainer(name, tower, has_decoder)


def explainer_info(name: str, explainer: CAMExplainer | RelevanceExplainer | None, target: str) -> dict:
    """``{"name", "target_layer", "target", "library", "version"}``: what metrics.json, the store and W&B record."""
    import xbench_pl

    if explainer is None:
        return {"name": "native", "target_layer": None, "target": None, "library": "xbench_pl", "version": xbench_pl.__version__}
    from xbench_pl.explainers.cams import LIBRARY, CAMExplainer, library_version

    cam = isinstance(explainer, CAMExplainer)
    return {"name": name, "target_layer": explainer.layer, "target": None if name in TARGETLESS else target,
            "library": LIBRARY if cam else "xbench_pl", "version": library_version() if cam else xbench_pl.__version__}


def explain(explainer: CAMExplainer | RelevanceExplainer, model, images: torch.Tensor,
            classes: list[str]) -> tuple[torch.Tensor, object | None]:
    """``explainer``'s maps ``[B, C, h, w]`` and, where its forward is the model's native one, that forward's output
    (detached; else None); with autograd wherever the caller runs (Lightning tests under inference mode): inputs
    and cached embeddings made in inference mode are replaced by normal copies."""
    with torch.inference_mode(False):
        model.thaw_caches()
        if torch.is_inference(images):
            images = images.clone()
        maps, output = explainer.saliency(model, images, classes)
    if output is not None:
        output = type(output)(*(None if t is None else t.detach() for t in (output.scores, output.saliency, output.logits)))
    return maps.detach(), output


__all__ = ["EXPLAINERS", "ExplainerName", "build_explainer", "explain", "explainer_info"]
