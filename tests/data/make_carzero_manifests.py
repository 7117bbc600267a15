"""Regenerate CARZero's checkpoint manifest and the reference outputs of the authors' own code.

Run from the repo root in the *scratch* environment described in ``tests/data/make_carzero_reference.md``
(not the project's venv: it needs transformers 4.35.2, timm 0.9.2, omegaconf 2.3.0, nltk and an export
of the authors' repository)::

    CARZERO_SRC=/tmp/carzero_scratch/CARZero /tmp/carzero_scratch/venv/bin/python tests/data/make_carzero_manifests.py manifests
    CARZERO_SRC=/tmp/carzero_scratch/CARZero /tmp/carzero_scratch/venv/bin/python tests/data/make_carzero_manifests.py reference

Nothing of the authors' code is copied here: this script *imports* their package (``CARZero``) from an
export of ``laihaoran/CARZero`` at ``CARZERO_COMMIT`` that lives outside the repo. What cannot run
offline, or is not installed, is replaced at run time, here, without touching their files:

* ``ipdb``, ``pandas``, ``sklearn(.metrics)``, ``segmentation_models_pytorch``, ``skimage(.transform)``:
  imported at module level, unused on the zero-shot path: empty stand-in modules;
* ``transformers.AutoModel.from_pretrained("Laihaoran/BioClinicalMPBERT", output_hidden_states=True)``
  becomes ``AutoModel.from_config`` of the local folder's config (same BertModel with pooler, random
  init), and ``AutoTokenizer.from_pretrained`` reads the local folder written by
  ``tests/carzero_reference.py::write_text_encoder_folder`` (config.json + vocab.txt, like the hub repo);
* ``transformer_backbones.load_weight(model, "./pretrain_model/VITB-16-M3AE_last.ckpt")`` (the image
  pre-training checkpoint, loaded unconditionally when the ViT is built) returns the model unchanged.

``manifests`` builds their Lightning module ``PretrainDQNWOSAMLPGLModel(cfg)`` (so the state-dict prefix
is the real ``CARZero.``) on the meta device from ``carzero_reference.HYPER_PARAMETERS`` and records
every key with shape and dtype, the aliases (same tensor under two keys), the frozen parameters, the
parameter counts and the keys the zero-shot path does not use (found by back-propagating their
score and map on a CPU copy: parameters that receive no gradient).

``reference`` writes ``carzero_reference.write_lightning_checkpoint(seed=0)`` (OmegaConf hyper-parameters,
Lightning callback classes) to a temporary file, lists the globals its pickle references, loads it
with **their** ``CARZero.load_CARZero`` (``torch.load`` told ``weights_only=False`` for this trusted
file; their key filter and strict load), tokenises the prompts with their ``process_class_prompts``,
and runs their zero-shot score (``get_dqn_similarities``) and grounding map (``get_grounding_map``)
on ``reference_images(seed=0)``; it saves ``tests/data/carzero_reference.pt``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import json
import os
import pickletools
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))

import carzero_reference as ref  # noqa: E402  (tests/carzero_reference.py: the shared test-data generator)
from reference_common import describe_module, versions  # noqa: E402

CARZERO_COMMIT = ref.CARZERO_COMMIT
HUB_NAME = "Laihaoran/BioClinicalMPBERT"
STUBS = ("ipdb", "pandas", "sklearn", "sklearn.metrics", "segmentation_models_pytorch", "skimage", "skimage.transform")


def import_official(src: Path, bert: Path):
    """Import the authors' package from an export of their repo, with offline stand-ins."""
    for name in STUBS:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module
    sys.modules["sklearn"].metrics = sys.modules["sklearn.metrics"]
    sys.modules["skimage"].transform = sys.modules["skimage.transform"]

    import transformers

    def local(name):
        return str(bert) if name == HUB_NAME else name

    def model_from_config(cls, name, *args, **kwargs):
        config = transformers.AutoConfig.from_pretrained(local(name), **kwargs)
        return cls.from_config(config)

    tokenizer_from_pretrained = transformers.AutoTokenizer.from_pretrained.__func__
    transformers.AutoModel.from_pretrained = classmethod(model_from_config)
    transformers.AutoTokenizer.from_pretrained = classmethod(
        lambda cls, name, *a, **k: tokenizer_from_pretrained(cls, local(name), *a, **k))

    sys.path.insert(0, str(src))
    import CARZero  # their package, unmodified
    from CARZero.models import transformer_backbones

    transformer_backbones.load_weight = lambda model, path: model  # skip VITB-16-M3AE_last.ckpt
    return CARZero


