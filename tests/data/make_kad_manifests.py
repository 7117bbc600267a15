"""Regenerate KAD's checkpoint manifests and the reference outputs of the authors' own code.

Run from the repo root in the *scratch* environment described in ``tests/data/make_kad_reference.md``
(not the project's venv: it needs a transformers 4.x of the authors' era and the authors' files)::

    KAD_SRC=/tmp/kad_scratch/KAD/A3_CLIP python tests/data/make_kad_manifests.py manifests
    KAD_SRC=/tmp/kad_scratch/KAD/A3_CLIP python tests/data/make_kad_manifests.py reference

How the manifests were derived. Nothing of the authors' code is copied here: this script *imports*
their classes (``models/clip_tqn.py``: ``ModelRes`` for 224, ``ModelRes512`` for 512/1024,
``CLP_clinical``, ``TQN_Model``; ``models/transformer_decoder.py``) from an export of
``xiaoman-zhang/KAD`` at ``KAD_COMMIT`` that lives outside the repo, and builds them on the ``meta``
device (no memory, no weights). What cannot run offline is replaced at run time, here, without
touching their files:

* ``petrel_client`` (SenseTime storage client, imported and instantiated at import time) and
  ``pytorch_pretrained_vit`` (imported, never used by the ResNet variants) are empty stand-ins;
* ``torchvision.models.resnet50(pretrained=True)`` is built with ``weights=None`` (same modules);
* ``AutoModel.from_pretrained(name, config=...)`` becomes ``AutoModel.from_config(config)`` with
  the BERT-base uncased config of ``xmcmic/Med-KEBERT`` shipped in
  ``xbench_pl/models/configs/hf/xmcmic/Med-KEBERT/config.json`` (vocab 30522), so the text encoder
  is the same BertModel with pooler.

Each manifest records, per sub-dict of ``best_valid.pt`` (``image_encoder``, ``text_encoder``,
``model``; ``A3_CLIP/main.py`` saves ``{model, image_encoder, text_encoder, optimizer,
lr_scheduler, config, epoch}``): every state-dict key in state-dict order with its shape and dtype,
the keys that alias another key (same tensor: ``res_features.*`` = ``resnet.*`` because
``res_features`` is an ``nn.Sequential`` of the resnet's own children; ``decoder.norm.*`` =
``decoder_norm.*`` because the same LayerNorm is passed to the decoder), and parameter counts.
``bert_model.embeddings.position_ids`` is a persistent buffer in the transformers of the authors'
era (up to 4.30; non-persistent from 4.31 on), so the released files most probably contain it.
The 1024 model has the 512 layout. No real checkpoint was opened.

``reference`` loads ``tests/kad_reference.py::official_checkpoint(arch, seed=0)`` into the
authors' classes with their own ``load_state_dict`` calls (strict), tokenises the 14 ChestX-ray14
texts with their tokenizer call, runs their modules in eval mode on ``reference_images`` and saves
``tests/data/kad_reference_{224,512}.pt``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))

import kad_reference  # noqa: E402  (tests/kad_reference.py: the shared test-data generator)
from reference_common import describe_module, versions  # noqa: E402

KAD_COMMIT = "591d999e325a783868599b3e53067acd2ecbddc0"
MEDKEBERT_CONFIG = REPO / "xbench_pl/models/configs/hf/xmcmic/Med-KEBERT/config.json"
IMAGE_SIZE = {"kad_224": 224, "kad_512": 512}
MAX_LENGTH = 256  # test_chestxray14.py --max_length default


def import_official(src: Path):
    """Import the authors' model classes from an export of their repo, with offline stand-ins."""
    petrel = types.ModuleType("petrel_client")
    petrel_client = types.ModuleType("petrel_client.client")
    petrel_client.Client = lambda *a, **k: None
    petrel.client = petrel_client
    vit = types.ModuleType("pytorch_pretrained_vit")
    vit.ViT = None
    sys.modules.update({"petrel_client": petrel, "petrel_client.client": petrel_client, "pytorch_pretrained_vit": vit})

    import torchvision.models
    import transformers

    resnet50 = torchvision.models.resnet50
    torchvision.models.resnet50 = lambda pretrained=False, **kw: resnet50(weights=None, **kw)
    transformers.AutoModel.from_pretrained = classmethod(lambda cls, name, config=None, **kw: cls.from_config(config))

    sys.path.insert(0, str(src))
    from models import clip_tqn  # their module, unmodified

    return clip_tqn


def bert_folder(tmp: Path) -> Path:
    """A local 'bert_model_name' folder: Med-KEBERT's config plus the generated tokenizer files."""
    folder = kad_reference.write_tokenizer(tmp / "Med-KEBERT")
    (folder / "config.json").write_text(MEDKEBERT_CONFIG.read_text())
    return folder


def build(clip_tqn, arch: str, bert: Path):
    image_encoder = clip_tqn.ModelRes("resnet50") if arch == "kad_224" else clip_tqn.ModelRes512("resnet50")
    return image_encoder, clip_tqn.CLP_clinical(bert_model_name=str(bert)), clip_tqn.TQN_Model()


