"""KAD (Zhang et al., Nat. Commun. 2023): knowledge-enhanced query decoding, from local files only.

Architecture (``xiaoman-zhang/KAD`` @ 591d999e, ``A3_CLIP/models/clip_tqn.py``,
``transformer_decoder.py``): a ResNet-50 trunk (to layer3 at 224 px -> 14 x 14 tokens of 1024
channels; to layer4 at 512 / 1024 px -> 16 x 16 / 32 x 32 tokens of 2048 channels), each token
through ``Linear(C, C) -> ReLU -> Linear(C, 768)``; the Med-KEBERT text encoder (a BERT-base
with pooler, weights in the checkpoint) whose ``pooler_output`` goes through ``Linear -> GELU ->
Linear`` to one query per finding; a 4-layer, 4-head, pre-norm DETR decoder (d 768, FFN 1024,
queries self-attend, no positional encodings) whose final LayerNorm is also applied once to the
queries and to the image tokens before the first layer; a ``Linear(768, 2)`` head per query.
The variants differ only in data (``xbench_pl/models/configs/kad-{224,512,1024}.json``).

Weights: the released ``best_valid.pt`` as distributed, read with ``weights_only=True``: a dict
``{model, image_encoder, text_encoder, optimizer, lr_scheduler, config, epoch}``. The three
state dicts are merged with prefixes ``""``, ``image.``, ``text.``; the rest is training-only
and ignored. The authors' modules register the ResNet twice (``resnet.*`` and the
``res_features.*`` Sequential over the same tensors) and the decoder norm twice
(``decoder.norm`` and ``decoder_norm``): each duplicate is dropped only after ``torch.equal``
confirms it copies its twin. Declared unused keys: the classifier ``resnet.fc``, at 224 px the
unused ``resnet.layer4``, the two training-only ``logit_scale`` and BERT's ``position_ids``
(checked equal to ``arange``). Everything else loads strictly: missing, unexpected and
mis-shaped keys are listed, with a hint when the file is another variant's. The checkpoint's
``config.img_res`` (when present) must equal the architecture's input size (512 and 1024
checkpoints have identical shapes; only that entry tells them apart).

Text: tokenised from a local Med-KEBERT tokenizer folder (``text=DIR`` with ``vocab.txt``)
as the authors' test scripts call it (lower case, special tokens, max length 256), with
explicit ``padding="max_length", truncation=True`` (``transformers`` 5 ignores their
``pad_to_max_length=True``). ``random_init`` weights are drawn from a fixed seed, so every rank
and every run builds the same smoke-test model; without a text folder it tokenises with a
stand-in of Med-KEBERT's layout (``stand_ins``), and says so.

Queries: KAD scores plain finding names decoded together, and a finding's score depends on the
other names decoded with it (self-attention). ``query_set="authors"`` (default) decodes the
authors' ChestX-ray14 evaluation set in their order and spelling (``test_chestxray14.py``:
"lung mass", "pleural thicken", ...) plus any requested finding not in it, appended in request
order; ``"requested"`` decodes exactly the requested findings. Canonical finding names map to
the authors' texts in ``configs/kad_texts.yaml`` (other findings: the lower-cased name), and
``texts={finding: text}`` overrides them. Query embeddings are cached per (texts, device).

Score: ``softmax(head)[..., 1]``. Saliency: the last decoder layer's cross-attention averaged
over heads (rows sum to 1 over the patches), reshaped row-major to the native grid, as their
``plot_visualize_512.py`` does. Preprocessing as their test scripts: bicubic resize of the
whole image (PIL, antialiased) to the input size, ImageNet mean/std.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

import torch
import yaml
from jsonargparse.typing import PositiveInt
from torch import nn

from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.models.checkpoints import (CheckpointError, build_weights, drop_aliases, load_or_warn, load_weights, merge_parts,
                                          read_checkpoint, rename_prefix)
from xbench_pl.models.layers import BertQueryEncoder, QueryDecoder, ResNetPatches, ViTPatches
from xbench_pl.models.local_files import (bert_config, checkpoint_file, local_folder, preprocess_from, read_architecture,
                                          resolve_file, sized_architecture)
from xbench_pl.models.prompts import EmbeddingCache
from xbench_pl.models.randomization import image_tower_stages

TEXT_HINT = ("the Med-KEBERT tokenizer files from a local folder (text=DIR): vocab.txt (required), "
             "tokenizer_config.json and special_tokens_map.json of the Hugging Face model xmcmic/Med-KEBERT")
CHECKPOINT_HINT = ("a local KAD-style checkpoint file (KAD's released KAD_Models/KAD_512/best_valid.pt, "
                   "KAD_1024/best_valid.pt, or a 224 px one): a dict {model, image_encoder, text_encoder, ...}")

# the checkpoint's three state dicts -> key prefixes of this model (the rest is training-only)
PARTS = {"image_encoder": "image.", "text_encoder": "text.", "model": ""}
# the authors' res_features Sequential indices -> torchvision ResNet names
RESNET_CHILDREN = {0: "conv1", 1: "bn1", 4: "layer1", 5: "layer2", 6: "layer3", 7: "layer4"}
# explicit renames of the merged checkpoint (prefix -> prefix), applied after aliases are dropped
RENAMES = (
    *((f"image.res_features.{i}.", f"image.{name}.") for i, name in RESNET_CHILDREN.items()),
    ("image.res_l1.", "project.0."),
    ("image.res_l2.", "project.2."),
    ("image.vit.", "image."),  # Hugging Face ViTModel under the attribute ``vit`` (DeViDe layout)
)
POSITION_IDS = "text.bert_model.embeddings.position_ids"
ARCHITECTURE_KEYS = ("image", "text", "decoder", "preprocess", "queries")


def rename(key: str) -> str:
    return rename_prefix(key, RENAMES)


def image_layout(state: dict[str, torch.Tensor]) -> str:
    """Which image encoder a merged checkpoint (or this model's state dict) holds, in words."""
    if any(k.startswith("image.vit.") or k.startswith("image.embeddings.") for k in state):
        return "ViT-B/16 image encoder (devide layout)"
    if any(k.startswith(("image.res_features.7.", "image.layer4.")) for k in state):
        return "ResNet-50 to layer4, 2048-channel tokens (kad_512 / kad_1024 layout)"
    if any(k.startswith(("image.res_features.6.", "image.layer3.")) for k in state):
        return "ResNet-50 to layer3, 1024-channel tokens (kad_224 layout)"
    return "no known image encoder"


def checkpoint_filter_fn(checkpoint: object, model: "KAD", source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """A released KAD-style checkpoint dict -> this model's state dict keys (the model is untouched)."""
    state = merge_parts(checkpoint, PARTS, source, layout="KAD-style")
    state = drop_aliases(state, model.ALIASES, source)
    if POSITION_IDS in state:  # a buffer older transformers saved; it must be the plain positions
        ids = state.pop(POSITION_IDS)
        if not torch.equal(ids.reshape(-1), torch.arange(ids.numel(), dtype=ids.dtype)):
            raise CheckpointError(f"checkpoint {source}: {POSITION_IDS} is not 0, 1, 2, ...: not a standard BERT")
    return {rename(k): v for k, v in state.items()}


#: the finding queries KAD embeds: its authors' list, or the requested findings (``KAD.__init__``)
QuerySet = Literal["authors", "requested"]


class KAD(ZeroShotModel):
    """KAD and the query-decoder models of its lineage; see the module docstring.

    Args:
        architecture: shipped config name (``kad-224``, ``kad-512``, ``kad-1024``, ``devide``) or a JSON file.
        checkpoint: the KAD-style checkpoint file (required unless ``random_init``).
        text: local folder with the Med-KEBERT tokenizer files (``vocab.txt`` ...); required unless ``random_init``
            without a checkpoint (a stand-in tokenizer).
        random_init: allow running without weights (smoke tests; reports say so).
        query_set: ``"authors"`` (their ChestX-ray14 set, plus requested findings not in it) or
            ``"requested"`` (exactly the requested findings).
        texts: ``{canonical finding: query text}`` overriding the shipped texts.
        image_size: input size; picks the released variant of that size (``INPUT_SIZES``), any other is refused.
        **kwargs: ``ZeroShotModel`` options (normalize, fixed_threshold, score_threshold).
    """

    # regexes of checkpoint keys the model does not use (matched after merging and renaming; see the module docstring)
    IGNORE_UNEXPECTED = (
        r"^logit_scale$",              # TQN_Model.logit_scale: training-only
        r"^text\.logit_scale$",        # CLP_clinical.logit_scale: training-only
        r"^image\.resnet\.fc\.",       # torchvision's ImageNet classifier, never called
        r"^image\.resnet\.layer4\.",   # built but unused when the trunk stops at layer3 (224 px)
        r"^image\.(vit\.)?pooler\.",   # Hugging Face ViT pooler (vit.pooler.* in the file); patch tokens are used
    )
    # duplicate key prefix -> prefix of the twin kept (dropped only if torch.equal)
    ALIASES = {
        "image.resnet.conv1.": "image.res_features.0.",
        "image.resnet.bn1.": "image.res_features.1.",
        **{f"image.resnet.layer{i}.": f"image.res_features.{i + 3}." for i in range(1, 5)},
        "decoder_norm.": "decoder.norm.",
    }
    QUERY_SETS = get_args(QuerySet)
    TRAINABLE = (r"^mlp_head\.",)  # fit: the classifier head (queries are embedded without gradients)
    INPUT_SIZES = {224: "kad-224", 512: "kad-512", 1024: "kad-1024"}  # --model.image_size -> the released variant
    IMAGE_TOWER = "image"
    #: the cascade of weight randomization (``models.randomization``)
    RANDOMIZATION_STAGES = (("decoder", ("mlp_head", "decoder")), ("text", ("text",)),
                            ("image head", ("project", "image.layernorm")), *image_tower_stages("image"))

    def __init__(
        self,
        architecture: str = "kad-512",
        checkpoint: str | None = None,
        text: str | None = None,
        random_init: bool = False,
        query_set: QuerySet = "authors",
        texts: dict[str, str] | None = None,
        image_size: PositiveInt | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        architecture = sized_architecture(architecture, image_size, self.INPUT_SIZES, type(self).__name__)
        if query_set not in self.QUERY_SETS:
            raise ValueError(f"query_set must be one of {self.QUERY_SETS}, got {query_set!r}")
        weights = checkpoint_file(checkpoint, random_init, f"{type(self).__name__}({architecture!r})", CHECKPOINT_HINT)
        config, base = read_architecture(architecture, ARCHITECTURE_KEYS, "query-decoder")
        self.architecture = architecture
        self.query_set = query_set
        self.max_length = int(config["text"].get("max_length", 256))
        lower_case = bool(config["text"].get("lower_case", True))
        self.tokenizer = self.tokenizer_or_stand_in(text, weights, lambda: load_tokenizer(text, lower_case), config["text"]["bert"],
                                                    lower_case=lower_case)
        queries = yaml.safe_load(resolve_file(config["queries"], base).read_text())
        self.texts = {**queries["texts"], **(texts or {})}
        self.authors_set = tuple(queries["query_set"])

        build_weights(lambda: self.build(config, base, text), random_init=weights is None)
        self.attn_layers = list(config.get("attn_layers", [-1]))
        self.preprocess = preprocess_from(config)
        self._query_cache = EmbeddingCache()
        load_or_warn(self, weights)
        self.attach_explainer()

    def build(self, config: dict, base: Path, text: str | None) -> None:
        """The towers, decoder and head of ``config``, with random weights."""
        image = config["image"]
        if image["type"] == "resnet":
            self.image = ResNetPatches(stage=image["stage"])
        elif image["type"] == "vit":
            self.image = ViTPatches(**image["config"])
        else:
            raise ValueError(f"architecture {self.architecture!r}: unknown image encoder type {image['type']!r} (resnet, vit)")
        projection = config.get("projection")
        self.project = (nn.Identity() if projection is None else
                        nn.Sequential(nn.Linear(self.image.channels, projection[0]), nn.ReLU(), nn.Linear(*projection)))
        text = config["text"]
        self.text = BertQueryEncoder(bert_config(text["bert"], base), text.get("pooling", "pooler"), text.get("mlp"))
        self.text.bert_model.check_tokenizer(self.tokenizer, f"text folder {text}", "wrong text folder?")
        self.decoder = QueryDecoder(**config["decoder"])
        self.mlp_head = nn.Sequential(nn.Linear(config["decoder"]["d_model"], int(config.get("classes", 2))))

    # -- weights -------------------------------------------------------------------------------
    def load_checkpoint(self, path: Path) -> None:
        checkpoint = read_checkpoint(path)
        trained = checkpoint.get("config") if isinstance(checkpoint, dict) else None
        img_res = trained.get("img_res") if isinstance(trained, dict) else None
        if img_res is not None and int(img_res) != self.preprocess.size:
            raise CheckpointError(f"checkpoint {path} was trained at img_res {img_res} (its config entry) but architecture "
                                  f"{self.architecture!r} feeds {self.preprocess.size} px: use the variant of that resolution")
        state = checkpoint_filter_fn(checkpoint, self, str(path))
        found, expected = image_layout(state), image_layout(self.state_dict())
        hint = "" if found == expected else (f"this looks like a checkpoint with a {found}; architecture "
                                             f"{self.architecture!r} expects a {expected}")
        load_weights(self, state, str(path), self.IGNORE_UNEXPECTED, hint)  # ZeroShotModel.load_state_dict clears the caches

    # -- queries -------------------------------------------------------------------------------
    def text_for(self, finding: str) -> str:
        return self.texts.get(finding, finding.lower())

    def query_texts(self, classes: list[str]) -> tuple[tuple[str, ...], list[int]]:
        """The texts decoded together for ``classes`` and, per class, the index of its query."""
        requested = [self.text_for(c) for c in classes]
        base = [self.text_for(f) for f in self.authors_set] if self.query_set == "authors" else []
        decoded = list(dict.fromkeys(base + requested))  # order kept, duplicates once
        return tuple(decoded), [decoded.index(t) for t in requested]

    def tokenize(self, texts: list[str] | tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Token ids and attention mask as the authors' scripts produce them (padded to ``max_length``)."""
        return self.tokenizer(list(texts), add_special_tokens=True, max_length=self.max_length, padding="max_length",
                              truncation=True, return_tensors="pt")

    @torch.no_grad()
    def query_embeddings(self, texts: tuple[str, ...]) -> torch.Tensor:
        """``[Q, D]`` query embeddings (not normalised), cached per (texts, device)."""
        def encode() -> torch.Tensor:
            tokens = self.tokenize(texts)
            with torch.autocast(self.device.type, enabled=False):
                return self.text(tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device)).float()

        return self._query_cache.get_or_compute(tuple(texts), self.device, encode)

    # -- inference -----------------------------------------------------------------------------
    def decode(self, images: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """Image -> tokens -> decoder -> head: ``logits [B, Q, 2]``, ``attn [L, B, Q, N]``, ``grid``."""
        tokens, grid = self.image(images)
        out, attn = self.decoder(queries.to(tokens.dtype), self.project(tokens))
        return self.mlp_head(out), attn, grid

    @torch.no_grad()
    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        texts, index = self.query_texts(classes)
        logits, attn, grid = self.decode(images, self.query_embeddings(texts))
        index = torch.tensor(index, device=images.device)
        scores = logits.float().softmax(dim=-1)[..., 1].index_select(1, index)
        return ZeroShotOutput(scores=scores, saliency=self.decoder_maps(attn[self.attn_layers].float().mean(dim=0), classes, grid))

    def decoder_maps(self, per_query: torch.Tensor, classes: list[str], grid: tuple[int, int]) -> torch.Tensor:
        """``[B, Q, N]`` over the decoded queries -> ``[B, C, h, w]``: each class's query (its native maps' reduction)."""
        _, index = self.query_texts(classes)
        return per_query.index_select(1, torch.tensor(index, device=per_query.device)).unflatten(-1, grid)


# -- local files only --------------------------------------------------------------------------
def load_tokenizer(folder: str | None, lower_case: bool):
    """The BERT WordPiece tokenizer of a local folder (``vocab.txt`` or ``tokenizer.json``)."""
    path = local_folder(folder, "text", TEXT_HINT, "the text encoder", [("vocab.txt", "tokenizer.json")])
    import transformers

    return transformers.BertTokenizer.from_pretrained(str(path), do_lower_case=lower_case, local_files_only=True)