def config():
    from omegaconf import OmegaConf

    return OmegaConf.create(ref.HYPER_PARAMETERS)


def zero_shot(CARZero, model, imgs, text):
    """Their zero-shot path, unchanged: score = get_dqn_similarities, maps = get_grounding_map."""
    score = CARZero.get_dqn_similarities(model, imgs, text)
    _, maps = CARZero.get_grounding_map(model, imgs, text)
    return score, maps


def text_batch(model, prompts):
    """What their dqn_shot_classification / grounding_shot_classification build from
    process_class_prompts: one prompt per class, caption tensors concatenated in class order."""
    processed = model.process_class_prompts({str(i): [p] for i, p in enumerate(prompts)}, "cpu")
    return {k: torch.cat([processed[str(i)][k] for i in range(len(prompts))], dim=0)
            for k in ("caption_ids", "attention_mask", "token_type_ids")}


def unused_keys(CARZero, lightning_module) -> list[str]:
    """Parameters that get no gradient from their score and map on a CPU copy (random init)."""
    model = lightning_module.CARZero
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()
    imgs = ref.reference_images(seed=0, batch=1)
    text = text_batch(model, ref.PROMPTS[:2])
    with torch.enable_grad():
        img_l, img_g = model.image_encoder_forward(imgs)
        q_l, q_g, _ = model.text_encoder_forward(text["caption_ids"], text["attention_mask"], text["token_type_ids"])
        img_l = img_l.flatten(2).permute(0, 2, 1)
        q_l = q_l.permute(0, 2, 1)
        i2t, att = model.fusion_module(torch.cat([img_g.unsqueeze(1), img_l], 1), q_g, return_atten=True)
        t2i, _ = model.fusion_module(torch.cat([q_g.unsqueeze(1), q_l], 1), img_g, return_atten=True)
        loss = i2t.sum() + t2i.sum() + sum((a[:, :, 1:] ** 2).sum() for a in att)
        loss.backward()
    names = {id(p): n for n, p in lightning_module.named_parameters()}
    return sorted(names[id(p)] for p in lightning_module.parameters() if p.grad is None or not p.grad.any())


