"""Makes this folder's reference (``README.md``): runs Microsoft's MAIRA-2 release code on a tiny random checkpoint.

Run with the scratch environment's Python (transformers 4.51.3; the authors' files are imported from ``MAIRA2_SRC``,
a folder holding their unmodified ``configuration_maira2.py`` and ``modeling_maira2.py``), from the repo root:

    MAIRA2_SRC=/tmp/scratch_maira2_eq/authors/maira2 /tmp/scratch_maira2_eq/venv/bin/python \
        tests/data/generative/maira2_reference/make_reference.py

Ours: no line of the authors' code is here. Deterministic (the weights from ``test_maira2_reference.SEED``, the inputs
from ``INPUT_SEED``).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[2]
sys.path.insert(0, str(TESTS))

from test_maira2_reference import SEED, fingerprint, release_state  # noqa: E402

INPUT_SEED = 7
#: our stand-in tokenizer's ids (Maira2(random_init=True): 311 tokens, <image> 102, <s> 103, </s> 104, <pad> 0)
VOCAB, IMAGE, BOS, EOS, PAD = 311, 102, 103, 104, 0
#: the tiny configuration: our ``Maira2.tiny_config`` in the release's config class, with what the release sets
#: (a DINOv2 backbone whose last stage is the feature map, not reshaped, layer-normed; the text model's linear RoPE
#: scaling 1.5)
TEXT = dict(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, bos_token_id=BOS,
            eos_token_id=EOS, pad_token_id=PAD, rope_scaling={"type": "linear", "factor": 1.5})
VISION = dict(model_type="dinov2", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              image_size=56, patch_size=14, out_features=["stage2"], reshape_hidden_states=False, apply_layernorm=True)
AUTO_MAP = {"AutoConfig": "configuration_maira2.Maira2Config",
            "AutoModelForCausalLM": "modeling_maira2.Maira2ForConditionalGeneration",
            "AutoModelForVision2Seq": "modeling_maira2.Maira2ForConditionalGeneration"}
GRID = 4  # 56 / 14: 16 image tokens per image


def import_authors(src: Path):
    """Their two files as the package ``maira2_release`` (``modeling_maira2`` imports ``.configuration_maira2``)."""
    spec = importlib.util.spec_from_file_location("maira2_release", src / "__init__.py" if (src / "__init__.py").exists()
                                                  else None, submodule_search_locations=[str(src)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["maira2_release"] = package
    if spec.loader is not None:
        spec.loader.exec_module(package)
    from maira2_release.configuration_maira2 import Maira2Config
    from maira2_release.modeling_maira2 import Maira2ForConditionalGeneration

    return Maira2Config, Maira2ForConditionalGeneration


def accept_none_kwargs(model_class) -> str | None:
    """transformers 4.51's ``LlavaForConditionalGeneration.forward`` calls ``get_image_features(..., image_sizes=None)``;
    this version of their file takes no ``**kwargs`` (it ran under 4.46-4.50). Where so, their method is wrapped to
    refuse any extra argument that is not None and call it unchanged without them. Returns what was done."""
    original = model_class.get_image_features
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(original).parameters.values()):
        return None

    def get_image_features(self, pixel_values, vision_feature_layer, vision_feature_select_strategy, **kwargs):
        extra = {k: v for k, v in kwargs.items() if v is not None}
        if extra:
            raise ValueError(f"extra arguments to get_image_features: {sorted(extra)}")
        return original(self, pixel_values, vision_feature_layer, vision_feature_select_strategy)

    model_class.get_image_features = get_image_features
    return ("their get_image_features (no **kwargs) wrapped to accept and drop None keyword arguments (4.51's Llava "
            "forward passes image_sizes=None); their method itself runs unchanged")


def inputs() -> dict[str, torch.Tensor]:
    """Two rows of 36 tokens, each ``<s>`` text, 16 image tokens, text; the first left-padded by 4; pixel values drawn
    from N(0, 1) and rounded to float16 (stored so), three distinct channels."""
    g = torch.Generator().manual_seed(INPUT_SEED)
    text = [i for i in range(1, VOCAB) if i not in (IMAGE, PAD)]

    def words(n):
        return [text[int(i)] for i in torch.randint(len(text), (n,), generator=g)]

    rows = [[PAD] * 4 + [BOS] + words(7) + [IMAGE] * GRID ** 2 + words(8),
            [BOS] + words(9) + [IMAGE] * GRID ** 2 + words(10)]
    input_ids = torch.tensor(rows)
    attention_mask = (torch.arange(input_ids.shape[1])[None] >= torch.tensor([[4], [0]])).long()
    pixel_values = torch.randn(2, 3, GRID * 14, GRID * 14, generator=g).half()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "pixel_values": pixel_values}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = Path(os.environ["MAIRA2_SRC"]).resolve()
    out = Path(os.environ.get("MAIRA2_OUT", HERE))  # elsewhere: a cross-check run (README.md)
    out.mkdir(parents=True, exist_ok=True)
    Maira2Config, Maira2ForConditionalGeneration = import_authors(src)
    shim = accept_none_kwargs(Maira2ForConditionalGeneration)
    config = Maira2Config(text_config=copy.deepcopy(TEXT), vision_config=copy.deepcopy(VISION), image_token_index=IMAGE, projector_n_layers=4,
                          vision_feature_select_strategy="default", vision_feature_layer=-1, pad_token_id=PAD)
    config.auto_map = AUTO_MAP
    torch.manual_seed(0)
    model = Maira2ForConditionalGeneration(config)

    with tempfile.TemporaryDirectory() as tmp:
        raw, release = Path(tmp) / "raw", Path(tmp) / "release"
        # 1. the layout: what their save_pretrained writes
        model.save_pretrained(raw, safe_serialization=True)
        with safe_open(raw / "model.safetensors", "pt") as f:
            keys = {k: [list(f.get_slice(k).get_shape()), str(f.get_slice(k).get_dtype()).lower()] for k in f.keys()}
            metadata = f.metadata()
        keys = {k: [shape, {"f32": "float32"}.get(dtype, dtype)] for k, (shape, dtype) in keys.items()}
        assert set(keys) == set(model.state_dict()), "save_pretrained wrote other keys than the state dict"
        manifest = {"keys": keys, "metadata": metadata}

        # 2. the weights: drawn from the seed in that layout, loaded, written and read again by their code
        state = release_state(manifest)
        model.load_state_dict(state, strict=True)
        model.save_pretrained(release, safe_serialization=True)
        with safe_open(release / "model.safetensors", "pt") as f:
            assert list(f.keys()) == list(keys) and f.metadata() == metadata
        loaded, info = Maira2ForConditionalGeneration.from_pretrained(release, torch_dtype=torch.float32,
                                                                      output_loading_info=True)
        assert not any(info.values()), info
        assert fingerprint(loaded.state_dict()) == fingerprint(state), "the release folder does not hold the seeded weights"
        manifest["fingerprint"] = fingerprint(state)
        manifest["seed"] = SEED
        config_text = (release / "config.json").read_text()

    # 3. their forward, teacher forced
    loaded.eval()
    x = inputs()
    pixel_values = x["pixel_values"].float()
    mask = x["attention_mask"]
    generate_positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as their generate's prepare_inputs
    with torch.no_grad():
        features = loaded.get_image_features(pixel_values, vision_feature_layer=config.vision_feature_layer,
                                             vision_feature_select_strategy=config.vision_feature_select_strategy)
        logits = loaded(input_ids=x["input_ids"], attention_mask=mask, pixel_values=pixel_values, use_cache=False).logits
        logits_positions = loaded(input_ids=x["input_ids"], attention_mask=mask, pixel_values=pixel_values,
                                  position_ids=generate_positions, use_cache=False).logits
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()

    (out / "config.json").write_text(config_text)
    (out / "release_manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    save_file({"input_ids": x["input_ids"], "attention_mask": mask, "pixel_values": x["pixel_values"],
               "position_ids_generate": generate_positions, "image_features": features.contiguous(),
               "logits": logits.contiguous(), "logits_position_ids_generate": logits_positions.contiguous()},
              out / "reference.safetensors", metadata={"made_by": "make_reference.py"})
    versions = {n: importlib.metadata.version(n) for n in ("torch", "transformers", "tokenizers", "safetensors", "numpy")}
    source = {
        "authors_code": {
            "release": "huggingface.co/microsoft/maira-2 (gated, MSRLA); hub code for transformers 4.46-4.51",
            "files": {name: {"sha256": sha256(src / name)} for name in ("configuration_maira2.py", "modeling_maira2.py")},
            "where_read": {"modeling_maira2.py": "code-search index id 37696548710 (4,323 chars; get_image_features reads "
                                                 "Dinov2Backbone.feature_maps), the hub header 'Copyright 2024 Microsoft'",
                           "configuration_maira2.py": "code-search index id 37594029613 (1,061 chars)"},
            "processing_maira2.py": "not used (github johannes2moll/maira_rrg@a07b72d holds it; the inputs here are ids)",
            "classes_run": ["Maira2Config", "Maira2ForConditionalGeneration (from_pretrained, get_image_features, forward)"],
        },
        "ran_with": {**versions, "python": platform.python_version(), "machine": platform.machine()},
        "config": {"text": TEXT, "vision": VISION, "image_token_index": IMAGE, "projector_n_layers": 4,
                   "vision_feature_layer": -1, "vision_feature_select_strategy": "default", "attn_implementation":
                   loaded.config._attn_implementation},
        "weights": "release_manifest.json's keys drawn by test_maira2_reference.release_state (seed "
                   f"{SEED}); loaded by their from_pretrained from the file their save_pretrained wrote",
        "outputs": {
            "image_features": "get_image_features(pixel_values, -1, 'default'): [2, 16, 64]",
            "logits": "forward(input_ids, attention_mask, pixel_values, use_cache=False).logits: [2, 36, 311], no position_ids "
                      "(as Maira2.recognition calls it)",
            "logits_position_ids_generate": "the same with position_ids = cumsum(mask) - 1 (1 at padding), as generate's first step",
            "padding": "row 0 is left-padded by 4; outputs at padded positions are not compared (a query that sees no key)",
        },
        "run_time_stand_in": shim,
        "inputs": f"make_reference.inputs (seed {INPUT_SEED}); pixel_values stored as float16, run as float32",
    }
    (out / "source.json").write_text(json.dumps(source, indent=1) + "\n")
    print(json.dumps({"keys": len(keys), "fingerprint": manifest["fingerprint"], "logits_absmax": logits.abs().max().item(),
                      "versions": versions}))


if __name__ == "__main__":
    main()
