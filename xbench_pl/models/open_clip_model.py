"""CLIP, BiomedCLIP and any other open_clip model, from local files only.

Architecture: ``architecture`` names a config shipped in ``xbench_pl/models/configs``
(``clip-ViT-B-16``, ``biomedclip``, ``chexzero``), an open_clip built-in name (``ViT-B-32``), a JSON file
(an open_clip model config, or an ``open_clip_config.json`` with ``model_cfg`` and
``preprocess_cfg``) or a folder holding ``open_clip_config.json``. A Hugging Face text tower
(``text_cfg.hf_model_name``) is built from a local folder with its ``config.json``: the name
itself when it is a folder, else the copy shipped in ``configs/hf/<hub id>/``.

Weights: ``checkpoint`` is OpenAI's TorchScript release (``ViT-B-16.pt``), an open_clip state
dict (``.bin``/``.pt``/``.pth``/``.safetensors``; a training checkpoint's ``state_dict`` and a
DDP ``module.`` prefix are unwrapped) or a model folder such as BiomedCLIP's release. No file
runs code: OpenAI's TorchScript archive is read without ``torch.jit.load`` (its tensors only,
``checkpoints.read_torchscript``) and pickles with ``weights_only=True``; ``trust_checkpoint=True``
is the explicit opt-in for a file that needs more (``torch.jit.load`` / full unpickling). Nothing
downloads: ``"openai"`` or ``hf-hub:`` names fail with the list of local files needed. Keys and
shapes must match the architecture exactly; otherwise the error lists the missing, unexpected
and mis-shaped keys.

Scores: unit image embedding (the tower's pooled output) against the unit text embedding of
each class's positive and negative prompts, times the model's ``logit_scale``, softmax over
the pair: ``p = softmax(s * [cos_pos, cos_neg])[0]`` (``score="softmax"``); the same softmax
over the raw cosines, without the scale (``score="softmax_cosine"``: CheXzero's
``run_softmax_eval``, ``exp(cos_pos) / (exp(cos_pos) + exp(cos_neg))``); or ``(1 + cos_pos) / 2``
(``score="cosine"``, no negative prompt needed).

Preprocessing: ``preprocess_cfg`` as open_clip reads it (``resize_mode``, ``interpolation``,
``mean``, ``std``), plus one key of ours: ``canvas`` (with ``resize_mode: "longest"``) letterboxes
the image to ``canvas x canvas`` first and then resizes that canvas to the input side without
antialiasing (``Preprocess(resize="letterbox_resize")``, CheXzero's 320 -> 224).

Saliency: the patch tokens after the tower's final norm, through the same projection as the
pooled token (``visual.proj`` for open_clip ViTs, whose ``output_tokens`` are unprojected;
``visual.head`` for timm trunks), L2-normalised, cosine with the class's positive text
embedding -> ``[B, C, grid, grid]`` (14 x 14 at 224 px, patch 16), row = y. Raw cosines: the
benchmark normalises them.
"""

from __future__ import annotations

import functools
import json
import tempfile
from copy import deepcopy
from pathlib import Path
from typing import Literal, get_args

import open_clip
import torch
import torch.nn.functional as F
from jsonargparse.typing import PositiveInt
from open_clip.timm_model import TimmModel
from open_clip.tokenizer import HFTokenizer, SimpleTokenizer
from open_clip.transformer import VisionTransformer
from torch import nn

from xbench_pl.geometry import Preprocess
from xbench_pl.models import local_files
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.models.checkpoints import load_weights, read_state_dict
from xbench_pl.models.local_files import RANDOM_INIT_HINT, SHIPPED_CONFIGS
from xbench_pl.models.prompts import PromptSet, TextEmbeddingCache, as_templates
from xbench_pl.models.stand_ins import stand_in_tokenizer

