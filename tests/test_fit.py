"""``fit``: fine-tuning on a dataset's training split, validated every epoch with the benchmark's metrics.

Tiny random-init models of the real families (an open_clip ViT, KAD's ResNet + query decoder) fit
for a few steps on the synthetic demo: the selected parameters change and nothing else does (frozen
BatchNorm statistics included); the logged validation numbers of each epoch are exactly a fresh
``test`` of that epoch's weights on the validation images (nothing accumulates across epochs); the
split is by patient, seeded, saved and re-used; a ``fit`` checkpoint loads in ``test`` and gives the
numbers of the fitted weights, on 1 process and (in a subprocess) on 2 DDP processes.
"""

from __future__ import annotations

import copy
import csv
import json
import re
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from test_cli import ddp_ranks

import kad_reference
from test_kad import tiny_architecture, write_json
from xbench_pl.commands import main
from xbench_pl.commands.arguments import PROG
from xbench_pl.data import splits
from xbench_pl.data.base import Record
from xbench_pl.data.errors import DataError
from xbench_pl.data.nih_bbox import DemoDataModule, NIHBoxDataModule
from xbench_pl.data.synthetic import ensure_demo
from xbench_pl.models.checkpoints import CheckpointError
from xbench_pl.models.kad import KAD
from xbench_pl.models.open_clip_model import OpenCLIPModel

