"""BioViL (Boecking et al., ECCV 2022) and BioViL-T (Bannur et al., CVPR 2023), from local files only.

Architecture (``microsoft/hi-ml`` @ b67c1d27, hi-ml-multimodal 0.2.2, ``health_multimodal``), one class for
both variants; the variant is data (``configs/biovil.json``, ``configs/biovil_t.json``):

* Image (their ``ImageModel``): torchvision ResNet-50 to ``layer4`` (stride 32, no dilation; ``ResNetPatches``),
  then a 1 x 1-conv projector ``Conv(no bias) -> BatchNorm -> ReLU -> Conv`` to the 128-wide joint space, per
  patch. BioViL-T (their ``MultiImageEncoder``) first maps the 2048 channels to 256 (``backbone_to_vit``)
  and, in single-image mode (no prior image, as here), concatenates its learned ``missing_previous_emb``
  in place of the temporal difference features: its transformer (``vit_pooler``) is never called
  without a prior image, so it is not built (its keys are declared unused). Global image embedding:
  the mean of the projected patch embeddings.
* Text: CXR-BERT (``layers.cxr_bert.CXRBert``): BERT, the last layer's ``[CLS]`` state through their
  projection head (dense, GELU, LayerNorm, dense) to 128. Built from the ``config.json`` of a local hub
  folder; the tokenizer is that folder's WordPiece vocabulary (CXR-BERT's own: special-token ids come
  from its files). As their ``TextInput``: trailing ``!?.`` stripped, special tokens refused, padded
  to the longest prompt, longer than the position embeddings refused.

Scores (a protocol choice, not the authors'; their code gives cosines only): CheXzero's pair,
``p = exp(s_pos) / (exp(s_pos) + exp(s_neg))`` of the cosines between the unit global image embedding
and the unit text embeddings of ``"{}"`` and ``"no {}"`` (``positive``/``negative``, any templates;
several templates of one polarity are averaged after normalising, ``prompts.TextEmbeddingCache``,
where their ``get_similarity_score_from_raw_data`` averages before: the same for one template).
A class name that is no finding is embedded as it is (phrase grounding).

Saliency: their ``_get_similarity_map_from_embeddings``: per patch, the cosine of the unit projected
patch embedding with the unit text embedding of the positive prompt, smoothed by
``scipy.ndimage.gaussian_filter`` (sigma 1.5, truncate 4: radius 6, mode ``reflect``, i.e. the edge
sample repeated, ``d c b a | a b c d``; torch's ``reflect`` is scipy's ``mirror``), here as two
float64 matrices built for the grid (one float32 rounding between the axes, as scipy's float32 output).
The map is theirs before their resize to the image (15 x 15 at 480 px, 14 x 14 at 448 px).

Preprocessing as their ``create_chest_xray_transform_for_inference``: the short side resized to 512
(bilinear, antialiased as PIL), centre crop 480 (BioViL) / 448 (BioViL-T), grey on three channels, no
mean/std. Deviations: their loader min-max scales each image to uint8 and PIL resizes in uint8; here
the decoded [0, 1] image is resized in float (no min-max: an 8-bit image spanning 0..255 is already
so; ``ImageStore`` windows DICOMs to [0, 1]).

Weights: ``checkpoint`` is the released image state dict (``biovil_image_resnet50_proj_size_128.pt`` of
``microsoft/BiomedVLP-CXR-BERT-specialized``, ``biovil_t_image_model_proj_size_128.pt`` of
``microsoft/BiomedVLP-BioViL-T``), read with ``weights_only=True`` and loaded strictly after
``checkpoint_filter_fn``; ``text`` the local hub folder (``config.json``, ``vocab.txt``, tokenizer
files, ``pytorch_model.bin`` or ``model.safetensors``; its MLM head is declared unused). No remote
code runs, nothing downloads. ``random_init`` draws the weights from a fixed seed; without a text folder
the text config is the shipped copy (``configs/hf/<hub folder>/config.json``) and the tokenizer a stand-in of
CXR-BERT's layout (``stand_ins``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from jsonargparse.typing import PositiveInt
from torch import nn

from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.models.checkpoints import CheckpointError, build_weights, guess_layout, load_weights, read_checkpoint, rename_prefix
from xbench_pl.models.layers import ResNetPatches
from xbench_pl.models.layers.cxr_bert import CXRBert
from xbench_pl.models.local_files import (bert_config, checkpoint_file, local_folder, preprocess_from, read_architecture,
                                          weights_in)
from xbench_pl.models.prompts import PromptSet, TextEmbeddingCache, as_templates
from xbench_pl.models.randomization import image_tower_stages
from xbench_pl.models.stand_ins import stand_in_tokenizer

ARCHITECTURE_KEYS = ("image", "text", "smoothing", "preprocess")
CHECKPOINT_HINT = ("a local BioViL image state dict: biovil_image_resnet50_proj_size_128.pt (BioViL, from "
                   "microsoft/BiomedVLP-CXR-BERT-specialized) or biovil_t_image_model_proj_size_128.pt (BioViL-T, from "
                   "microsoft/BiomedVLP-BioViL-T)")
TEXT_HINT = ("a local copy of the hub folder {} (text=DIR): config.json, vocab.txt, tokenizer_config.json, "
             "special_tokens_map.json and pytorch_model.bin or model.safetensors")

# the authors' ImageModel names -> this model's ``visual`` names
IMAGE_RENAMES = (("encoder.encoder.", "trunk."), ("encoder.backbone_to_vit.", "backbone_to_vit."),
                 ("encoder.missing_previous_emb", "missing_previous_emb"), ("projector.model.", "projector."))
TEMPORAL_SENTINEL = "encoder.vit_pooler."  # only BioViL-T's image file holds its transformer


def checkpoint_filter_fn(state: object, model: "BioViLImage", source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The released image state dict -> ``BioViLImage`` keys (the model is only read for its variant)."""
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        found = sorted(map(str, state))[:8] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint {source} is not a BioViL image state dict (found {found}); expected {CHECKPOINT_HINT}")
    if "projector.model.0.weight" not in state:
        keys = sorted(state)
        raise CheckpointError(f"checkpoint {source} is not a BioViL image state dict: no projector.model.0.weight among its "
                              f"{len(keys)} keys (e.g. {keys[:4]}){guess_layout(keys)}; expected {CHECKPOINT_HINT}")
    temporal = any(k.startswith(TEMPORAL_SENTINEL) for k in state)
    if temporal != model.temporal:
        given, wanted = ("BioViL-T", "BioViL") if temporal else ("BioViL", "BioViL-T")
        raise CheckpointError(f"checkpoint {source} is a {given} image state dict, this model is {wanted}: use "
                              f"--model {'biovil_t' if temporal else 'biovil'} (or its architecture)")
    return {rename_image_key(key): value for key, value in state.items()}


