"""MedKLIP (Wu et al., ICCV 2023) and MAVL (Phan et al., CVPR 2024): knowledge queries decoded
over ResNet-50 patches, from local files only. One family: MAVL is MedKLIP with 9 queries per
entity; the variants differ only in data (``xbench_pl/models/configs/{medklip,mavl}.json``).

Architecture (``MediaBrain-SJTU/MedKLIP`` @ 8e60b035, ``Sample_zero-shot_Classification_CXR14/
models/model_MedKLIP.py``, ``models/transformer.py``; ``HieuPhan33/MAVL`` @ 15970307,
``Zero-shot_grounding/models/model_MAVL.py``): ResNet-50 to layer3 (224 px -> 14 x 14 tokens of
1024 channels, row-major); each token through ``Linear -> ReLU -> Linear(256)`` (MedKLIP) or
``Conv1x1 -> PReLU -> Conv1x1(256)`` (MAVL); no positional encoding. Queries: Bio_ClinicalBERT
[CLS] vectors of knowledge sentences through ``Linear(768, 256)``; a 4-layer, 4-head, pre-norm
DETR decoder (d 256, FFN 1024, queries self-attend) with a final LayerNorm; a ``Linear(256, 2)``
head per query (MedKLIP) or ``Linear(9 * 256, 2)`` over the 9 concatenated concept outputs of
an entity (MAVL). MAVL also has CLIP's ``AttentionPool2d`` global branch (``pool``), used only by
``score_mode="text"``; it is built so that the released files load strictly and both score modes
of the authors' classification script are available.

Weights: the released ``checkpoint_final.pth`` (MedKLIP) and ``checkpoint_full_40.pth`` /
``checkpoint_full_46.pth`` (MAVL), read with ``weights_only=True``: a dict ``{model, optimizer,
lr_scheduler, config, epoch}`` whose ``model`` keys carry DataParallel's ``module.`` prefix
(a bare state dict is accepted too). ``checkpoint_filter_fn`` strips ``module.`` and renames by
the class's ``RENAMES`` table (``res_features.{0,1,4,5,6}`` / ``backbone.*`` -> ``image.conv1`` ...,
``res_l1``/``res_l2`` -> ``project.*``). Declared unused keys (``IGNORE_UNEXPECTED``): MedKLIP's
``cl_fc`` (training-only contrastive head), MAVL's ``temp`` (dropped by the authors' loader too)
and ``location_emb`` (pretraining loss only). Everything else loads strictly. BERT is not in
these checkpoints: the authors build the query book in ``__init__`` from a local BERT.

Knowledge (``knowledge=FILE`` or a list of files; the user's copies of the authors' release,
never shipped here): JSON files whose string values are descriptions and list values are MAVL's
aspect sentences. MedKLIP reads its 75 base descriptions from the first file **in file order**
(as their test code does; their file spells the pneumonia key "eumonia", accepted); MAVL reads
descriptions and aspects **by entity key** (MAVL's ``observation explanation.json`` and
``Pretrain/concept_gen/gpt4_mimic.json``; 8 aspects per entity). Later files (or later keys)
only add descriptions/aspects for findings outside the 75 entities.

Queries: the 75 entities (MedKLIP: 75 descriptions; MAVL: 75 x (description + 8 aspects) =
675 concepts, disease-major) are always decoded together, as their scripts do; a requested
finding is mapped to its entity by the config's ``findings`` table (``Fibrosis`` ->
``tail_abnorm_obs``, ``Pleural Effusion`` -> ``effusion`` ..., overridable with
``entities={finding: key}``); a finding with no entity is appended (request order) with the
description (and, for MAVL, 8 aspects) stored under its key in the knowledge files, as the
authors' ``Zero-shot_classification/test.py`` extends ``original_class``. Scores of the 75 thus
depend on the appended queries (self-attention).

Text: tokenised by the Bio_ClinicalBERT folder's ``vocab.txt`` (``text=DIR``) as the
authors' tokenizer does: lower-cased and accent-stripped unless the folder's
``tokenizer_config.json`` says otherwise (Bio_ClinicalBERT ships none), ``[CLS]`` + the first 63
word pieces, **no** ``[SEP]``, padded to 64; BERT is called with ids and mask only, and the
query is the [CLS] vector of the last hidden state. Embeddings are cached on disk keyed by
(text encoder, max length, texts) in ``query_cache`` (default ``$XBENCH_CACHE_DIR/
query_embeddings`` or ``~/.cache/xbench_pl/query_embeddings``), so BERT is loaded only when texts
are new. ``query_embeddings=FILE`` supplies precomputed rows (the cache's file format,
``save_query_embeddings``): its texts are used as is, only others need the text encoder.

``random_init`` without a checkpoint needs no file: without ``knowledge`` each entity's name is its
description (MAVL: "<concept> of <entity>" its aspects), and without ``text`` the text encoder is a
random BERT of Bio_ClinicalBERT's shipped config (``text.bert``) with a stand-in tokenizer of its layout
(``stand_ins``); its embeddings are not cached on disk. The warning says so.

Score: ``softmax(head)[..., 1]`` at the finding's query (MAVL ``score_mode="feature"``, the
default); MAVL ``score_mode="text"``: cosines of the pooled global feature with every concept
query, softmax against the "normal" and "clear" anchors' cosines, averaged over anchors and the
9 concepts. Saliency: the cross-attention of the 4 decoder layers averaged (heads averaged),
MAVL then averages concepts 0, 6, 7, 8 (description, patterns, shape, texture; config
``map_concepts``, ``map_reduce``), on the native 14 x 14 grid spanning the 224 px input. The
authors upsample (MedKLIP nearest x16, MAVL bilinear ``align_corners=True``); here the
benchmark's own warp to the evaluation grid replaces both. Preprocessing as their datasets:
bilinear (PIL, antialiased) squash to 224, ImageNet mean/std.

Over 500 lines on purpose: one family per file (timm's rule); MedKLIP and MAVL share the architecture, the
checkpoint filter, the knowledge files and the cached query embeddings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Literal, get_args

import torch
from jsonargparse.typing import PositiveInt
from torch import nn

from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.models.checkpoints import (CheckpointError, build_weights, drop_aliases, guess_layout, load_or_warn, load_weights,
                                          read_checkpoint, rename_prefix)
from xbench_pl.models.layers import AttentionPool2d, BertModel, QueryDecoder, ResNetPatches, without_trailing_padding
from xbench_pl.models.local_files import (HF_WEIGHT_FILES, checkpoint_file, local_file, local_files, local_folder, preprocess_from,
                                          resolve_file, sized_architecture, weights_in)
from xbench_pl.models.local_files import read_architecture as read_architecture_file
from xbench_pl.models.prompts import EmbeddingCache
from xbench_pl.models.randomization import image_tower_stages
from xbench_pl.outputs import atomic_write, file_bytes
from xbench_pl.models.stand_ins import stand_in_tokenizer

RESNET_CHILDREN = {0: "conv1", 1: "bn1", 4: "layer1", 5: "layer2", 6: "layer3"}
CACHE_FORMAT = 1
CACHE_ENV = "XBENCH_CACHE_DIR"
TEXT_HINT = ("a local copy of the Hugging Face model emilyalsentzer/Bio_ClinicalBERT (text=DIR with "
             "config.json, vocab.txt and model.safetensors or pytorch_model.bin)")


# -- architecture configs ------------------------------------------------------------------------
ARCHITECTURE_KEYS = ("image", "projection", "text", "decoder", "concepts", "entities", "findings", "preprocess")


def read_architecture(architecture: str) -> dict:
    """The architecture dict of a shipped name (``medklip``, ``mavl``) or a JSON file."""
    return read_architecture_file(architecture, ARCHITECTURE_KEYS, "MedKLIP-family")[0]


# -- checkpoints -----------------------------------------------------------------------------------
def family_of(keys) -> str:
    """Which family a (``module.``-stripped) state dict looks like: ``"medklip"``, ``"mavl"``, or a
    hint for other layouts (``guess_layout``), or ``""``."""
    keys = set(keys)
    if any(k.startswith(("backbone.", "location_emb.")) for k in keys) or "temp" in keys:
        return "mavl"
    if any(k.startswith("cl_fc.") for k in keys) or (any(k.startswith("res_features.") for k in keys) and "res_l1.weight" in keys):
        return "medklip"
    return guess_layout(keys).removeprefix(": ")


def checkpoint_filter_fn(checkpoint: object, model: "MedKLIP", source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """A released MedKLIP / MAVL file -> this model's state dict keys (the model is untouched).

    ``{model: state dict, optimizer, ...}`` (the training scripts' layout) or a bare state dict;
    DataParallel's ``module.`` prefix is stripped, then ``model.RENAMES`` (prefix -> prefix)."""
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"checkpoint {source} holds a {type(checkpoint).__name__}, not the dict "
                              f"{{model, optimizer, ...}} of a released {model.LAYOUT} checkpoint")
    if {"image_encoder", "text_encoder"} & checkpoint.keys():
        raise CheckpointError(f"checkpoint {source} is a KAD-style checkpoint (entries {sorted(map(str, checkpoint))[:8]}), "
                              f"not {model.LAYOUT}'s {model.RELEASED}: use --model kad (or devide)")
    state = checkpoint.get("model", checkpoint)
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        entries = sorted(map(str, checkpoint))[:12]
        raise CheckpointError(f"checkpoint {source} is not a {model.LAYOUT} checkpoint: expected a dict with a 'model' "
                              f"state dict (the authors' {model.RELEASED}) or a state dict; it holds entries {entries}")
    if all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    state = drop_aliases(state, model.ALIASES, source)
    return {model.rename(k): v for k, v in state.items()}


