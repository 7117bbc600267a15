"""Deterministic test data for CARZero: a checkpoint laid out like the released PyTorch Lightning
``CARZero_best_model.ckpt``, a BioClinicalMPBERT-like text-encoder folder (config + small WordPiece
vocabulary), reference images and the prompts.

Used both by the scratch run of the authors' own code (``tests/data/make_carzero_manifests.py
reference``, which wrote ``tests/data/carzero_reference.pt``) and by our tests, which load the same
checkpoint into ``xbench_pl.models.carzero`` and compare with those outputs. Plain module: no pytest,
no transformers; only torch. ``write_lightning_checkpoint`` pickles omegaconf / pytorch_lightning
objects as a real file does, with the real packages when they import and byte-identical named
stand-ins otherwise (nothing of either is needed, and nothing is left in ``sys.modules``).

Layout facts (keys, shapes, dtypes, aliases) come from ``tests/data/carzero_checkpoint_manifest.json``,
derived from the authors' architecture on the meta device (``tests/data/make_carzero_manifests.py``).
The Lightning container follows pytorch-lightning 1.1.4 (the authors' pin),
``trainer/connectors/checkpoint_connector.py::dump_checkpoint``:

* ``epoch``, ``global_step``, ``pytorch-lightning_version``;
* ``callbacks``: ``{callback class: state}`` (the *class object* is the key, so the pickle
  references ``pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint`` and
  ``pytorch_lightning.callbacks.early_stopping.EarlyStopping``);
* ``optimizer_states`` (Adam), ``lr_schedulers`` (ReduceLROnPlateau), ``native_amp_scaling_state``
  (the config trains with ``precision: 16``);
* ``state_dict`` (``CARZero.`` + the model's keys);
* ``hparams_name`` (``"cfg"``), ``hyper_parameters`` (the OmegaConf ``DictConfig`` itself) and
  ``hparams_type`` (the ``DictConfig`` class).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.machinery
import json
import math
import sys
import types
from functools import lru_cache
from pathlib import Path

import torch

from reference_common import (LETTER_PIECES, LOWER, PUNCTUATION_DIGITS, bert_specials, fill, grey_fields, seeded_tensors,
                              write_json, write_vocab)

DATA = Path(__file__).resolve().parent / "data"

CARZERO_COMMIT = "fa4e09cdfe7801e36e83d96815e3fcf66ffdd13d"
PREFIX = "CARZero."
IMAGE_SIZE = 224
GRID = 14
WORD_NUM = 97  # cfg.data.text.word_num: tokenizer max_length and the number of word slots
MEAN, STD = 0.4978, 0.2449  # builder.build_transformation, norm "CXR_MAE" (one value for all channels)
PL_VERSION = "1.1.4"
NUM_LAYERS = 4  # fusion decoder layers

# Zero-shot prompts, "There is {finding}" (the authors' Dataset/ChestXray14/chestxray14_test_text.json,
# as copied in Skizdukion/reproduce_carzero), one prompt per class, in class order.
CXR14_PROMPTS = (
    "There is Atelectasis", "There is Cardiomegaly", "There is Pleural Effusion",
    "There is Pulmonary Infiltration", "There is Pulmonary Mass", "There is Lung Nodule", "There is Pneumonia",
    "There is Pneumothorax", "There is Pulmonary Consolidation", "There is Pulmonary Edema",
    "There is Pulmonary Emphysema", "There is Fibrosis", "There is Pleural Thickening", "There is Hernia",
)
# Extra texts exercising the authors' text path: several sentences (split on "."), a one-word sentence
# (dropped), punctuation and digits (only \w+ kept), upper case (lower-cased), unknown words
# (split into ## pieces and merged back into words).
EXTRA_PROMPTS = (
    "Small left pleural effusion. Heart. No pneumothorax, 2 nodules seen",
    "Findings suggest hyperinflation; xyzzy opacities at the bases",
)
PROMPTS = CXR14_PROMPTS + EXTRA_PROMPTS

# Query/key projections (ViT ``attn.qkv`` q/k rows, BERT ``attention.self.{query,key}``, the decoder's
# packed ``in_proj_weight`` q/k rows) are drawn 3x wider than 1/sqrt(fan_in), so the attention
# softmaxes are peaked, not near-uniform: maps then depend clearly on image and text.
ATTENTION_GAIN = 3.0
TOKEN_STD = 0.5  # cls_token, pos_embed

# cfg after run.py's and the module's in-place edits (the object saved as hyper_parameters): the
# values of configs/mimic_pretrain_llm_dqn_wo_self_atten_mlp_gl.yaml, then frac/experiment_name/
# extension/output_dir/dirpath (run.py __main__), logger name and re-appended logger_type,
# trainer.val_check_interval/auto_lr_find (run.py main) and train.scheduler.interval/frequency
# (builder.build_scheduler). The timestamp and frequency are invented.
_STAMP = "2023_11_20_09_41_07"
_EXP = "CARZero_Globa_local_MLP_1.0"
HYPER_PARAMETERS = {
    "experiment_name": _EXP,
    "phase": "pretrain_llm_dqn_wo_self_atten_mlp_gl",
    "trial_name": None,
    "lightning": {
        "trainer": {"gpus": "0", "max_epochs": 15, "distributed_backend": "dp", "gradient_clip_val": 0.25,
                    "lr": 5e-05, "precision": 16, "reload_dataloaders_every_epoch": True,
                    "val_check_interval": 1.0, "auto_lr_find": False},
        "checkpoint_callback": {"monitor": "val_loss", "dirpath": f"./data/ckpt/{_EXP}/{_STAMP}", "save_last": True,
                                "mode": "min", "save_top_k": 1},
        "early_stopping_callback": {"monitor": "val_loss", "min_delta": 0.0, "patience": 10, "verbose": False,
                                    "mode": "min"},
        "logger": {"save_dir": "./data/CSV", "name": f"{_EXP}_{_STAMP}", "logger_type": "CSVLogger"},
    },
    "model": {
        "norm": False,
        "CARZero": {"local_loss_weight": 1.0, "global_loss_weight": 1.0, "ce_loss_weight": 1.0, "temp1": 4.0,
                    "temp2": 5.0, "temp3": 10.0},
        "vision": {"model_name": "vit_b_16", "base": "transformer", "freeze_cnn": False, "pretrained": True},
        "text": {"bert_type": "Laihaoran/BioClinicalMPBERT", "last_n_layers": 4, "aggregate_method": "sum",
                 "norm": False, "embedding_dim": 768, "freeze_bert": False, "agg_tokens": True},
        "fusion": {"d_model": 768, "H": 4, "N": 4, "dropout": 0.1, "state_prob": 1, "class_num": 1,
                   "decoder_number_layer": 4},
    },
    "data": {"dataset": "pretrain_xh", "text": {"word_num": WORD_NUM, "captions_per_image": 5, "full_report": False},
             "image": {"imsize": 256}, "frac": 1.0},
    "transforms": {"norm": "CXR_MAE", "random_crop": {"crop_size": 224}, "random_horizontal_flip": 0.3,
                   "random_affine": {"degrees": 30, "translate": [0.1, 0.1], "scale": [0.9, 1.1]},
                   "color_jitter": {"bightness": [0.8, 1.2], "contrast": [0.8, 1.2]}},
    "train": {"update_interval": 1000, "batch_size": 256, "num_workers": 0, "nvis": 4, "rand_vis": False,
              "optimizer": {"name": "Adam", "weight_decay": 1e-06},
              "scheduler": {"name": "plateau", "monitor": "val_loss", "inerval": "epoch", "frequency": 1408,
                            "interval": "step"}},
    "extension": _STAMP,
    "output_dir": f"./data/output/{_EXP}/{_STAMP}",
}

# BioClinicalMPBERT's architecture: BERT-base (12 layers, 12 heads, 768/3072, 512 positions, 2 token
# types), vocabulary of Bio_ClinicalBERT / bert-base-cased (28996 entries; the hub repo's vocab.txt is
# 213 kB and pytorch_model.bin 433 MB, i.e. 108.3 M float32 values, which match 28996 rows).
BERT_CONFIG = {
    "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute", "type_vocab_size": 2,
    "vocab_size": 28996,
}

OMEGACONF_CLASSES = {
    "DictConfig": ("omegaconf.dictconfig", "DictConfig"),
    "ListConfig": ("omegaconf.listconfig", "ListConfig"),
    "AnyNode": ("omegaconf.nodes", "AnyNode"),
    "Metadata": ("omegaconf.base", "Metadata"),
    "ContainerMetadata": ("omegaconf.base", "ContainerMetadata"),
}
CALLBACK_CLASSES = {
    "model_checkpoint": ("pytorch_lightning.callbacks.model_checkpoint", "ModelCheckpoint"),
    "early_stopping": ("pytorch_lightning.callbacks.early_stopping", "EarlyStopping"),
}

# Whole words of the generated vocabulary. Several finding words are deliberately *absent*
# (atelectasis, cardiomegaly, pneumothorax, infiltration, consolidation, emphysema, hernia, ...):
# the tokenizer splits them into "##" pieces and the authors' text encoder merges them back.
_WORDS = """
there is no small left right pleural effusion heart lung lungs nodule nodules mass pulmonary edema
pneumonia fibrosis thickening seen findings suggest at the bases base opacity opacities with without
mild moderate severe and of in on
"""
_PREFIXES = "at card pneum pneumo infil consol emph hern hyper fib thick xy op"
_PIECES = """
ele ect asis iomeg aly egal ot ora thorax tra tion ation id ida emph ys ema ia nia in fl fla
zz zy s es ed ing al ic
"""


@lru_cache(maxsize=None)
def manifest() -> dict:
    """The checkpoint manifest (keys with the ``CARZero.`` prefix, shapes, dtypes, aliases, counts)."""
    return json.loads((DATA / "carzero_checkpoint_manifest.json").read_text())


def _fill(key: str, shape: list[int], dtype: str, g: torch.Generator) -> torch.Tensor:
    """One tensor of the manifest: ``reference_common.fill``, the ViT's class and position tokens
    drawn wider, query/key projections widened (packed ``[q; k; v]``: q and k rows only)."""
    if dtype == "float32" and key.rsplit(".", 1)[-1] in ("cls_token", "pos_embed"):
        return TOKEN_STD * torch.randn(shape, generator=g)
    w = fill(key, shape, dtype, g)
    if len(shape) > 1 and key.endswith(("attention.self.query.weight", "attention.self.key.weight")):
        w = w * ATTENTION_GAIN
    elif len(shape) > 1 and key.endswith(("attn.qkv.weight", "in_proj_weight")):
        d = shape[0] // 3
        w[: 2 * d] *= ATTENTION_GAIN
    return w


def state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """The Lightning ``state_dict`` (``CARZero.`` keys), in the manifest's key order.

    Every non-alias tensor is drawn from one ``torch.Generator(seed)`` in sorted key order; an alias
    key (``fusion_module.decoder.norm.*``) holds the very tensor of its source (``decoder_norm.*``).
    """
    spec = manifest()
    return seeded_tensors(spec["keys"], spec["aliases"], _fill, torch.Generator().manual_seed(seed))


def official_checkpoint(seed: int = 0) -> dict:
    """A plain-dict image of the released checkpoint (~221 M float32 values, ~0.9 GB).

    Loadable with ``torch.load(weights_only=True)`` as is: the callbacks are keyed by the dotted
    class *name* and ``hyper_parameters`` is a plain nested dict. ``write_lightning_checkpoint``
    writes the real thing (class keys, a ``DictConfig``, ``hparams_type``).
    """
    sd = state_dict(seed)
    trainable = [k for k in sd if k not in manifest()["aliases"] and k not in manifest()["frozen"]]
    return {
        "epoch": 9,
        "global_step": 14080,
        "pytorch-lightning_version": PL_VERSION,
        "callbacks": {
            ".".join(CALLBACK_CLASSES["model_checkpoint"]): {
                "monitor": "val_loss", "best_model_score": torch.tensor(2.7182817),
                "best_model_path": f"/data/ckpt/{_EXP}/{_STAMP}/epoch=8.ckpt",
                "current_score": torch.tensor(2.7182817), "dirpath": f"./data/ckpt/{_EXP}/{_STAMP}",
            },
            ".".join(CALLBACK_CLASSES["early_stopping"]): {
                "wait_count": 0, "stopped_epoch": 0, "best_score": torch.tensor(2.7182817), "patience": 10,
            },
        },
        "optimizer_states": [{
            "state": {0: {"step": torch.tensor(14080.0), "exp_avg": torch.zeros(4), "exp_avg_sq": torch.zeros(4)}},
            "param_groups": [{"lr": 5e-05, "betas": (0.5, 0.999), "eps": 1e-08, "weight_decay": 1e-06,
                              "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                              "initial_lr": 5e-05, "params": list(range(len(trainable)))}],
        }],
        "lr_schedulers": [{
            "factor": 0.5, "min_lrs": [0.0], "patience": 5, "verbose": False, "cooldown": 0, "cooldown_counter": 0,
            "mode": "min", "threshold": 0.0001, "threshold_mode": "rel", "best": 2.7182817, "num_bad_epochs": 0,
            "mode_worse": math.inf, "eps": 1e-08, "last_epoch": 9, "_last_lr": [5e-05],
        }],
        "native_amp_scaling_state": {"scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                     "growth_interval": 2000, "_growth_tracker": 417},
        "state_dict": sd,
        "hparams_name": "cfg",
        "hyper_parameters": copy.deepcopy(HYPER_PARAMETERS),
    }


@contextlib.contextmanager
def _importable_classes(targets: dict[str, tuple[str, str]]):
    """Yield ``{name: class}`` whose ``module.qualname`` is ``targets[name]``, so that pickle writes a
    GLOBAL by that name. The real class is used when its package imports; otherwise a bare stand-in
    class is registered under that module in ``sys.modules`` only for the duration (pickle looks the
    name up to check it), and removed afterwards."""
    added: list[str] = []
    found = {}
    try:
        for name, (module, qualname) in targets.items():
            try:
                found[name] = getattr(importlib.import_module(module), qualname)
                continue
            except (ImportError, AttributeError):
                pass
            parts = module.split(".")
            for i in range(1, len(parts) + 1):
                mod_name = ".".join(parts[:i])
                if mod_name not in sys.modules:
                    mod = types.ModuleType(mod_name)
                    mod.__spec__ = importlib.machinery.ModuleSpec(mod_name, None)
                    sys.modules[mod_name] = mod
                    added.append(mod_name)
            cls = type(qualname, (), {"__module__": module, "__qualname__": qualname})
            setattr(sys.modules[module], qualname, cls)
            found[name] = cls
        yield found
    finally:
        for mod_name in reversed(added):
            sys.modules.pop(mod_name, None)


def _omegaconf_image(value, classes: dict):
    """An object graph that pickles byte for byte like ``OmegaConf.create(value)`` (omegaconf 2.3.0),
    built from ``classes`` (stand-ins named like omegaconf's). omegaconf pickles each node's
    ``__dict__`` minus ``_flags_cache``: containers ``{_metadata, _parent, _content}``, leaves
    (``AnyNode``) ``{_metadata, _parent, _val}``; the metadata are dataclasses (``ref_type``,
    ``object_type``, ``optional``, ``key``, ``flags``, ``flags_root``, ``resolver_cache`` [+ ``key_type``,
    ``element_type`` for containers]). ``make_carzero_manifests.py`` checks the bytes against omegaconf."""
    import collections
    import typing

    def metadata(kind, key, object_type, **extra):
        m = object.__new__(classes[kind])
        m.__dict__.update(ref_type=typing.Any, object_type=object_type, optional=True, key=key, flags={},
                          flags_root=False, resolver_cache=collections.defaultdict(dict), **extra)
        return m

    def node(v, key, parent):
        if isinstance(v, dict):
            obj = object.__new__(classes["DictConfig"])
            obj.__dict__.update(_metadata=metadata("ContainerMetadata", key, dict, key_type=typing.Any,
                                                   element_type=typing.Any), _parent=parent, _content=None)
            obj._content = {k: node(x, k, obj) for k, x in v.items()}
        elif isinstance(v, (list, tuple)):
            obj = object.__new__(classes["ListConfig"])
            obj.__dict__.update(_metadata=metadata("ContainerMetadata", key, list, key_type=int,
                                                   element_type=typing.Any), _parent=parent, _content=None)
            obj._content = [node(x, i, obj) for i, x in enumerate(v)]
        else:
            obj = object.__new__(classes["AnyNode"])
            obj.__dict__.update(_metadata=metadata("Metadata", key, None), _parent=parent, _val=v)
        return obj

    return node(value, None, None)


def lightning_checkpoint(seed: int = 0, with_omegaconf: bool = True, classes: dict | None = None) -> dict:
    """``official_checkpoint`` with the objects a real file pickles: callback classes as keys and, if
    ``with_omegaconf``, the hyper-parameters as an OmegaConf ``DictConfig`` plus ``hparams_type``
    (``classes`` from ``_importable_classes``: real omegaconf / pytorch_lightning classes where they
    import, named stand-ins otherwise)."""
    ckpt = official_checkpoint(seed)
    if classes is not None:
        names = {".".join(v): k for k, v in CALLBACK_CLASSES.items()}
        ckpt["callbacks"] = {classes[names[k]]: v for k, v in ckpt["callbacks"].items()}
    if with_omegaconf:
        if classes is None:
            raise ValueError("with_omegaconf needs the classes from _importable_classes(OMEGACONF_CLASSES)")
        hp = ckpt.pop("hyper_parameters")
        if classes["DictConfig"].__module__ == "omegaconf.dictconfig" and hasattr(classes["DictConfig"], "_get_node"):
            from omegaconf import OmegaConf  # noqa: PLC0415  (the real package, when installed)

            ckpt["hyper_parameters"] = OmegaConf.create(hp)
        else:
            ckpt["hyper_parameters"] = _omegaconf_image(hp, classes)
        ckpt["hparams_type"] = classes["DictConfig"]
    return ckpt


def write_lightning_checkpoint(path: str | Path, seed: int = 0, with_omegaconf: bool = True) -> Path:
    """Write a ``.ckpt`` pickled like the released file: ``torch.save`` of the Lightning dict whose
    pickle references the classes listed in ``carzero_reference.pt["pickle_globals"]``: omegaconf's
    ``DictConfig``, ``ListConfig``, ``AnyNode``, ``Metadata``, ``ContainerMetadata`` (plus
    ``typing.Any``, ``collections.defaultdict``, ``__builtin__.dict/list/long``) and
    ``pytorch_lightning.callbacks.{model_checkpoint.ModelCheckpoint, early_stopping.EarlyStopping}``.

    Neither omegaconf nor pytorch_lightning is needed: where one does not import, named stand-in
    classes are registered for the duration of the save and the ``DictConfig`` is emulated
    (``_omegaconf_image``), giving the same pickle bytes as omegaconf 2.3.0 (checked when
    ``carzero_reference.pt`` was made: ``hyper_parameters_pickle_sha256``). ``with_omegaconf=False``
    keeps ``hyper_parameters`` a plain dict and writes no ``hparams_type``.

    A reader must load it without importing or running any of these classes: e.g. ``weights_only=True``
    with those names mapped to inert stand-ins."""
    path = Path(path)
    targets = {**CALLBACK_CLASSES, **(OMEGACONF_CLASSES if with_omegaconf else {})}
    with _importable_classes(targets) as classes:
        ckpt = lightning_checkpoint(seed, with_omegaconf=with_omegaconf, classes=classes)
        torch.save(ckpt, path)
    return path


def hyper_parameters_pickle(classes: dict | None = None) -> bytes:
    """``pickle.dumps`` (protocol 2, as ``torch.save``) of ``{hyper_parameters, hparams_type}`` as
    written by ``write_lightning_checkpoint``, for comparing omegaconf with the emulation."""
    import pickle

    with _importable_classes(OMEGACONF_CLASSES) as found:
        classes = classes or found
        ckpt = {"hyper_parameters": copy.deepcopy(HYPER_PARAMETERS)}
        if hasattr(classes["DictConfig"], "_get_node"):
            from omegaconf import OmegaConf  # noqa: PLC0415

            ckpt["hyper_parameters"] = OmegaConf.create(ckpt["hyper_parameters"])
        else:
            ckpt["hyper_parameters"] = _omegaconf_image(ckpt["hyper_parameters"], classes)
        ckpt["hparams_type"] = classes["DictConfig"]
        return pickle.dumps(ckpt, protocol=2)


def vocabulary() -> list[str]:
    """BERT-cased-like WordPiece vocabulary: ``[PAD]``=0, ``[unusedN]``, ``[UNK]``=100, ``[CLS]``=101,
    ``[SEP]``=102, ``[MASK]``=103, then punctuation, digits, letters, words, prefixes, ## pieces."""
    chars = PUNCTUATION_DIGITS + LOWER
    words = sorted(set(_WORDS.split()) | set(_PREFIXES.split()))
    pieces = LETTER_PIECES + sorted({f"##{p}" for p in _PIECES.split()} - set(LETTER_PIECES))
    vocab = bert_specials(range(1, 100)) + chars + [w for w in words if w not in chars] + pieces
    assert len(vocab) == len(set(vocab)) and len(vocab) < BERT_CONFIG["vocab_size"]
    return vocab


def write_text_encoder_folder(folder: str | Path, seed: int = 0) -> Path:
    """The files of a local ``Laihaoran/BioClinicalMPBERT`` folder as the hub repo has them:
    ``config.json`` (the BERT config above) and ``vocab.txt`` (generated). No tokenizer_config.json,
    as in the hub repo: AutoTokenizer then gives a BertTokenizer(Fast) with its defaults
    (do_lower_case=True). ``seed`` is unused (the vocabulary is fixed); kept for symmetry."""
    del seed
    folder = write_vocab(folder, vocabulary())
    write_json(folder / "config.json", BERT_CONFIG, indent=2)
    return folder


def reference_images(seed: int = 0, batch: int = 2) -> torch.Tensor:
    """``[batch, 3, 224, 224]`` inputs normalised as trained, ``(x - 0.4978) / 0.2449`` on all three
    channels: smooth grey fields in [0, 1] (two scales of up-sampled noise through a sigmoid)."""
    grey = grey_fields(IMAGE_SIZE, torch.Generator().manual_seed(seed), batch, fine=28)
    return ((grey - MEAN) / STD).contiguous()
