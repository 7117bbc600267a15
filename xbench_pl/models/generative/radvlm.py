"""RadVLM (KrauthammerLab/RadVLM; code uzh-dqbm-cmi/RadVLM): LLaVA-OneVision (transformers
``LlavaOnevisionForConditionalGeneration``: SigLIP at 384 px, Qwen2 7B).

Input: the radiograph squashed to 384 x 384, the base view their ``process_anyres_image`` makes (no padding); a square
input's best any-res grid is one 384 tile, so the image goes in twice (base view, tile), as LLaVA-OneVision's image
processor sends a 384-pixel square. Image tokens: as many as the network's ``get_image_features`` gives for that input
(729 base tokens, the 27 x 27 grid the map is read on, then the tile's with its row ends). Prompt: their chat template
with the system turn their training prepended, ``<image>\\n`` before the text; grounding with their abnormality question
"Where is the {} located in this Chest X-ray?" (the first of their 20 variations; their evaluation draws one at random),
answered with ``[x1, y1, x2, y2]`` normalised to the image (``parsing.radvlm_boxes``). Licence: code CC-BY-NC-4.0,
weights not stated (PhysioNet lists the model as credentialed access); the authors pin transformers 4.46.0.
"""

from __future__ import annotations


import torch

from xbench_pl.geometry import Preprocess
from xbench_pl.models.generative.base import GenerativeModel
from xbench_pl.models.generative.parsing import radvlm_boxes

#: SigLIP's mean and std (LLaVA-OneVision's image processor)
SIGLIP_MEAN = SIGLIP_STD = (0.5, 0.5, 0.5)
#: the release's key prefixes -> transformers 5's (``re.sub`` in order). RadVLM was converted and saved with
#: transformers 4.46 (their converter, ``convert_llava_onevision_weights_to_hf.py``): ``language_model.model.*``,
#: ``language_model.lm_head.weight`` (untied), ``vision_tower.vision_model.*``, ``multi_modal_projector.linear_{1,2}``,
#: ``image_newline``; transformers 5 nests them under ``model.`` (``lm_head`` at the top) and its SigLIP tower has no
#: ``vision_model`` level. Keys already in 5's layout pass unchanged; a 4.52.x save's in-memory names
#: (``model.language_model.*``, ``model.vision_tower.vision_model.*``: transformers issue #38489) lose only the tower's
#: ``vision_model``.
RELEASE_RENAMES = ((r"^language_model\.model\.", "model.language_model."), (r"^language_model\.lm_head\.", "lm_head."),
                   (r"^(model\.)?vision_tower\.vision_model\.", "model.vision_tower."),
                   (r"^multi_modal_projector\.", "model.multi_modal_projector."), (r"^image_newline$", "model.image_newline"))


class RadVLM(GenerativeModel):
    """RadVLM (LLaVA-OneVision); see the module."""

    RELEASE_RENAMES = RELEASE_RENAMES
    #: the cascade of weight randomization (``models.randomization``), top first
    RANDOMIZATION_STAGES = (("language model", ("network.lm_head", "network.model.language_model")), ("projector", ("network.model.multi_modal_projector", "network.model.image_newline")),
                            ("image tower", ("network.model.vision_tower",)))
    NETWORK = "LlavaOnevisionForConditionalGeneration"
    IMAGE_TOWER = "network.model.vision_tower"
    SPECIAL_TOKENS = ("<image>", "<video>", "<|im_start|>", "<|im_end|>")
    GROUNDING_PROMPT = "Where is the {} located in this Chest X-ray?"
    RELEASE = {"hub": "KrauthammerLab/RadVLM", "licence": "code CC-BY-NC-4.0; weights not stated", "transformers": "4.46.0"}
    MAX_NEW_TOKENS = 128
    TOKEN_FIELDS = {"image_token_index": "<image>", "video_token_index": "<video>"}
    STOP_TOKEN = "<|im_end|>"

    def tiny_config(self, vocab_size: int):
        from transformers import LlavaOnevisionConfig

        return LlavaOnevisionConfig(
            text_config=dict(model_type="qwen2", vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, image_size=56, patch_size=14, vision_use_head=False),
            image_grid_pinpoints=[[56, 56], [56, 112], [112, 56]], vision_feature_select_strategy="full", vision_feature_layer=-1)

    def input_preprocess(self) -> Preprocess:
        from transformers.image_processing_utils import select_best_resolution

        size = self.network.config.vision_config.image_size
        if tuple(select_best_resolution((size, size), self.network.config.image_grid_pinpoints)) != (size, size):
            raise ValueError(f"RadVLM: a {size}-pixel square's any-res grid is not one {size}-pixel tile in this configuration")
        return Preprocess(resize="squash", size=size, interpolation="bicubic", antialias=True, mean=SIGLIP_MEAN, std=SIGLIP_STD)

    def image_grid(self) -> tuple[int, int]:
        side = self.preprocess.size // self.network.config.vision_config.patch_size
        return side, side

    def image_tokens(self) -> int:
        """How many features the network gives a square input (base view and tile), counted once on a blank image."""
        if not hasattr(self, "_image_tokens"):
            size = self.preprocess.size
            blank = torch.zeros(1, 3, size, size, device=self.device, dtype=next(self.network.parameters()).dtype)
            with torch.no_grad():
                features = self.network.model.get_image_features(**self.image_inputs(blank))
            self._image_tokens = int(sum(f.shape[0] for f in (features.pooler_output if hasattr(features, "pooler_output") else features)))
        return self._image_tokens

    def prompt(self, text: str) -> str:
        return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + "<image>" * self.image_tokens()
                + f"\n{text}<|im_end|>\n<|im_start|>assistant\n")

    def image_inputs(self, images: torch.Tensor) -> dict:
        size = self.preprocess.size
        return {"pixel_values": torch.stack((images, images), dim=1),
                "image_sizes": torch.tensor([[size, size]] * images.shape[0], device=images.device)}

    def parse(self, text: str) -> list[tuple[float, ...]]:
        return radvlm_boxes(text, self.preprocess.size)
