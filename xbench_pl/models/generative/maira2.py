"""MAIRA-2 (microsoft/maira-2): LLaVA with a Rad-DINO (DINOv2 ViT-B/14) image tower, Vicuna-7B, and its own projector.

Architecture (the release's ``modeling_maira2.py``, read, not copied): ``Maira2ForConditionalGeneration`` subclasses
transformers' ``LlavaForConditionalGeneration``; image features are the DINOv2 tower's final layer-normed tokens
without the class token (37 x 37 = 1,369 at 518 px); the projector is 4 linear layers (768 -> 4096, then 4096 ->
4096 three times) with exact GELU between them (``multi_modal_projector.layers.{0,2,4,6}``). Here ``Maira2Network``
is that subclass, built from transformers' own Llava, DINOv2 and Llama classes; the release's keys (transformers 4.x
layout: ``vision_tower.``, ``multi_modal_projector.``, ``language_model.model.``, ``language_model.lm_head.``, DINOv2's
``attention.attention.query``) are renamed by ``checkpoint_filter``.

Input: the shortest side resized to 518 (bicubic; the long side truncated) and the centre 518 x 518 cropped with the
offset floored (``crop``, ``crop_offset="floor"``), mean/std 0.5307/0.2583: the release's image processor
(transformers' ``BitImageProcessor``). Not reproduced: the processor's grey min-max stretch of each image
before normalisation (the loaders here scale by the file's bit depth).

Prompt: the release's chat template for phrase grounding (``processing_maira2.py``,
``format_and_preprocess_phrase_grounding_input``): "You are an expert radiology assistant tasked with interpreting a
chest X-ray study.  USER:  Given the current frontal image<image> Repeat the following finding as a grounded phrase
with bounding boxes indicating all locations where it can be seen in the given chest X-ray image. Finding: {}
ASSISTANT: ", the image token expanded to the 1,369 features, after the Llama tokenizer's ``<s>``; 150 new tokens,
greedy, as the card. Boxes: ``<obj>phrase<box><xA><yB><xC><yD></box></obj>`` with 100 bins per axis read at their
centres on the 518-pixel crop (``parsing.maira2_boxes``), mapped to the original image through the crop's affine:
the exact inverse of the resize and crop, where the authors' ``adjust_box_for_original_image_size`` truncates to whole
original pixels and takes the crop offset in original pixels: they differ by less than one original pixel plus half an
input pixel of offset (1.9 original pixels on a 3000 x 2000 image; tests/test_generative_parsing.py).

Recognition: MAIRA-2 answers no questions, so its score is a likelihood contrast in its own output format: the
log-probability of the grounded answer ``<obj>{finding}`` against ``<obj>No {finding}`` after the grounding prompt
(teacher-forced, one forward of both), ``logits = log P(positive) - log P(negative)``, ``scores = sigmoid(logits)``.
Its map: the attention of the positive answer's last token to the image tokens (every layer and head averaged).

Licence: Microsoft Research Licence Agreement (MSRLA), research use only; gated (tick the disclaimer on the model
page, then ``huggingface-cli login``); the authors require transformers >= 4.46 (users pin 4.48-4.51).
"""

from __future__ import annotations

import torch
from torch import nn

from xbench_pl.geometry import Preprocess
from xbench_pl.models.generative.base import GenerativeModel
from xbench_pl.models.generative.parsing import maira2_boxes

RELEASE_MEAN, RELEASE_STD = (0.5307,) * 3, (0.2583,) * 3
PROMPT = ("<s>You are an expert radiology assistant tasked with interpreting a chest X-ray study.  USER:  Given the current "
          "frontal image{image} Repeat the following finding as a grounded phrase with bounding boxes indicating all locations "
          "where it can be seen in the given chest X-ray image. Finding: {text}  ASSISTANT: ")
#: transformers 4.x names of the release -> this transformers' (``re.sub`` in order: prefixes, then DINOv2's attention)
RELEASE_RENAMES = ((r"^language_model\.model\.", "model.language_model."), (r"^language_model\.lm_head\.", "lm_head."),
                   (r"^vision_tower\.", "model.vision_tower."), (r"^multi_modal_projector\.", "model.multi_modal_projector."),
                   (r"\.attention\.attention\.query\.", ".attention.q_proj."), (r"\.attention\.attention\.key\.", ".attention.k_proj."),
                   (r"\.attention\.attention\.value\.", ".attention.v_proj."), (r"\.attention\.output\.dense\.", ".attention.o_proj."))


class Maira2Projector(nn.Module):
    """``layers``: Linear(vision, text), then (GELU, Linear(text, text)) ``n - 1`` times (MAIRA-2: n = 4)."""

    def __init__(self, vision: int, text: int, n_layers: int = 4):
        super().__init__()
        parts: list[nn.Module] = [nn.Linear(vision, text)]
        for _ in range(n_layers - 1):
            parts += [nn.GELU(), nn.Linear(text, text)]
        self.layers = nn.Sequential(*parts)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)