# -- knowledge files ----------------------------------------------------------------------------------
def read_knowledge(files: list[Path]) -> tuple[list[tuple[str, str]], dict[str, str], dict[str, list[str]], dict[str, Path]]:
    """``(first file's (key, description) pairs in file order, descriptions by key, aspects by key,
    file of each key's aspects)``; the first file defining a key wins."""
    first: list[tuple[str, str]] = []
    descriptions: dict[str, str] = {}
    aspects: dict[str, list[str]] = {}
    origin: dict[str, Path] = {}
    for index, path in enumerate(files):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"knowledge file {path} is not readable JSON ({type(error).__name__}: {error}); expected the "
                             "authors' observation explanation.json or gpt4_mimic.json") from error
        if not isinstance(data, dict):
            raise ValueError(f"knowledge file {path} holds a {type(data).__name__}, not a JSON object of entity -> text")
        for key, value in data.items():
            if isinstance(value, str):
                if index == 0:
                    first.append((key, value))
                descriptions.setdefault(key, value)
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                aspects.setdefault(key, value)
                origin.setdefault(key, path)
            else:
                raise ValueError(f"knowledge file {path}, key {key!r}: a {type(value).__name__}, not a description "
                                 "string or a list of aspect sentences")
    return first, descriptions, aspects, origin


