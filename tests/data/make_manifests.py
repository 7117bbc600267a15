"""Regenerate the state-dict manifests (key -> shape) of the released CLIP and BiomedCLIP checkpoints.

Run ``python tests/data/make_manifests.py`` from the repo root. Each real-size model is built on
the ``meta`` device (no memory, no weights) from its *official* architecture, independently of
the configs xbench_pl ships, so the tests can check that those configs reproduce it:

* CLIP ViT-B/16: open_clip's built-in ``ViT-B-16-quickgelu`` config, open_clip's record of
  OpenAI's ``ViT-B-16.pt`` (whose JIT state dict has these keys plus ``input_resolution``,
  ``context_length`` and ``vocab_size``).
* BiomedCLIP: ``model_cfg`` of the authors' ``open_clip_config.json`` (model card of
  microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224) with the BERT-base dimensions of
  microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract's ``config.json`` (vocab 30522).

Neither real checkpoint was opened (none is available offline); the published parameter
counts (149.6 M, 195.9 M) are checked by the tests against these manifests.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import open_clip
import timm
import torch
import transformers

HERE = Path(__file__).resolve().parent

BIOMEDCLIP_MODEL_CFG = {
    "embed_dim": 512,
    "vision_cfg": {"timm_model_name": "vit_base_patch16_224", "timm_model_pretrained": False, "timm_pool": "",
                   "timm_proj": "linear", "image_size": 224},
    "text_cfg": {"hf_model_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                 "hf_tokenizer_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                 "hf_proj_type": "mlp", "hf_pooler_type": "cls_last_hidden_state_pooler", "context_length": 256},
}
BIOMEDBERT_CONFIG = transformers.BertConfig(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0,
)


def manifest(model: torch.nn.Module, source: str) -> dict:
    state = model.state_dict()
    return {
        "source": source,
        "versions": {"open_clip": open_clip.__version__, "timm": timm.__version__, "transformers": transformers.__version__},
        "parameters": sum(p.numel() for p in model.parameters()),
        "keys": {k: list(v.shape) for k, v in state.items()},
    }


def clip_manifest() -> dict:
    with torch.device("meta"):
        model = open_clip.CLIP(**open_clip.get_model_config("ViT-B-16-quickgelu"))
    return manifest(model, "open_clip built-in ViT-B-16-quickgelu (OpenAI CLIP ViT-B/16, ViT-B-16.pt layout)")


def biomedclip_manifest() -> dict:
    with tempfile.TemporaryDirectory() as bert:
        BIOMEDBERT_CONFIG.save_pretrained(bert)
        cfg = json.loads(json.dumps(BIOMEDCLIP_MODEL_CFG))
        cfg["text_cfg"].update(hf_model_name=bert, hf_model_pretrained=False)
        with torch.device("meta"):
            model = open_clip.CustomTextCLIP(**cfg)
    return manifest(model, "BiomedCLIP-PubMedBERT_256-vit_base_patch16_224 open_clip_config.json model_cfg "
                           "+ BiomedBERT-base-uncased-abstract config.json (vocab 30522)")


def main() -> None:
    for name, make in (("clip_vit_b16", clip_manifest), ("biomedclip", biomedclip_manifest)):
        path = HERE / f"{name}_state_dict_manifest.json"
        data = make()
        keys = ",\n".join(f"  {json.dumps(k)}: {json.dumps(shape)}" for k, shape in data["keys"].items())
        header = json.dumps({k: v for k, v in data.items() if k != "keys"}, indent=1)[:-2]  # one line per key
        path.write_text(f'{header},\n "keys": {{\n{keys}\n }}\n}}\n')
        print(f"{path.name}: {len(data['keys'])} keys, {data['parameters'] / 1e6:.2f} M parameters")


if __name__ == "__main__":
    main()
