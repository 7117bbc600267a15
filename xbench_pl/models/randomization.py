"""Cascading model-parameter randomization (Adebayo et al., "Sanity checks for saliency maps", NeurIPS 2018).

Each family declares its cascade as data, a class attribute ``RANDOMIZATION_STAGES``: ordered ``(stage name,
names)`` from the top (score head, decoder, text/query side) down to the image tower's blocks, last to first,
then its stem. A name is a module or parameter path (``model.get_submodule`` / ``get_parameter``); a name ending
in ``.*`` stands for the children of that container, one stage each, last to first, the stage name's ``{}`` filled
with ``container.child`` (``"image {}"`` -> ``image layer4.2``). Names a model lacks are skipped, so one declaration
serves a family's layouts (open_clip's own ViT and timm's, ResNet and ViT towers); every parameter of the model must
fall in exactly one stage (``cascade_stages`` checks), so a layout the declaration misses fails, never half-randomizes.

``randomized_copy(model, upto, seed)`` re-initialises stages 0..upto of a copy (``Cascade(model, seed)`` walks every
stage in turn on one working copy, as often as asked: what a run measuring every stage on every batch uses): each
module by its own init (``reset_parameters``, or ``_reset_parameters`` for ``nn.MultiheadAttention``), and the
parameters no module init covers (class tokens, position embeddings, projections, layer scales, temperatures) from
N(0, 0.02²), the ViT/BERT initializer (timm's ``trunc_normal_(std=.02)``, transformers' ``initializer_range``).
Stage i draws from seed ``seed + i`` (Quantus's MPRT draws every layer from ``seed + 1``: same-shaped blocks got the
same weights), so a stage's weights are the same in every later copy and every walk: the cascade is cumulative and
repeatable.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from itertools import chain

import torch
from torch import nn

from xbench_pl.models.prompts import EmbeddingCache

#: the standard deviation of the parameters no module init covers (ViT/BERT's initializer)
INIT_STD = 0.02


def image_tower_stages(tower: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The stages of a ``layers.image_encoders`` tower at ``tower`` (``ResNetPatches``: its bottleneck blocks of
    layer4 .. layer1, then conv1/bn1; ``ViTPatches`` and transformers' DINOv2: its encoder layers, then its
    embeddings), for a family's ``RANDOMIZATION_STAGES``."""
    blocks = tuple(f"{tower}.{layer}.*" for layer in ("layer4", "layer3", "layer2", "layer1", "encoder.layer"))
    return ("image {}", blocks), ("image stem", tuple(f"{tower}.{stem}" for stem in ("conv1", "bn1", "embeddings")))


def exists(model: nn.Module, name: str) -> bool:
    """Whether ``name`` is a module or a parameter of ``model``."""
    try:
        model.get_submodule(name)
    except AttributeError:
        try:
            model.get_parameter(name)
        except AttributeError:
            return False
    return True


def expanded(model: nn.Module, stage: str, names: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """One declared entry -> its stages: a starred entry one per child of each container (last to first)."""
    starred = [name.endswith(".*") for name in names]
    if any(starred) and not all(starred):
        raise ValueError(f"RANDOMIZATION_STAGES entry {stage!r}: either every name ends in '.*' or none does: {names}")
    if not any(starred):
        present = [name for name in names if exists(model, name)]
        return [(stage, present)] if present else []
    stages = []
    for name in names:
        container = name[:-2]
        if not exists(model, container):
            continue
        children = [child for child, module in model.get_submodule(container).named_children()
                    if any(True for _ in module.parameters())]
        label = container.rsplit(".", 1)[-1]
        stages += [(stage.format(f"{label}.{child}"), [f"{container}.{child}"]) for child in reversed(children)]
    return stages


def parameter_names(model: nn.Module, name: str) -> list[str]:
    """The parameter names under module or parameter ``name``."""
    try:
        module = model.get_submodule(name)
    except AttributeError:
        return [name]
    return [f"{name}.{p}" for p, _ in module.named_parameters()]


def cascade_stages(model: nn.Module) -> list[tuple[str, list[str]]]:
    """``(stage name, module or parameter names)`` of ``model``'s cascade, top first (``RANDOMIZATION_STAGES``).
    A model without parameters has none; a model with parameters must declare them, and its stages must cover
    every parameter exactly once."""
    declared = getattr(model, "RANDOMIZATION_STAGES", ())
    parameters = [name for name, _ in model.named_parameters()]
    if not declared:
        if parameters:
            raise ValueError(f"{type(model).__name__} declares no RANDOMIZATION_STAGES: its weights cannot be randomized")
        return []
    stages = [part for stage, names in declared for part in expanded(model, stage, tuple(names))]
    owner: dict[str, str] = {}
    for stage, names in stages:
        for name in names:
            for parameter in parameter_names(model, name):
                if parameter in owner:
                    raise ValueError(f"{type(model).__name__}: parameter {parameter} is in stages "
                                     f"{owner[parameter]!r} and {stage!r}")
                owner[parameter] = stage
    missing = [name for name in parameters if name not in owner]
    if missing:
        raise ValueError(f"{type(model).__name__}'s RANDOMIZATION_STAGES leave {len(missing)} parameters out "
                         f"(first: {', '.join(missing[:3])}): declare the modules of this layout")
    return stages


@torch.no_grad()
def reinitialise(model: nn.Module, name: str) -> None:
    """Module ``name`` re-initialised by its modules' own inits, the parameters no init covers (and parameter
    ``name`` itself) from N(0, INIT_STD²)."""
    try:
        root = model.get_submodule(name)
    except AttributeError:
        nn.init.normal_(model.get_parameter(name), std=INIT_STD)
        return
    covered = set()
    for module in root.modules():
        reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
        if callable(reset):
            reset()
            covered.update(id(p) for p in module.parameters(recurse=False))
    for parameter in root.parameters():
        if id(parameter) not in covered:
            nn.init.normal_(parameter, std=INIT_STD)


#: a ``ZeroShotModel``'s evaluation state (metrics, their results, the datasets whose regions cxl mode reads): a copy
#: that only computes maps starts these empty
EVALUATION_STATE = ("benchmark", "val_benchmark", "results", "val_results", "curves", "region_datasets", "val_region_datasets")


def detached_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with its evaluation state empty (``EVALUATION_STATE``): the copy only computes maps.
    Lightning drops the trainer from a copy itself (``LightningModule.__getstate__``). Made outside inference mode
    (Lightning tests in it), so explainers can take gradients through the copy."""
    memo = {id(state): type(state)() for name in EVALUATION_STATE if (state := getattr(model, name, None)) is not None}
    with torch.inference_mode(False):
        return copy.deepcopy(model, memo)


def randomize_stage(model: nn.Module, index: int, names: list[str], seed: int) -> None:
    """Stage ``index`` (``names``) of ``model`` re-initialised in place from seed ``seed + index`` (the same values
    every time), the caller's random stream untouched."""
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.inference_mode(False), torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed + index)
        for name in names:
            reinitialise(model, name)


