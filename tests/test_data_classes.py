"""A dataset is a plain class (``XBenchData``); its ``LightningDataModule`` (the class name + ``Module``, in the same
module) is built on first use and is what configs and stores name (``registry.lightning_datamodules``)."""

import inspect
import pickle

import lightning as L
import pytest

from xbench_pl.data import nih_bbox
from xbench_pl.data.base import XBenchData
from xbench_pl.data.lightning import XBenchDataModule, datamodule_class
from xbench_pl.registry import class_path, data_class, qualified_name


def test_a_datamodule_is_its_plain_class_for_lightning_and_subclasses_as_the_plain_class_does():
    demo = nih_bbox.DemoDataModule
    assert demo is datamodule_class(nih_bbox.DemoData) and demo is nih_bbox.DemoDataModule  # built once
    assert issubclass(demo, (nih_bbox.DemoData, nih_bbox.NIHBoxDataModule, XBenchDataModule, L.LightningDataModule))
    assert qualified_name(demo) == class_path("data", "demo") == "xbench_pl.data.nih_bbox.DemoDataModule"
    assert inspect.signature(demo) == inspect.signature(nih_bbox.DemoData) and demo.__doc__ == nih_bbox.DemoData.__doc__
    assert type(pickle.loads(pickle.dumps(demo()))) is demo  # found again by its class path
    assert not issubclass(nih_bbox.DemoData, L.LightningDataModule)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchDataModule'"):
        nih_bbox.NoSuchDataModule


def test_a_config_class_path_reads_as_the_plain_class_and_any_other_class_as_itself():
    assert data_class("xbench_pl.data.nih_bbox.NIHBoxDataModule") is nih_bbox.NIHBoxData
    assert data_class("xbench_pl.data.lightning.XBenchDataModule") is XBenchDataModule  # written by hand: as it is
    assert data_class("xbench_pl.data.base.XBenchData") is XBenchData
