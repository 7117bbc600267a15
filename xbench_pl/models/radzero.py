"""RadZero (Park et al., NeurIPS 2025): similarity-based cross-attention between text and patches, from local files only.

Architecture (``deepnoid-ai/RadZero`` @ 656ae5f6, ``exp/cxr_pt/configs/radzero.yaml`` built by their
``CxrAlignModel``; towers are transformers' own classes, built from the local config folders named in
``configs/radzero.json``, never downloaded, no remote code):

* Image: XrayDINOv2 (``StanfordAIMI/dinov2-base-xray-224``, a DINOv2 ViT-B/14, transformers ``Dinov2Model``)
  at 518 px: class token + 37 x 37 patches after its final norm; then their ``AlignTransformer``: two more
  DINOv2 layers (transformers ``Dinov2Encoder``, d 768, 12 heads), no norm after them.
* Text: all-mpnet-base-v2 (transformers ``MPNetModel``), the last hidden state mean-pooled over the
  attention mask, no projection, no normalisation (``text_features_wo_l2_norm``).
* Their ``RadZeroLoss`` holds the rest: one LayerNorm applied to both the text vectors and the image
  tokens (``norm``), and the learnt log-temperature (``log_temperature``, ``loss_temperature``; their
  ``attn_temperature`` is null, so the same temperature T serves the attention and the logits).
* VL-CABS (their ``SimilarityLogit``, ``sim_op="cos"``): text q and tokens k (class token included) unit
  normalised; s = q.k / T over the 1 + N tokens; attention softmax(s) pools the unit tokens; the logit is
  cos(q, pooled) / T (their ``compute_logits`` divides ``t2i_logits`` by T once more).

Outputs:

* ``logits`` [B, C]: their ``compute_logits(...)["logits"]``. ``scores = sigmoid(logits)``: the
  ``similarity_prob`` of their Hugging Face ``model_inference``, reconstructed (see below).
* ``saliency`` [B, C, 37, 37]: ``sigmoid(s)`` over the patch tokens (the class token dropped, row-major),
  i.e. their ``similarity_scores`` through the sigmoid their map functions apply. They upsample the
  scores bilinearly to the image size *before* the sigmoid (``interpolate_similarity_scores``); the map
  stays here on the patch grid (the benchmark warps it), so the sigmoid comes first: the same values at
  the patches, a monotone function of the score, not the same interpolation between patches.

Reconstructed (the Hugging Face remote code ``modeling_radzero.py`` / ``utils.py`` of ``Deepnoid/RadZero``
is not on GitHub and was not read): the ``similarity_prob`` of ``model_inference`` as sigmoid of the logit,
the same sigmoid of the same cosine / T that their maps use; the weights' layout as the state dict of
their ``CxrAlignModel`` (``vision_model.*``, ``text_model.*``, ``align_transformer.transformer_layers.*``,
``loss_fns.RadZeroLoss.*``, no ``text_projector``), renamed by ``checkpoint_filter_fn`` (prefixes, and the
transformers 4 DINOv2 attention names ``attention.attention.query`` ... to transformers 5's ``q_proj`` ...); the image
processor of XrayDINOv2 as a ``BlipImageProcessor`` (their ``segmentation_utils`` treats it as one)
resized to 518 x 518 by their ``adapt_img_size``: PIL bicubic squash resize, OpenAI-CLIP mean/std; and
the two towers' hub configs (``configs/hf/``; the DINOv2's 224 px position grid is interpolated to
37 x 37 at every forward). Not copied: their GitHub ``compute_logits`` reads ``compute_i2t_loss``,
which their loss never sets (an ``AttributeError`` in the release); the t2i logits alone are what it
can mean (their loss computes no i2t term), and are what this model computes.

Deviation kept on purpose: none in the numbers. The DINOv2 position embeddings are interpolated as
transformers 4.39 (the authors' pin) does, with a *scale factor* ``(grid + 0.1) / 16`` (bicubic); since
transformers 4.45 the target *size* is given instead, which moves the maps by up to 1e-3.

Prompts: ``"There is {finding}"`` (their evaluation prompts), with their spellings (``names``); a text
that is not a known finding name (``xbench_pl.data.vocabulary``) is embedded as it is (their MS-CXR
phrase grounding feeds the phrase itself); ``texts={finding: text}`` overrides.

Files: ``checkpoint`` = the local ``model.safetensors`` (or ``pytorch_model.bin``) of ``Deepnoid/RadZero``,
or that folder; ``text`` = a folder with the MPNet tokenizer files (``vocab.txt`` or
``tokenizer.json``; default: the checkpoint folder). ``random_init`` weights come from a fixed seed;
without a checkpoint or text folder, a stand-in of MPNet's tokenizer layout (``stand_ins``).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from jsonargparse.typing import PositiveInt
from torch import nn
from transformers import Dinov2Config, MPNetConfig, MPNetModel, MPNetTokenizerFast
from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings, Dinov2Encoder, Dinov2Model

from xbench_pl.data.base import Phrase
from xbench_pl.data.vocabulary import canonical
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.models.checkpoints import CheckpointError, build_weights, guess_layout, load_or_warn, load_weights, read_checkpoint, rename_prefix
from xbench_pl.models.local_files import (bert_config, checkpoint_file, local_folder, preprocess_from, read_architecture,
                                          sized_architecture, weights_in)
from xbench_pl.models.prompts import EmbeddingCache
from xbench_pl.models.randomization import image_tower_stages

ARCHITECTURE_KEYS = ("vision", "text", "align", "similarity", "prompt", "preprocess")
CHECKPOINT_HINT = ("the weights of the Hugging Face model Deepnoid/RadZero saved locally: its model.safetensors (the state "
                   "dict of the authors' CxrAlignModel: vision_model.*, text_model.*, align_transformer.*, loss_fns.*) "
                   "or the folder holding it")
TEXT_HINT = ("the MPNet tokenizer of Deepnoid/RadZero (that of sentence-transformers/all-mpnet-base-v2) from a local "
                  "folder (text=DIR, default: the checkpoint folder) holding vocab.txt or tokenizer.json")
# the released (CxrAlignModel) key prefixes -> this model's
PREFIXES = (
    ("vision_model.", "image."),
    ("text_model.", "text."),
    ("align_transformer.transformer_layers.", "align."),
    ("loss_fns.RadZeroLoss.layer_norm.", "norm."),
    ("loss_fns.RadZeroLoss.loss_temperature", "log_temperature"),
)
# transformers 4.x DINOv2 attention names (theirs) -> transformers 5's (the layers of both DINOv2 stacks)
DINOV2_ATTENTION = (
    (".attention.attention.query.", ".attention.q_proj."),
    (".attention.attention.key.", ".attention.k_proj."),
    (".attention.attention.value.", ".attention.v_proj."),
    (".attention.output.dense.", ".attention.o_proj."),
)


def checkpoint_filter_fn(state: object, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The released state dict (their ``CxrAlignModel``'s; a ``state_dict``/``model`` entry is unwrapped) -> ours."""
    if isinstance(state, dict):
        state = state.get("state_dict", state.get("model", state))
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"checkpoint {source} is not a RadZero checkpoint: it holds no state dict of tensors; "
                              f"expected {CHECKPOINT_HINT}")
    if not any(k.startswith("align_transformer.") for k in state):
        keys = sorted(state)
        raise CheckpointError(f"checkpoint {source} is not a RadZero checkpoint: none of its {len(keys)} keys is under "
                              f"align_transformer. (e.g. {keys[:4]}){guess_layout(keys)}; expected {CHECKPOINT_HINT}")
    out = {}
    for key, value in state.items():
        key = rename_prefix(key, PREFIXES)
        if key.startswith(("image.encoder.layer.", "align.layer.")):
            for old, new in DINOV2_ATTENTION:
                key = key.replace(old, new)
        out[key] = value
    return out