def restore_weights(working: nn.Module, model: nn.Module) -> None:
    """``working``'s parameters and buffers (BatchNorm's statistics too) set back to ``model``'s, in place: no new
    memory."""
    trained = dict(chain(model.named_parameters(), model.named_buffers()))
    with torch.inference_mode(False), torch.no_grad():
        for name, tensor in chain(working.named_parameters(), working.named_buffers()):
            tensor.copy_(trained[name])


class Cascade:
    """``model``'s cascade (stages 0..``last``, default all) on one working copy (``detached_copy``, in eval mode;
    ``model`` untouched), walked as often as asked. Each walk (``iter``) sets the copy back to ``model``'s weights
    (``restore_weights``), then re-initialises stage after stage (``randomize_stage``) and yields ``(index, stage name,
    copy)`` after each, the copy's weights then ``randomized_copy(model, index, seed)``'s. Two copies of the weights
    at any time, ``model``'s and the working one, however many stages: a copy per stage would hold them all.

    Where the cached text/query embeddings follow the weights (``CACHES_FOLLOW_WEIGHTS``), each stage has caches of
    its own on the copy, empty at first and kept from walk to walk (a stage's weights are the same in every walk), so
    a randomized text tower takes effect and each stage encodes a text once per run. A model whose caches do not follow
    its weights (MedKLIP's come from a text encoder outside the model) keeps the copy's one set."""

    def __init__(self, model: nn.Module, seed: int, last: int | None = None):
        self.model, self.seed = model, seed
        stages = cascade_stages(model)
        self.stages = stages if last is None else stages[:last + 1]
        self.copy = detached_copy(model).eval()
        follows = getattr(model, "CACHES_FOLLOW_WEIGHTS", False)
        self.empty_caches = {name: value for name, value in vars(self.copy).items()
                             if follows and isinstance(value, EmbeddingCache)}  # attribute -> a cleared cache
        for cache in self.empty_caches.values():
            cache.clear()
        self.stage_caches: list[dict[str, EmbeddingCache]] = []  # per stage walked: its caches

    def __iter__(self) -> Iterator[tuple[int, str, nn.Module]]:
        restore_weights(self.copy, self.model)
        for index, (stage, names) in enumerate(self.stages):
            randomize_stage(self.copy, index, names, self.seed)
            if index == len(self.stage_caches):
                self.stage_caches.append({name: copy.deepcopy(cache) for name, cache in self.empty_caches.items()})
            vars(self.copy).update(self.stage_caches[index])
            yield index, stage, self.copy


def randomized_copy(model: nn.Module, upto: int, seed: int) -> nn.Module:
    """A copy of ``model`` (untouched) with cascade stages 0..``upto`` re-initialised (stage i from seed
    ``seed + i``), in eval mode, its cached text/query embeddings empty so randomized text towers take effect
    (those of a model whose caches do not follow its weights, ``CACHES_FOLLOW_WEIGHTS``, are kept)."""
    count = len(cascade_stages(model))
    if not 0 <= upto < count:
        raise ValueError(f"randomized_copy: upto must be in [0, {count - 1}] for {type(model).__name__}'s "
                         f"{count} stages, got {upto}")
    *_, (_, _, randomized) = Cascade(model, seed, last=upto)  # one walk, to stage upto
    return randomized
