"""Write the release key manifests of the generative families (``<family>.json`` here), from the release configs in
``xbench_pl/models/configs/generative`` and the key layouts the releases were saved in (see each manifest's
``_source``). Shapes are the configs' arithmetic, independent of the transformers classes the tests build.

    python tests/data/generative/release_keys/make_release_keys.py

A manifest: ``stacks`` (per repeated block: the key prefix with ``{}`` for the index, how many, and the keys of one
block with shapes), ``keys`` (the others), and the totals of the expanded list (``tensors``, ``parameters``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parents[3] / "xbench_pl" / "models" / "configs" / "generative"


def decoder_layer(h: int, inter: int, heads: int, kv: int, head_dim: int, qkv_bias: bool, gemma: bool = False) -> dict:
    """A Llama/Qwen2/Gemma 3 decoder layer's keys (``torch.nn.Linear`` weights are ``[out, in]``)."""
    keys = {"input_layernorm.weight": [h], "post_attention_layernorm.weight": [h],
            "mlp.gate_proj.weight": [inter, h], "mlp.up_proj.weight": [inter, h], "mlp.down_proj.weight": [h, inter],
            "self_attn.q_proj.weight": [heads * head_dim, h], "self_attn.k_proj.weight": [kv * head_dim, h],
            "self_attn.v_proj.weight": [kv * head_dim, h], "self_attn.o_proj.weight": [h, heads * head_dim]}
    if qkv_bias:
        keys.update({"self_attn.q_proj.bias": [heads * head_dim], "self_attn.k_proj.bias": [kv * head_dim],
                     "self_attn.v_proj.bias": [kv * head_dim]})
    if gemma:
        keys.update({"pre_feedforward_layernorm.weight": [h], "post_feedforward_layernorm.weight": [h],
                     "self_attn.q_norm.weight": [head_dim], "self_attn.k_norm.weight": [head_dim]})
    return keys


