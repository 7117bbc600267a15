"""MedGemma (google/medgemma-4b-it; the 1.5 release google/medgemma-1.5-4b-it): Gemma 3 (transformers
``Gemma3ForConditionalGeneration``: SigLIP at 896 px, 256 pooled image tokens).

Input: the radiograph zero-padded to a square and resized to 896 x 896 (``letterbox``), as Google's localisation
notebook prepares it ("Pad the input image to a square format. This maintains consistency with the original
preprocessing in model training and evaluation"; the Gemma 3 processor then resizes without keeping the aspect),
mean/std 0.5. Prompt: Gemma 3's chat template, no system turn, the image before the text
(``\\n\\n<start_of_image>`` + 256 ``<image_soft_token>`` + ``<end_of_image>\\n\\n``). Grounding: the notebook's
instruction (``GROUNDING_PROMPT``: boxes ``[y0, x0, y1, x1]`` normalised to 0-1000 in a fenced JSON list, reasoning
first, "Final Answer: ..."), read by ``parsing.gemma_boxes`` from the first ``json`` fence; 1,000 new tokens as the
notebook. Licence: Health AI Developer Foundations terms (gated: accept them on the model page, then ``huggingface-cli
login``); transformers >= 4.50.0.
"""

from __future__ import annotations


import torch

from xbench_pl.geometry import Preprocess
from xbench_pl.models.generative.base import GenerativeModel
from xbench_pl.models.generative.parsing import gemma_boxes

#: Google's chest X-ray localisation prompt (``cxr_anatomy_localization_with_hugging_face.ipynb``), ``{}``: the finding
GROUNDING = (
    "Instructions:\nThe following user query will require outputting bounding boxes. The format of bounding boxes coordinates "
    "is [y0, x0, y1, x1] where (y0, x0) must be top-left corner and (y1, x1) the bottom-right corner. This implies that x0 < x1 "
    "and y0 < y1. Always normalize the x and y coordinates the range [0, 1000], meaning that a bounding box starting at 15% of "
    "the image width would be associated with an x coordinate of 150. You MUST output a single parseable json list of objects "
    "enclosed into ```json...``` brackets, for instance ```json[{{\"box_2d\": [800, 3, 840, 471], \"label\": \"car\"}}, "
    "{{\"box_2d\": [400, 22, 600, 73], \"label\": \"dog\"}}]``` is a valid output. Now answer to the user query.\n\nRemember "
    "\"left\" refers to the patient's left side where the heart is and sometimes underneath an L in the upper right corner of "
    "the image.\n\nQuery:\nWhere is the {}? Don't give a final answer without reasoning. Output the final answer in the format "
    "\"Final Answer: X\" where X is a JSON list of objects. The object needs a \"box_2d\" and \"label\" key. Answer:")

#: the release's key prefixes -> transformers 5's (``re.sub`` in order). MedGemma's files (saved by transformers 4.5x,
#: as google/medgemma-27b-it's index shows) name ``language_model.model.*``, ``vision_tower.vision_model.*`` and
#: ``multi_modal_projector.*``; transformers 5 nests them under ``model.`` and its SigLIP tower has no ``vision_model``
#: level. Keys already in 5's layout pass unchanged; a 4.52.x save's in-memory names (``model.language_model.*``,
#: ``model.vision_tower.vision_model.*``: transformers issue #38489) lose only the tower's ``vision_model``.
RELEASE_RENAMES = ((r"^language_model\.model\.", "model.language_model."), (r"^language_model\.lm_head\.", "lm_head."),
                   (r"^(model\.)?vision_tower\.vision_model\.", "model.vision_tower."),
                   (r"^multi_modal_projector\.", "model.multi_modal_projector."))
EMBEDDINGS = "model.language_model.embed_tokens.weight"


class MedGemma(GenerativeModel):
    """MedGemma 4B (Gemma 3); see the module."""

    RELEASE_RENAMES = RELEASE_RENAMES
    #: the cascade of weight randomization (``models.randomization``), top first
    RANDOMIZATION_STAGES = (("language model", ("network.lm_head", "network.model.language_model")), ("projector", ("network.model.multi_modal_projector",)),
                            ("image tower", ("network.model.vision_tower",)))
    NETWORK = "Gemma3ForConditionalGeneration"
    IMAGE_TOWER = "network.model.vision_tower"
    SPECIAL_TOKENS = ("<image_soft_token>", "<start_of_image>", "<end_of_image>", "<start_of_turn>", "<end_of_turn>", "<bos>")
    GROUNDING_PROMPT = GROUNDING
    RELEASE = {"hub": "google/medgemma-4b-it", "variants": ["google/medgemma-1.5-4b-it"],
               "licence": "Health AI Developer Foundations terms (gated)", "transformers": ">= 4.50.0"}
    MAX_NEW_TOKENS = 1000
    SIGLIP_ONE_VIEW = True  # its SigLIP sees each image once: gradient explainers may target it (explainers/towers.py)
    ANSWERS = ("yes", "no")
    TOKEN_FIELDS = {"image_token_index": "<image_soft_token>", "boi_token_index": "<start_of_image>",
                    "eoi_token_index": "<end_of_image>"}
    STOP_TOKEN = "<end_of_turn>"

    def tiny_config(self, vocab_size: int):
        from transformers import Gemma3Config

        return Gemma3Config(
            text_config=dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, sliding_window=64, max_position_embeddings=4096),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=64,
                               patch_size=8, vision_use_head=False),
            mm_tokens_per_image=16)

    def build(self, config) -> None:
        super().build(config)
        if self.tiny:  # transformers initialises the projection to zeros (it is trained): images would not reach the text
            torch.nn.init.normal_(self.network.model.multi_modal_projector.mm_input_projection_weight, std=0.5)

    def input_preprocess(self) -> Preprocess:
        size = self.network.config.vision_config.image_size
        return Preprocess(resize="letterbox", size=size, canvas=size, interpolation="bilinear", antialias=True,
                          mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

    def image_grid(self) -> tuple[int, int]:
        side = int(round(self.network.config.mm_tokens_per_image ** 0.5))
        return side, side

    def prompt(self, text: str) -> str:
        tokens = self.network.config.mm_tokens_per_image
        return ("<bos><start_of_turn>user\n\n\n<start_of_image>" + "<image_soft_token>" * tokens
                + f"<end_of_image>\n\n{text}<end_of_turn>\n<start_of_turn>model\n")

    def image_inputs(self, images: torch.Tensor) -> dict:
        return {"pixel_values": images}

    def token_inputs(self, input_ids: torch.Tensor) -> dict:
        """Gemma 3's processor marks the image tokens (``token_type_ids`` 1): they attend to each other both ways."""
        return {"token_type_ids": (input_ids == self.image_token_id).long()}

    def parse(self, text: str) -> list[tuple[float, ...]]:
        return gemma_boxes(text.split("<unused95>", 1)[-1], self.preprocess.size)

    def checkpoint_filter(self, state: dict) -> dict:
        """The release's keys in transformers 5's names (``RELEASE_RENAMES``). Gemma 3 ties the output layer to the input
        embeddings (``tie_word_embeddings``), so the release stores no ``lm_head``: where the network ties them, the
        embeddings fill ``lm_head.weight`` too, as transformers' ``tie_weights`` does (the same tensor)."""
        out = super().checkpoint_filter(state)
        network = self.network
        if "lm_head.weight" not in out and EMBEDDINGS in out and network.lm_head.weight is network.get_input_embeddings().weight:
            out["lm_head.weight"] = out[EMBEDDINGS]
        return out