class ScaleFactorDinov2Embeddings(Dinov2Embeddings):
    """DINOv2 embeddings whose position grid is resized as transformers 4.39 (the authors' pin) resizes it:
    bicubic by the scale factor ``(new + 0.1) / old`` (DINO's offset against rounding), not to a target size."""

    def interpolate_pos_encoding(self, embeddings: torch.Tensor, height: int, width: int) -> torch.Tensor:
        positions = self.position_embeddings.shape[1] - 1
        if embeddings.shape[1] - 1 == positions and height == width:
            return self.position_embeddings
        side = math.sqrt(positions)
        patch = self.patch_embeddings.patch_size[0]
        rows, cols = height // patch + 0.1, width // patch + 0.1
        grid = self.position_embeddings[:, 1:].reshape(1, int(side), int(side), -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid.to(torch.float32), scale_factor=(float(rows / side), float(cols / side)), mode="bicubic",
                             align_corners=False).to(self.position_embeddings.dtype)
        if grid.shape[-2:] != (int(rows), int(cols)):
            raise ValueError(f"DINOv2 position grid {int(side)}^2 resized to {tuple(grid.shape[-2:])}, not {int(rows)} x {int(cols)}")
        return torch.cat((self.position_embeddings[:, :1], grid.flatten(2).transpose(1, 2)), dim=1)


