"""Run the authors' RadZero code (deepnoid-ai/RadZero, an export of RADZERO_COMMIT) in a scratch environment and
write the small files ``tests/test_radzero.py`` compares with (see ``make_radzero_reference.md``).

``manifests``: their ``CxrAlignModel`` built on the meta device from their ``configs/radzero.yaml`` (full size,
the towers from the hub configs shipped in ``xbench_pl/models/configs/hf/``) and from the tiny configs of
``tests/radzero_reference.py``; every state-dict key with shape and dtype ->
``radzero_checkpoint_manifest.json`` and ``radzero_tiny_manifest.json``.

``reference``: the tiny ``CxrAlignModel`` loaded strictly with ``radzero_reference.state_dict(seed=0)``; their
``process_class_prompts`` tokenisation, ``compute_logits`` (logits, ``similarity_scores``) and
``interpolate_similarity_scores`` + sigmoid (their pixel map) on ``reference_images(seed=0)`` ->
``radzero_reference.pt``.

Offline stand-ins, applied before their modules are imported (their files are not edited): ``peft`` and
``common.trainer`` (a logger) and ``external.CARZero...transformer_backbones`` (the unused M3AE encoder) are
empty modules; ``from_pretrained`` of ``AutoConfig``/``Dinov2Model``/``AutoModel`` builds from the local
config folder of the hub name (random weights); ``compute_i2t_loss = False`` is set on their loss, the
attribute their ``compute_logits`` reads and their loss never sets.
"""

from __future__ import annotations

import argparse
import copy
import importlib.machinery
import json
import logging
import os
import sys
import tempfile
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))

import radzero_reference as ref  # noqa: E402
from reference_common import describe_module, versions  # noqa: E402

VISION_HUB = "StanfordAIMI/dinov2-base-xray-224"
TEXT_HUB = "sentence-transformers/all-mpnet-base-v2"
SHIPPED_HF = REPO / "xbench_pl" / "models" / "configs" / "hf"

# their exp/cxr_pt/configs/radzero.yaml, model.model_config (with the keys CxrAlignModel reads from kwargs)
MODEL_CONFIG = {
    "vision_config": {"model_type": "dinov2", "pretrained_name_or_path": VISION_HUB, "img_size": 518},
    "text_config": {"use_text_projection": False, "model_type": "mpnet", "pretrained_name_or_path": TEXT_HUB,
                    "pretrained_tokenizer_name_or_path": TEXT_HUB, "use_cls_token": False},
    "align_transformer_config": {"model_type": "align_transformer", "hidden_size": 768, "num_hidden_layers": 2,
                                 "projector_config": None, "use_layer_norm": False},
    "loss": {"apply": ["RadZeroLoss"], "ratio": [1.0],
             "RadZeroLoss": {"hidden_dim": 768, "mpnce_row_sum": False, "mpnce_col_sum": False, "attn_temperature": None,
                             "loss_temperature": 0.07, "text_features_l2_norm": False, "sim_op": "cos"}},
    "compute_logits_type": "radzero",
}
MODULE_TO_UPDATE = ["align_transformer", "text_model", "loss_fns"]


