"""Lingshu (lingshu-medical-mllm/Lingshu-7B): Qwen2.5-VL (transformers ``Qwen2_5_VLForConditionalGeneration``).

Input: the image squashed to ``image_size`` square (default 448, a multiple of Qwen's 28-pixel grid, so the
processor's ``smart_resize`` keeps it: 16 x 16 merged image tokens), mean/std of Qwen2-VL's image processor (CLIP's),
cut into 14-pixel patches with the frame repeated for the temporal patch (``qwen_patches``, the arithmetic of
transformers' ``Qwen2VLImageProcessor``). The release would resize each image dynamically (``smart_resize`` between
``min_pixels`` and ``max_pixels``: a 2048 x 2500 radiograph becomes 6,497 tokens); a fixed square keeps every batch one
shape and the map one grid: stated here, recorded in ``metrics.json``'s model config.

Prompt: Qwen2.5-VL's chat template with its default system turn, the image first; grounding with the cookbook's
sentence ("Locate the {}, output its bbox coordinates using JSON format."), answered as ``[{"bbox_2d": [x1, y1, x2,
y2], "label": ...}]`` in absolute pixels of the input (``parsing.qwen_boxes``). Licence of the weights: MIT (the
card, as reported by third parties; check it); the authors' evaluation kit pins transformers 4.52.4.
"""

from __future__ import annotations


import torch
from jsonargparse.typing import PositiveInt

from xbench_pl.geometry import Preprocess
from xbench_pl.models.generative.base import GenerativeModel
from xbench_pl.models.generative.parsing import qwen_boxes

#: Qwen2-VL's image processor mean and std (OpenAI CLIP's)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PATCH, MERGE, TEMPORAL = 14, 2, 2
#: the release's key prefixes -> transformers 5's (``re.sub`` in order). A Qwen2.5-VL release saved by transformers
#: 4.4x-4.5x names ``model.layers.*``, ``model.embed_tokens``, ``model.norm``, ``lm_head``, ``visual.*`` (Qwen2.5-VL-7B-
#: Instruct's own files; save_pretrained writes that layout back after the 4.52 refactor). Some 4.52.x saves wrote the
#: in-memory names instead (transformers issue #38489, fixed by PR #38385): ``model.language_model.*``, ``model.visual.*``,
#: which are transformers 5's and pass unchanged. ``lm_head`` is a separate tensor (untied) and keeps its name.
RELEASE_RENAMES = ((r"^visual\.", "model.visual."), (r"^model\.(?!language_model\.|visual\.)", "model.language_model."))


def qwen_patches(images: torch.Tensor, patch: int = PATCH, merge: int = MERGE, temporal: int = TEMPORAL) -> tuple[torch.Tensor, torch.Tensor]:
    """``images [N, 3, H, W]`` (normalised) as Qwen2-VL's flattened patches ``[N * gh * gw, 3 * temporal * patch^2]`` and
    ``image_grid_thw [N, 3]``: one frame repeated ``temporal`` times, patches in merge-window order."""
    n, c, h, w = images.shape
    gh, gw = h // patch, w // patch
    frames = images[:, None].expand(n, temporal, c, h, w)
    patches = frames.reshape(n, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(n * gh * gw, c * temporal * patch * patch)
    return patches, torch.tensor([[1, gh, gw]] * n, dtype=torch.long, device=images.device)


class Lingshu(GenerativeModel):
    """Lingshu-7B (Qwen2.5-VL); see the module.

    Args:
        image_size: the square input side (a multiple of 28); None: 448 (the tiny configuration: 56).
    """

    RELEASE_RENAMES = RELEASE_RENAMES
    #: the cascade of weight randomization (``models.randomization``), top first: the language model, then the image tower
    RANDOMIZATION_STAGES = (("language model", ("network.lm_head", "network.model.language_model")), ("image tower", ("network.model.visual",)))
    NETWORK = "Qwen2_5_VLForConditionalGeneration"
    IMAGE_TOWER = "network.model.visual"
    SPECIAL_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>", "<|im_start|>", "<|im_end|>")
    GROUNDING_PROMPT = "Locate the {}, output its bbox coordinates using JSON format."
    RELEASE = {"hub": "lingshu-medical-mllm/Lingshu-7B", "licence": "MIT (per the card; check it)", "transformers": "4.52.4"}
    MAX_NEW_TOKENS = 128
    POSITIONS_FROM_MASK = False  # Qwen2.5-VL's multimodal rope index reads the attention mask itself
    TOKEN_FIELDS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                    "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
    STOP_TOKEN = "<|im_end|>"

    def __init__(self, image_size: PositiveInt | None = None, **kwargs):
        self.image_size = image_size
        super().__init__(**kwargs)

    def tiny_config(self, vocab_size: int):
        from transformers import Qwen2_5_VLConfig

        return Qwen2_5_VLConfig(
            text_config=dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                             rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=True,
                             bos_token_id=None, eos_token_id=None),  # Qwen's ids are past this vocabulary: stand_in_ids sets them
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=PATCH,
                               spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, window_size=56, fullatt_block_indexes=[1]),
            tie_word_embeddings=True)

    def input_preprocess(self) -> Preprocess:
        size = self.image_size or (56 if self.tiny else 448)
        if size % (PATCH * MERGE):
            raise ValueError(f"image_size {size} is not a multiple of {PATCH * MERGE} (Qwen2.5-VL's merged patch)")
        return Preprocess(resize="squash", size=size, interpolation="bicubic", antialias=True, mean=CLIP_MEAN, std=CLIP_STD)

    def image_grid(self) -> tuple[int, int]:
        side = self.preprocess.size // (PATCH * MERGE)
        return side, side

    def prompt(self, text: str) -> str:
        h, w = self.image_grid()
        return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
                + "<|image_pad|>" * (h * w) + f"<|vision_end|>{text}<|im_end|>\n<|im_start|>assistant\n")

    def image_inputs(self, images: torch.Tensor) -> dict:
        pixel_values, grid = qwen_patches(images)
        return {"pixel_values": pixel_values, "image_grid_thw": grid}

    def token_inputs(self, input_ids: torch.Tensor) -> dict:
        """Qwen2.5-VL's processor marks the image tokens (``mm_token_type_ids`` 1), which its multimodal rope reads: without
        them transformers falls back to text positions."""
        return {"mm_token_type_ids": (input_ids == self.image_token_id).int()}

    def layout_inputs(self, rows: int) -> dict:
        side = self.preprocess.size // PATCH
        return {"image_grid_thw": torch.tensor([[1, side, side]] * rows, dtype=torch.long, device=self.device)}

    def parse(self, text: str) -> list[tuple[float, ...]]:
        return qwen_boxes(text)