def manifest(CARZero) -> dict:
    from CARZero.lightning import PretrainDQNWOSAMLPGLModel

    with torch.device("meta"):
        module = PretrainDQNWOSAMLPGLModel(config())
    part = describe_module(module)
    frozen = sorted(n for n, p in module.named_parameters() if not p.requires_grad)
    total = sum(p.numel() for p in module.parameters())
    by_tower = {}
    for n, p in module.named_parameters():
        tower = n.split(".")[1]
        by_tower[tower] = by_tower.get(tower, 0) + p.numel()

    torch.manual_seed(0)
    cpu = PretrainDQNWOSAMLPGLModel(config())
    unused = unused_keys(CARZero, cpu)
    shapes = dict(cpu.named_parameters())
    unused_params = sum(shapes[n].numel() for n in unused)
    del cpu
    return {
        "source": f"laihaoran/CARZero@{CARZERO_COMMIT} CARZero/lightning/pretrain_model_dqn_wo_self_atten_mlp_gl.py "
                  "PretrainDQNWOSAMLPGLModel(cfg) (CARZeroDQNWOSAGLMLP: ImageEncoder/MRM ViT-B/16 timm 0.9.2, "
                  "BertEncoder on Laihaoran/BioClinicalMPBERT config (BERT-base, vocab 28996), "
                  "dqn_wo_self_atten_mlp.TQN_Model) built on meta from configs/mimic_pretrain_llm_dqn_wo_self_atten_mlp_gl.yaml; "
                  "layout of a pytorch-lightning 1.1.4 checkpoint's state_dict",
        "prefix": ref.PREFIX,
        "versions": versions("timm", "omegaconf", "nltk"),
        "non_tensor": ["epoch", "global_step", "pytorch-lightning_version", "callbacks", "optimizer_states",
                       "lr_schedulers", "native_amp_scaling_state", "hparams_name", "hyper_parameters", "hparams_type"],
        "parameters": {"total": total, **by_tower, "used_by_zero_shot": total - unused_params,
                       "unused_by_zero_shot": unused_params},
        "notes": [
            "text_encoder.model.embeddings.position_ids is a non-persistent buffer from transformers 4.31 on "
            "(authors pin 4.35.2), so it is absent here; a file written with an older transformers would carry it "
            "and load_CARZero would drop it (keys not in the model are filtered before the strict load).",
            "fusion_module.decoder.norm.* and fusion_module.decoder_norm.* are the same LayerNorm (two keys).",
            "img_encoder.model.pos_embed is a frozen Parameter (requires_grad=False) loaded from the file.",
        ],
        "aliases": part["aliases"],
        "frozen": frozen,
        "unused_by_zero_shot": unused,
        "keys": part["keys"],
    }


def write_manifest(path: Path, data: dict) -> None:
    head = json.dumps({k: v for k, v in data.items() if k != "keys"}, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["keys"].items())
    path.write_text(f'{head},\n "keys": {{\n{rows}\n }}\n}}\n')


def pickle_globals(path: Path) -> list[str]:
    """``module.qualname`` of every GLOBAL / STACK_GLOBAL in the checkpoint's data.pkl."""
    data = data_pkl(path)
    found, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            found.add(arg.replace(" ", "."))
        elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            found.add(f"{strings[-2]}.{strings[-1]}")
    return sorted(found)


def data_pkl(path: Path) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"))