# A model folder's weights, in open_clip's order of preference.
CHECKPOINT_NAMES = (
    "open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
    "open_clip_pytorch_model.pth", "model.safetensors", "pytorch_model.bin",
)
HF_ALIASES = {"microsoft/BiomedNLP-PubMedBERT-base-uncased-abstract": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract"}
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
# open_clip's resize_mode -> Preprocess.resize ("longest" pads to a square: a letterbox with canvas = size)
RESIZE_MODES = {"shortest": "crop", "squash": "squash", "longest": "letterbox"}
LOCAL_FILES_HINT = (
    "a local checkpoint: OpenAI's TorchScript release (ViT-B-16.pt), an open_clip state dict "
    "(.bin/.pt/.pth/.safetensors), or a model folder holding open_clip_pytorch_model.bin "
    "(BiomedCLIP: the folder of microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224 with "
    "open_clip_pytorch_model.bin, vocab.txt, tokenizer_config.json, special_tokens_map.json)"
)


def refuse_download(value: str | None, what: str) -> None:
    """``local_files.refuse_download`` that also refuses open_clip's ``"openai"`` pretrained tag."""
    if value == "openai":
        raise ValueError(f"{what}={value!r} would download; nothing is downloaded here. Give {LOCAL_FILES_HINT}.")
    local_files.refuse_download(value, what, f"{LOCAL_FILES_HINT}.")


# -- architecture ------------------------------------------------------------------------------
def read_architecture(architecture: str) -> tuple[dict, dict]:
    """``(model_cfg, preprocess_cfg)`` of a shipped name, open_clip built-in name, JSON file or model folder."""
    refuse_download(architecture, "architecture")
    path = Path(architecture).expanduser()
    if path.is_dir():
        path = path / "open_clip_config.json"
    elif path.suffix != ".json" and (SHIPPED_CONFIGS / f"{architecture}.json").is_file():
        path = SHIPPED_CONFIGS / f"{architecture}.json"
    if path.suffix == ".json":
        if not path.is_file():
            raise FileNotFoundError(f"architecture config not found: {path}")
        config = json.loads(path.read_text())
    else:
        config = open_clip.get_model_config(architecture)  # built-in configs only: never downloads
        if config is None:
            shipped = sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.json"))
            raise ValueError(f"unknown architecture {architecture!r}: not a shipped config {shipped}, "
                             "an open_clip built-in name (open_clip.list_models()), a JSON file or a model folder")
    model_cfg = deepcopy(config.get("model_cfg", config))
    text_cfg = model_cfg.get("text_cfg", {})
    if text_cfg.get("hf_model_name"):
        text_cfg["hf_model_name"] = local_hf_config(text_cfg["hf_model_name"], path.parent if path.suffix == ".json" else None)
    return model_cfg, dict(config.get("preprocess_cfg", {}))


def local_hf_config(name: str, base: Path | None) -> str:
    """The local folder holding ``config.json`` of a Hugging Face text tower ``name``."""
    candidates = [Path(name).expanduser()]
    if base is not None and not Path(name).is_absolute():
        candidates.append(base / name)
    candidates.append(SHIPPED_CONFIGS / "hf" / HF_ALIASES.get(name, name))
    for folder in candidates:
        if (folder / "config.json").is_file():
            return str(folder)
    raise FileNotFoundError(
        f"text tower {name!r}: no folder with its config.json among {[str(c) for c in candidates]}. Nothing is "
        f"downloaded: save that model's Hugging Face config.json in a folder and set text_cfg.hf_model_name to it")


def build_open_clip(model_cfg: dict) -> nn.Module:
    """The open_clip model of ``model_cfg``, randomly initialised (no tower loads pretrained weights)."""
    cfg = deepcopy(model_cfg)
    if "multimodal_cfg" in cfg:
        raise ValueError("CoCa-style models (multimodal_cfg) are not supported")
    custom_text = cfg.pop("custom_text", False)
    vision_cfg, text_cfg = dict(cfg.pop("vision_cfg")), dict(cfg.pop("text_cfg"))
    if vision_cfg.get("timm_model_name"):
        vision_cfg["timm_model_pretrained"] = False
    if text_cfg.get("hf_model_name"):
        text_cfg["hf_model_pretrained"] = False
    model_class = open_clip.CustomTextCLIP if custom_text or text_cfg.get("hf_model_name") else open_clip.CLIP
    return model_class(vision_cfg=vision_cfg, text_cfg=text_cfg, **cfg)


# -- weights -----------------------------------------------------------------------------------
def find_checkpoint(checkpoint: str) -> Path:
    refuse_download(checkpoint, "checkpoint")
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        for name in CHECKPOINT_NAMES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"no checkpoint in folder {path}: expected one of {list(CHECKPOINT_NAMES)}")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