class RadZero(ZeroShotModel):
    """RadZero; see the module docstring.

    Args:
        architecture: shipped config name (``radzero``) or a JSON file.
        checkpoint: ``model.safetensors`` of Deepnoid/RadZero or its folder (required unless ``random_init``).
        text: folder with the MPNet tokenizer files (default: the checkpoint folder; a stand-in tokenizer with
            ``random_init`` and no checkpoint).
        random_init: allow running without weights (smoke tests; reports say so).
        trust_checkpoint: read a pickled checkpoint that needs more than tensors with full unpickling (runs
            code from the file: only for files you trust).
        texts: ``{finding: text}`` overriding the ``"There is {}"`` prompts.
        image_size: input size; only the trained 518 px (``INPUT_SIZES``), any other is refused.
        **kwargs: ``ZeroShotModel`` options.
    """

    IGNORE_UNEXPECTED = (r"^text\.pooler\.",)  # MPNetModel's pooler: the text vector is a mean over tokens
    TRAINABLE = (r"^align\.", r"^norm\.", r"^log_temperature$")  # fit: the alignment layers, shared norm, temperature
    INPUT_SIZES = {518: "radzero"}
    IMAGE_TOWER = "image"
    #: the cascade of weight randomization (``models.randomization``): the alignment layers work on top of both towers
    RANDOMIZATION_STAGES = (("alignment", ("log_temperature", "norm", "align")), ("text", ("text",)),
                            ("image head", ("image.layernorm",)), *image_tower_stages("image"))
    EXPLAINER_TARGET = "logits"

    def __init__(
        self,
        architecture: str = "radzero",
        checkpoint: str | None = None,
        text: str | None = None,
        random_init: bool = False,
        trust_checkpoint: bool = False,
        texts: dict[str, str] | None = None,
        image_size: PositiveInt | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        architecture = sized_architecture(architecture, image_size, self.INPUT_SIZES, type(self).__name__)
        weights = weights_file(checkpoint, random_init, architecture)
        config, base = read_architecture(architecture, ARCHITECTURE_KEYS, "RadZero")
        self.architecture, self.trust_checkpoint = architecture, trust_checkpoint
        self.prompt = str(config["prompt"])
        self.names = dict(config.get("names", {}))
        self.texts = dict(texts or {})
        if text is None and checkpoint is not None and Path(checkpoint).expanduser().is_dir():
            text = checkpoint
        self.tokenizer = self.tokenizer_or_stand_in(text, weights, lambda: load_tokenizer(text), config["text"])
        build_weights(lambda: self.build(config, base), random_init=weights is None)
        self.preprocess = preprocess_from(config)
        patch = self.image.config.patch_size
        if self.preprocess.size % patch:
            raise ValueError(f"architecture {architecture!r}: input size {self.preprocess.size} is not a multiple of the patch {patch}")
        self.grid = (self.preprocess.size // patch,) * 2
        if len(self.tokenizer) > self.text.config.vocab_size:
            raise ValueError(f"text folder {text} has {len(self.tokenizer)} tokens, the text tower {self.text.config.vocab_size}: "
                             f"wrong text folder? It needs {TEXT_HINT}")
        self._text_cache = EmbeddingCache()
        load_or_warn(self, weights)
        self.attach_explainer()

    def build(self, config: dict, base: Path) -> None:
        vision = Dinov2Config(**bert_config(config["vision"], base))
        self.image = Dinov2Model(vision)
        self.image.embeddings = ScaleFactorDinov2Embeddings(vision)
        self.text = MPNetModel(MPNetConfig(**bert_config(config["text"], base)), add_pooling_layer=False)
        align = Dinov2Config(**config["align"])
        self.align = Dinov2Encoder(align)
        similarity = config["similarity"]
        self.norm = nn.LayerNorm(align.hidden_size, eps=float(similarity.get("norm_eps", 1e-5)))
        self.log_temperature = nn.Parameter(torch.tensor([math.log(float(similarity["initial_temperature"]))]))

    # -- weights -------------------------------------------------------------------------------
    def load_checkpoint(self, path: Path) -> None:
        state = checkpoint_filter_fn(read_checkpoint(path, trust=self.trust_checkpoint), str(path))
        load_weights(self, state, str(path), self.IGNORE_UNEXPECTED)  # ZeroShotModel.load_state_dict clears the caches

    # -- text ----------------------------------------------------------------------------------
    def prompt_for(self, text: str) -> str:
        """``"There is {name}"`` for a finding (any spelling ``canonical`` knows; their spelling of it), else the text
        itself: a phrase, as written (a dataset's phrases, ``Phrase``, even one that spells a finding: "opacity")."""
        if isinstance(text, Phrase):
            return text
        if text in self.texts:
            return self.texts[text]
        try:
            finding = canonical(text)
        except KeyError:
            return text
        return self.prompt.format(self.names.get(finding, finding))

    def tokenize(self, prompts: list[str] | tuple[str, ...]) -> dict[str, torch.Tensor]:
        """As their ``process_class_prompts``: padded to the longest, truncated to the tokenizer's maximum."""
        return self.tokenizer(list(prompts), padding=True, truncation=True, return_tensors="pt")

    def encode_text(self, prompts: list[str] | tuple[str, ...]) -> torch.Tensor:
        """``[C, D]``: MPNet's last hidden state mean-pooled over each prompt's tokens (their ``forward_text_model``)."""
        tokens = self.tokenize(prompts)
        mask = tokens["attention_mask"].to(self.device)
        hidden = self.text(input_ids=tokens["input_ids"].to(self.device), attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)

    @torch.no_grad()
    def text_embeddings(self, prompts: tuple[str, ...]) -> torch.Tensor:
        """The pooled text vectors ``[C, D]`` (before the shared norm), cached per (prompts, device); prompts holding a
        dataset's phrases (``Phrase``) text by text."""
        def encode(texts: tuple[str, ...]) -> torch.Tensor:
            with torch.autocast(self.device.type, enabled=False):
                return self.encode_text(texts).float()

        return self._text_cache.get_texts(prompts, self.device, lambda texts: encode(tuple(texts)))

    # -- inference -----------------------------------------------------------------------------
    def image_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 1 + N, D]``: XrayDINOv2's normed tokens through the two alignment layers (``forward_vision_model``)."""
        if images.shape[-2:] != (self.preprocess.size,) * 2:
            raise ValueError(f"RadZero expects {self.preprocess.size} x {self.preprocess.size} inputs, got {tuple(images.shape[-2:])}")
        return self.align(self.image(pixel_values=images).last_hidden_state).last_hidden_state

    def similarities(self, images: torch.Tensor, prompts: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """VL-CABS: ``logits [B, C]`` (their ``compute_logits``) and ``scores [B, C, N]`` (their
        ``similarity_scores``: cosine / T of each text with each patch token, the class token dropped)."""
        text = F.normalize(self.norm(self.text_embeddings(prompts).to(images.dtype)), dim=-1)  # [C, D]
        tokens = F.normalize(self.norm(self.image_tokens(images)), dim=-1)  # [B, 1 + N, D]
        temperature = self.log_temperature.exp()
        scores = torch.einsum("cd,bnd->bcn", text, tokens) / temperature
        pooled = F.normalize(scores.softmax(dim=-1) @ tokens, dim=-1)  # [B, C, D]
        logits = (pooled * text).sum(dim=-1) / temperature
        return {"logits": logits, "scores": scores[..., 1:]}

    @torch.no_grad()
    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        out = self.similarities(images, tuple(self.prompt_for(c) for c in classes))
        logits, scores = out["logits"].float(), out["scores"].float()
        return ZeroShotOutput(scores=torch.sigmoid(logits), saliency=torch.sigmoid(scores).unflatten(-1, self.grid), logits=logits)


# -- local files only --------------------------------------------------------------------------
def weights_file(checkpoint: str | None, random_init: bool, architecture: str) -> Path | None:
    """The local weights file (``checkpoint`` itself, or ``model.safetensors`` / ``pytorch_model.bin`` in that folder)."""
    if checkpoint is not None and Path(checkpoint).expanduser().is_dir():
        return weights_in(Path(checkpoint).expanduser(), "checkpoint", CHECKPOINT_HINT)
    return checkpoint_file(checkpoint, random_init, f"RadZero({architecture!r})", CHECKPOINT_HINT)


def load_tokenizer(folder: str | None) -> MPNetTokenizerFast:
    """The MPNet tokenizer from a local folder, as their ``AutoTokenizer`` gives it (``MPNetTokenizerFast``)."""
    path = local_folder(folder, "text", TEXT_HINT, "RadZero's text tower", [("vocab.txt", "tokenizer.json")])
    return MPNetTokenizerFast.from_pretrained(str(path), local_files_only=True)