def siglip(prefix: str, v: dict) -> tuple[dict, dict]:
    """SigLIP vision tower (transformers 4.x ``SiglipVisionModel``: ``vision_model.*``), no head."""
    hv, iv = v["hidden_size"], v["intermediate_size"]
    layer = {"layer_norm1.weight": [hv], "layer_norm1.bias": [hv], "layer_norm2.weight": [hv], "layer_norm2.bias": [hv],
             "mlp.fc1.weight": [iv, hv], "mlp.fc1.bias": [iv], "mlp.fc2.weight": [hv, iv], "mlp.fc2.bias": [hv]}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        layer.update({f"self_attn.{proj}.weight": [hv, hv], f"self_attn.{proj}.bias": [hv]})
    positions = (v["image_size"] // v["patch_size"]) ** 2
    keys = {f"{prefix}embeddings.patch_embedding.weight": [hv, 3, v["patch_size"], v["patch_size"]],
            f"{prefix}embeddings.patch_embedding.bias": [hv], f"{prefix}embeddings.position_embedding.weight": [positions, hv],
            f"{prefix}post_layernorm.weight": [hv], f"{prefix}post_layernorm.bias": [hv]}
    return {"prefix": f"{prefix}encoder.layers.{{}}", "count": v["num_hidden_layers"], "keys": layer}, keys


def lingshu(c: dict) -> dict:
    h, v = c["hidden_size"], c["vision_config"]
    hv, iv, merged = v["hidden_size"], v["intermediate_size"], v["hidden_size"] * v["spatial_merge_size"] ** 2
    block = {"norm1.weight": [hv], "norm2.weight": [hv], "attn.qkv.weight": [3 * hv, hv], "attn.qkv.bias": [3 * hv],
             "attn.proj.weight": [hv, hv], "attn.proj.bias": [hv],
             "mlp.gate_proj.weight": [iv, hv], "mlp.gate_proj.bias": [iv], "mlp.up_proj.weight": [iv, hv], "mlp.up_proj.bias": [iv],
             "mlp.down_proj.weight": [hv, iv], "mlp.down_proj.bias": [hv]}
    return {
        "stacks": [{"prefix": "model.layers.{}", "count": c["num_hidden_layers"],
                    "keys": decoder_layer(h, c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"],
                                          h // c["num_attention_heads"], qkv_bias=True)},
                   {"prefix": "visual.blocks.{}", "count": v["depth"], "keys": block}],
        "keys": {"model.embed_tokens.weight": [c["vocab_size"], h], "model.norm.weight": [h], "lm_head.weight": [c["vocab_size"], h],
                 "visual.patch_embed.proj.weight": [hv, v["in_chans"], v["temporal_patch_size"], v["patch_size"], v["patch_size"]],
                 "visual.merger.ln_q.weight": [hv], "visual.merger.mlp.0.weight": [merged, merged], "visual.merger.mlp.0.bias": [merged],
                 "visual.merger.mlp.2.weight": [v["out_hidden_size"], merged], "visual.merger.mlp.2.bias": [v["out_hidden_size"]]}}


def siglip_llm(c: dict, head_dim: int, qkv_bias: bool, gemma: bool, keys: dict) -> dict:
    """A SigLIP tower and a language model saved under ``language_model.model.`` (Gemma 3, LLaVA-OneVision), and ``keys``."""
    t, v = c["text_config"], c["vision_config"]
    h = t["hidden_size"]
    tower, tower_keys = siglip("vision_tower.vision_model.", v)
    return {
        "stacks": [{"prefix": "language_model.model.layers.{}", "count": t["num_hidden_layers"],
                    "keys": decoder_layer(h, t["intermediate_size"], t["num_attention_heads"], t["num_key_value_heads"],
                                          head_dim, qkv_bias=qkv_bias, gemma=gemma)}, tower],
        "keys": {"language_model.model.embed_tokens.weight": [t["vocab_size"], h], "language_model.model.norm.weight": [h],
                 **keys, **tower_keys}}


def medgemma(c: dict) -> dict:
    t, hv = c["text_config"], c["vision_config"]["hidden_size"]
    h = t["hidden_size"]
    return siglip_llm(c, t["head_dim"], False, True, {"multi_modal_projector.mm_input_projection_weight": [hv, h],
                                                      "multi_modal_projector.mm_soft_emb_norm.weight": [hv]})


def radvlm(c: dict) -> dict:
    t, hv = c["text_config"], c["vision_config"]["hidden_size"]
    h = t["hidden_size"]
    return siglip_llm(c, h // t["num_attention_heads"], True, False, {
        "language_model.lm_head.weight": [t["vocab_size"], h], "image_newline": [h],
        "multi_modal_projector.linear_1.weight": [h, hv], "multi_modal_projector.linear_1.bias": [h],
        "multi_modal_projector.linear_2.weight": [h, h], "multi_modal_projector.linear_2.bias": [h]})


def maira2(c: dict) -> dict:
    t, v = c["text_config"], c["vision_config"]
    h, hv, mlp = t["hidden_size"], v["hidden_size"], v["hidden_size"] * v["mlp_ratio"]
    layer = {"norm1.weight": [hv], "norm1.bias": [hv], "norm2.weight": [hv], "norm2.bias": [hv],
             "layer_scale1.lambda1": [hv], "layer_scale2.lambda1": [hv],
             "mlp.fc1.weight": [mlp, hv], "mlp.fc1.bias": [mlp], "mlp.fc2.weight": [hv, mlp], "mlp.fc2.bias": [hv]}
    for name in ("attention.attention.query", "attention.attention.key", "attention.attention.value", "attention.output.dense"):
        layer.update({f"{name}.weight": [hv, hv], f"{name}.bias": [hv]})
    projector = {"multi_modal_projector.layers.0.weight": [h, hv], "multi_modal_projector.layers.0.bias": [h]}
    for index in range(2, 2 * c["projector_n_layers"], 2):
        projector.update({f"multi_modal_projector.layers.{index}.weight": [h, h], f"multi_modal_projector.layers.{index}.bias": [h]})
    tokens = (v["image_size"] // v["patch_size"]) ** 2 + 1
    return {
        "stacks": [{"prefix": "language_model.model.layers.{}", "count": t["num_hidden_layers"],
                    "keys": decoder_layer(h, t["intermediate_size"], t["num_attention_heads"], t["num_key_value_heads"],
                                          h // t["num_attention_heads"], qkv_bias=False)},
                   {"prefix": "vision_tower.encoder.layer.{}", "count": v["num_hidden_layers"], "keys": layer}],
        "keys": {"language_model.model.embed_tokens.weight": [t["vocab_size"], h], "language_model.model.norm.weight": [h],
                 "language_model.lm_head.weight": [t["vocab_size"], h],
                 "vision_tower.embeddings.cls_token": [1, 1, hv], "vision_tower.embeddings.mask_token": [1, hv],
                 "vision_tower.embeddings.position_embeddings": [1, tokens, hv],
                 "vision_tower.embeddings.patch_embeddings.projection.weight": [hv, 3, v["patch_size"], v["patch_size"]],
                 "vision_tower.embeddings.patch_embeddings.projection.bias": [hv],
                 "vision_tower.layernorm.weight": [hv], "vision_tower.layernorm.bias": [hv], **projector}}


def expand(manifest: dict) -> dict[str, list[int]]:
    """Every key of a manifest with its shape."""
    keys = dict(manifest["keys"])
    for stack in manifest["stacks"]:
        for index in range(stack["count"]):
            keys.update({f"{stack['prefix'].format(index)}.{name}": shape for name, shape in stack["keys"].items()})
    return keys


SOURCES = {
    "lingshu": {
        "_source": "Key names and shapes of a Qwen2.5-VL-7B release in the layout transformers 4.4x-4.5x save (Lingshu-7B's own "
                   "model.safetensors.index.json was not found). Names: Qwen2-VL-7B's real index (GitHub BrianYAU-NTEC/olmOCR "
                   "model.safetensors.index.json: model.layers.*, model.embed_tokens, model.norm, lm_head, visual.blocks.N.{attn.qkv,"
                   "attn.proj,norm1,norm2,mlp.*}, visual.merger.{ln_q,mlp.0,mlp.2}, visual.patch_embed.proj; 730 keys) with "
                   "Qwen2.5-VL's block changes (RMSNorm without bias, SwiGLU mlp.{gate,up,down}_proj with bias) as a capture of "
                   "Qwen2.5-VL-7B's own tensors lists them with shapes (code-index id 55514795804, 'captured from "
                   "qwen_2.5_vl_7b_fp8_scaled.safetensors': every key and shape below matches it, fp8 scale entries aside). Shapes: "
                   "lingshu.json's arithmetic.",
        "saved_with_transformers": "not known for Lingshu-7B (its evaluation kit pins 4.52.4; Qwen2.5-VL-7B-Instruct was re-saved by "
                                   "Qwen with 4.49.0.dev0); every 4.4x-4.5x save writes this layout, a transformers 5 save the "
                                   "model.language_model/model.visual one (Lingshu.checkpoint_filter accepts both)",
        "published_parameters": 8292000000, "published_source": "8.292 B (huggingface.co/OpenExplorer/Qwen2.5-VL-7B-Instruct, "
                                   "counted from the upstream checkpoint's tensors); HF lists Lingshu-7B as 8B"},
    "medgemma": {
        "_source": "Key names: google/medgemma-27b-it's model.safetensors.index.json (verbatim copy in GitHub Ibtasam-98/medgemma-27b-it "
                   "@ 2488902; 1247 keys: language_model.model.layers.N.{13 keys}, language_model.model.{embed_tokens,norm}, "
                   "multi_modal_projector.{mm_input_projection_weight,mm_soft_emb_norm.weight}, vision_tower.vision_model.*; no "
                   "lm_head, tied to the embeddings). MedGemma 4B is the same Gemma3ForConditionalGeneration module tree with "
                   "Gemma 3 4B's sizes (34 text layers; the same SigLIP 27 layers), its own index was not found. Shapes: "
                   "medgemma.json's arithmetic; the same arithmetic on medgemma-27b-it's config gives 1247 keys and "
                   "27,432,406,640 parameters: its index's metadata.total_size 54,864,813,280 bytes / 2 (bfloat16) exactly "
                   "(metadata.total_parameters 28,842,036,848 also counts the tied lm_head, 262208 x 5376, once more).",
        "saved_with_transformers": "4.5x (medgemma-27b-it's config says 4.54.0.dev0; the 4B's own file not seen); the layout above "
                                   "is what every 4.x save writes",
        "published_parameters": 4300000000, "published_source": "4.3 B (featherless.ai/models/google/medgemma-4b-it 'Model Size: "
                                                                 "4.3B'; 'a 4.3 billion parameter ... variant of Gemma 3')"},
    "radvlm": {
        "_source": "DERIVED, not read from RadVLM's index (not found): the module tree of transformers 4.46's "
                   "LlavaOnevisionForConditionalGeneration (vision_tower = SiglipVisionModel: vision_tower.vision_model.*; "
                   "multi_modal_projector.linear_{1,2}; language_model = Qwen2ForCausalLM: language_model.model.*, "
                   "language_model.lm_head; image_newline), which the authors' converter (uzh-dqbm-cmi/RadVLM "
                   "radvlm/evaluation/convert_llava_onevision_weights_to_hf.py, KEYS_TO_MODIFY_MAPPING) fills and "
                   "save_pretrained writes. Shapes: radvlm.json's arithmetic (SigLIP 26 layers: the converter drops the last).",
        "saved_with_transformers": "4.46.0 (RadVLM's requirements.txt pin; the converter ran in that environment)",
        "published_parameters": 8000000000, "published_source": "8.0 B: the brief's figure for RadVLM; the authors call it 'compact "
                                                                 "(7B)' (physionet.org/content/radvlm-model/1.0.0), i.e. the 7B class "
                                                                 "(Qwen2-7B + SigLIP-400M); no exact count was found"},
    "maira2": {
        "_source": "DERIVED, not read from MAIRA-2's index (not found): the hub modeling_maira2.py's module tree under transformers "
                   "4.46-4.51 (Maira2ForConditionalGeneration: vision_tower = AutoBackbone -> Dinov2Backbone: vision_tower."
                   "{embeddings,encoder.layer.N,layernorm}; multi_modal_projector.layers.{0,2,4,6}; language_model = "
                   "LlamaForCausalLM: language_model.model.*, language_model.lm_head), as the hub's modeling_maira2.py builds it (a copy "
                   "in the code index, id 37696548710). "
                   "Shapes: maira2.json's arithmetic (itself reconstructed).",
        "saved_with_transformers": "4.46.0.dev0 or later 4.4x (the hub code's check_min_version; not seen in a config)",
        "published_parameters": 6900000000, "published_source": "6.9 B: the brief's figure; bio.rodeo/models/maira-2 says 'Parameters: 7 "
                                                                 "Billion' ('Vicuna-7B-v1.5 language backbone (roughly 7B parameters)'); "
                                                                 "no exact count was found"},
}
BUILDERS = {"lingshu": lingshu, "medgemma": medgemma, "radvlm": radvlm, "maira2": maira2}


def medgemma_27b_check() -> int:
    """The medgemma arithmetic on medgemma-27b-it's config (Ibtasam-98/medgemma-27b-it config.json)."""
    config = {"text_config": {"hidden_size": 5376, "intermediate_size": 21504, "num_attention_heads": 32, "num_key_value_heads": 16,
                              "head_dim": 128, "num_hidden_layers": 62, "vocab_size": 262208},
              "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "image_size": 896,
                                "patch_size": 14}}
    keys = expand(medgemma(config))
    assert len(keys) == 1247, len(keys)
    return sum(math.prod(shape) for shape in keys.values())


def main() -> None:
    assert medgemma_27b_check() * 2 == 54864813280  # the 27B index's metadata.total_size (bfloat16)
    for family, build in BUILDERS.items():
        config = json.loads((CONFIGS / f"{family}.json").read_text())
        manifest = {**SOURCES[family], "config": f"xbench_pl/models/configs/generative/{family}.json", **build(config)}
        keys = expand(manifest)
        manifest.update(tensors=len(keys), parameters=sum(math.prod(shape) for shape in keys.values()))
        text = re.sub(r"\[\s*([\d,\s]+?)\s*\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]",
                      json.dumps(manifest, indent=1))  # a shape on one line
        (HERE / f"{family}.json").write_text(text + "\n")
        print(family, manifest["tensors"], manifest["parameters"], f"{len(text) / 1024:.1f} KB")


if __name__ == "__main__":
    main()
