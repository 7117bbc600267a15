"""Every dataset as a Lightning ``LightningDataModule``, which ``test`` and ``fit`` run.

A dataset is a plain class (``XBenchData`` and its subclasses: records, checks, loaders), so that the commands that
only read data (``describe``, ``score``, ``compare``) start without Lightning. Its ``LightningDataModule`` is the
same class with ``XBenchDataModule`` mixed in, named as it plus ``Module`` in its own module (``NIHBoxData`` ->
``xbench_pl.data.nih_bbox.NIHBoxDataModule``, the class path its config names), built here once, when the module's
``__getattr__`` (``registry.lightning_datamodules``) is first asked for it. A datamodule subclasses another's
(``DemoDataModule`` is a ``NIHBoxDataModule``) as its plain class does.
"""

from __future__ import annotations

import sys

import lightning as L

from xbench_pl.data.base import XBenchData
from xbench_pl.geometry import Preprocess


class XBenchDataModule(XBenchData, L.LightningDataModule):
    """``XBenchData`` for Lightning: the base of every dataset's ``LightningDataModule`` (and of one written by hand).

    Without a ``preprocess`` of its own it takes the trainer's model's (looked up at every setup, so one datamodule can
    serve several models in turn); it writes its files (``split_out``) on the global rank zero only.
    """

    def model_preprocess(self) -> Preprocess | None:
        model = self.trainer.lightning_module if self.trainer is not None else None
        return getattr(model, "preprocess", None)

    def is_rank_zero(self) -> bool:
        return self.trainer is None or self.trainer.is_global_zero


def datamodule_class(data_class: type[XBenchData]) -> type[XBenchDataModule]:
    """``data_class``'s ``LightningDataModule``: ``data_class`` and its base class's datamodule, named ``data_class``'s
    name + ``Module`` in its module (built once, then found there)."""
    if data_class is XBenchData:
        return XBenchDataModule
    module, name = sys.modules[data_class.__module__], data_class.__name__ + "Module"
    built = vars(module).get(name)
    if built is None:
        base = next(b for b in data_class.__bases__ if issubclass(b, XBenchData))
        built = type(name, (data_class, datamodule_class(base)),
                     {"__module__": module.__name__, "__qualname__": name, "__doc__": data_class.__doc__})
        setattr(module, name, built)  # found as a module attribute from now on (pickle, jsonargparse)
    return built