def maira2_network_class():
    """``Maira2Network``: transformers' Llava with MAIRA-2's image features and projector (built on first use: transformers
    loads only where a generative model runs)."""
    from transformers import LlavaForConditionalGeneration, LlavaModel, LlavaPreTrainedModel
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    class Maira2Model(LlavaModel):
        def __init__(self, config):
            super().__init__(config)
            self.multi_modal_projector = Maira2Projector(config.vision_config.hidden_size, config.text_config.hidden_size,
                                                         getattr(config, "projector_n_layers", 4))

        def get_image_features(self, pixel_values, **kwargs):
            tokens = self.vision_tower(pixel_values).last_hidden_state[:, 1:]  # layer-normed, class token dropped
            return BaseModelOutputWithPooling(last_hidden_state=tokens, pooler_output=list(self.multi_modal_projector(tokens)))

    class Maira2Network(LlavaForConditionalGeneration):
        def __init__(self, config):  # LlavaForConditionalGeneration's, with MAIRA-2's model: the language model built once
            LlavaPreTrainedModel.__init__(self, config)
            self.model = Maira2Model(config)
            self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
            self.post_init()

    return Maira2Network


class Maira2(GenerativeModel):
    """MAIRA-2; see the module."""

    RELEASE_RENAMES = RELEASE_RENAMES
    #: the cascade of weight randomization (``models.randomization``), top first
    RANDOMIZATION_STAGES = (("language model", ("network.lm_head", "network.model.language_model")), ("projector", ("network.model.multi_modal_projector",)),
                            ("image tower", ("network.model.vision_tower",)))
    NETWORK = "LlavaForConditionalGeneration"
    IMAGE_TOWER = "network.model.vision_tower"
    SPECIAL_TOKENS = ("<image>", "<s>", "</s>", "<obj>", "</obj>", "<box>", "</box>",
                      *(f"<x{i}>" for i in range(100)), *(f"<y{i}>" for i in range(100)))
    GROUNDING_PROMPT = "{}"  # the finding goes into PROMPT's Finding: slot
    RELEASE = {"hub": "microsoft/maira-2", "licence": "MSRLA (research only; gated)", "transformers": ">= 4.46 (4.48-4.51)"}
    MAX_NEW_TOKENS = 150
    TOKEN_FIELDS = {"image_token_index": "<image>"}
    STOP_TOKEN = "</s>"

    def build(self, config) -> None:
        network = maira2_network_class()
        self.network = network(config)
        from xbench_pl.models.generative.base import LAST_QUERY

        self.network.set_attn_implementation({"text_config": LAST_QUERY})

    def tiny_config(self, vocab_size: int):
        from transformers import LlavaConfig

        return LlavaConfig(
            text_config=dict(model_type="llama", vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096),
            vision_config=dict(model_type="dinov2", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=56, patch_size=14),
            vision_feature_select_strategy="default", vision_feature_layer=-1)

    def config_from(self, data: dict):
        """The release's ``Maira2Config`` (a ``LlavaConfig`` with ``projector_n_layers``) as transformers' ``LlavaConfig``."""
        from transformers import LlavaConfig

        data = {k: v for k, v in data.items() if not k.startswith("_source")}
        extra = {k: data.pop(k) for k in ("projector_n_layers",) if k in data}
        config = LlavaConfig(**{k: v for k, v in data.items() if k not in ("architectures", "auto_map", "model_type")})
        for key, value in extra.items():
            setattr(config, key, value)
        return config

    def input_preprocess(self) -> Preprocess:
        size = self.network.config.vision_config.image_size
        return Preprocess(resize="crop", size=size, interpolation="bicubic", antialias=True, mean=RELEASE_MEAN, std=RELEASE_STD,
                          crop_offset="floor")  # transformers' center_crop, as the release's BitImageProcessor

    def image_grid(self) -> tuple[int, int]:
        side = self.preprocess.size // self.network.config.vision_config.patch_size
        return side, side

    def prompt(self, text: str) -> str:
        h, w = self.image_grid()
        return PROMPT.format(image="<image>" * (h * w), text=text)

    def image_inputs(self, images: torch.Tensor) -> dict:
        return {"pixel_values": images}

    def parse(self, text: str) -> list[tuple[float, ...]]:
        return maira2_boxes(text, self.preprocess.size)

    def recognition(self, features, image: int, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The likelihood contrast of ``<obj>{text}`` against ``<obj>No {text}`` about image ``image`` (see the module),
        both rows in one forward; the map from the positive rows."""
        n = len(texts)
        answers = [f"<obj>{text}" for text in texts] + [f"<obj>No {text}" for text in texts]
        prompts = [self.prompt(text) for text in texts] * 2
        lengths = torch.tensor([len(self.tokenizer.encode(a, add_special_tokens=False)) for a in answers], device=self.device)
        logits, inputs, layers = self.text_forward([p + a for p, a in zip(prompts, answers)], features, image)
        ids, t = inputs["input_ids"], int(lengths.max())
        # the last t next-token predictions hold every row's answer (left padding): no log-softmax over the prompt's
        logprobs = logits[:, -t - 1:-1].float().log_softmax(-1).gather(2, ids[:, -t:, None])[..., 0]
        answer = torch.arange(t, device=ids.device)[None, :] >= (t - lengths[:, None])
        total = torch.where(answer, logprobs, 0).sum(1)
        maps = self.image_attention(torch.stack(layers).mean(dim=(0, 2))[:n], ids[:n])
        return total[:n] - total[n:], maps
