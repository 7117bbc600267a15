"""Several datasets in one run, each evaluated and reported on its own.

``PooledData`` holds child datasets (``XBenchData``; plain even in a Lightning run, where the pooled
``PooledDataModule`` builds their loaders). Its ``dataset_specs`` lists each
child's (name, classes), so the model creates one metric set per dataset; its test
dataloader is a list, one loader per child, each built by the child (exact, un-padded
distributed sampling per dataset). Batches carry their dataset's name and class list, so
nothing is mixed: a pooled run gives the same per-dataset numbers as separate runs.

YAML (``configs/data/pooled.yaml``, or ``--data pooled --data.datasets '[...]'``)::

    class_path: xbench_pl.data.pooled.PooledDataModule
    init_args:
      datasets:
        - demo                                        # a registered name
        - name: chestx_det10                          # a name with overrides
          init_args: {root: /data/ChestX-Det10}
        - class_path: xbench_pl.data.chexlocalize.CheXlocalizeDataModule
          init_args: {root: /data/CheXlocalize, split: val}

With ``root`` set (``--data.root /data``), a child built from a name or mapping without its
own ``root`` reads ``root/<dataset name>`` when that folder exists: the shipped
``configs/data/pooled.yaml`` pools the seven XBench datasets laid out that way. When that
folder is missing, a child that needs a root fails naming it (one that needs none, such as
``demo``, uses its default).

Settings given to the pooled module (``batch_size``, ``num_workers``, ``eval_size``,
``on_error``, ``preprocess``, ``cache_dir``, ``max_side``) apply to every child built from a
name or mapping, over the child's own config; an entry's ``init_args`` override them in turn.
A child passed as an ``XBenchData`` instance is used as it is.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from jsonargparse.typing import NonNegativeInt, PositiveInt
from torch.utils.data import DataLoader

from xbench_pl.data.base import OnError, XBenchData
from xbench_pl.geometry import Preprocess
from xbench_pl.registry import create, data_class, lightning_datamodules


class PooledData(XBenchData):
    """Datasets evaluated together, reported per dataset.

    Args:
        datasets: the children: registered names, ``{"name": NAME, "init_args": {...}}``,
            ``{"class_path": PATH, "init_args": {...}}``, or ``XBenchData`` instances.
        root: parent folder holding one folder per dataset, named as the dataset.
        batch_size, num_workers, eval_size, on_error, preprocess, cache_dir, max_side: shared
            by every child built here (see the module docstring).
    """

    name = "pooled"

    def __init__(
        self,
        datasets: list[str | dict[str, Any]],
        root: str | None = None,
        batch_size: PositiveInt = 16,
        num_workers: NonNegativeInt = 0,
        eval_size: PositiveInt = 512,
        on_error: OnError = "raise",
        preprocess: Preprocess | None = None,
        cache_dir: str | None = None,
        max_side: PositiveInt | None = None,
    ):
        shared = dict(batch_size=batch_size, num_workers=num_workers, eval_size=eval_size, on_error=on_error,
                      preprocess=preprocess, cache_dir=cache_dir, max_side=max_side)
        super().__init__(**shared)
        if not datasets:
            raise ValueError("pooled: give at least one dataset")
        self.children = [build_child(entry, shared, root) for entry in datasets]
        names = [child.name for child in self.datamodules]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"pooled: dataset(s) {repeated} given twice; results are keyed by dataset name")

    @property
    def datamodules(self) -> list[XBenchData]:
        return self.children

    def setup(self, stage: str | None = None) -> None:
        preprocess = self.resolve_preprocess()
        for child in self.datamodules:
            child.build_test_set(child.preprocess or preprocess)
        self.problems = [problem for child in self.datamodules for problem in child.problems]

    def test_dataloader(self) -> list[DataLoader]:
        return [child.test_dataloader() for child in self.datamodules]


def build_child(entry: str | dict[str, Any] | XBenchData, shared: dict[str, Any], root: str | None = None) -> XBenchData:
    """One child dataset from a pooled ``datasets`` entry (see ``PooledData``), a plain ``XBenchData``."""
    if isinstance(entry, XBenchData):
        return entry
    if isinstance(entry, str):
        entry = {"name": entry}
    if isinstance(entry, dict) and set(entry) <= {"name", "class_path", "init_args"} and ("name" in entry) != ("class_path" in entry):
        overrides = {**shared, **(entry.get("init_args") or {})}
        if "name" in entry:
            name, make = entry["name"], partial(create, "data", entry["name"], data_class)
        else:
            cls = data_class(entry["class_path"])
            name, make = getattr(cls, "name", ""), cls
        folder = Path(root) / name if root is not None and "root" not in overrides and name else None
        if folder is not None and folder.is_dir():
            overrides["root"] = str(folder)
        child = make(**overrides)
        if isinstance(child, XBenchData):
            if folder is not None and not folder.is_dir():
                child.expected_root = folder  # a dataset that needs a root then says this folder is missing
            return child
    raise ValueError(f"pooled: a dataset entry must be a registered name, {{'name' or 'class_path', 'init_args'}} "
                     f"or an XBenchData giving an XBenchData, got {entry!r}")

#: ``PooledDataModule``: its ``LightningDataModule``, built on first use (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(PooledData)