def reference(CARZero, tmp: Path) -> dict:
    import omegaconf  # the real package must be what wrote the file here

    ckpt_path = ref.write_lightning_checkpoint(tmp / "CARZero_best_model.ckpt", seed=0, with_omegaconf=True)
    globals_ = pickle_globals(ckpt_path)
    hp_sha = hashlib.sha256(ref.hyper_parameters_pickle()).hexdigest()
    data_sha = hashlib.sha256(data_pkl(ckpt_path)).hexdigest()
    assert isinstance(torch.load(ckpt_path, weights_only=False, mmap=True)["hyper_parameters"], omegaconf.DictConfig)

    # their loader; torch >= 2.6 defaults to weights_only=True, which this (trusted, self-made) file needs off
    load = torch.load
    torch.load = lambda *a, **k: load(*a, **{**k, "weights_only": False})
    try:
        raw = torch.load(ckpt_path, map_location="cpu")
        model = CARZero.load_CARZero(name=str(ckpt_path), device="cpu")
    finally:
        torch.load = load
    model_keys = set(model.state_dict())
    stripped = {k.split("CARZero.")[-1]: k for k in raw["state_dict"]}
    ignored = sorted(v for k, v in stripped.items() if k not in model_keys)
    assert not ignored, ignored
    model.eval()

    prompts = list(ref.PROMPTS)
    text = text_batch(model, prompts)
    imgs = ref.reference_images(seed=0, batch=2)
    with torch.no_grad():
        word_emb, sent_emb, sents = model.text_encoder_forward(
            text["caption_ids"], text["attention_mask"], text["token_type_ids"])
        img_l, img_g = model.image_encoder_forward(imgs)
        score = torch.from_numpy(CARZero.get_dqn_similarities(model, imgs, text))
        up, maps = CARZero.get_grounding_map(model, imgs, text)
        maps = torch.from_numpy(maps)
        # i2t and t2i separately, by the very calls of get_dqn_similarities (l.469-483), batched over images
        mem_img = torch.cat([img_g.unsqueeze(1), img_l.flatten(2).permute(0, 2, 1)], dim=1)
        i2t, att = model.fusion_module(mem_img, sent_emb, return_atten=True)
        i2t = i2t.squeeze(-1)
        mem_txt = torch.cat([sent_emb.unsqueeze(1), word_emb.permute(0, 2, 1)], dim=1)
        t2i = torch.stack([model.fusion_module(mem_txt, img_g[i:i + 1]).squeeze(-1).transpose(1, 0)[0]
                           for i in range(imgs.shape[0])])
    att = torch.stack(att)  # [layers, B, C, 197], head-averaged
    torch.testing.assert_close((i2t + t2i) / 2, score, rtol=0, atol=1e-5)
    assert torch.equal(up, maps.repeat_interleave(16, 2).repeat_interleave(16, 3))
    torch.testing.assert_close(att[:, :, :, 1:].mean(0).unflatten(-1, (14, 14)), maps, rtol=0, atol=1e-7)
    words = [[w for w in s if w != "[PAD]"] for s in sents]
    return {
        "seed": 0,
        "carzero_commit": CARZERO_COMMIT,
        "versions": versions("timm", "omegaconf", "nltk"),
        "pickle_globals": globals_,
        "hyper_parameters_pickle_sha256": hp_sha,  # hyper_parameters_pickle() made with omegaconf 2.3.0
        "data_pkl_sha256": data_sha,  # data.pkl of write_lightning_checkpoint(seed=0) made with omegaconf 2.3.0
        "ignored_keys": ignored,
        "prompts": prompts,
        "words": words,
        "input_ids": text["caption_ids"].clone(),
        "attention_mask": text["attention_mask"].clone(),
        "token_type_ids": text["token_type_ids"].clone(),
        "word_embeddings": word_emb.permute(0, 2, 1).contiguous(),  # [C, 97, 768], zero rows after [SEP]
        "sentence_embeddings": sent_emb.clone(),  # [C, 768]
        "image_global": img_g.clone(),  # [B, 768]
        "image_local_mean_std": torch.stack([img_l.mean(), img_l.std()]),
        "i2t": i2t.clone(),  # [B, C]
        "t2i": t2i.clone(),  # [B, C]
        "score": score.clone(),  # [B, C] = (i2t + t2i) / 2, raw
        "i2t_attention": att.clone(),  # [4, B, C, 197] per layer, head-averaged, key 0 = image CLS
        "maps": maps.clone(),  # [B, C, 14, 14] = mean over layers of att[..., 1:], before the x16 upsampling
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("manifests", "reference"))
    parser.add_argument("--carzero-src", default=os.environ.get("CARZERO_SRC", "/tmp/carzero_scratch/CARZero"),
                        help="an export of laihaoran/CARZero at CARZERO_COMMIT (the folder holding CARZero/)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bert = ref.write_text_encoder_folder(tmp / "BioClinicalMPBERT")
        CARZero = import_official(Path(args.carzero_src), bert)
        if args.what == "manifests":
            data = manifest(CARZero)
            path = HERE / "carzero_checkpoint_manifest.json"
            write_manifest(path, data)
            print(f"{path.name}: {len(data['keys'])} keys, parameters {data['parameters']}")
            print("unused:", data["unused_by_zero_shot"])
        else:
            data = reference(CARZero, tmp)
            path = HERE / "carzero_reference.pt"
            torch.save(data, path)
            print(f"{path.name}: score {data['score'].tolist()}")
            print("globals:", data["pickle_globals"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
