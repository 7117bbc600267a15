"""The generative families' released checkpoints against this transformers, on the meta device (no weights, no network,
no memory): each family's network, built by ``GenerativeModel.release_network`` from the release's ``config.json``
(``xbench_pl/models/configs/generative/<family>.json``), must take exactly the release's keys
(``tests/data/generative/release_keys/<family>.json``, written by ``make_release_keys.py`` there) once the family's
``checkpoint_filter`` has renamed them: the same key set, the same shapes, accepted by the strict ``load_weights`` that
``load_release`` calls; the names agree with the renames transformers' own ``from_pretrained`` would apply; and the
parameter count is the published size (the sources are in each manifest's ``published_source``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from xbench_pl.models.checkpoints import load_weights
from xbench_pl.models.generative.lingshu import Lingshu
from xbench_pl.models.generative.maira2 import Maira2
from xbench_pl.models.generative.medgemma import MedGemma
from xbench_pl.models.generative.radvlm import RadVLM

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "xbench_pl" / "models" / "configs" / "generative"
MANIFESTS = ROOT / "tests" / "data" / "generative" / "release_keys"
FAMILIES = {"lingshu": Lingshu, "medgemma": MedGemma, "radvlm": RadVLM, "maira2": Maira2}
_NETWORKS: dict = {}


def manifest(family: str) -> dict:
    return json.loads((MANIFESTS / f"{family}.json").read_text())


def release_keys(family: str) -> dict[str, tuple[int, ...]]:
    """Every key of the release with its shape (the manifest's stacks expanded)."""
    data = manifest(family)
    keys = {key: tuple(shape) for key, shape in data["keys"].items()}
    for stack in data["stacks"]:
        for index in range(stack["count"]):
            keys.update({f"{stack['prefix'].format(index)}.{name}": tuple(shape) for name, shape in stack["keys"].items()})
    return keys


def release_state(family: str) -> dict[str, torch.Tensor]:
    return {key: torch.empty(shape, device="meta") for key, shape in release_keys(family).items()}


def network(family: str):
    """The family's network from its release config, on the meta device (built once per family)."""
    if family not in _NETWORKS:
        _NETWORKS[family] = FAMILIES[family].release_network(json.loads((CONFIGS / f"{family}.json").read_text()))
    return _NETWORKS[family]


def renamed(family: str, state: dict) -> dict:
    """The family's ``checkpoint_filter`` (it reads nothing of the model but its class and ``network``)."""
    shell = FAMILIES[family].__new__(FAMILIES[family])
    torch.nn.Module.__init__(shell)
    shell.network = network(family)
    return shell.checkpoint_filter(state)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_release_keys_fit_the_network(family):
    net = network(family)
    expected = {key: tuple(value.shape) for key, value in net.state_dict().items()}
    state = renamed(family, release_state(family))
    got = {key: tuple(value.shape) for key, value in state.items()}
    assert not sorted(expected.keys() - got.keys()), f"missing after checkpoint_filter: {sorted(expected.keys() - got.keys())[:10]}"
    assert not sorted(got.keys() - expected.keys()), f"unexpected after checkpoint_filter: {sorted(got.keys() - expected.keys())[:10]}"
    assert {k: v for k, v in got.items() if v != expected[k]} == {}
    load_weights(net, state, f"{family} release (meta)")  # the strict loader load_release uses accepts it


def test_medgemma_ties_its_output_layer_to_the_embeddings():
    """Gemma 3 stores no lm_head (tie_word_embeddings): the filter gives it the embeddings, the very tensor, as
    transformers' tie_weights does; the network holds one tensor for both, counted once."""
    net = network("medgemma")
    assert net.lm_head.weight is net.get_input_embeddings().weight
    state = release_state("medgemma")
    assert not any("lm_head" in key for key in state)
    out = renamed("medgemma", state)
    assert out["lm_head.weight"] is out["model.language_model.embed_tokens.weight"]
    assert "lm_head.weight" not in renamed("lingshu", {"model.embed_tokens.weight": torch.empty(1, 1, device="meta")})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_transformers_5_layout_passes_unchanged(family):
    """A release already saved in this transformers' layout (e.g. by transformers 5) loads too: the filter keeps its names."""
    state = network(family).state_dict()
    assert list(renamed(family, state)) == list(state)


#: a 4.52.x save's in-memory names (transformers issue #38489: its save_pretrained did not map the keys back)
IN_MEMORY_4_52 = (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
                  ("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector."),
                  ("image_newline", "model.image_newline"), ("visual.", "model.visual."), ("model.layers.", "model.language_model.layers."),
                  ("model.embed_tokens.", "model.language_model.embed_tokens."), ("model.norm.", "model.language_model.norm."))


@pytest.mark.parametrize("family", ["lingshu", "medgemma", "radvlm"])
def test_a_4_52_save_in_memory_names_load_too(family):
    state = {}
    for key, value in release_state(family).items():
        for old, new in IN_MEMORY_4_52:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        state[key] = value
    assert renamed(family, state).keys() == network(family).state_dict().keys()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_names_agree_with_transformers_own_renames(family):
    """The filter gives every release key the name transformers' from_pretrained would (its checkpoint conversion
    mapping for the class). MAIRA-2's network is a subclass transformers does not map (custom code): its keys are
    checked against the stock LlavaForConditionalGeneration of the same config, all but its own projector."""
    conversion = pytest.importorskip("transformers.conversion_mapping")
    loading = pytest.importorskip("transformers.core_model_loading")
    if not all(hasattr(module, name) for module, name in ((conversion, "get_model_conversion_mapping"),
                                                           (loading, "rename_source_key"))):
        pytest.skip("this transformers has no checkpoint conversion mapping API")
    net = network(family)
    reference, keys = net, release_keys(family)
    if family == "maira2":
        import transformers

        with torch.device("meta"):
            reference = transformers.LlavaForConditionalGeneration(net.config)
        keys = {key: shape for key, shape in keys.items() if not key.startswith("multi_modal_projector.")}
    mapping = conversion.get_model_conversion_mapping(reference)
    renamings = [m for m in mapping if isinstance(m, loading.WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, loading.WeightConverter)]
    meta = reference.state_dict()
    theirs = {key: loading.rename_source_key(key, renamings, converters, reference.base_model_prefix, meta)[0] for key in keys}
    ours = {key: next(iter(renamed(family, {key: torch.empty(0, device="meta")}))) for key in keys}
    assert {k: (ours[k], theirs[k]) for k in keys if ours[k] != theirs[k]} == {}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parameter_count_is_the_published_size(family):
    data = manifest(family)
    count = sum(p.numel() for p in network(family).parameters())  # tied tensors once
    assert count == data["parameters"] == sum(math.prod(shape) for shape in release_keys(family).values())
    assert abs(count - data["published_parameters"]) / data["published_parameters"] < 0.01, data["published_source"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_manifest_and_config_are_documented(family):
    data = manifest(family)
    assert (MANIFESTS / f"{family}.json").stat().st_size < 60_000
    assert data["tensors"] == len(release_keys(family))
    assert data["_source"] and data["saved_with_transformers"] and data["published_source"]
    assert json.loads((CONFIGS / f"{family}.json").read_text())["_source"]
