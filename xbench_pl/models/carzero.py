"""CARZero (Lai et al., CVPR 2024): cross-attention alignment for zero-shot chest X-ray findings, from local files only.

Architecture (``laihaoran/CARZero`` @ fa4e09cd, the zero-shot model their ``load_CARZero`` builds:
``CARZeroDQNWOSAGLMLP``), all in plain torch from the shared towers:

* Image: ViT-B/16 (timm ``Block``\\ s, LayerNorm eps 1e-6, exact GELU; ``ViTPatches``) at 224 px;
  after the final norm, the class token is the global image vector and the 14 x 14 patch tokens
  the local ones.
* Text: BioClinicalMPBERT (a BERT-base, vocabulary 28996, weights in the checkpoint; ``BertModel``).
  As their ``BertEncoder``: the last 4 hidden states; word pieces merged back into words (a word's
  pieces summed per layer, ``[CLS]`` the first word, ``[SEP]`` its own word, zero rows after it up
  to the 97 slots); words = sum over the 4 layers; sentence = mean over all 97 slots (zero rows
  included) summed over the 4 layers. No projection, no normalisation.
* Fusion: their ``TQN_Model`` without self-attention, i.e. ``QueryDecoder(self_attn=False)``: the
  decoder's final LayerNorm is applied once to queries and memory, 4 pre-norm cross-attention
  layers (d 768, 4 heads, FFN 1024, ReLU), the final norm, then ``mlp_head`` 768-1024-512-256-1.
* Score, as their zero-shot code (``get_dqn_similarities``): i2t = head(decode(query = each class's
  sentence vector, memory = [image CLS; 196 patches])); t2i = head(decode(query = the image CLS,
  memory = [sentence vector; 97 word slots], padding rows included, unmasked));
  ``logits = (i2t + t2i) / 2``, raw and unbounded (their loss is a batch-wise contrastive cross
  entropy, so it is a relative logit, not a calibrated probability). ``ZeroShotOutput.logits``
  carries it; ``scores = sigmoid(logits)``: monotone, so AUROC and AUPRC equal those of the raw
  score; the benchmark's F1 / Hamming threshold 0.5 is raw score 0.
* Saliency, as their ``get_grounding_map``: the i2t cross-attention of every layer, averaged over
  heads, without the image-CLS key, averaged over the 4 layers (``attn_layers``), row-major 14 x 14
  (they upsample it nearest x16; the benchmark warps the native grid itself).

Prompts: one per class, ``"There is {}"`` with their ChestX-ray14 spellings (``names`` in
``configs/carzero.json``: "Lung Nodule", "Pulmonary Mass", ...; other findings by their name),
cleaned as their ``process_text`` (split into sentences on ``.`` and ``N.``; ``\\w+`` words of the
lower-cased text; a sentence of <= 1 word is dropped; non-ASCII removed), tokenised by a local
``BertTokenizerFast`` folder (``text=DIR`` with BioClinicalMPBERT's ``vocab.txt``; their
``AutoTokenizer`` defaults: lower case) to 97 tokens (a ``random_init`` model without it: a stand-in
of that layout, ``stand_ins``). ``texts={finding: prompt}`` overrides.

Preprocessing as their test transform: grey, longest side to 256 (``INTER_AREA``), zero-padded to
256 x 256, centre crop 224, ``(x - 0.4978) / 0.2449`` on the three equal channels.

Weights: their released PyTorch Lightning checkpoint (``CARZero_best_model.ckpt``) as distributed:
read with ``torch.load(weights_only=True)``; the OmegaConf config and Lightning callback classes
its pickle references are allowed by name as inert stand-ins (``SAFE_GLOBALS``; neither package is
imported, nothing from the file runs). ``trust_checkpoint=True`` is the opt-in for a file that
needs more. The ``state_dict`` entry (``CARZero.`` prefix) goes through ``checkpoint_filter_fn``
(prefix and timm -> ``ViTPatches`` renames, ``attn.qkv`` split into query/key/value, the decoder
norm alias dropped after ``torch.equal``) and loads strictly; ``IGNORE_UNEXPECTED`` declares the
weights the zero-shot path never uses. No other file (such as their image pre-training checkpoint)
is needed. ``random_init`` weights come from a fixed seed (smoke runs only).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from jsonargparse.typing import PositiveInt
from torch import nn

from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.models.checkpoints import (CheckpointError, build_weights, drop_aliases, guess_layout, load_or_warn, load_weights,
                                          read_checkpoint, rename_prefix)
from xbench_pl.models.layers import BertModel, QueryDecoder, ViTPatches, without_trailing_padding
from xbench_pl.models.local_files import (bert_config, checkpoint_file, local_folder, preprocess_from, read_architecture,
                                          sized_architecture)
from xbench_pl.models.prompts import EmbeddingCache
from xbench_pl.models.randomization import image_tower_stages

PREFIX = "CARZero."
ARCHITECTURE_KEYS = ("image", "text", "decoder", "head", "prompt", "preprocess")
CHECKPOINT_HINT = ("a local CARZero checkpoint: the authors' released PyTorch Lightning file CARZero_best_model.ckpt "
                   "(a dict with 'state_dict' of 'CARZero.*' keys)")
TEXT_HINT = ("the BioClinicalMPBERT tokenizer from a local folder (text=DIR) holding vocab.txt of the Hugging "
             "Face model Laihaoran/BioClinicalMPBERT")

# globals the released Lightning file pickles besides tensors: allowed by name, as inert stand-ins
SAFE_GLOBALS = (
    "__builtin__.dict", "__builtin__.list", "__builtin__.long", "collections.defaultdict", "typing.Any",
    "omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig", "omegaconf.nodes.AnyNode",
    "omegaconf.base.Metadata", "omegaconf.base.ContainerMetadata",
    "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
    "pytorch_lightning.callbacks.early_stopping.EarlyStopping",
)

# the authors' timm ViT names (after ``img_encoder.model.``) -> ViTPatches names (after ``image.``)
VIT_RENAMES = (
    (r"^cls_token$", "embeddings.cls_token"),
    (r"^pos_embed$", "embeddings.position_embeddings"),
    (r"^patch_embed\.proj\.", "embeddings.patch_embeddings.projection."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layer.\1.layernorm_before."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layer.\1.layernorm_after."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layer.\1.attention.output.dense."),
    (r"^blocks\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^blocks\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
    (r"^norm\.", "layernorm."),
)
QKV = re.compile(r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")
# module prefixes of the authors' model -> this model's
PREFIXES = (("text_encoder.model.", "text."), ("fusion_module.decoder.", "decoder."), ("fusion_module.mlp_head.", "mlp_head."))


def rename_vit(key: str) -> str:
    for pattern, replacement in VIT_RENAMES:
        new, count = re.subn(pattern, replacement, key)
        if count:
            return new
    return key


def checkpoint_filter_fn(checkpoint: object, model: "CARZero", source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The released Lightning checkpoint (or its bare ``state_dict``) -> this model's state dict keys."""
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else checkpoint
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        found = sorted(map(str, checkpoint))[:12] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(f"checkpoint {source} is not a CARZero checkpoint: it holds no state dict of tensors "
                              f"(found {found}); expected {CHECKPOINT_HINT}")
    foreign = sorted(k for k in state if not k.startswith(PREFIX))
    if foreign:
        raise CheckpointError(f"checkpoint {source} is not a CARZero checkpoint: {len(foreign)} of its {len(state)} keys lack "
                              f"the '{PREFIX}' prefix of the authors' Lightning module (e.g. {foreign[:4]})"
                              f"{guess_layout(foreign)}; expected {CHECKPOINT_HINT}")
    state = {k[len(PREFIX):]: v for k, v in state.items()}
    state = drop_aliases(state, model.ALIASES, source)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith("img_encoder.model."):
            inner = key[len("img_encoder.model."):]
            qkv = QKV.match(inner)
            if qkv:  # timm's packed [q; k; v] -> three projections
                if value.shape[0] % 3:
                    raise CheckpointError(f"checkpoint {source}: {key} has {value.shape[0]} rows, not q, k, v of equal size")
                for name, part in zip(("query", "key", "value"), value.chunk(3, dim=0)):
                    out[f"image.encoder.layer.{qkv.group(1)}.attention.attention.{name}.{qkv.group(2)}"] = part
                continue
            out["image." + rename_vit(inner)] = value
            continue
        out[rename_prefix(key, PREFIXES)] = value
    return out


