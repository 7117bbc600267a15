"""Regenerate MedKLIP's and MAVL's checkpoint manifests and the reference outputs of the authors' own code.

Run from the repo root in the *scratch* environment described in ``tests/data/make_medklip_mavl_reference.md``
(not the project's venv: it needs a transformers 4.x of the authors' era and an export of their files)::

    MEDKLIP_SRC=/tmp/mm_scratch/src/MedKLIP MAVL_SRC=/tmp/mm_scratch/src/MAVL \\
        python tests/data/make_medklip_mavl_manifests.py manifests   # tests/data/{medklip,mavl}_checkpoint_manifest.json
    ... make_medklip_mavl_manifests.py reference                     # tests/data/{medklip,mavl}_reference.pt
    ... make_medklip_mavl_manifests.py text                          # tests/data/medklip_text_reference.pt

Nothing of the authors' code is copied here: this script *imports* their model and tokenizer modules
from exports of ``MediaBrain-SJTU/MedKLIP`` at ``MEDKLIP_COMMIT`` and ``HieuPhan33/MAVL`` at ``MAVL_COMMIT``
that live outside the repo (each ``models`` folder is imported as its own package), and repeats the few
steps of their test scripts that are not functions (tokenizer call, DataParallel wrap, checkpoint
filtering, softmax, layer averaging), citing them. What cannot run offline is replaced at run time,
here, without touching their files:

* ``torchvision.models.resnet50/resnet18(pretrained=...)`` are built with ``weights=None`` (same modules;
  MAVL's configs ask for ImageNet weights, which are overwritten by the checkpoint anyway);
* ``torchvision.models.vit_b_16/vit_l_16`` (built eagerly with SWAG weights in MAVL's ``net_dict``, never used
  by the ResNet models) return ``None``;
* ``transformers.AutoModel.from_pretrained`` returns, for ``manifests`` and ``reference``, a stand-in whose
  ``last_hidden_state[:, 0]`` is ``tests/medklip_mavl_reference.py::query_book`` (Bio_ClinicalBERT's weights
  are not available offline); for ``text`` it is the real one on the tiny folder of ``write_bert_folder``.

Manifests: each model's ``state_dict()`` as their training script saves it — MedKLIP's
``PreTrain_MedKLIP/models/model_MedKLIP.py::MedKLIP`` in ``nn.DataParallel`` (``train_MedKLIP.py:153``), MAVL's
``Pretrain/models/model_MAVL.py::MAVL`` prepared by accelerate (DDP, ``train_MAVL.py:213``) — built on the meta
device; every key with its shape and dtype, in state-dict order, ``module.`` included. The test-time classes
(MedKLIP ``Sample_zero-shot_Classification_CXR14`` and ``Sample_Zero-Shot_Grounding_RSNA``; MAVL
``Zero-shot_grounding`` and ``Zero-shot_classification``) are checked to have the same keys, less ``temp`` for
MAVL (their loaders drop it). No real checkpoint was opened.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))

import medklip_mavl_reference as ref  # noqa: E402  (tests/medklip_mavl_reference.py)
from reference_common import versions  # noqa: E402

MEDKLIP_COMMIT = ref.MEDKLIP_COMMIT
MAVL_COMMIT = ref.MAVL_COMMIT
# The ana_book of 51 location sentences ("It is located at ..."), built by the pretraining and MAVL
# classification classes; the stand-in only needs the row count.
N_LOCATIONS = 51


class StandInBert(nn.Module):
    """What ``AutoModel.from_pretrained`` returns in ``manifests``/``reference``: maps a tokenised book of
    N rows to ``last_hidden_state`` whose position 0 is the stand-in row block registered for N."""

    books: dict[int, torch.Tensor] = {}

    def forward(self, input_ids=None, attention_mask=None, **_):
        n = input_ids.shape[0]
        if n in self.books:
            cls = self.books[n]
        else:  # manifests on the meta device: any values
            cls = torch.zeros(n, 768, device=input_ids.device)
        return types.SimpleNamespace(last_hidden_state=cls.unsqueeze(1).to(input_ids.device))


def patch_offline(real_bert: bool) -> None:
    import torchvision.models
    import transformers

    resnet50, resnet18 = torchvision.models.resnet50, torchvision.models.resnet18
    torchvision.models.resnet50 = lambda pretrained=False, **kw: resnet50(weights=None, **kw)
    torchvision.models.resnet18 = lambda pretrained=False, **kw: resnet18(weights=None, **kw)
    torchvision.models.vit_b_16 = lambda *a, **kw: None
    torchvision.models.vit_l_16 = lambda *a, **kw: None
    if real_bert:
        real = transformers.AutoModel.from_pretrained.__func__
        transformers.AutoModel.from_pretrained = classmethod(
            lambda cls, name, *a, **kw: real(cls, name, *a, local_files_only=True, **kw))
    else:
        transformers.AutoModel.from_pretrained = classmethod(lambda cls, name, *a, **kw: StandInBert())


def import_models(alias: str, folder: Path, *modules: str):
    """Import ``folder/models/<module>.py`` (their namespace package ``models``) under the name ``alias``."""
    spec = importlib.machinery.ModuleSpec(alias, None, is_package=True)
    spec.submodule_search_locations = [str(folder / "models")]
    sys.modules[alias] = importlib.util.module_from_spec(spec)
    return [importlib.import_module(f"{alias}.{m}") for m in modules]


def read_yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def tokens(n: int) -> dict:
    """A tokenised book of n rows (the stand-in BERT only reads the row count)."""
    return {"input_ids": torch.zeros(n, ref.MAX_LENGTH, dtype=torch.long),
            "attention_mask": torch.ones(n, ref.MAX_LENGTH, dtype=torch.long)}


class Sources:
    def __init__(self, medklip: Path, mavl: Path):
        self.medklip, self.mavl = medklip, mavl
        (self.mk_pretrain,) = import_models("mk_pretrain_models", medklip / "PreTrain_MedKLIP", "model_MedKLIP")
        self.mk_cxr14, self.mk_tok = import_models("mk_cxr14_models", medklip / "Sample_zero-shot_Classification_CXR14",
                                                   "model_MedKLIP", "tokenization_bert")
        (self.mk_rsna,) = import_models("mk_rsna_models", medklip / "Sample_Zero-Shot_Grounding_RSNA", "model_MedKLIP")
        (self.mv_pretrain,) = import_models("mv_pretrain_models", mavl / "Pretrain", "model_MAVL")
        (self.mv_zg,) = import_models("mv_zg_models", mavl / "Zero-shot_grounding", "model_MAVL")
        (self.mv_zc,) = import_models("mv_zc_models", mavl / "Zero-shot_classification", "model_MAVL")

    def medklip_config(self, which: str) -> dict:
        path = {"pretrain": "PreTrain_MedKLIP/configs/Pretrain_MedKLIP.yaml",
                "test": "Sample_zero-shot_Classification_CXR14/configs/MedKLIP_config.yaml",
                "grounding": "Sample_Zero-Shot_Grounding_RSNA/configs/MedKLIP_config.yaml"}[which]
        return read_yaml(self.medklip / path)

    def mavl_config(self, which: str) -> dict:
        path = {"pretrain": "Pretrain/configs/MAVL_resnet.yaml",
                "grounding": "Zero-shot_grounding/configs/rsna_mavl.yaml",
                "classification": "Zero-shot_classification/configs/chexpert_mavl.yaml"}[which]
        return read_yaml(self.mavl / path)


def describe(state: dict, prefix: str = "") -> dict:
    return {prefix + k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state.items()}


def count(keys: dict, *prefixes: str) -> int:
    total = 0
    for k, (shape, dtype) in keys.items():
        if k.endswith(("running_mean", "running_var")) or not dtype.startswith("float"):
            continue  # BatchNorm statistics are buffers, not parameters
        if not prefixes or any(k.startswith("module." + p) for p in prefixes):
            total += int(torch.Size(shape).numel())
    return total


def manifest_medklip(src: Sources) -> dict:
    with torch.device("meta"):
        model = nn.DataParallel(src.mk_pretrain.MedKLIP(src.medklip_config("pretrain"), tokens(N_LOCATIONS), tokens(75)))
        keys = describe(model.state_dict())
        test_keys = describe(src.mk_cxr14.MedKLIP(src.medklip_config("test"), tokens(75)).state_dict(), "module.")
        rsna_keys = describe(src.mk_rsna.MedKLIP(src.medklip_config("grounding"), tokens(N_LOCATIONS), tokens(75))
                             .state_dict(), "module.")
    assert test_keys == keys and rsna_keys == keys, "test-time MedKLIP classes differ from the pretraining one"
    params = sum(p.numel() for p in model.parameters())
    return {
        "source": f"MediaBrain-SJTU/MedKLIP@{MEDKLIP_COMMIT} PreTrain_MedKLIP/models/model_MedKLIP.py::MedKLIP "
                  "(configs/Pretrain_MedKLIP.yaml) in nn.DataParallel, built on meta; same keys as "
                  "Sample_zero-shot_Classification_CXR14 and Sample_Zero-Shot_Grounding_RSNA models",
        "model": "medklip",
        "files": ["checkpoint_final.pth"],
        "saved_by": "PreTrain_MedKLIP/train_MedKLIP.py:195-215 {'model': DataParallel.state_dict(), 'optimizer', "
                    "'lr_scheduler', 'config', 'epoch'}",
        "loaded_by": "Sample_zero-shot_Classification_CXR14/test.py:93-100: DataParallel(MedKLIP).load_state_dict("
                     "checkpoint['model']) strict, module. kept, nothing dropped",
        "prefix": "module.",
        "versions": versions("einops", "timm"),
        "non_tensor": ["optimizer", "lr_scheduler", "config", "epoch"],
        "ignored_by_authors_loader": [],
        "training_only": ["module.cl_fc."],
        "parameters": {
            "total": params,
            "used_by_forward": params - count(keys, "cl_fc."),
            "res_features": count(keys, "res_features."),
            "res_l1_l2": count(keys, "res_l1.", "res_l2."),
            "disease_embedding_layer": count(keys, "disease_embedding_layer."),
            "decoder": count(keys, "decoder."),
            "classifier": count(keys, "classifier."),
            "cl_fc": count(keys, "cl_fc."),
        },
        "keys": keys,
    }


def manifest_mavl(src: Sources) -> dict:
    n_aspects = 8 * 76  # Pretrain/concept_gen/gpt4_mimic.json: 76 keys x 8; MAVL(mode='train') keeps 75 x 8
    with torch.device("meta"):
        model = src.mv_pretrain.MAVL(src.mavl_config("pretrain"), tokens(N_LOCATIONS), tokens(75), tokens(n_aspects))
        keys = describe(model.state_dict(), "module.")  # accelerate's DDP wrapper
        zg = describe(src.mv_zg.MAVL(src.mavl_config("grounding"), tokens(75), tokens(600)).state_dict(), "module.")
        zc = describe(src.mv_zc.MAVL(src.mavl_config("classification"), tokens(N_LOCATIONS), tokens(75),
                                     tokens(600)).state_dict(), "module.")
    without_temp = {k: v for k, v in keys.items() if "temp" not in k}
    assert zg == without_temp and zc == without_temp, "test-time MAVL classes differ from the pretraining one"
    params = sum(p.numel() for p in model.parameters())
    return {
        "source": f"HieuPhan33/MAVL@{MAVL_COMMIT} Pretrain/models/model_MAVL.py::MAVL (configs/MAVL_resnet.yaml, "
                  "concept book 76 x 8 as gpt4_mimic.json) with accelerate's DDP module. prefix, built on meta; same keys "
                  "less temp as Zero-shot_grounding and Zero-shot_classification models",
        "model": "mavl",
        "files": ["checkpoint_full_40.pth", "checkpoint_full_46.pth"],
        "saved_by": "Pretrain/train_MAVL.py:264-286 {'model': DDP.state_dict(), 'optimizer', 'lr_scheduler', "
                    "'config', 'epoch'}",
        "loaded_by": "Zero-shot_grounding/test.py:154-161, Zero-shot_classification/test.py:323-329: "
                     "k.replace('module.', ''), drop keys containing 'temp', strict load_state_dict",
        "prefix": "module.",
        "versions": versions("einops", "timm"),
        "non_tensor": ["optimizer", "lr_scheduler", "config", "epoch"],
        "ignored_by_authors_loader": ["module.temp"],
        "training_only": ["module.temp", "module.location_emb."],
        "text_mode_only": ["module.pool."],
        "parameters": {
            "total": params,
            "used_by_forward": params - count(keys, "temp", "location_emb."),
            "used_by_feature_scores_and_maps": params - count(keys, "temp", "location_emb.", "pool."),
            "backbone": count(keys, "backbone."),
            "pool": count(keys, "pool."),
            "res_l1_l2": count(keys, "res_l1.", "res_l2."),
            "disease_embedding_layer": count(keys, "disease_embedding_layer."),
            "location_emb": count(keys, "location_emb."),
            "decoder": count(keys, "decoder."),
            "classifier": count(keys, "classifier."),
            "temp": count(keys, "temp"),
        },
        "keys": keys,
    }


def write_manifest(path: Path, data: dict) -> None:
    head = json.dumps({k: v for k, v in data.items() if k != "keys"}, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["keys"].items())
    path.write_text(f'{head},\n "keys": {{\n{rows}\n }}\n}}\n')


def strict(result) -> None:
    assert not result.missing_keys and not result.unexpected_keys, result


def reference_medklip(src: Sources) -> dict:
    ckpt = ref.official_checkpoint("medklip", seed=0)
    book = ref.query_book("medklip", seed=0)
    StandInBert.books = {75: book, N_LOCATIONS: torch.randn(N_LOCATIONS, 768, generator=torch.Generator().manual_seed(1))}
    images = ref.reference_images(seed=0)
    # Classification (Sample_zero-shot_Classification_CXR14/test.py:93-100, 116-118).
    model = nn.DataParallel(src.mk_cxr14.MedKLIP(src.medklip_config("test"), tokens(75)))
    strict(model.load_state_dict(ckpt["model"]))
    model.eval()
    # Grounding (Sample_Zero-Shot_Grounding_RSNA/test.py:87-94, 116-118).
    grounding = nn.DataParallel(src.mk_rsna.MedKLIP(src.medklip_config("grounding"), tokens(N_LOCATIONS), tokens(75)))
    strict(grounding.load_state_dict(ckpt["model"]))
    grounding.eval()
    with torch.no_grad():
        logits = model(images)
        scores = F.softmax(logits.reshape(-1, 2), dim=-1).reshape(-1, 75, 2)[:, :, 1]
        logits_g, ws = grounding(images, None, is_train=False)
        tokens_ = grounding.module.image_encoder(images)
    assert torch.equal(logits, logits_g)
    layers = torch.stack(ws)  # [4, B, 75, 196], head-averaged cross-attention per layer
    mean = (ws[-4] + ws[-3] + ws[-2] + ws[-1]) / 4
    maps = mean.reshape(images.shape[0], mean.shape[1], ref.GRID, ref.GRID)
    return {
        "model": "medklip", "seed": 0, "commit": MEDKLIP_COMMIT, "versions": versions("einops", "timm"),
        "entities": list(ref.ENTITIES), "images_sum": images.double().sum(), "query_book_sum": book.double().sum(),
        "image_tokens_mean_std": torch.stack([tokens_.mean(), tokens_.std()]),
        "logits": logits.clone(), "scores": scores.clone(),
        "attn_layers": layers.clone(), "maps": maps.clone(),
        "notes": "scores = softmax(logits)[..., 1] [B,75]; maps = mean of 4 layers' head-averaged cross-attention, "
                 "reshape [B,75,14,14] (before their nearest x16); attn_layers [4,B,75,196]",
    }


def reference_mavl(src: Sources) -> dict:
    ckpt = ref.official_checkpoint("mavl", seed=0)
    book = ref.query_book("mavl", seed=0).view(75, ref.N_CONCEPTS, 768)
    # What their BERT calls would return: descriptions [75,768] and the 75 x 8 aspects [600,768], which their
    # __init__ re-assembles into the [675,768] book (Zero-shot_grounding/models/model_MAVL.py:79-91).
    StandInBert.books = {75: book[:, 0].contiguous(), 600: book[:, 1:].reshape(600, 768).contiguous(),
                         N_LOCATIONS: torch.randn(N_LOCATIONS, 768, generator=torch.Generator().manual_seed(1))}
    images = ref.reference_images(seed=0)
    # Their loader (Zero-shot_grounding/test.py:154-161; Zero-shot_classification/test.py:323-329).
    state = {k.replace("module.", ""): v for k, v in ckpt["model"].items()}
    state = {k: v for k, v in state.items() if "temp" not in k}
    grounding = src.mv_zg.MAVL(src.mavl_config("grounding"), tokens(75), tokens(600))
    strict(grounding.load_state_dict(state))
    grounding.eval()
    assert torch.equal(grounding.concept_book, book.reshape(-1, 768))
    classification = src.mv_zc.MAVL(src.mavl_config("classification"), tokens(N_LOCATIONS), tokens(75), tokens(600))
    strict(classification.load_state_dict(state))
    classification.eval()
    b = images.shape[0]
    with torch.no_grad():
        logits, ws = grounding(images)
        pred_class, _, _, pred_global, _ = classification(images)
        local, global_ = grounding.image_encoder(images)
    assert torch.equal(logits, pred_class)
    scores = F.softmax(logits.reshape(-1, 2), dim=-1).reshape(-1, 75, 2)[:, :, 1]  # Zero-shot_classification/test.py:366-367
    # Text mode (Zero-shot_classification/test.py:352-359, 369): anchors normal (0) and clear (1).
    anchored = []
    for normal_idx in (0, 1):
        normal = pred_global[:, :, [normal_idx]].repeat(1, 1, 75)
        anchored.append(F.softmax(torch.stack([normal, pred_global], dim=-1), dim=-1))
    text_scores = torch.stack(anchored).mean(0)[:, :, :, 1].mean(1)  # [B, 75]
    layers_mean = (ws[-4] + ws[-3] + ws[-2] + ws[-1]) / 4  # Zero-shot_grounding/test.py:193-194, [B,675,196]
    grouped = layers_mean.view(b, 75, ref.N_CONCEPTS, -1)[:, :, list(ref.GROUNDING_CONCEPTS)]  # :202
    as_grid = lambda w: w.reshape(b, 75, ref.GRID, ref.GRID)  # noqa: E731  (:210)
    return {
        "model": "mavl", "seed": 0, "commit": MAVL_COMMIT, "versions": versions("einops", "timm"),
        "entities": list(ref.ENTITIES), "images_sum": images.double().sum(), "query_book_sum": book.double().sum(),
        "image_tokens_mean_std": torch.stack([local.mean(), local.std()]), "global_feature": global_.clone(),
        "logits": logits.clone(), "scores": scores.clone(), "text_scores": text_scores.clone(),
        "text_logits": pred_global.clone(),
        "attn_layers_mean_image0": layers_mean[0].clone(),
        "maps": as_grid(grouped.mean(2)).clone(),  # mode 'avg' (rsna_mavl.yaml), the default
        "maps_max": as_grid(grouped.max(2)[0]).clone(),
        "maps_global": as_grid(grouped[:, :, 0]).clone(),
        "notes": "scores = softmax(logits)[..., 1] [B,75] (feature mode); text_scores: Zero-shot_classification "
                 "text mode; text_logits [B,9,75] cosines of the global feature with each concept query; "
                 "attn_layers_mean_image0 [675,196] = for the first image, the mean of the 4 layers' head-averaged cross-attention (query 9*i+j); "
                 "maps = concepts (0,6,7,8) averaged, [B,75,14,14], before their bilinear align_corners=True "
                 "upsampling; maps_max / maps_global = modes 'max' / 'global'",
    }


def reference_text(src: Sources, tmp: Path) -> dict:
    folder = ref.write_bert_folder(tmp / "tiny-bert", seed=0)
    samples = ref.text_samples()
    tokenizer = src.mk_tok.BertTokenizer.from_pretrained(str(folder))

    def tokenize(texts):  # Sample_zero-shot_Classification_CXR14/test.py:62-66 (and every test script)
        return tokenizer(list(texts), padding="max_length", truncation=True, max_length=ref.MAX_LENGTH,
                         return_tensors="pt")

    config = {**src.medklip_config("test"), "text_encoder": str(folder)}
    medklip_tok = tokenize(samples["medklip"])
    medklip = src.mk_cxr14.MedKLIP(config, medklip_tok)  # __init__ embeds the book (model_MedKLIP.py:33-36)
    mavl_config = {**src.mavl_config("grounding"), "text_encoder": str(folder)}
    desc_tok, aspect_tok = tokenize(samples["mavl_descriptions"]), tokenize(samples["mavl_aspects"])
    mavl = src.mv_zg.MAVL(mavl_config, desc_tok, aspect_tok)  # model_MAVL.py:79-91
    return {
        "seed": 0, "medklip_commit": MEDKLIP_COMMIT, "mavl_commit": MAVL_COMMIT, "versions": versions("einops", "timm"),
        "bert": dict(ref.BERT_CONFIG), "max_length": ref.MAX_LENGTH,
        "medklip_texts": samples["medklip"],
        "medklip_input_ids": medklip_tok["input_ids"].clone(),
        "medklip_attention_mask": medklip_tok["attention_mask"].clone(),
        "medklip_tokens": [tokenizer.convert_ids_to_tokens(row.tolist()) for row in medklip_tok["input_ids"]],
        "medklip_cls": medklip.disease_book.clone(),
        "mavl_descriptions": samples["mavl_descriptions"], "mavl_aspects": samples["mavl_aspects"],
        "mavl_description_input_ids": desc_tok["input_ids"].clone(),
        "mavl_aspect_input_ids": aspect_tok["input_ids"].clone(),
        "mavl_concept_book": mavl.concept_book.clone(),  # [2 * 9, 768], row 9 * i + j
        "notes": "their BertTokenizer adds [CLS] and no [SEP]; padding='max_length', truncation, max_length 64; "
                 "BERT called with input_ids and attention_mask only; [CLS] = last_hidden_state[:, 0]",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("manifests", "reference", "text"))
    parser.add_argument("--medklip-src", default=os.environ.get("MEDKLIP_SRC", "/tmp/mm_scratch/src/MedKLIP"))
    parser.add_argument("--mavl-src", default=os.environ.get("MAVL_SRC", "/tmp/mm_scratch/src/MAVL"))
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    patch_offline(real_bert=args.what == "text")
    src = Sources(Path(args.medklip_src), Path(args.mavl_src))
    if args.what == "manifests":
        for name, make in (("medklip", manifest_medklip), ("mavl", manifest_mavl)):
            data = make(src)
            write_manifest(HERE / f"{name}_checkpoint_manifest.json", data)
            print(f"{name}: {len(data['keys'])} keys, parameters {data['parameters']}")
    elif args.what == "reference":
        for name, make in (("medklip", reference_medklip), ("mavl", reference_mavl)):
            out = make(src)
            torch.save(out, HERE / f"{name}_reference.pt")
            print(f"{name}: scores {tuple(out['scores'].shape)} range [{out['scores'].min():.4f}, "
                  f"{out['scores'].max():.4f}], maps {tuple(out['maps'].shape)} std {out['maps'].std():.2e}")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = reference_text(src, Path(tmp))
        torch.save(out, HERE / "medklip_text_reference.pt")
        print("text:", out["medklip_cls"].shape, out["mavl_concept_book"].shape)
        for row in out["medklip_tokens"]:
            print(" ", [t for t in row if t != "[PAD]"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