# -- text encoder (Bio_ClinicalBERT from a local folder) -----------------------------------------------------
def text_folder(value: str | None) -> Path:
    return local_folder(value, "text", TEXT_HINT, "the query book", [("config.json",), ("vocab.txt",), HF_WEIGHT_FILES])


def fingerprint(folder: Path) -> str:
    """Identity of a text encoder folder for the query cache: the contents of its small files
    (config, vocabulary, tokenizer settings) and the name, size and mtime of its weights file."""
    digest = hashlib.sha256()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<absent>") + b"\0")
    weights = weights_in(folder, "text", TEXT_HINT)
    stat = weights.stat()
    digest.update(f"{weights.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def read_bert_weights(path: Path) -> dict[str, torch.Tensor]:
    """A Hugging Face BERT weights file as ``BertModel`` keys: ``bert.`` prefix removed (pretraining
    heads ``cls.*`` kept, then ignored), TF-era ``gamma``/``beta`` renamed ``weight``/``bias``."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path), device="cpu")
    else:
        state = read_checkpoint(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"text encoder weights {path} hold a {type(state).__name__}, not a BERT state dict")
    if any(k.startswith("bert.") for k in state):
        state = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in state.items()}
    return {re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)): v
            for k, v in state.items()}


class TextEncoder:
    """Bio_ClinicalBERT queries as the authors embed them: ``[CLS]`` + word pieces (no ``[SEP]``),
    padded to ``max_length``, BERT's last hidden state at [CLS]. Not a submodule of the model (its
    weights are not in the released checkpoints); loaded on first use. ``stand_in`` (the shipped config
    of its hub folder) instead of ``folder``: random weights and a stand-in tokenizer (``random_init``)."""

    IGNORE_UNEXPECTED = (r"^cls\.", r"^pooler\.")  # pretraining heads and pooler: the [CLS] state is used

    def __init__(self, folder: Path | None, max_length: int, stand_in: Path | None = None):
        self.folder, self.max_length, self.stand_in = folder, max_length, stand_in
        self.fingerprint = None if folder is None else fingerprint(folder)
        self._tokenizer = None
        self._bert: BertModel | None = None

    @property
    def tokenizer(self):
        if self._tokenizer is None and self.folder is None:
            self._tokenizer = stand_in_tokenizer(str(self.stand_in))
        if self._tokenizer is None:
            import transformers

            # do_lower_case as the folder says; BertTokenizer's default (True) when it has no tokenizer_config.json,
            # which is what the authors' copy of BertTokenizer does with Bio_ClinicalBERT
            self._tokenizer = transformers.BertTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        return self._tokenizer

    def tokenize(self, texts: list[str] | tuple[str, ...]) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` ``[N, max_length]``: [CLS] + the first ``max_length - 1``
        pieces, then [PAD] (the authors' ``build_inputs_with_special_tokens`` adds no [SEP])."""
        tokenizer = self.tokenizer
        pieces = tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=self.max_length - 1)["input_ids"]
        ids = torch.full((len(pieces), self.max_length), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(pieces), self.max_length), dtype=torch.long)
        for row, p in enumerate(pieces):
            ids[row, 0] = tokenizer.cls_token_id
            ids[row, 1:1 + len(p)] = torch.tensor(p, dtype=torch.long)
            mask[row, :1 + len(p)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def bert(self) -> BertModel:
        if self._bert is None and self.folder is None:  # a stand-in: the shipped config, seeded random weights
            def build() -> None:
                self._bert = BertModel.from_config_file(self.stand_in, add_pooling_layer=False).eval()

            build_weights(build, random_init=True)
        if self._bert is None:
            bert = BertModel.from_config_file(self.folder / "config.json", add_pooling_layer=False)
            bert.check_tokenizer(self.tokenizer, f"text encoder {self.folder}: vocab.txt", "config.json's vocab_size is too small")
            if bert.embeddings.position_embeddings.num_embeddings < self.max_length:
                raise ValueError(f"text encoder {self.folder}: max_position_embeddings < the query length {self.max_length}")
            weights = weights_in(self.folder, "text", TEXT_HINT)
            load_weights(bert, read_bert_weights(weights), str(weights), self.IGNORE_UNEXPECTED,
                         f"expected the BERT weights of {TEXT_HINT}")
            self._bert = bert.eval()
        return self._bert

    @torch.no_grad()
    def embed(self, texts: list[str], device: torch.device, batch: int = 128) -> torch.Tensor:
        bert = self.bert().to(device)
        tokens = self.tokenize(texts)
        out = []
        with torch.autocast(device.type, enabled=False):
            for start in range(0, len(texts), batch):
                hidden, _ = bert(*without_trailing_padding(tokens["input_ids"][start:start + batch].to(device),
                                                           tokens["attention_mask"][start:start + batch].to(device)))
                out.append(hidden[:, 0].float())  # only [CLS] is read
        return torch.cat(out).cpu()


def save_query_embeddings(path: str | Path, texts: list[str] | tuple[str, ...], embeddings: torch.Tensor,
                          text_encoder: str = "", max_length: int = 64) -> Path:
    """Write a query-embedding file (the on-disk cache's format): ``texts`` and their ``[N, D]``
    embeddings, one row per text. Pass it as ``query_embeddings=FILE`` to use these rows instead of
    running the text encoder (e.g. a book computed once elsewhere)."""
    embeddings = torch.as_tensor(embeddings).detach().float().cpu()
    if embeddings.dim() != 2 or embeddings.shape[0] != len(texts):
        raise ValueError(f"embeddings {tuple(embeddings.shape)} do not give one row per text ({len(texts)} texts)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": CACHE_FORMAT, "text_encoder": text_encoder, "max_length": max_length, "texts": list(texts),
              "embeddings": embeddings.contiguous()}
    atomic_write(path, file_bytes(lambda f: torch.save(record, f)))  # concurrent ranks never read half a file
    return path


def read_query_embeddings(path: Path) -> dict:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"query embeddings file {path} is not readable ({type(error).__name__}: {error}); "
                         "write it with xbench_pl.models.medklip.save_query_embeddings") from error
    ok = (isinstance(data, dict) and isinstance(data.get("texts"), list) and isinstance(data.get("embeddings"), torch.Tensor)
          and data["embeddings"].dim() == 2 and data["embeddings"].shape[0] == len(data["texts"]))
    if not ok:
        raise ValueError(f"query embeddings file {path} is not a {{texts, embeddings [N, D]}} file with one row per text; "
                         "write it with xbench_pl.models.medklip.save_query_embeddings")
    return data