# -- text, as the authors' process_text and BertEncoder ----------------------------------------
def clean_caption(text: str) -> str:
    """Their ``process_text`` before tokenising: sentences split on ``N.`` and ``.``, ``\\w+`` words of
    the lower-cased sentence, sentences of at most one word dropped, non-ASCII removed, joined by spaces."""
    text = text.replace("\n", " ")
    sentences = [sentence for point in re.split(r"[0-9]+\.", text) for sentence in point.split(".")]
    kept = []
    for sentence in sentences:
        words = re.findall(r"\w+", sentence.replace("\ufffd\ufffd", " ").lower())
        if len(words) <= 1:
            continue
        words = [w.encode("ascii", "ignore").decode("ascii") for w in words]
        kept.append(" ".join(w for w in words if w))
    return " ".join(kept)


def word_groups(tokens: list[str]) -> tuple[list[list[int]], list[str]]:
    """Token positions of each word and the words, as their ``aggregate_tokens``: a token not
    starting with ``##`` closes the open word and opens a new one, ``##`` pieces join the open word;
    at ``[SEP]`` the open word is closed and ``[SEP]`` is a word of its own; nothing after it counts."""
    groups: list[list[int]] = []
    words: list[str] = []
    current: list[int] = []
    pieces: list[str] = []
    for position, token in enumerate(tokens):
        if token == "[SEP]":
            if not current:
                break
            groups += [current, [position]]
            words += ["".join(pieces), token]
            return groups, words
        if token.startswith("##"):
            current.append(position)
            pieces.append(token[2:])
        else:
            if current:
                groups.append(current)
                words.append("".join(pieces))
            current, pieces = [position], [token]
    raise ValueError(f"tokenised caption {tokens[:8]}... has no [SEP] after a first token: not a BERT tokenizer's output")