def rename_image_key(key: str) -> str:
    return rename_prefix(key, IMAGE_RENAMES)


# -- image -------------------------------------------------------------------------------------
class BioViLImage(nn.Module):
    """Their ``ImageModel`` on one image: ``forward(images) -> projected patch embeddings [B, joint, h, w]``.

    ``temporal_width``: BioViL-T's ``backbone_to_vit`` width (its single-image features are those
    ``temporal_width`` channels and ``missing_previous_emb``); ``None``: BioViL."""

    def __init__(self, joint: int = 128, temporal_width: int | None = None):
        super().__init__()
        self.trunk = ResNetPatches(stage=4)
        self.temporal = temporal_width is not None
        width = self.trunk.channels
        if self.temporal:
            self.backbone_to_vit = nn.Conv2d(width, temporal_width, kernel_size=1, bias=False)
            self.missing_previous_emb = nn.Parameter(torch.zeros(1, temporal_width, 1, 1))
            nn.init.trunc_normal_(self.missing_previous_emb, std=0.02)
            width = 2 * temporal_width
        self.projector = nn.Sequential(nn.Conv2d(width, joint, kernel_size=1, bias=False), nn.BatchNorm2d(joint), nn.ReLU(),
                                       nn.Conv2d(joint, joint, kernel_size=1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens, grid = self.trunk(images)
        x = tokens.transpose(1, 2).unflatten(-1, grid)  # [B, 2048, h, w]
        if self.temporal:
            x = self.backbone_to_vit(x)
            x = torch.cat([x, self.missing_previous_emb.expand(x.shape[0], -1, *x.shape[2:])], dim=1)
        return self.projector(x)


# -- the similarity map's smoothing ------------------------------------------------------------------
@lru_cache(maxsize=16)
@torch.inference_mode(False)  # cached across runs: a normal tensor, which a later explainer's autograd can save
def gaussian_matrix(n: int, sigma: float, truncate: float) -> torch.Tensor:
    """``[n, n]`` float64 ``K`` with ``K @ x`` = ``scipy.ndimage.gaussian_filter1d(x, sigma, axis=0, mode="reflect",
    truncate=truncate)``: scipy's kernel (radius ``int(truncate * sigma + 0.5)``, normalised) with each tap
    beyond an edge folded back onto the sample it reflects to (period ``2n``: ``-1 -> 0``, ``n -> n - 1``)."""
    radius = int(truncate * sigma + 0.5)
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    weights = torch.exp(-0.5 * offsets.square() / sigma**2)
    weights = weights / weights.sum()
    matrix = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for offset, weight in zip(range(-radius, radius + 1), weights):
            j = (i + offset) % (2 * n)
            matrix[i, j if j < n else 2 * n - 1 - j] += weight
    return matrix


def smooth(maps: torch.Tensor, sigma: float, truncate: float) -> torch.Tensor:
    """``scipy.ndimage.gaussian_filter(map, sigma, mode="reflect")`` of each ``[h, w]`` map of ``maps [..., h, w]``
    (float32 in and out, float64 inside, rounded to float32 between the two axes as scipy's float32 output)."""
    rows = gaussian_matrix(maps.shape[-2], float(sigma), float(truncate)).to(maps.device)
    cols = gaussian_matrix(maps.shape[-1], float(sigma), float(truncate)).to(maps.device)
    along_rows = (rows @ maps.double()).float()
    return (along_rows.double() @ cols.T).float()


# -- the model ---------------------------------------------------------------------------------------
class BioViL(ZeroShotModel):
    """BioViL / BioViL-T; see the module docstring.

    Args:
        architecture: shipped config name (``biovil``, ``biovil_t``) or a JSON file.
        checkpoint: the released image state dict (``.pt``; required unless ``random_init``).
        text: local hub folder of the text model (config, vocabulary and weights); required unless
            ``random_init`` without a checkpoint (the shipped config and a stand-in tokenizer).
        positive, negative: prompt template(s) per polarity (``{}`` = the finding or phrase); a list is an
            ensemble. Default: CheXzero's ``"{}"`` / ``"no {}"``.
        text_batch_size: prompts per text forward when filling the embedding cache.
        random_init: allow running without weights (smoke tests; reports say so).
        image_size: input side; only the variant's own (480 / 448) is accepted.
        **kwargs: ``ZeroShotModel`` options.
    """

    IGNORE_UNEXPECTED_IMAGE = (r"^trunk\.fc\.", r"^encoder\.vit_pooler\.")  # classifier; BioViL-T's two-image transformer
    IGNORE_UNEXPECTED_TEXT = (r"^cls\.predictions\.",)  # the masked-language-model head
    TRAINABLE = (r"^text\.cls_projection_head\.",)  # fit: the text projection
    IMAGE_TOWER = "visual.trunk"
    #: the cascade of weight randomization (``models.randomization``)
    RANDOMIZATION_STAGES = (("text", ("text",)),
                            ("image head", ("visual.projector", "visual.backbone_to_vit", "visual.missing_previous_emb")),
                            *image_tower_stages("visual.trunk"))

    def __init__(
        self,
        architecture: str = "biovil",
        checkpoint: str | None = None,
        text: str | None = None,
        positive: str | list[str] = "{}",
        negative: str | list[str] = "no {}",
        text_batch_size: PositiveInt = 256,
        random_init: bool = False,
        image_size: PositiveInt | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        config, base = read_architecture(architecture, ARCHITECTURE_KEYS, "BioViL")
        size = int(config["preprocess"]["size"])
        if image_size is not None and image_size != size:
            raise ValueError(f"BioViL({architecture!r}) cannot run at image_size={image_size}: it takes {size} px only (its "
                             "transform's centre crop); the eval grid is the same at any input size")
        self.prompts = PromptSet(as_templates(positive), as_templates(negative))
        if not self.prompts.negative:
            raise ValueError("BioViL scores the positive against the negative prompt: negative needs template(s)")
        weights = checkpoint_file(checkpoint, random_init, f"BioViL({architecture!r})", CHECKPOINT_HINT)
        self.text_hint = TEXT_HINT.format(config["text"])
        self.architecture = architecture
        self.sigma, self.truncate = float(config["smoothing"]["sigma"]), float(config["smoothing"]["truncate"])
        if text is None and weights is None:
            folder = text_weights = None
            self.tokenizer = self.stand_in("tokenizer", stand_in_tokenizer(config["text"]))
            text_config = bert_config(f"hf/{config['text']}", base)
        else:
            folder = local_folder(text, "text", self.text_hint, f"BioViL({architecture!r})", [("config.json",), ("vocab.txt",)])
            text_weights = None if weights is None else weights_in(folder, "text", self.text_hint)
            self.tokenizer = load_tokenizer(folder)
            text_config = bert_config(str(folder), base)
        build_weights(lambda: self.build(config, text_config), random_init=weights is None)
        self.text.bert.check_tokenizer(self.tokenizer, f"text folder {folder}", "its vocab.txt does not fit its config.json")
        self.preprocess = preprocess_from(config)
        self.text_cache = TextEmbeddingCache(text_batch_size)
        if weights is None:
            self.warn_random_weights()
        else:
            self.load_checkpoint(weights, text_weights)
        self.eval()
        self.attach_explainer()

    def build(self, config: dict, text_config: dict) -> None:
        self.visual = BioViLImage(**config["image"])
        self.text = CXRBert(**text_config)
        if self.text.cls_projection_head.dense_to_output.out_features != config["image"]["joint"]:
            raise ValueError(f"text folder config.json: projection_size {self.text.cls_projection_head.dense_to_output.out_features} "
                             f"!= the image's joint size {config['image']['joint']}: not this model's text folder")

    # -- weights -------------------------------------------------------------------------------
    def load_checkpoint(self, image_path: Path, text_path: Path) -> None:
        state = checkpoint_filter_fn(read_checkpoint(image_path), self.visual, str(image_path))
        load_weights(self.visual, state, str(image_path), self.IGNORE_UNEXPECTED_IMAGE)
        text_state = read_checkpoint(text_path)
        if not isinstance(text_state, dict) or not any(str(k).startswith("bert.") for k in text_state):
            raise CheckpointError(f"text weights {text_path} are not a CXR-BERT state dict (no bert.* keys); expected {self.text_hint}")
        load_weights(self.text, text_state, str(text_path), self.IGNORE_UNEXPECTED_TEXT)
        self.text_cache.clear()

    # -- text ----------------------------------------------------------------------------------
    def tokenize(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """As their ``TextInput.tokenize_input_prompts``: trailing ``!?.`` stripped, special tokens, longest padding."""
        specials = [t for t in self.tokenizer.all_special_tokens if t != self.tokenizer.mask_token]
        for prompt in prompts:
            if any(token in prompt for token in specials):
                raise ValueError(f"prompt {prompt!r} contains a special token of the tokenizer ({specials})")
        tokens = self.tokenizer([p.rstrip("!?.") for p in prompts], add_special_tokens=True, padding="longest", return_tensors="pt")
        limit = self.text.bert.embeddings.position_embeddings.num_embeddings
        if tokens["input_ids"].shape[1] > limit:
            raise ValueError(f"a prompt of {tokens['input_ids'].shape[1]} tokens is longer than the text model's {limit} positions")
        return tokens

    def encode_text(self, prompts: list[str]) -> torch.Tensor:
        """Projected ``[CLS]`` embeddings ``[N, joint]``, unnormalised."""
        tokens = self.tokenize(prompts)
        return self.text(tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device))

    def text_embeddings(self, classes: list[str]) -> torch.Tensor:
        """Unit text embeddings ``[C, 2, joint]`` (positive, negative), cached per (prompts, classes, device)."""
        return self.text_cache.get(self.prompts, classes, self.device, self.encode_text)

    # -- inference -----------------------------------------------------------------------------
    @torch.no_grad()
    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        text = self.text_embeddings(classes)
        patches = self.visual(images)
        with torch.autocast(images.device.type, enabled=False):  # similarities in float32 under mixed precision
            patches = patches.float()
            image = F.normalize(patches.mean(dim=(2, 3)), dim=-1)
            scores = torch.einsum("bd,cpd->bcp", image, text).softmax(dim=-1)[..., 0]
            cosines = torch.einsum("bdhw,cd->bchw", F.normalize(patches, dim=1), text[:, 0])
            saliency = smooth(cosines, self.sigma, self.truncate)
        return ZeroShotOutput(scores=scores, saliency=saliency)


# -- local files only --------------------------------------------------------------------------
def load_tokenizer(folder: Path):
    """The folder's WordPiece tokenizer (their ``CXRBertTokenizer`` is a ``BertTokenizer`` with its defaults)."""
    import transformers

    return transformers.BertTokenizerFast.from_pretrained(str(folder), local_files_only=True)
