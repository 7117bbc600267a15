"""Regenerate BioViL's manifest and the reference outputs of the authors' own code (hi-ml-multimodal 0.2.2).

Run from the repo root in the *scratch* environment of ``tests/data/make_biovil_reference.md`` (not the
project's venv: it needs hi-ml-multimodal installed with ``--no-deps`` and transformers 4.x)::

    /tmp/biovil_scratch/venv/bin/python tests/data/make_biovil_reference.py manifests
    /tmp/biovil_scratch/venv/bin/python tests/data/make_biovil_reference.py reference

Nothing of the authors' code is copied here: this script *imports* their package ``health_multimodal``.

``manifests`` builds on the meta device their ``ImageModel`` of both variants (``get_biovil_image_encoder``'s
``RESNET50`` and ``get_biovil_t_image_encoder``'s ``RESNET50_MULTI_IMAGE``, joint size 128) and their
``CXRBertModel`` at full size (``CXRBertConfig()``: BERT-base, vocabulary 30522, projection 128, as the
hub configs) and at the tiny test size, and records every state-dict key with shape and dtype and the
aliases (tied tensors). On a CPU copy of each image model it back-propagates the single-image projected
patch embeddings and records the parameters that get no gradient (``unused``).

``reference`` writes the seeded files of ``tests/biovil_reference.py`` to a temporary folder, loads them
with **their** loaders (``ImageModel(pretrained_model_path=...)``: ``torch.load`` + strict
``load_state_dict``; ``CXRBertTokenizer`` / ``CXRBertModel.from_pretrained`` of the folder), wraps them
in their ``ImageInferenceEngine`` / ``TextInferenceEngine`` / ``ImageTextInferenceEngine`` and records,
per image and class, their similarity score of the positive and negative prompt
(``get_similarity_score_from_raw_data``) and the similarity map before the resize to the image
(``_get_similarity_map_from_embeddings`` of ``get_projected_patch_embeddings`` and
``get_embeddings_from_prompt``: what ``get_similarity_map_from_raw_data`` does before
``convert_similarity_to_image_size``). Their engines read an image file; the reference images are
handed to them instead (``load_and_transform_input_image`` replaced by a function returning the
tensor: the transform is tested separately against torchvision).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))

import biovil_reference as ref  # noqa: E402  (tests/biovil_reference.py: the shared test-data generator)
from reference_common import describe_module, versions, write_json  # noqa: E402

ENCODER_TYPES = {"biovil": "resnet50", "biovil_t": "resnet50_multi_image"}


def image_model(variant: str, path: Path | None = None):
    from health_multimodal.image.model.model import ImageModel

    return ImageModel(img_encoder_type=ENCODER_TYPES[variant], joint_feature_size=ref.JOINT, pretrained_model_path=path)


def unused_parameters(variant: str) -> list[str]:
    """Parameters of the image model that get no gradient through the single-image projected patch embeddings."""
    torch.manual_seed(0)
    model = image_model(variant).eval()
    out = model(torch.rand(1, 3, 64, 64))
    (out.projected_patch_embeddings.square().sum() + out.projected_global_embedding.sum()).backward()
    return sorted(name for name, p in model.named_parameters() if p.grad is None)


def manifests() -> None:
    from health_multimodal.text.model import CXRBertConfig, CXRBertModel

    out: dict = {"himl_commit": ref.HIML_COMMIT, "versions": versions("hi-ml-multimodal"), "image": {}, "text": {}}
    for variant in ref.VARIANTS:
        with torch.device("meta"):
            entry = describe_module(image_model(variant))
        entry["unused"] = unused_parameters(variant)
        out["image"][variant] = entry
    for name, config in (("full", CXRBertConfig()), ("tiny", CXRBertConfig(**ref.tiny_text_config()))):
        with torch.device("meta"):
            out["text"][name] = describe_module(CXRBertModel(config))
        out["text"][name]["config"] = {k: getattr(config, k) for k in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "projection_size")}
    write_json(ref.MANIFEST, out)
    print("wrote", ref.MANIFEST)


def reference() -> None:
    from health_multimodal.image import ImageInferenceEngine
    from health_multimodal.image.data.transforms import create_chest_xray_transform_for_inference
    from health_multimodal.text import CXRBertModel, CXRBertTokenizer, TextInferenceEngine
    from health_multimodal.vlp import ImageTextInferenceEngine

    images = ref.reference_images()
    result: dict = {"himl_commit": ref.HIML_COMMIT, "versions": versions("hi-ml-multimodal", "scipy"),
                    "classes": list(ref.CLASSES)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = ref.write_text_folder(Path(tmp) / "text")
        tokenizer = CXRBertTokenizer.from_pretrained(str(folder))
        text_model, info = CXRBertModel.from_pretrained(str(folder), output_loading_info=True)
        assert not any(info.values()), info  # every key of the file used, none missing
        text_engine = TextInferenceEngine(tokenizer=tokenizer, text_model=text_model.eval())
        prompts = [p for c in ref.CLASSES for p in (c, f"no {c}")]
        tokens = text_engine.tokenize_input_prompts(prompts, verbose=False)
        result["prompts"], result["input_ids"] = prompts, tokens.input_ids.clone()
        result["text_embeddings"] = text_engine.get_embeddings_from_prompt(prompts, normalize=True, verbose=False)
        for variant in ref.VARIANTS:
            path = ref.write_image_checkpoint(Path(tmp) / ref.IMAGE_WEIGHTS[variant], variant)
            model = image_model(variant, path)  # their strict load
            crop = 480 if variant == "biovil" else 448
            image_engine = ImageInferenceEngine(image_model=model, transform=create_chest_xray_transform_for_inference(512, crop))
            image_engine.load_and_transform_input_image = lambda index, transform: (images[index : index + 1], (0, 0))
            engine = ImageTextInferenceEngine(image_engine, text_engine)
            similarity = torch.tensor([[[engine.get_similarity_score_from_raw_data(b, p) for p in (c, f"no {c}")]
                                        for c in ref.CLASSES] for b in range(len(images))])
            maps = torch.stack([torch.stack([
                engine._get_similarity_map_from_embeddings(image_engine.get_projected_patch_embeddings(b)[0],
                                                           text_engine.get_embeddings_from_prompt(c, verbose=False))
                for c in ref.CLASSES]) for b in range(len(images))])
            result[variant] = {
                "global_embeddings": torch.stack([image_engine.get_projected_global_embedding(b) for b in range(len(images))]),
                "similarity": similarity.float(),  # [B, C, 2]: cosine with "{c}", "no {c}"
                "scores": similarity.float().softmax(dim=-1)[..., 0],  # CheXzero's pair probability (ours, not theirs)
                "maps": maps.float(),  # [B, C, h, w]: smoothed, before the resize to the image
            }
            print(variant, "maps", tuple(maps.shape), "scores", result[variant]["scores"])
    torch.save(result, HERE / "biovil_reference.pt")
    print("wrote", HERE / "biovil_reference.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("manifests", "reference"))
    {"manifests": manifests, "reference": reference}[parser.parse_args().what]()