class CARZero(ZeroShotModel):
    """CARZero; see the module docstring.

    Args:
        architecture: shipped config name (``carzero``) or a JSON file.
        checkpoint: the authors' released Lightning checkpoint (required unless ``random_init``).
        text: local folder with BioClinicalMPBERT's ``vocab.txt``; required unless ``random_init`` without a
            checkpoint (a stand-in tokenizer).
        random_init: allow running without weights (smoke tests; reports say so).
        trust_checkpoint: read a checkpoint that needs more than tensors and the allowed inert
            classes with full unpickling (runs code from the file: only for files you trust).
        texts: ``{finding: prompt}`` overriding the ``"There is {}"`` prompts.
        image_size: input size; only the trained 224 px (``INPUT_SIZES``), any other is refused.
        **kwargs: ``ZeroShotModel`` options (normalize, fixed_threshold, score_threshold).
    """

    IGNORE_UNEXPECTED = (
        r"^decoder\.layers\.\d+\.self_attn\.",   # built by their decoder layer, never called (commented out)
        r"^decoder\.layers\.\d+\.norm1\.",       # the self-attention's norm, never called either
        r"^fusion_module\.logit_scale$",         # training-only temperature
        r"^text\.pooler\.",                      # BertModel's pooler: the encoder uses hidden states only
    )
    # duplicate key prefix -> prefix of the twin kept (TQN passes decoder_norm to the decoder as its norm)
    ALIASES = {"fusion_module.decoder_norm.": "fusion_module.decoder.norm."}
    SAFE_GLOBALS = SAFE_GLOBALS
    TRAINABLE = (r"^mlp_head\.",)  # fit: the score head (its text embeddings are computed without gradients)
    INPUT_SIZES = {224: "carzero"}
    IMAGE_TOWER = "image"
    #: the cascade of weight randomization (``models.randomization``)
    RANDOMIZATION_STAGES = (("decoder", ("mlp_head", "decoder")), ("text", ("text",)),
                            ("image head", ("image.layernorm",)), *image_tower_stages("image"))
    EXPLAINER_TARGET = "logits"  # its raw (i2t + t2i) / 2

    def __init__(
        self,
        architecture: str = "carzero",
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
        weights = checkpoint_file(checkpoint, random_init, f"CARZero({architecture!r})", CHECKPOINT_HINT)
        config, base = read_architecture(architecture, ARCHITECTURE_KEYS, "CARZero")
        self.architecture = architecture
        self.trust_checkpoint = trust_checkpoint
        self.max_length = int(config["text"].get("max_length", 97))
        self.last_layers = int(config["text"].get("last_layers", 4))
        self.prompt = str(config["prompt"])
        self.names = dict(config.get("names", {}))
        self.texts = dict(texts or {})
        self.attn_layers = list(config.get("attn_layers", [-4, -3, -2, -1]))
        self.tokenizer = self.tokenizer_or_stand_in(text, weights, lambda: load_tokenizer(text), config["text"]["bert"])
        build_weights(lambda: self.build(config, base), random_init=weights is None)
        self.text.check_tokenizer(self.tokenizer, f"text folder {text}", f"wrong text folder? It needs {TEXT_HINT}")
        if self.last_layers > len(self.text.encoder.layer) + 1:
            raise ValueError(f"architecture {architecture!r}: last_layers {self.last_layers} > the BERT's hidden states")
        self.preprocess = preprocess_from(config)
        self._text_cache = EmbeddingCache()
        load_or_warn(self, weights)
        self.attach_explainer()

    def build(self, config: dict, base: Path) -> None:
        self.image = ViTPatches(**config["image"])
        self.text = BertModel(**{**bert_config(config["text"]["bert"], base), "add_pooling_layer": False})
        self.decoder = QueryDecoder(**config["decoder"])
        widths = [config["decoder"]["d_model"], *config["head"]]
        dropout = float(config["decoder"].get("dropout", 0.1))
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(nn.Linear(fan_in, fan_out))
            if i < len(widths) - 2:
                layers += [nn.ReLU(), nn.Dropout(dropout)]
        self.mlp_head = nn.Sequential(*layers)  # Linear ReLU Dropout ... Linear: keys 0, 3, 6, 9 as theirs

    # -- weights -------------------------------------------------------------------------------
    def load_checkpoint(self, path: Path) -> None:
        checkpoint = read_checkpoint(path, trust=self.trust_checkpoint, safe_globals=self.SAFE_GLOBALS)
        state = checkpoint_filter_fn(checkpoint, self, str(path))
        load_weights(self, state, str(path), self.IGNORE_UNEXPECTED)  # ZeroShotModel.load_state_dict clears the caches

    # -- text ----------------------------------------------------------------------------------
    def prompt_for(self, finding: str) -> str:
        return self.texts.get(finding) or self.prompt.format(self.names.get(finding, finding))

    def tokenize(self, prompts: list[str] | tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Token ids and mask of the cleaned captions, as their tokenizer call (97 tokens, padded)."""
        return self.tokenizer([clean_caption(p) for p in prompts], truncation=True, padding="max_length",
                              max_length=self.max_length, return_tensors="pt")

    def encode_text(self, prompts: list[str] | tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
        """``(sentences [C, D], words [C, max_length, D], merged words)`` as their ``BertEncoder``."""
        tokens = self.tokenize(prompts)
        ids = tokens["input_ids"].to(self.device)
        # nothing after a caption's [SEP] counts (word_groups): BERT runs on the columns up to the last one
        states = self.text.hidden_states(*without_trailing_padding(ids, tokens["attention_mask"].to(self.device)))
        layers = torch.stack(states[-self.last_layers:]).permute(1, 2, 0, 3)  # [C, T', layers, D]
        merged, all_words = [], []
        for caption, token_ids in zip(layers, ids.tolist()):
            groups, words = word_groups(self.tokenizer.convert_ids_to_tokens(token_ids))
            rows = torch.stack([torch.stack([caption[i] for i in group]).sum(dim=0) for group in groups])
            merged.append(torch.cat([rows, rows.new_zeros(ids.shape[1] - rows.shape[0], *rows.shape[1:])]))  # to T again
            all_words.append(words)
        embeddings = torch.stack(merged).permute(0, 2, 1, 3)  # [C, layers, T, D]
        sentences = embeddings.mean(dim=2).sum(dim=1)
        return sentences, embeddings.sum(dim=1), all_words

    @torch.no_grad()
    def text_embeddings(self, prompts: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached ``(sentences [C, D], text memory [C, 1 + max_length, D])`` per (prompts, device)."""
        def encode() -> tuple[torch.Tensor, torch.Tensor]:
            with torch.autocast(self.device.type, enabled=False):
                sentences, words, _ = self.encode_text(prompts)
            return sentences.float(), torch.cat([sentences[:, None], words], dim=1).float()

        return self._text_cache.get_or_compute(tuple(prompts), self.device, encode)

    # -- inference -----------------------------------------------------------------------------
    def head(self, decoded: torch.Tensor) -> torch.Tensor:
        return self.mlp_head(decoded)[..., 0]

    def similarities(self, images: torch.Tensor, prompts: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """``i2t``, ``t2i``, ``logits = (i2t + t2i) / 2`` (each ``[B, C]``) and the i2t cross-attention
        ``attn [L, B, C, 1 + N]`` (key 0: the image CLS), as their ``get_dqn_similarities``."""
        sentences, text_memory = self.text_embeddings(prompts)
        image = self.image.forward_features(images)  # [B, 1 + N, D]: CLS, then the patches
        decoded, attn = self.decoder(sentences.to(image.dtype), image)
        i2t = self.head(decoded)  # [B, C]
        decoded_t2i, _ = self.decoder(image[:, 0], text_memory.to(image.dtype))  # queries: the B images
        t2i = self.head(decoded_t2i).transpose(0, 1)  # [C, B] -> [B, C]
        return {"i2t": i2t, "t2i": t2i, "logits": (i2t + t2i) / 2, "attn": attn}

    @torch.no_grad()
    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        out = self.similarities(images, tuple(self.prompt_for(c) for c in classes))
        logits = out["logits"].float()
        attn = out["attn"].float()
        total = attn[self.attn_layers[0]]
        for layer in self.attn_layers[1:]:
            total = total + attn[layer]
        maps = self.decoder_maps(total / len(self.attn_layers), classes, self.image.embeddings.grid)
        return ZeroShotOutput(scores=torch.sigmoid(logits), saliency=maps, logits=logits)

    def decoder_maps(self, per_query: torch.Tensor, classes: list[str], grid: tuple[int, int]) -> torch.Tensor:
        """``[B, C, 1 + N]`` over the i2t decoder's image tokens -> ``[B, C, h, w]``: the image-CLS key dropped."""
        return per_query[..., 1:].unflatten(-1, grid)


# -- local files only --------------------------------------------------------------------------
def load_tokenizer(folder: str | None):
    """BioClinicalMPBERT's tokenizer from a local folder, as their ``AutoTokenizer`` gives it
    (``BertTokenizerFast``, default lower casing)."""
    path = local_folder(folder, "text", TEXT_HINT, "CARZero's text encoder", [("vocab.txt", "tokenizer.json")])
    import transformers

    return transformers.BertTokenizerFast.from_pretrained(str(path), local_files_only=True)