# -- the benchmarked model ---------------------------------------------------------------------
def preprocess_for(model: nn.Module, preprocess_cfg: dict) -> Preprocess:
    """The model's own inference transform (open_clip's defaults: bicubic, short side + centre crop, OpenAI mean/std)."""
    height, width = model.visual.image_size if isinstance(model.visual.image_size, (tuple, list)) else (model.visual.image_size,) * 2
    if height != width:
        raise ValueError(f"non-square model input {height}x{width} is not supported")
    resize_mode = preprocess_cfg.get("resize_mode", "shortest")
    if resize_mode not in RESIZE_MODES:
        raise ValueError(f"unsupported preprocess resize_mode {resize_mode!r}; known: {sorted(RESIZE_MODES)}")
    resize = RESIZE_MODES[resize_mode]
    canvas = int(height) if resize == "letterbox" else None
    if "canvas" in preprocess_cfg:  # ours: letterbox to the canvas, then resize it to the input (CheXzero)
        if resize != "letterbox":
            raise ValueError(f"preprocess canvas needs resize_mode 'longest', got {resize_mode!r}")
        resize, canvas = "letterbox_resize", int(preprocess_cfg["canvas"])
    return Preprocess(
        resize=resize,
        size=int(height),
        canvas=canvas,
        interpolation=preprocess_cfg.get("interpolation", "bicubic"),
        mean=tuple(preprocess_cfg.get("mean", open_clip.OPENAI_DATASET_MEAN)),
        std=tuple(preprocess_cfg.get("std", open_clip.OPENAI_DATASET_STD)),
        antialias=True,  # open_clip resizes PIL images
    )


def force_image_size(model_cfg: dict, image_size: int, architecture: str) -> dict:
    """``model_cfg`` with the vision tower's input side set to ``image_size`` (a multiple of its patch)."""
    vision = model_cfg.get("vision_cfg", {})
    patch = vision.get("patch_size")
    if patch is None and vision.get("timm_model_name"):  # timm names carry it: vit_base_patch16_224
        import re

        found = re.search(r"patch(\d+)", vision["timm_model_name"])
        patch = int(found.group(1)) if found else None
    if not patch or image_size <= 0 or image_size % patch:
        raise ValueError(f"image_size={image_size}: {architecture} takes a positive multiple of its patch size ({patch})")
    model_cfg = deepcopy(model_cfg)
    model_cfg["vision_cfg"]["image_size"] = image_size
    return model_cfg


def resize_position_embeddings(state: dict, model: nn.Module) -> None:
    """Interpolate a checkpoint's ViT position embeddings to ``model``'s patch grid, in place (open_clip's
    ``resize_pos_embed`` for its ViTs; timm's ``resample_abs_pos_embed`` for timm trunks)."""
    open_clip.model.resize_pos_embed(state, model)
    key = "visual.trunk.pos_embed"
    if key in state and isinstance(model.visual, TimmModel):
        from timm.layers import resample_abs_pos_embed

        trunk = model.visual.trunk
        if state[key].shape != trunk.pos_embed.shape:
            prefix = 0 if getattr(trunk, "no_embed_class", False) else trunk.num_prefix_tokens
            state[key] = resample_abs_pos_embed(state[key], new_size=list(trunk.patch_embed.grid_size),
                                                num_prefix_tokens=prefix, verbose=False)


def check_patch_tokens(visual: nn.Module) -> None:
    """Saliency needs a ViT whose patch tokens can be projected like its pooled token."""
    if isinstance(visual, VisionTransformer):
        if visual.attn_pool is not None or visual.pool_type not in ("tok", "avg") or visual.proj is None:
            raise ValueError("saliency needs a ViT tower pooled by its class token or mean, with a projection")
    elif isinstance(visual, TimmModel):
        if not hasattr(visual.trunk, "num_prefix_tokens") or "pool" in visual.head._modules:
            raise ValueError("saliency needs a timm ViT trunk (patch tokens) without an attention-pool head")
    else:
        raise ValueError(f"saliency needs a ViT image tower, got {type(visual).__name__}")


#: how an image-prompt similarity becomes a score (``OpenCLIPModel.__init__``)
ScoreMode = Literal["softmax", "softmax_cosine", "cosine"]


