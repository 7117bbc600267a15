"""MAIRA-2 equals the authors' code: our ``Maira2`` (transformers 5.x Llava with our image features and projector,
``xbench_pl.models.generative.maira2``) loads a tiny random checkpoint in the release's file layout and gives the
teacher-forced logits that Microsoft's own ``Maira2ForConditionalGeneration`` (the hub's ``modeling_maira2.py`` and
``configuration_maira2.py``, run under transformers 4.51.3, the authors' last pin) gave on the same weights and inputs.

``data/generative/maira2_reference/`` (made by its ``make_reference.py``, which ran the authors' files in a scratch
environment outside this repo; ``README.md`` there says how): ``config.json`` as the authors' ``save_pretrained`` wrote
it; ``release_manifest.json``, the keys, shapes and dtypes of the ``model.safetensors`` it wrote (the weights are
drawn again here from a seed, ``release_state``, and their fingerprint checked, so the repo holds no weight file);
``reference.safetensors``, the inputs and the authors' outputs; ``source.json``, where the code came from and what ran.

Not one line of the authors' code is in this repo.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from reference_common import assert_within_float32_roundoff, fill, seeded_tensors

DATA = Path(__file__).resolve().parent / "data" / "generative" / "maira2_reference"
#: the seed of the release-layout weights (``release_state``); changing it invalidates ``reference.safetensors``
SEED = 20241024


def _fill(key: str, shape: list, dtype: str, g: torch.Generator) -> torch.Tensor:
    """``reference_common.fill``, but DINOv2's layer scales near 1 (its 1-D rule would make them ~0.1: every residual
    branch of the image tower would count for little)."""
    if key.endswith(".lambda1"):
        return 1 + 0.1 * torch.randn(shape, generator=g)
    return fill(key, shape, dtype, g)


def release_state(manifest: dict) -> dict[str, torch.Tensor]:
    """The tiny checkpoint in the release's keys (``manifest["keys"]``: ``{key: [shape, dtype]}``), every tensor
    non-trivial (no zero biases, no unit norms), drawn from ``SEED`` in sorted key order."""
    return seeded_tensors(manifest["keys"], {}, _fill, torch.Generator().manual_seed(SEED))


def fingerprint(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the sorted names, dtypes, shapes and bytes of ``state``."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def reference() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(DATA / "reference.safetensors")


def manifest() -> dict:
    return json.loads((DATA / "release_manifest.json").read_text())


#: the authors' ``save_pretrained`` config as transformers 4.51.3 writes it (every field) and as 4.48.3 writes it (the
#: sub-configs' non-default fields only, the form of the tiny-random copies of the release)
CONFIGS = ("config.json", "config_transformers_4.48.3.json")


def release_folder(folder: Path, config: str = CONFIGS[0]) -> Path:
    """A release-shaped checkpoint folder: one of the authors' configs as ``config.json``, the seeded weights in their
    file layout and our stand-in tokenizer (the release's tokenizer files are not in the repo; only ids enter this
    comparison)."""
    from safetensors.torch import save_file

    from xbench_pl.models.generative.maira2 import Maira2
    from xbench_pl.models.generative.tokens import chat_stand_in

    layout = manifest()
    save_file(release_state(layout), folder / "model.safetensors", metadata=layout["metadata"])
    shutil.copy(DATA / config, folder / "config.json")
    chat_stand_in(Maira2.SPECIAL_TOKENS, Maira2.ANSWERS).save_pretrained(folder)
    return folder


def ours(tmp_path_factory, config: str = CONFIGS[0]):
    from xbench_pl.models.generative.maira2 import Maira2

    return Maira2(checkpoint=str(release_folder(tmp_path_factory.mktemp("maira2_release"), config)))


@pytest.fixture(scope="module", params=CONFIGS)
def model(request, tmp_path_factory):
    return ours(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def twin(model):
    """Our network in float64: its distance to our float32 outputs is their round-off (``reference_common``)."""
    return copy.deepcopy(model.network).double().eval()


def test_weights_are_the_ones_the_authors_ran():
    """The seeded weights drawn here are bit for bit those the authors' ``from_pretrained`` loaded."""
    layout = manifest()
    assert fingerprint(release_state(layout)) == layout["fingerprint"]


def test_release_layout_maps_onto_our_network_key_for_key(model):
    """The release file's keys (transformers 4.x, as the authors' ``save_pretrained`` wrote them) are exactly our
    network's after ``checkpoint_filter``: none left over, none missing (``load_weights`` is strict as well)."""
    keys = manifest()["keys"]
    prefixes = ("vision_tower.", "multi_modal_projector.layers.", "language_model.model.", "language_model.lm_head.")
    assert all(k.startswith(prefixes) for k in keys)
    assert "language_model.lm_head.weight" in keys and "vision_tower.layernorm.weight" in keys
    state = release_state(manifest())
    renamed = model.checkpoint_filter(state)
    assert len(renamed) == len(state)
    loaded = model.network.state_dict()
    assert set(renamed) == set(loaded)
    for key, value in renamed.items():
        assert torch.equal(loaded[key], value), key


def test_image_features_equal_the_authors(model, twin):
    """``get_image_features``: the DINOv2 backbone's layer-normed last stage without the class token, through the
    4-layer projector ([2, 16, 64])."""
    ref = reference()
    pixels = ref["pixel_values"].float()
    with torch.no_grad():
        features = torch.stack(model.network.model.get_image_features(pixels).pooler_output)
        exact = torch.stack(twin.model.get_image_features(pixels.double()).pooler_output)
    assert features.shape == ref["image_features"].shape
    assert_within_float32_roundoff("image features", features, exact, ref["image_features"])


@pytest.mark.parametrize("positions", ["none", "generate"])
def test_teacher_forced_logits_equal_the_authors(model, twin, positions):
    """The forward's logits [2, 36, 311] at every non-padded position, both rows (one left-padded), without
    position ids (as ``Maira2.recognition`` calls it) and with generate's (cumulative mask). Padded positions are
    queries that may attend to no key; what a library puts there is not the model's, so they are not compared."""
    ref = reference()
    kwargs = {"input_ids": ref["input_ids"], "attention_mask": ref["attention_mask"], "use_cache": False}
    expected = ref["logits"]
    if positions == "generate":
        kwargs["position_ids"] = ref["position_ids_generate"]
        expected = ref["logits_position_ids_generate"]
    with torch.no_grad():
        logits = model.network(pixel_values=ref["pixel_values"].float(), **kwargs).logits
        exact = twin(pixel_values=ref["pixel_values"].double(), **kwargs).logits
    real = ref["attention_mask"].bool()
    assert logits.shape == expected.shape == (2, 36, 311) and real.sum() == 68
    assert_within_float32_roundoff(f"logits ({positions} position ids)", logits[real], exact[real], expected[real])
    log_probs = logits[real].double().log_softmax(-1)
    assert_within_float32_roundoff("log-probabilities", log_probs, exact[real].log_softmax(-1),
                                   expected[real].double().log_softmax(-1))