TINY_CLIP = {  # OpenAI CLIP layout at toy size: 32 px, patch 8 -> 4 x 4 grid
    "model_cfg": {"embed_dim": 16, "quick_gelu": True,
                  "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
                  "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}},
    "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]},
}
QUIET = dict(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False)


@pytest.fixture(scope="module")
def clip_config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("clip") / "tiny_clip.json"
    path.write_text(json.dumps(TINY_CLIP))
    return str(path)


def tiny_clip(config: str, **kwargs) -> OpenCLIPModel:
    torch.manual_seed(0)
    return OpenCLIPModel(config, random_init=True, bootstrap=0, **kwargs)


def load_fit_checkpoint(model, path) -> dict:
    """As ``test --ckpt_path`` restores a model (read as test reads it: tensors and plain data only): the
    ``on_load_checkpoint`` hook, then a strict load. Returns the checkpoint as stored."""
    stored = torch.load(path, map_location="cpu", weights_only=True)
    checkpoint = {**stored}
    model.on_load_checkpoint(checkpoint)
    model.load_state_dict(checkpoint["state_dict"])
    return stored


def judged(model, loader) -> dict:
    """A fresh ``test`` of ``model``'s current weights on ``loader``: the demo's mean row."""
    L.Trainer(logger=False, **QUIET).test(model, dataloaders=loader, verbose=False)
    return model.results["demo"]["mean"]


# -- training and validation ---------------------------------------------------------------------
def test_fit_trains_only_the_selected_parameters_and_validates_each_epoch_afresh(clip_config, tmp_path):
    model = tiny_clip(clip_config, lr=0.05)
    dm = DemoDataModule(batch_size=4, val_fraction=0.25)
    weights = []

    class KeepWeights(L.Callback):  # the weights each validation judges
        def on_validation_epoch_start(self, trainer, pl_module):
            if not trainer.sanity_checking:
                weights.append(copy.deepcopy(pl_module.state_dict()))

    start = copy.deepcopy(model.state_dict())
    trainer = L.Trainer(max_epochs=2, logger=CSVLogger(tmp_path), enable_checkpointing=False, callbacks=[KeepWeights()],
                        log_every_n_steps=1, **QUIET)  # the sanity check fills the text cache in inference mode
    trainer.fit(model, datamodule=dm)

    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {"model.text_projection", "model.logit_scale"}  # OpenCLIPModel.TRAINABLE
    for name, value in model.state_dict().items():
        assert torch.equal(value, start[name]) != (name in trained), name  # these changed, nothing else did
    # validation: one logged row per epoch, each exactly a fresh test of that epoch's weights on the val set
    assert len(dm.val_set) == 3 and len(dm.train_set) == 9 and len(weights) == 2
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv") as handle:
        logged = [row for row in csv.DictReader(handle) if row.get("val/demo/dice_best")]
    assert len(logged) == 2 and len(model.val_history) == 2
    fresh = tiny_clip(clip_config)
    for row, state, history in zip(logged, weights, model.val_history):
        fresh.load_state_dict(state)
        expected = judged(fresh, dm.val_dataloader())
        assert expected["n_regions"] == 3 and expected["n_pos"] + expected["n_neg"] == 3 * 8  # nothing accumulated
        for key, value in expected.items():
            if value is not None:
                assert float(row[f"val/demo/{key}"]) == value, key
                assert history["mean"]["demo"][key] == value, key
    assert logged[0]["val/demo/ece"] != logged[1]["val/demo/ece"]  # the numbers follow the weights
    assert [int(row["step"]) for row in logged] == [3, 6]  # logged at the global step of each epoch end


def test_frozen_batchnorm_stays_in_eval_and_an_untrainable_choice_is_refused(tmp_path):
    tokenizer = str(kad_reference.write_tokenizer(tmp_path / "tokenizer"))
    architecture = write_json(tmp_path / "kad.json", tiny_architecture())
    model = KAD(architecture, random_init=True, text=tokenizer, bootstrap=0, lr=0.05)
    dm = DemoDataModule(batch_size=4, val_fraction=0.25, eval_size=64)
    start = copy.deepcopy(model.state_dict())
    fit = dict(max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False, enable_checkpointing=False, **QUIET)
    L.Trainer(**fit).fit(model, datamodule=dm)
    changed = {name for name, value in model.state_dict().items() if not torch.equal(value, start[name])}
    assert changed == {"mlp_head.0.weight", "mlp_head.0.bias"}  # KAD.TRAINABLE; BatchNorm statistics unchanged
    assert any(name.endswith("running_mean") for name in start)
    assert not model.image.training and not model.decoder.training and model.mlp_head.training
    # KAD embeds its queries without gradients: a text parameter cannot train, and fit says so at once
    text = KAD(architecture, random_init=True, text=tokenizer, bootstrap=0, trainable=[r"^text\.", r"^mlp_head\."])
    with pytest.raises(ValueError, match=r"trainable: \d+ selected parameter\(s\) get no gradient .*first: text\."):
        L.Trainer(**fit).fit(text, datamodule=dm)


def test_nothing_to_train_is_a_clear_error(clip_config):
    with pytest.raises(ValueError, match=r"has nothing to fit: trainable \['\^nothing'\] matches none of its"):
        tiny_clip(clip_config, trainable=["^nothing"]).select_trainable()
    with pytest.raises(ValueError, match="not a regular expression"):
        tiny_clip(clip_config, trainable=["("])


# -- the split -------------------------------------------------------------------------------------
def records(patients: list[str | None]) -> list[Record]:
    return [Record(f"img{i}.png", Path(f"img{i}.png"), {}, patient_id=p) for i, p in enumerate(patients)]


def test_split_is_by_patient_seeded_and_saved(tmp_path):
    pool = records([f"p{i // 3}" for i in range(30)] + [None] * 6)  # 10 patients of 3 images, 6 images without one
    split = splits.patient_split(pool, 0.25, seed=7)
    assert split == splits.patient_split(pool, 0.25, seed=7) != splits.patient_split(pool, 0.25, seed=8)
    by_unit: dict[str, set] = {}
    for record in pool:
        by_unit.setdefault(splits.unit_of(record), set()).add(split[record.image_id])
    assert len(by_unit) == 16 and all(len(sets) == 1 for sets in by_unit.values())  # a patient in one set only
    assert sum("val" in sets for sets in by_unit.values()) == 4  # round(0.25 x 16 units)
    path = splits.write_split(tmp_path / "split.csv", pool, split)
    assert path.read_text().splitlines()[:2] == ["image_id,patient_id,split", f"img0.png,p0,{split['img0.png']}"]
    assert splits.read_split(path, pool, report=pytest.fail) == split
    with pytest.raises(ValueError, match="at least 2 patients"):
        splits.patient_split(records(["p", "p"]), 0.5, 0)


def test_a_split_file_is_checked_when_re_used(tmp_path):
    pool = records(["a", "a", "b", "c"])
    bad = tmp_path / "bad.csv"
    bad.write_text("image_id,split\nimg0.png,train\nimg1.png,val\nimg2.png,val\n")
    with pytest.raises(DataError, match=r"bad.csv, row 3: patient a is in train \(row 2\) and in val"):
        splits.read_split(bad, pool, report=pytest.fail)
    bad.write_text("image_id,split\nimg0.png,train\nimg2.png,test\n")
    with pytest.raises(DataError, match="split 'test' of 'img2.png' is not one of"):
        splits.read_split(bad, pool, report=pytest.fail)
    bad.write_text("image_id,split\nimg9.png,train\nimg2.png,val\nimg3.png,train\n")
    problems = []
    assert splits.read_split(bad, pool, report=problems.append) == {"img2.png": "val", "img3.png": "train"}
    assert [str(p) for p in problems] == [f"{bad}, row 2: image id 'img9.png' is not among the images fit may use"]


def test_datamodule_saves_its_split_and_re_uses_it(tmp_path):
    preprocess = tiny_preprocess()
    first = DemoDataModule(preprocess=preprocess, val_fraction=0.25, split_seed=3)
    first.split_out = tmp_path / "split.csv"
    first.setup("fit")
    again = DemoDataModule(preprocess=preprocess, split_seed=99, fit_split=str(tmp_path / "split.csv"))
    again.setup("fit")
    for part in ("train_set", "val_set"):
        assert [r.image_id for r in getattr(again, part).records] == [r.image_id for r in getattr(first, part).records]
    assert {r.patient_id for r in first.val_set.records}.isdisjoint({r.patient_id for r in first.train_set.records})
    assert first.test_dataloader() is not None and len(first.test_set) == 12  # the evaluated set, built on first use


def test_official_test_list_is_left_out_of_fit(tmp_path):
    root = shutil.copytree(ensure_demo() / "nih", tmp_path / "nih")
    (root / "test_list.txt").write_text("phantom_000.png\nphantom_001.png\n")
    dm = NIHBoxDataModule(root=str(root), preprocess=tiny_preprocess())
    dm.setup("fit")
    used = {r.image_id for r in dm.train_set.records + dm.val_set.records}
    assert len(used) == 10 and not used & {"phantom_000.png", "phantom_001.png"}
    assert "official test_list.txt" in dm.fit_source


def test_chexlocalize_fits_on_its_val_split(real_cxr):
    from xbench_pl.data.chexlocalize import CheXlocalizeDataModule

    dm = CheXlocalizeDataModule(root=str(real_cxr / "chexlocalize"), split="test", preprocess=tiny_preprocess(), val_fraction=0.5)
    dm.setup("fit")
    assert dm.split == "test" and "official val split" in dm.fit_source
    assert len(dm.train_set) + len(dm.val_set) == 2  # the two CheXpert validation images of the sample


def tiny_preprocess():
    from xbench_pl.geometry import Preprocess

    return Preprocess(resize="squash", size=32)


# -- the CLI: fit, then test the checkpoint ------------------------------------------------------------
def test_fit_checkpoint_loads_in_test_with_the_fitted_numbers(clip_config, tmp_path, capsys):
    model_args = ["--model", "open_clip", "--model.architecture", clip_config, "--model.random_init", "true",
                  "--model.bootstrap", "0"]
    common = ["--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"]
    assert main(["fit", *model_args, "--model.lr", "0.05", "--data", "demo", "--data.val_fraction", "0.25",
                 "--trainer.max_epochs", "1", *common, "--out", str(tmp_path / "fit")]) == 0
    printed = capsys.readouterr().out
    checkpoint = tmp_path / "fit" / "checkpoints" / "last.ckpt"
    assert f"checkpoint: {checkpoint}" in printed and "validation after epoch 0 (3 images)" in printed
    assert f"{PROG} test {' '.join(model_args)} --data demo --ckpt_path {checkpoint}\n" in printed  # to paste
    assert "Total params" not in printed and "FLOPs" not in printed  # no Lightning model summary
    record = json.loads((tmp_path / "fit" / "fit.json").read_text())
    validated = record["validation"][0]["mean"]["demo"]  # in one table: the last epoch has no line of its own
    assert re.search(rf"\| demo +\| +{validated['pointing_game']:.3f} \| +{validated['dice@0.5']:.3f} \|", printed)
    assert "epoch 0 validation" not in printed
    assert record["checkpoint"] == str(checkpoint) and [e["epoch"] for e in record["validation"]] == [0]
    assert record["trained_parameters"] == ["model.text_projection", "model.logit_scale"]
    assert (tmp_path / "fit" / "split.csv").read_text().count(",val\n") == 3

    assert main(["test", *model_args, "--data", "demo", "--ckpt_path", str(checkpoint), *common,
                 "--out", str(tmp_path / "test")]) == 0
    report = json.loads((tmp_path / "test" / "metrics.json").read_text())
    assert report["config"]["ckpt_path"] == str(checkpoint)
    # the checkpoint holds the trained tensors only (and a fingerprint of the base weights): a few times their bytes
    fitted = tiny_clip(clip_config)
    stored = load_fit_checkpoint(fitted, checkpoint)
    assert sorted(stored["state_dict"]) == sorted(record["trained_parameters"])
    trained_bytes = sum(p.numel() * p.element_size() for n, p in fitted.named_parameters() if n in stored["state_dict"])
    all_bytes = sum(v.numel() * v.element_size() for v in fitted.state_dict().values())
    assert checkpoint.stat().st_size < 3 * trained_bytes + 32_000 < all_bytes / 100, (checkpoint.stat().st_size, trained_bytes)
    # testing the fitted weights directly
    dm = DemoDataModule(batch_size=4, preprocess=fitted.preprocess)
    dm.setup("test")
    assert report["datasets"]["demo"]["mean"] == judged(fitted, dm.test_dataloader())
    assert report["datasets"]["demo"]["mean"] != judged(tiny_clip(clip_config), dm.test_dataloader())  # not the start
    # the last epoch's validation is the checkpoint's numbers on the validation images
    val = DemoDataModule(batch_size=4, preprocess=fitted.preprocess, fit_split=str(tmp_path / "fit" / "split.csv"))
    val.setup("fit")
    last = {k: v for k, v in judged(fitted, val.val_dataloader()).items() if v is not None}
    assert {k: record["validation"][-1]["mean"]["demo"][k] for k in last} == last


def test_fit_trains_one_epoch_unless_told_and_says_so(clip_config, tmp_path, capsys):
    """Lightning's own default is 1,000 epochs; fit's is 1, said in one line when no --trainer.max_epochs (nor
    max_steps or max_time) was given. One training batch an epoch, no validation: the checkpoint's step count tells."""
    argv = ["fit", "--model", "open_clip", "--model.architecture", clip_config, "--model.random_init", "true",
            "--model.bootstrap", "0", "--data", "demo", "--data.batch_size", "4", "--trainer.accelerator", "cpu",
            "--trainer.enable_progress_bar", "false", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "0"]
    note = "fit: 1 epoch, the default (Lightning's: 1,000); --trainer.max_epochs N trains N"
    for given, steps, said in (([], 1, True), (["--trainer.max_epochs", "2"], 2, False), (["--trainer.max_steps", "3"], 3, False)):
        out = tmp_path / f"fit{len(given)}{steps}"
        assert main([*argv, *given, "--out", str(out)]) == 0
        err = capsys.readouterr().err
        stored = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert stored["global_step"] == steps, given
        assert [line for line in err.splitlines() if "epoch" in line] == ([note] if said else []), err


@pytest.mark.filterwarnings("ignore:`max_epochs` was not set")  # the refused fit of center gives none
def test_fit_usage_errors_are_one_line(clip_config, capsys, tmp_path):
    out = ["--out", str(tmp_path)]  # the datamodule writes the split before the model says it has nothing to fit
    base = ["fit", "--model", "open_clip", "--model.architecture", clip_config, "--model.random_init", "true", *out]
    assert main([*base, "--data", "pooled", "--data.datasets", '["demo", "demo_dicom"]']) == 2
    assert capsys.readouterr().err == ("error: --data: fit trains on one dataset; pooled pools ['demo', 'demo_dicom'] "
                                       "(fit on each with --data NAME)\n")
    assert main([*base, "--data", "demo", "--data.val_fraction", "1.5"]) == 2
    assert capsys.readouterr().err == "error: --data.val_fraction: must be > 0 and < 1, got 1.5\n"
    assert main(["fit", "--model", "center", "--data", "demo", "--trainer.accelerator", "cpu", *out]) == 2
    assert capsys.readouterr().err == "error: CenterBaseline has nothing to fit: trainable [] matches none of its 0 parameters\n"


class Executable:  # a pickled object whose class torch.load(weights_only=True) refuses to rebuild
    pass


def test_test_refuses_a_checkpoint_that_does_not_fit_or_needs_code(tmp_path, capsys):
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"model.extra": torch.zeros(2)}, "pytorch-lightning_version": "2.6.0"}, foreign)
    assert main(["test", "--model", "center", "--data", "demo", "--ckpt_path", str(foreign), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == ('error: --ckpt_path: the checkpoint does not fit --model: Missing key(s) in state_dict: "gaussian". '
                   'Unexpected key(s) in state_dict: "model.extra".\n')
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"state_dict": {}, "extra": Executable()}, unsafe)
    assert main(["test", "--model", "center", "--data", "demo", "--ckpt_path", str(unsafe), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: --ckpt_path: {unsafe} holds more than tensors and plain data (a pickled "
                                       "object), so it is not loaded; nothing from the file was run\n")


def fit_checkpoint(model, path):
    """What ``fit`` saves for ``model`` (Lightning's checkpoint with the model's ``on_save_checkpoint``), without fitting."""
    model.select_trainable()
    checkpoint = {"state_dict": model.state_dict(), "pytorch-lightning_version": L.__version__}
    model.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


@pytest.mark.parametrize("command", ["test", "fit"])
def test_a_damaged_or_foreign_ckpt_path_is_one_line_before_any_model_is_built(clip_config, tmp_path, capsys, command):
    saved = fit_checkpoint(tiny_clip(clip_config), tmp_path / "clip_fit.ckpt")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    weights = tmp_path / "weights.pt"  # a model's own weights, not a Lightning checkpoint
    torch.save(tiny_clip(clip_config).model.state_dict(), weights)
    # --model.checkpoint of a model that would fail to build: the checkpoint is judged first
    base = [command, "--model", "open_clip", "--model.checkpoint", str(tmp_path / "absent.pt"), "--data", "demo",
            "--out", str(tmp_path / "out")]
    expected = {
        truncated: f"{truncated}: not a checkpoint written by torch.save (a truncated or damaged file, or another kind of file)",
        text: f"{text}: not a checkpoint written by torch.save (a truncated or damaged file, or another kind of file)",
        weights: f"{weights} is not a Lightning checkpoint (no state_dict; it holds ['ln_final.bias', 'ln_final.weight', "
                 "'logit_scale', 'positional_embedding', 'text_projection', 'token_embedding.weight']): a model's own weights go to --model.checkpoint",
    }
    for path, message in expected.items():
        assert main([*base, "--ckpt_path", str(path)]) == 2
        assert capsys.readouterr().err == f"error: --ckpt_path: {message}\n"
    assert main([command, "--model", "center", "--data", "demo", "--ckpt_path", str(saved), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: --ckpt_path: {saved} is a `fit` checkpoint of xbench_pl.models.open_clip_model.OpenCLIPModel, not of --model "
        "xbench_pl.models.baselines.CenterBaseline: test it with the --model options fit had (its fit.json records them)\n")
    assert not (tmp_path / "out").exists()


def test_a_fit_checkpoint_given_as_model_weights_says_which_option_takes_it(clip_config, tmp_path, capsys):
    saved = fit_checkpoint(tiny_clip(clip_config), tmp_path / "clip_fit.ckpt")
    assert main(["test", "--model", "open_clip", "--model.architecture", clip_config, "--model.checkpoint", str(saved),
                 "--data", "demo", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: --model.checkpoint: {saved} is a `fit` checkpoint of xbench_pl.models.open_clip_model.OpenCLIPModel (its trained "
        "tensors only): pass it as --ckpt_path, with the --model options fit had\n")


def test_a_fit_checkpoint_keeps_the_trained_tensors_and_needs_its_base_weights(clip_config, tmp_path):
    fitted = tiny_clip(clip_config)
    fitted.select_trainable()
    with torch.no_grad():
        fitted.model.text_projection.add_(1.0)  # as if trained
    saved = fit_checkpoint(fitted, tmp_path / "clip_fit.ckpt")
    stored = torch.load(saved, weights_only=True)
    assert sorted(stored["state_dict"]) == ["model.logit_scale", "model.text_projection"]  # OpenCLIPModel.TRAINABLE
    again = tiny_clip(clip_config)
    load_fit_checkpoint(again, saved)
    assert all(torch.equal(value, fitted.state_dict()[name]) for name, value in again.state_dict().items())
    other = tiny_clip(clip_config)
    with torch.no_grad():
        other.model.visual.conv1.weight.add_(1e-3)  # other base weights: a frozen tensor differs
    with pytest.raises(CheckpointError, match=r"^--ckpt_path: the checkpoint was fitted on xbench_pl\.models\.open_clip_model\."
                                             r"OpenCLIPModel with other base weights than this OpenCLIPModel has: test it"):
        load_fit_checkpoint(other, saved)


@pytest.mark.ddp_pair
def test_ddp_fit_validates_exactly_and_its_checkpoint_tests_in_one_process(clip_config, tmp_path):
    """2 CPU processes: the same split, and the validation of the last epoch (each val image once over the
    ranks) equals a 1-process test of the checkpoint on the validation images, bit for bit. One image a
    batch on both sides: the tiny CLIP's float32 outputs move by ~1e-9 with the batch's size."""
    run = ddp_ranks("fit", "--model", "open_clip", "--model.architecture", clip_config, "--model.random_init", "true",
                    "--model.bootstrap", "0", "--model.lr", "0.05", "--data", "demo", "--data.val_fraction", "0.25",
                    "--data.batch_size", "1", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                    "--trainer.accelerator", "cpu", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "fit.json").read_text())
    assert record["provenance"]["world_size"] == 2
    fitted = tiny_clip(clip_config)
    load_fit_checkpoint(fitted, record["checkpoint"])
    one = DemoDataModule(batch_size=1, preprocess=fitted.preprocess, val_fraction=0.25)
    one.split_out = tmp_path / "one_process_split.csv"
    one.setup("fit")
    assert (tmp_path / "split.csv").read_text() == one.split_out.read_text()
    last = {k: v for k, v in judged(fitted, one.val_dataloader()).items() if v is not None}
    assert {k: record["validation"][-1]["mean"]["demo"][k] for k in last} == last