@functools.cache
def bundled_tokenizer(context_length: int) -> SimpleTokenizer:
    """open_clip's tokenizer with its bundled BPE vocabulary, read once per process (0.3-0.5 s: a sweep's runs and a
    suite's models share it; it keeps no state but a memo of the words it has split)."""
    return SimpleTokenizer(context_length=context_length)


class OpenCLIPModel(ZeroShotModel):
    """A CLIP-style dual encoder through open_clip; see the module docstring for conventions.

    Args:
        architecture: shipped config name, open_clip built-in name, JSON file or model folder.
        checkpoint: weights file or model folder (required unless ``random_init``).
        text: folder with the Hugging Face tokenizer files (HF text towers only; default: the checkpoint
            folder; a stand-in tokenizer with ``random_init`` and no checkpoint). Built-in CLIP text towers
            use open_clip's bundled BPE.
        positive, negative: prompt template(s) per polarity (``{}`` / ``{finding}`` = finding
            name); a list is a prompt ensemble. ``negative=None`` needs ``score="cosine"``.
        score: ``"softmax"`` over the prompt pair (cosines times the model's logit scale),
            ``"softmax_cosine"`` (raw cosines, CheXzero's protocol) or ``"cosine"``.
        text_batch_size: prompts per text-encoder forward when building the embedding cache.
        random_init: allow running without weights (tests, smoke runs).
        image_size: input side in pixels (default: the architecture's). The ViT's position
            embeddings are interpolated to the new patch grid (bicubic, as open_clip does when a
            size is forced); the saliency grid grows with it, the eval grid does not.
        trust_checkpoint: read a checkpoint that needs more than tensors with ``torch.jit.load`` /
            full unpickling, which runs code from the file (only for files you trust).
        **kwargs: ``ZeroShotModel`` options (normalize, fixed_threshold, score_threshold).
    """

    IMAGE_TOWER = "model.visual"
    #: the cascade of weight randomization (``models.randomization``), for open_clip's own ViT and timm's (BiomedCLIP)
    RANDOMIZATION_STAGES = (
        ("text", ("model.text", "model.transformer", "model.token_embedding", "model.positional_embedding", "model.ln_final",
                  "model.text_projection", "model.logit_scale", "model.logit_bias")),
        ("image head", ("model.visual.proj", "model.visual.ln_post", "model.visual.attn_pool", "model.visual.head",
                        "model.visual.trunk.norm", "model.visual.trunk.fc_norm", "model.visual.trunk.head")),
        ("image {}", ("model.visual.transformer.resblocks.*", "model.visual.trunk.blocks.*")),
        ("image stem", ("model.visual.conv1", "model.visual.class_embedding", "model.visual.positional_embedding",
                        "model.visual.ln_pre", "model.visual.trunk.patch_embed", "model.visual.trunk.cls_token",
                        "model.visual.trunk.pos_embed", "model.visual.trunk.norm_pre")),
    )
    #: fit's default: the text projection, and the temperature where the score reads it (``softmax``, in ``__init__``)
    TRAINABLE = (r"^model\.text_projection$", r"^model\.text\.proj\.")

    def __init__(
        self,
        architecture: str,
        checkpoint: str | None = None,
        text: str | None = None,
        positive: str | list[str] = "{}",
        negative: str | list[str] | None = "no {}",
        score: ScoreMode = "softmax",
        text_batch_size: PositiveInt = 256,
        random_init: bool = False,
        trust_checkpoint: bool = False,
        image_size: PositiveInt | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if score not in get_args(ScoreMode):
            raise ValueError(f"score must be one of {list(get_args(ScoreMode))}, got {score!r}")
        self.prompts = PromptSet(as_templates(positive), as_templates(negative))
        if score != "cosine" and not self.prompts.negative:
            raise ValueError(f"score={score!r} needs negative prompt template(s)")
        if checkpoint is None and not random_init:
            raise ValueError(f"{type(self).__name__}({architecture!r}) needs checkpoint=: {LOCAL_FILES_HINT}{RANDOM_INIT_HINT}")
        checkpoint_file = None if checkpoint is None else find_checkpoint(checkpoint)
        model_cfg, preprocess_cfg = read_architecture(architecture)
        if image_size is not None:
            model_cfg = force_image_size(model_cfg, image_size, architecture)
        self.score = score
        if score == "softmax":  # the other scores read raw cosines: logit_scale would get no gradient
            self.TRAINABLE = (*self.TRAINABLE, r"^model\.logit_scale$")
        self.tokenizer = self.make_tokenizer(model_cfg["text_cfg"], text, checkpoint)
        self.model = build_open_clip(model_cfg)
        check_patch_tokens(self.model.visual)
        if isinstance(self.model.visual, VisionTransformer):
            self.model.visual.output_tokens = True  # forward returns (pooled, unprojected tokens)
        if checkpoint_file is not None:
            state = read_state_dict(checkpoint_file, trust=trust_checkpoint)
            if image_size is not None:
                resize_position_embeddings(state, self.model)
            load_weights(self.model, state, str(checkpoint_file))
        else:
            self.warn_random_weights()
        self.preprocess = preprocess_for(self.model, preprocess_cfg)
        self.text_cache = TextEmbeddingCache(text_batch_size)
        self.eval()
        self.attach_explainer()

    def make_tokenizer(self, text_cfg: dict, text: str | None, checkpoint: str | None):
        context_length = text_cfg.get("context_length", 77)
        hf_name = text_cfg.get("hf_tokenizer_name") or text_cfg.get("hf_model_name")
        if not hf_name:
            return bundled_tokenizer(context_length)
        kwargs = {"context_length": context_length, **(text_cfg.get("tokenizer_kwargs") or {})}
        if text is None and checkpoint is None:  # random_init: a stand-in, through open_clip's own wrapper
            with tempfile.TemporaryDirectory() as folder:
                stand_in_tokenizer(hf_name).save_pretrained(folder)
                return self.stand_in("tokenizer", HFTokenizer(folder, **kwargs))
        if text is None and Path(checkpoint).is_dir():
            text = checkpoint
        refuse_download(text, "text")
        folder = None if text is None else Path(text).expanduser()
        if folder is None or not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise FileNotFoundError(
                f"the text tower needs the tokenizer of {hf_name!r} from a local folder (text=DIR) with "
                f"tokenizer_config.json and one of {list(TOKENIZER_FILES)}; got {text!r}")
        return HFTokenizer(str(folder), **kwargs)

    # -- encoders ------------------------------------------------------------------------------
    def encode_text(self, texts: list[str]) -> torch.Tensor:
        return self.model.encode_text(self.tokenizer(texts).to(self.device))

    def text_embeddings(self, classes: list[str]) -> torch.Tensor:
        """Unit text embeddings ``[C, P, D]`` (P = positive[, negative]), cached per (prompts, classes, device)."""
        return self.text_cache.get(self.prompts, classes, self.device, self.encode_text)

    def encode_image(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled image embedding ``[B, D]`` and projected patch embeddings ``[B, gh, gw, D]`` (unnormalised)."""
        visual = self.model.visual
        if isinstance(visual, TimmModel):
            trunk = visual.trunk
            tokens = trunk.forward_features(images)  # after the trunk's final norm
            pooled = visual.head(trunk.forward_head(tokens))
            patches = visual.head(trunk.fc_norm(tokens[:, trunk.num_prefix_tokens:]))
            grid = trunk.patch_embed.grid_size
        else:
            pooled, tokens = visual(images)
            if visual.final_ln_after_pool:  # this tower norms the pooled token only
                tokens = visual.ln_post(tokens)
            patches = tokens @ visual.proj
            grid = visual.grid_size
        return pooled, patches.reshape(patches.shape[0], *grid, patches.shape[-1])

    @torch.no_grad()
    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        text = self.text_embeddings(classes)
        pooled, patches = self.encode_image(images)
        with torch.autocast(images.device.type, enabled=False):  # similarities in float32 under mixed precision
            image = F.normalize(pooled.float(), dim=-1)
            similarity = torch.einsum("bd,cpd->bcp", image, text)
            if self.score == "softmax":
                scores = (self.model.logit_scale.float().exp() * similarity).softmax(dim=-1)[..., 0]
            elif self.score == "softmax_cosine":
                scores = similarity.softmax(dim=-1)[..., 0]
            else:
                scores = (similarity[..., 0] + 1) / 2
            saliency = torch.einsum("bhwd,cd->bchw", F.normalize(patches.float(), dim=-1), text[:, 0])
        return ZeroShotOutput(scores=scores, saliency=saliency)