def stub(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def import_official(src: Path, folders: dict[str, Path]):
    """Their ``modeling``, ``configuration`` and ``segmentation_utils`` modules, with the offline stand-ins."""
    stub("peft", LoraConfig=object, PeftModel=object, get_peft_model=None)
    stub("common.trainer", logger=logging.getLogger("radzero"))
    for name in ("external", "external.CARZero", "external.CARZero.CARZero", "external.CARZero.CARZero.models"):
        stub(name)
    stub("external.CARZero.CARZero.models.transformer_backbones", MRM=type("MRM", (), {}), load_weight=None)

    import transformers

    def local(name):
        return str(folders.get(name, name))

    config_from_pretrained = transformers.AutoConfig.from_pretrained.__func__
    transformers.AutoConfig.from_pretrained = classmethod(lambda cls, name, *a, **k: config_from_pretrained(cls, local(name), *a, **k))
    transformers.Dinov2Model.from_pretrained = classmethod(
        lambda cls, name, *a, **k: cls(transformers.Dinov2Config.from_pretrained(local(name))))
    transformers.AutoModel.from_pretrained = classmethod(
        lambda cls, name, *a, **k: cls.from_config(transformers.AutoConfig.from_pretrained(local(name))))

    sys.path.insert(0, str(src))
    import common  # noqa: F401  (their package; common.trainer is the stand-in above)
    from exp.cxr_pt.inference import segmentation_utils
    from exp.cxr_pt.model import configuration, modeling

    return modeling, configuration, segmentation_utils


def build(modeling, configuration, tiny: bool):
    """Their ``load_model`` without a checkpoint: ``CxrAlignModel(CxrAlignConfig(...))``."""
    model_config = copy.deepcopy(MODEL_CONFIG)
    if tiny:
        model_config["align_transformer_config"].update(ref.TINY_ALIGN)
        model_config["loss"]["RadZeroLoss"]["hidden_dim"] = ref.TINY_HIDDEN
    config = configuration.CxrAlignConfig(module_to_update=MODULE_TO_UPDATE, pretrained_dir=None, **model_config)
    return modeling.CxrAlignModel(config)


def manifest(modeling, configuration, tiny: bool, source: str) -> dict:
    with torch.device("meta"):
        model = build(modeling, configuration, tiny)
    part = describe_module(model)
    by_part = {}
    for name, p in model.named_parameters():
        top = name.split(".")[0]
        by_part[top] = by_part.get(top, 0) + p.numel()
    return {"source": source, "versions": versions(), "parameters": {"total": part["parameters"], **by_part},
            "aliases": part["aliases"], "keys": part["keys"]}


def write_manifest(path: Path, data: dict) -> None:
    head = json.dumps({k: v for k, v in data.items() if k != "keys"}, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["keys"].items())
    path.write_text(f'{head},\n "keys": {{\n{rows}\n }}\n}}\n')


def reference(modeling, configuration, segmentation_utils, tokenizer_dir: Path) -> dict:
    import transformers

    torch.manual_seed(0)
    model = build(modeling, configuration, tiny=True)
    model.load_state_dict(ref.state_dict(seed=0), strict=True)
    model.eval()
    model.to(torch.float32)
    loss = model.loss_fns["RadZeroLoss"]
    loss.compute_i2t_loss = False  # read by their compute_logits, never set by their loss (release bug)

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    # their process_class_prompts: one prompt per class, padded to the longest, truncated
    text = tokenizer(list(ref.PROMPTS), padding=True, truncation=True, return_tensors="pt")
    images = ref.reference_images(seed=0, batch=2)
    with torch.no_grad():
        out = model.compute_logits(pixel_values=images, encoded_key_phrases=[text])
        vision = model.forward_vision_model(images)
        text_features = model.forward_text_model(text)["text_features_wo_l2_norm"]
    logits, scores = out["logits"], out["similarity_scores"]  # [B, C], [B, C, N]
    # their pixel map of one (image, text): interpolate_similarity_scores to the input size, then sigmoid,
    # as their extract_similarity_map / process_and_visualize_map (a BlipImageProcessor: plain bilinear resize)
    processor = transformers.BlipImageProcessor(size={"height": ref.IMAGE_SIZE, "width": ref.IMAGE_SIZE},
                                                image_mean=list(ref.CLIP_MEAN), image_std=list(ref.CLIP_STD))
    pixel_maps = torch.stack([torch.stack([
        torch.sigmoid(segmentation_utils.interpolate_similarity_scores(scores[b, c].reshape(-1), (ref.IMAGE_SIZE,) * 2,
                                                                        processor).squeeze(0))
        for c in range(scores.shape[1])]) for b in range(scores.shape[0])])
    return {
        "seed": 0,
        "radzero_commit": ref.RADZERO_COMMIT,
        "versions": versions(),
        "prompts": list(ref.PROMPTS),
        "input_ids": text["input_ids"].clone(),
        "attention_mask": text["attention_mask"].clone(),
        "text_features": text_features.clone(),  # [C, D] mean-pooled, before their loss's LayerNorm
        "vision_tokens": vision["vision_tokens"].clone(),  # [B, 1 + N, D] after the align transformer
        "t2i_logits": out["t2i_logits"].clone(),  # [C, B] cosines of their SimilarityLogit
        "logits": logits.clone(),  # [B, C] = t2i_logits.T / T
        "similarity_scores": scores.clone(),  # [B, C, N] cosine / T per patch, class token dropped
        "pixel_maps": pixel_maps.clone(),  # [B, C, 28, 28] sigmoid of the bilinear upsampling
        "temperature": loss.loss_temperature.exp().detach().clone(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("manifests", "reference"))
    parser.add_argument("--radzero-src", default=os.environ.get("RADZERO_SRC", "/tmp/radzero_scratch/RadZero"),
                        help="an export of deepnoid-ai/RadZero at RADZERO_COMMIT (the folder holding exp/ and common/)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.what == "manifests":
            full = {VISION_HUB: SHIPPED_HF / VISION_HUB, TEXT_HUB: SHIPPED_HF / TEXT_HUB}
            tiny_towers = ref.write_tower_folders(tmp / "tiny")
            tiny = {VISION_HUB: tiny_towers["vision"], TEXT_HUB: tiny_towers["text"]}
            folders = dict(full)
            modules = import_official(Path(args.radzero_src), folders)
            source = (f"deepnoid-ai/RadZero@{ref.RADZERO_COMMIT} exp/cxr_pt/model/modeling.py CxrAlignModel(CxrAlignConfig(...)) "
                      "from exp/cxr_pt/configs/radzero.yaml, built on meta; towers from ")
            data = manifest(*modules[:2], tiny=False, source=source + "xbench_pl/models/configs/hf/{" + VISION_HUB + "," + TEXT_HUB + "}")
            write_manifest(HERE / "radzero_checkpoint_manifest.json", data)
            print("full:", len(data["keys"]), data["parameters"])
            folders.update(tiny)  # the same stand-ins now resolve the hub names to the tiny folders
            data = manifest(*modules[:2], tiny=True, source=source + "tests/radzero_reference.py TINY_VISION, tiny_text_config(), TINY_ALIGN")
            write_manifest(HERE / "radzero_tiny_manifest.json", data)
            print("tiny:", len(data["keys"]), data["parameters"])
        else:
            towers = ref.write_tower_folders(tmp / "tiny")
            modules = import_official(Path(args.radzero_src), {VISION_HUB: towers["vision"], TEXT_HUB: towers["text"]})
            data = reference(*modules, ref.write_tokenizer_folder(tmp / "tokenizer"))
            torch.save(data, HERE / "radzero_reference.pt")
            print("logits", data["logits"].tolist())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