def manifest(clip_tqn, arch: str, bert: Path) -> dict:
    with torch.device("meta"):
        image_encoder, text_encoder, model = build(clip_tqn, arch, bert)
    parts = {"image_encoder": describe_module(image_encoder), "text_encoder": describe_module(text_encoder), "model": describe_module(model)}
    # What the forward pass reaches: the 224 encoder stops at layer3, and no variant uses resnet.fc or
    # either logit_scale at test time.
    unused = ["resnet.fc."] + (["resnet.layer4."] if arch == "kad_224" else [])
    image_used = sum(p.numel() for n, p in image_encoder.named_parameters() if not any(n.startswith(u) for u in unused))
    used = image_used + parts["text_encoder"]["parameters"] + parts["model"]["parameters"] - 2
    grid = {"kad_224": 14, "kad_512": 16}[arch]
    return {
        "source": f"xiaoman-zhang/KAD@{KAD_COMMIT} A3_CLIP/models/clip_tqn.py "
                  f"({'ModelRes' if arch == 'kad_224' else 'ModelRes512'}, CLP_clinical, TQN_Model) built on meta; "
                  "text: xmcmic/Med-KEBERT config (BERT-base uncased, vocab 30522); layout of A3_CLIP/main.py best_valid.pt",
        "architecture": arch,
        "image_size": IMAGE_SIZE[arch],
        "grid": [grid, grid],
        "versions": versions("einops"),
        "non_tensor": ["optimizer", "lr_scheduler", "config", "epoch"],
        "parameters": {
            "total": sum(p["parameters"] for p in parts.values()),
            "used_by_forward": used,
            **{name: p["parameters"] for name, p in parts.items()},
        },
        "aliases": {name: p["aliases"] for name, p in parts.items()},
        "keys": {name: p["keys"] for name, p in parts.items()},
    }


def write_manifest(path: Path, data: dict) -> None:
    head = json.dumps({k: v for k, v in data.items() if k != "keys"}, indent=1)[:-2]
    parts = []
    for name, keys in data["keys"].items():
        rows = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in keys.items())
        parts.append(f'  {json.dumps(name)}: {{\n{rows}\n  }}')
    path.write_text(f'{head},\n "keys": {{\n' + ",\n".join(parts) + "\n }\n}\n")


def reference(clip_tqn, arch: str, bert: Path) -> dict:
    from transformers import AutoTokenizer

    image_encoder, text_encoder, model = build(clip_tqn, arch, bert)
    checkpoint = kad_reference.official_checkpoint(arch, seed=0)
    # Their loading (test_chestxray14.py): strict load_state_dict of each sub-dict.
    for module, name in ((image_encoder, "image_encoder"), (text_encoder, "text_encoder"), (model, "model")):
        result = module.load_state_dict(checkpoint[name])
        assert not result.missing_keys and not result.unexpected_keys, result
    for module in (model, image_encoder, text_encoder):
        module.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(bert), do_lower_case=True, local_files_only=True)
    texts = list(kad_reference.CXR14_TEXTS)
    tokens = tokenizer(texts, add_special_tokens=True, max_length=MAX_LENGTH, pad_to_max_length=True, return_tensors="pt")
    images = kad_reference.reference_images(IMAGE_SIZE[arch], seed=0)
    with torch.no_grad():
        text_features = text_encoder.encode_text(tokens)
        image_features, _ = image_encoder(images)
        logits, attention = model(image_features, text_features, return_atten=True)
    scores = torch.softmax(logits, dim=-1)[:, :, 1]
    grid = {"kad_224": 14, "kad_512": 16}[arch]
    maps = attention.reshape(attention.shape[0], attention.shape[1], grid, grid)  # row-major, as their plot script
    return {
        "arch": arch,
        "seed": 0,
        "image_size": IMAGE_SIZE[arch],
        "kad_commit": KAD_COMMIT,
        "versions": versions("einops"),
        "texts": texts,
        "input_ids": tokens["input_ids"].clone(),
        "attention_mask": tokens["attention_mask"].clone(),
        "text_features": text_features.clone(),
        "image_tokens_mean_std": torch.stack([image_features.mean(), image_features.std()]),
        "logits": logits.clone(),
        "scores": scores.clone(),
        "maps": maps.clone(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("manifests", "reference"))
    parser.add_argument("--kad-src", default=os.environ.get("KAD_SRC", "/tmp/kad_scratch/KAD/A3_CLIP"),
                        help="the A3_CLIP folder of an export of xiaoman-zhang/KAD at KAD_COMMIT")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    clip_tqn = import_official(Path(args.kad_src))
    with tempfile.TemporaryDirectory() as tmp:
        bert = bert_folder(Path(tmp))
        for arch in IMAGE_SIZE:
            if args.what == "manifests":
                data = manifest(clip_tqn, arch, bert)
                path = HERE / f"{arch}_checkpoint_manifest.json"
                write_manifest(path, data)
                n = sum(len(k) for k in data["keys"].values())
                print(f"{path.name}: {n} keys, parameters {data['parameters']}")
            else:
                data = reference(clip_tqn, arch, bert)
                path = HERE / f"kad_reference_{IMAGE_SIZE[arch]}.pt"
                torch.save(data, path)
                print(f"{path.name}: scores {data['scores'].tolist()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
