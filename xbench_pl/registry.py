"""Models and datasets by name. A name is a config file: ``configs/models/NAME.yaml`` or
``configs/data/NAME.yaml``, holding ``class_path`` and default ``init_args``. Adding a model or
dataset is one module plus one such file; the CLI and ``create_*`` find it by its name. A dataset module defines
its plain class (``MyData(XBenchData)``) and ends with ``__getattr__ = lightning_datamodules(MyData)``; its config
names ``module.MyDataModule``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import yaml

from xbench_pl.console import note

_PACKAGE = Path(__file__).resolve().parent
# repo checkout (editable install) first, then the copy a wheel carries
CONFIG_ROOTS = (_PACKAGE.parent / "configs", _PACKAGE / "configs")


class UnknownName(KeyError):
    """A model or dataset name with no config file; the message lists the available names, ``option`` is the
    command line's for the kind (``--model``, ``--data``)."""

    def __init__(self, message: str, kind: str):
        super().__init__(message, kind)
        self.option = "--model" if kind == "models" else "--data"

    def __str__(self) -> str:
        return str(self.args[0])


def config_dir(kind: str) -> Path:
    for root in CONFIG_ROOTS:
        if (root / kind).is_dir():
            return root / kind
    raise FileNotFoundError(f"no configs/{kind} folder in {[str(r) for r in CONFIG_ROOTS]}")


def available(kind: str) -> list[str]:
    """Registered names of ``kind`` ("models" or "data")."""
    return sorted(p.stem for p in config_dir(kind).glob("*.yaml"))


def config_path(kind: str, name: str) -> Path:
    path = config_dir(kind) / f"{name}.yaml"
    if not path.is_file():
        raise UnknownName(f"unknown {kind[:-1] if kind == 'models' else 'dataset'} {name!r}; available: {available(kind)}", kind)
    return path


def class_path(kind: str, name: str) -> str:
    """The class path of a registered name's config."""
    return yaml.safe_load(config_path(kind, name).read_text())["class_path"]


def qualified_name(cls: type) -> str:
    """``module.QualName`` of ``cls``: the class path a config names it by (``resolve_class`` reads it back)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def resolve_class(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def lightning_datamodules(*data_classes: type) -> Callable[[str], type]:
    """A dataset module's ``__getattr__``: each of ``data_classes``' (``XBenchData`` subclasses) ``LightningDataModule``
    by its name, the class's name + ``Module`` (``xbench_pl.data.lightning.datamodule_class``), built when first asked
    for, so that importing the module imports no Lightning. ``data_classes`` (an attribute of the function) maps each
    such name to its class, for ``data_class``."""
    names = {cls.__name__ + "Module": cls for cls in data_classes}

    def __getattr__(name: str) -> type:
        if name not in names:
            raise AttributeError(f"module {data_classes[0].__module__!r} has no attribute {name!r}")
        from xbench_pl.data.lightning import datamodule_class

        return datamodule_class(names[name])

    __getattr__.data_classes = names
    return __getattr__


def data_class(class_path: str) -> type:
    """The dataset class a data config's class path names, read without Lightning: a dataset's
    ``LightningDataModule`` built on demand (``lightning_datamodules``) is read as its plain class; any other class
    as it is."""
    module, _, name = class_path.rpartition(".")
    on_demand = vars(importlib.import_module(module)).get("__getattr__")
    return getattr(on_demand, "data_classes", {}).get(name) or resolve_class(class_path)


def read_config(kind: str, name: str, resolve=resolve_class) -> tuple[type, dict]:
    """The class of a registered name (its config's class path, ``resolve``d) and its default init args."""
    config = yaml.safe_load(config_path(kind, name).read_text())
    return resolve(config["class_path"]), dict(config.get("init_args") or {})


def read_data_config(name: str) -> tuple[type, dict]:
    """A registered dataset's plain class (``data_class``: reading it needs no Lightning) and its default init args."""
    return read_config("data", name, data_class)


#: model arguments renamed so that every family says the same thing by the same name (old -> new); the old
#: names still work, with a note, wherever model arguments are given (``renamed_args``)
RENAMED_ARGS = {"tokenizer": "text", "text_encoder": "text"}


def renamed_args(init_args: dict, spelling: str = "{}=", where: str = "") -> dict:
    """``init_args`` with each old name of ``RENAMED_ARGS`` replaced by the new one, and one ``note:`` line per
    rename on stderr (rank zero), naming both as the user wrote them (``spelling``: ``"--model.{}"`` on the command line;
    ``where``: the file they came from)."""
    renamed = {}
    for key, value in init_args.items():
        new = renamed_key(key, spelling, where)
        if new != key and new in init_args:
            raise ValueError(f"{spelling.format(key)} and {spelling.format(new)} name the same argument: "
                             f"give {spelling.format(new)} only")
        renamed[new] = value
    return renamed


def renamed_key(key: str, spelling: str = "{}=", where: str = "") -> str:
    """The name of argument ``key`` (``RENAMED_ARGS``); an old one is noted as ``renamed_args`` says."""
    new = RENAMED_ARGS.get(key, key)
    if new != key:
        note(f"note: {where}{spelling.format(key)} is now {spelling.format(new)}")
    return new


def create(kind: str, name: str, resolve=resolve_class, /, **overrides):
    """A registered name's class (``resolve``d from its config's class path) with ``overrides`` over its init args."""
    cls, init_args = read_config(kind, name, resolve)
    return cls(**{**init_args, **overrides})


def create_model(name: str, **kwargs):
    """A registered model by name, with ``kwargs`` overriding its config's init args (old argument names work:
    ``RENAMED_ARGS``)."""
    return create("models", name, **renamed_args(kwargs))


def create_datamodule(name: str, **kwargs):
    """A registered datamodule by name, with ``kwargs`` overriding its config's init args."""
    return create("data", name, **kwargs)