def default_query_cache() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) / "query_embeddings" if root else Path.home() / ".cache" / "xbench_pl" / "query_embeddings"


# -- the models ----------------------------------------------------------------------------------------
class MedKLIP(ZeroShotModel):
    """MedKLIP; see the module docstring.

    Args:
        architecture: shipped config name (``medklip``) or a JSON file.
        checkpoint: the released ``checkpoint_final.pth`` (required unless ``random_init``).
        knowledge: the user's copy of the authors' ``observation explanation.json`` (75 entities,
            read in file order); more files add descriptions of findings outside the 75. Required unless
            ``random_init`` without a checkpoint (stand-in descriptions).
        text: local Bio_ClinicalBERT folder (needed unless every query text is in ``query_embeddings``
            or the on-disk cache, or ``random_init`` without a checkpoint: a stand-in text encoder).
        query_embeddings: a precomputed query-embedding file (``save_query_embeddings``).
        query_cache: folder of the on-disk query-embedding cache (default: see the module docstring).
        entities: ``{finding: entity key}`` overriding the config's ``findings`` table.
        random_init: allow running without weights (smoke tests; reports say so).
        image_size: input size; only the trained 224 px (``INPUT_SIZES``), any other is refused.
        **kwargs: ``ZeroShotModel`` options (normalize, fixed_threshold, score_threshold).
    """

    IGNORE_UNEXPECTED = (r"^cl_fc\.",)  # contrastive location head of pretraining (PreTrain_MedKLIP only)
    TRAINABLE = (r"^disease_embedding_layer\.", r"^classifier\.")  # fit: query projection and classifier head
    ALIASES: dict[str, str] = {}
    RENAMES = (*((f"res_features.{i}.", f"image.{name}.") for i, name in RESNET_CHILDREN.items()),
               ("res_l1.", "project.0."), ("res_l2.", "project.2."))
    LAYOUT = "MedKLIP"
    RELEASED = "checkpoint_final.pth"
    INPUT_SIZES = {224: "medklip"}
    IMAGE_TOWER = "image"
    #: the cascade of weight randomization (``models.randomization``); the query texts' BERT is not the model's (``TextEncoder``)
    RANDOMIZATION_STAGES = (("decoder", ("classifier", "decoder")), ("query", ("disease_embedding_layer",)),
                            ("image head", ("project", "pool")), *image_tower_stages("image"))
    CACHES_FOLLOW_WEIGHTS = False  # its query cache holds the separate text encoder's outputs
    KNOWLEDGE_HINT = ("the user's copy of MedKLIP's 'observation explanation.json' (MediaBrain-SJTU/MedKLIP, "
                      "PreTrain_MedKLIP/data_file/; 75 entity descriptions) as knowledge=FILE")

    def __init__(
        self,
        architecture: str = "medklip",
        checkpoint: str | None = None,
        knowledge: str | list[str] | None = None,
        text: str | None = None,
        query_embeddings: str | None = None,
        query_cache: str | None = None,
        entities: dict[str, str] | None = None,
        random_init: bool = False,
        image_size: PositiveInt | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        architecture = sized_architecture(architecture, image_size, self.INPUT_SIZES, type(self).__name__)
        weights = checkpoint_file(checkpoint, random_init, f"{type(self).__name__}({architecture!r})",
                                  f"a local copy of the authors' {self.RELEASED}")
        config, base = read_architecture_file(architecture, ARCHITECTURE_KEYS, "MedKLIP-family")
        self.architecture = architecture
        self.config = config
        self.concepts = tuple(config["concepts"])
        self.base_entities = tuple(config["entities"])
        self.findings = {**config["findings"], **(entities or {})}
        self.attn_layers = list(config.get("attn_layers", [-1]))
        self.map_concepts = list(config.get("map_concepts", [0]))
        self.map_reduce = config.get("map_reduce", "mean")
        if self.map_reduce not in ("mean", "max"):
            raise ValueError(f"architecture {architecture!r}: map_reduce must be 'mean' or 'max', got {self.map_reduce!r}")
        self.max_length = int(config["text"].get("max_length", 64))
        self.knowledge_stand_in = knowledge is None and weights is None
        self.read_knowledge(self.stand_in("knowledge", []) if self.knowledge_stand_in
                            else local_files(knowledge, "knowledge", self.KNOWLEDGE_HINT))

        self.precomputed = None if query_embeddings is None else read_query_embeddings(local_file(
            query_embeddings, "query_embeddings", "a file written by xbench_pl.models.medklip.save_query_embeddings"))
        if text is None and weights is None:
            stand_in = TextEncoder(None, self.max_length, resolve_file(config["text"]["bert"], base))
            self.text_encoder = self.stand_in("text encoder", stand_in)
        elif text is None and self.precomputed is None:
            text_folder(None)  # raises, naming what is needed
        else:
            self.text_encoder = None if text is None else TextEncoder(text_folder(text), self.max_length)
        self.query_cache = Path(query_cache).expanduser() if query_cache else default_query_cache()

        build_weights(lambda: self.build(config), random_init=weights is None)
        self.preprocess = preprocess_from(config)
        self._query_cache = EmbeddingCache()  # of the text encoder's outputs: loading model weights leaves it valid
        load_or_warn(self, weights)
        self.attach_explainer()

    # -- architecture ----------------------------------------------------------------------------
    def build(self, config: dict) -> None:
        """The towers, decoder and head of ``config``, with random weights."""
        if config["image"].get("type") != "resnet":
            raise ValueError(f"architecture {self.architecture!r}: the MedKLIP family uses image type 'resnet'")
        self.image = ResNetPatches(stage=config["image"]["stage"])
        projection = config["projection"]
        hidden, width = projection["widths"]
        if projection["type"] == "linear_relu":  # MedKLIP: res_l1 -> ReLU -> res_l2 on each token
            self.project = nn.Sequential(nn.Linear(self.image.channels, hidden), nn.ReLU(), nn.Linear(hidden, width))
        elif projection["type"] == "conv1x1_prelu":  # MAVL: Conv1x1 -> PReLU -> Conv1x1 on the feature map
            self.project = nn.Sequential(nn.Conv2d(self.image.channels, hidden, 1), nn.PReLU(), nn.Conv2d(hidden, width, 1))
        else:
            raise ValueError(f"architecture {self.architecture!r}: unknown projection type {projection['type']!r} "
                             "(linear_relu, conv1x1_prelu)")
        if "pool" in config:
            pool = config["pool"]
            self.pool = AttentionPool2d(pool["grid"], self.image.channels, pool["heads"], pool["out"])
        self.disease_embedding_layer = nn.Linear(int(config["text"]["width"]), config["decoder"]["d_model"])
        self.decoder = QueryDecoder(**config["decoder"])
        self.classifier = nn.Linear(config["decoder"]["d_model"] * len(self.concepts), 2)

    def project_tokens(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Patch tokens ``[B, N, 1024]`` -> decoder memory ``[B, N, 256]`` (row-major)."""
        if isinstance(self.project[0], nn.Conv2d):
            feature_map = tokens.transpose(1, 2).unflatten(2, grid)
            return self.project(feature_map).flatten(2).transpose(1, 2)
        return self.project(tokens)

    # -- weights ---------------------------------------------------------------------------------
    @classmethod
    def rename(cls, key: str) -> str:
        return rename_prefix(key, cls.RENAMES)

    def load_checkpoint(self, path: Path) -> None:
        checkpoint = read_checkpoint(path)
        state = checkpoint_filter_fn(checkpoint, self, str(path))
        found = family_of(k.removeprefix("module.") for k in checkpoint.get("model", checkpoint))
        if found in ("medklip", "mavl") and found != self.LAYOUT.lower():
            layouts = {"medklip": "MedKLIP (res_features.*, Linear res_l1, cl_fc)", "mavl": "MAVL (backbone.*, pool, location_emb, temp)"}
            hint = f"this is a {layouts[found]} checkpoint: use --model {found}"
        else:
            hint = found or f"expected the authors' {self.RELEASED}"
        load_weights(self, state, str(path), self.IGNORE_UNEXPECTED, hint)

    # -- knowledge and queries ---------------------------------------------------------------------
    def read_knowledge(self, files: list[Path]) -> None:
        self.knowledge_files = files
        self.file_order, self.descriptions, self.aspects, self.knowledge_origin = read_knowledge(files)
        if self.config.get("file_order") and files:
            self.check_file_order()

    def check_file_order(self) -> None:
        """MedKLIP reads the first file's values in order: its keys must be the 75 entities in order."""
        spellings = self.config.get("key_spellings", {})
        keys = [key for key, _ in self.file_order]
        if len(keys) < len(self.base_entities):
            raise ValueError(f"knowledge file {self.knowledge_files[0]} has {len(keys)} descriptions; MedKLIP reads the "
                             f"{len(self.base_entities)} entity descriptions of its 'observation explanation.json' in file "
                             f"order. Expected {self.KNOWLEDGE_HINT}")
        for position, (entity, key) in enumerate(zip(self.base_entities, keys)):
            if key not in spellings.get(entity, [entity]):
                raise ValueError(f"knowledge file {self.knowledge_files[0]}: key {position} is {key!r}, expected entity "
                                 f"{entity!r} (MedKLIP reads the descriptions in file order, which must be the authors' entity "
                                 f"order: {', '.join(self.base_entities[:4])}, ...). Expected {self.KNOWLEDGE_HINT}")

    def entity_of(self, finding: str) -> str:
        return self.findings.get(finding, finding.lower())

    def query_entities(self, classes: list[str]) -> tuple[tuple[str, ...], list[int]]:
        """The entities decoded together for ``classes`` (the 75, then unseen ones in request order)
        and, per class, the index of its entity."""
        requested = [self.entity_of(c) for c in classes]
        decoded = list(dict.fromkeys([*self.base_entities, *requested]))
        return tuple(decoded), [decoded.index(e) for e in requested]

    def texts_of(self, entities: tuple[str, ...], classes: list[str] | None = None) -> tuple[str, ...]:
        """Query texts of ``entities`` in decoder order: MedKLIP one description per entity (the 75
        base ones in the first knowledge file's order, others by key)."""
        base = len(self.base_entities)
        texts = [text for _, text in self.file_order[:base]] if entities[:base] == self.base_entities else []
        missing = [e for e in entities[len(texts):] if e not in self.descriptions]
        if missing:
            raise self.knowledge_error(missing, "description", classes)
        return tuple(texts + [self.descriptions[e] for e in entities[len(texts):]])

    def knowledge_error(self, missing: list[str], what: str, classes: list[str] | None) -> ValueError:
        files = ", ".join(str(f) for f in self.knowledge_files)
        base = [e for e in missing if e in self.base_entities]
        if base:
            return ValueError(f"{type(self).__name__}: the knowledge files ({files}) have no {what} for "
                              f"{len(base)} of the {len(self.base_entities)} entities ({', '.join(map(repr, base[:5]))}"
                              f"{', ...' if len(base) > 5 else ''}), which are read by key. Expected {self.KNOWLEDGE_HINT} "
                              "(MedKLIP's own copy spells the pneumonia key 'eumonia')")
        by_entity = {self.entity_of(c): c for c in (classes or [])}
        named = ", ".join(f"{by_entity[e]!r} (key {e!r})" if e in by_entity else repr(e) for e in missing)
        return ValueError(f"{type(self).__name__}: no {what} for {named} in the knowledge files ({files}). A finding outside "
                          f"the {len(self.base_entities)} entities is decoded as more queries, from the {what} stored under "
                          "its key, as the authors' Zero-shot_classification/test.py does: add a knowledge file holding it "
                          "(e.g. their observation explanation_padchest_rare.json), or map the finding to an entity with "
                          "entities={finding: key}")

    def query_texts(self, classes: list[str]) -> tuple[tuple[str, ...], list[int]]:
        """The texts decoded together for ``classes`` and, per class, the index of its entity."""
        entities, index = self.query_entities(classes)
        if self.knowledge_stand_in:
            self.invent_knowledge(entities)
        return self.texts_of(entities, classes), index

    def invent_knowledge(self, entities: tuple[str, ...]) -> None:
        """Stand-in knowledge (``random_init`` without files): an entity's name as its description, "<concept> of
        <name>" as its aspects."""
        for entity in entities:
            name = entity.replace("_", " ")
            self.descriptions.setdefault(entity, name)
            self.aspects.setdefault(entity, [f"{concept} of {name}" for concept in self.concepts[1:]])
        if not self.file_order:
            self.file_order = [(entity, self.descriptions[entity]) for entity in self.base_entities]

    def cache_file(self, texts: tuple[str, ...]) -> Path:
        digest = hashlib.sha256(json.dumps([CACHE_FORMAT, self.text_encoder.fingerprint, self.max_length, list(texts)]).encode())
        return self.query_cache / f"{digest.hexdigest()[:32]}.pt"

    def embed_texts(self, texts: tuple[str, ...]) -> torch.Tensor:
        """``[Q, 768]`` text-encoder embeddings: precomputed rows, else the disk cache, else BERT."""
        if self.precomputed is not None:
            known = self.precomputed["texts"]
            if list(texts) == known:
                return self.precomputed["embeddings"].float()
            rows = {t: i for i, t in reversed(list(enumerate(known)))}
            if all(t in rows for t in texts):
                return self.precomputed["embeddings"][[rows[t] for t in texts]].float()
            if self.text_encoder is None:
                absent = [t for t in texts if t not in rows]
                raise ValueError(f"{len(absent)} query texts are not in query_embeddings file and no text=DIR is "
                                 f"given to embed them (first: {absent[0][:80]!r}); give {TEXT_HINT}")
        if self.text_encoder.folder is None:  # a stand-in: nothing worth keeping on disk
            return self.text_encoder.embed(list(texts), self.device)
        cached = self.cache_file(texts)
        if cached.is_file():
            try:
                data = read_query_embeddings(cached)
                if data["texts"] == list(texts):
                    return data["embeddings"].float()
            except ValueError:
                pass  # a damaged cache file is recomputed and replaced
        embeddings = self.text_encoder.embed(list(texts), self.device)
        try:
            save_query_embeddings(cached, texts, embeddings, self.text_encoder.fingerprint, self.max_length)
        except OSError:
            pass  # a read-only cache folder only costs recomputation
        return embeddings

    @torch.no_grad()
    def query_embeddings(self, texts: tuple[str, ...]) -> torch.Tensor:
        """``[Q, 768]`` query embeddings on the model's device, kept per (texts, device)."""
        return self._query_cache.get_or_compute(tuple(texts), self.device, lambda: self.embed_texts(tuple(texts)).to(self.device))

    # -- inference -------------------------------------------------------------------------------
    def decode(self, images: torch.Tensor, book: torch.Tensor) -> dict[str, torch.Tensor]:
        """Image -> tokens -> decoder -> head. ``logits [B, n, 2]`` (n entities), ``attn [L, B, Q, N]``
        (Q = n x concepts, entity-major), ``tokens`` (backbone), ``queries [Q, 256]``, ``grid``."""
        tokens, grid = self.image(images)
        queries = self.disease_embedding_layer(book.to(tokens.dtype))
        out, attn = self.decoder(queries, self.project_tokens(tokens, grid))
        logits = self.classifier(out.flatten(1).unflatten(1, (-1, len(self.concepts) * out.shape[-1])))
        return {"logits": logits, "attn": attn, "tokens": tokens, "queries": queries, "grid": grid}

    def saliency(self, attn: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``attn [L, B, Q, N]`` -> ``[B, n, h, w]``: layers averaged, then the map concepts reduced."""
        return self.entity_maps(attn[self.attn_layers].float().mean(dim=0), grid)

    def entity_maps(self, per_query: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``[B, Q, N]`` over the queries (entity-major) -> ``[B, n, h, w]``: the map concepts reduced."""
        maps = per_query.unflatten(1, (-1, len(self.concepts)))[:, :, self.map_concepts]
        maps = maps.mean(dim=2) if self.map_reduce == "mean" else maps.amax(dim=2)
        return maps.unflatten(-1, grid)

    def decoder_maps(self, per_query: torch.Tensor, classes: list[str], grid: tuple[int, int]) -> torch.Tensor:
        """``[B, Q, N]`` over the decoded queries -> ``[B, C, h, w]``, as the native maps reduce the attention."""
        _, index = self.query_texts(classes)
        return self.entity_maps(per_query, grid).index_select(1, torch.tensor(index, device=per_query.device))

    def scores(self, decoded: dict[str, torch.Tensor]) -> torch.Tensor:
        return decoded["logits"].float().softmax(dim=-1)[..., 1]

    @torch.no_grad()
    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        texts, index = self.query_texts(classes)
        decoded = self.decode(images, self.query_embeddings(texts))
        index = torch.tensor(index, device=images.device)
        scores = self.scores(decoded).index_select(1, index)
        maps = self.saliency(decoded["attn"], decoded["grid"]).index_select(1, index)
        return ZeroShotOutput(scores=scores, saliency=maps)


#: how MAVL scores an entity (``MAVL.__init__``)
ScoreMode = Literal["feature", "text"]


class MAVL(MedKLIP):
    """MAVL; see the module docstring.

    Arguments as ``MedKLIP``, plus these.

    Args:
        knowledge: the user's copies of MAVL's ``observation explanation.json`` and
            ``gpt4_mimic.json`` (descriptions and 8 aspect sentences per entity, read by key);
            more files add findings outside the 75 entities.
        score_mode: ``"feature"`` (the decoder head, default) or ``"text"`` (cosines of the pooled
            global feature with the concept queries against the normal/clear anchors).
    """

    IGNORE_UNEXPECTED = (
        r"^temp$",            # learned temperatures of pretraining; their test loader drops them too
        r"^location_emb\.",   # Conv1d location embedding of the pretraining loss, unused by scores and maps
    )
    RENAMES = (*((f"backbone.{i}.", f"image.{name}.") for i, name in RESNET_CHILDREN.items()),
               ("res_l1.0.", "project.0."), ("res_l1.1.", "project.1."), ("res_l2.", "project.2."))
    LAYOUT = "MAVL"
    RELEASED = "checkpoint_full_40.pth or checkpoint_full_46.pth"
    INPUT_SIZES = {224: "mavl"}  # its attention pool is built for the 14 x 14 grid of 224 px
    KNOWLEDGE_HINT = ("the user's copies of MAVL's 'observation explanation.json' (HieuPhan33/MAVL, Zero-shot_grounding/) and "
                      "'gpt4_mimic.json' (Pretrain/concept_gen/) as knowledge=[FILE, FILE]")
    SCORE_MODES = get_args(ScoreMode)

    def __init__(
        self,
        architecture: str = "mavl",
        checkpoint: str | None = None,
        knowledge: str | list[str] | None = None,
        text: str | None = None,
        query_embeddings: str | None = None,
        query_cache: str | None = None,
        entities: dict[str, str] | None = None,
        random_init: bool = False,
        score_mode: ScoreMode = "feature",
        image_size: PositiveInt | None = None,
        **kwargs,
    ):
        if score_mode not in self.SCORE_MODES:
            raise ValueError(f"score_mode must be one of {self.SCORE_MODES}, got {score_mode!r}")
        super().__init__(architecture, checkpoint, knowledge, text, query_embeddings, query_cache, entities,
                         random_init, image_size, **kwargs)
        self.score_mode = score_mode

    def texts_of(self, entities: tuple[str, ...], classes: list[str] | None = None) -> tuple[str, ...]:
        """Per entity, by key: its description then its aspect sentences (query ``9 i + j``)."""
        aspects = len(self.concepts) - 1
        missing = [e for e in entities if e not in self.descriptions]
        if missing:
            raise self.knowledge_error(missing, "description", classes)
        missing = [e for e in entities if e not in self.aspects]
        if missing:
            raise self.knowledge_error(missing, f"{aspects} aspect sentences (as in gpt4_mimic.json)", classes)
        wrong = [f"{e!r} has {len(self.aspects[e])} ({self.knowledge_origin[e]})" for e in entities if len(self.aspects[e]) != aspects]
        if wrong:
            raise ValueError(f"MAVL needs exactly {aspects} aspect sentences per entity (the model groups "
                             f"{len(self.concepts)} queries per entity): {', '.join(wrong)}")
        return tuple(t for e in entities for t in (self.descriptions[e], *self.aspects[e]))

    def scores(self, decoded: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.score_mode == "feature":
            return super().scores(decoded)
        return self.text_scores(decoded)

    def text_scores(self, decoded: dict[str, torch.Tensor]) -> torch.Tensor:
        """``score_mode="text"``: ``[B, n]``, the mean over the anchors and the concepts of
        ``softmax([cos(anchor_k), cos(entity_k)])[1]``; cosines of the pooled global feature."""
        cosines = self.text_logits(decoded)  # [B, concepts, n]
        probs = []
        for anchor in self.config.get("anchors", ["normal", "clear"]):
            column = cosines[:, :, [self.base_entities.index(anchor)]].expand_as(cosines)
            probs.append(torch.stack([column, cosines], dim=-1).softmax(dim=-1)[..., 1])
        return torch.stack(probs).mean(dim=0).mean(dim=1)

    def text_logits(self, decoded: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cosines ``[B, concepts, n]`` of the global feature with every concept query."""
        global_feature = nn.functional.normalize(self.pool(decoded["tokens"]).float(), dim=-1)
        queries = nn.functional.normalize(decoded["queries"].float(), dim=-1)
        return (global_feature @ queries.T).unflatten(1, (-1, len(self.concepts))).transpose(1, 2)
