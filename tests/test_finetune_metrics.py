"""The benchmark's metrics inside a user's LightningModule: validation every epoch, reset between epochs.

``FineTune`` is the example of docs/fit.md ("Fine-tuning with the benchmark's metrics"), verbatim: a
tiny trainable model fits on the synthetic demo for a few steps (one CPU process) and validates
with ``BenchmarkMetrics``. The logged per-epoch values must be the benchmark's own (the same
numbers ``test`` gives for the same weights) and must not accumulate across epochs.
"""

import csv

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from xbench_pl.data.nih_bbox import DemoDataModule
from xbench_pl.geometry import Preprocess, warp_to_eval_grid
from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput


class TinyModel(ZeroShotModel):
    """Random-init, trainable: a 3x3 conv gives one 14 x 14 map per finding; scores = sigmoid of each map's mean."""

    def __init__(self, classes: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.preprocess = Preprocess(resize="squash", size=56)
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, classes, 3, padding=1)

    def zero_shot(self, images, classes):
        maps = F.adaptive_avg_pool2d(self.conv(images), 14)[:, : len(classes)]
        return ZeroShotOutput(scores=torch.sigmoid(maps.mean((2, 3))), saliency=maps)


# --- the docs/fit.md example ------------------------------------------------------------------------
class FineTune(L.LightningModule):
    def __init__(self, model, classes, lr=1e-2):
        super().__init__()
        self.model, self.lr = model, lr
        self.val_metrics = BenchmarkMetrics(classes)  # a Module: moves with this one; exact under DDP

    def training_step(self, batch, batch_idx):
        out = self.model.zero_shot(batch.images, batch.classes)
        loss = F.binary_cross_entropy(out.scores, batch.labels)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        out = self.model.zero_shot(batch.images, batch.classes)
        counted = batch.counted  # False only for a stand-in sample of a DDP rank without images
        pairs = counted[batch.region_index[:, 0]]
        sample, cls = batch.region_index[pairs].unbind(1)
        # as the benchmark does: each (image, finding) map back onto the eval grid of its original image
        maps = warp_to_eval_grid(out.saliency[sample, cls], batch.affine[sample], batch.images.shape[-1],
                                 batch.original_size[sample], batch.region_masks.shape[-1])
        self.val_metrics.update(out.scores[counted], batch.labels[counted], maps, batch.region_masks[pairs], cls)

    def on_validation_epoch_end(self):
        table = self.val_metrics.compute()  # synced over the ranks, identical on each
        self.log_dict({f"val/{k}": float(v) for k, v in table["mean"].items() if v is not None}, sync_dist=True)
        self.val_metrics.reset()  # the next epoch starts from zero

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)
# -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    model = TinyModel()
    dm = DemoDataModule(batch_size=4, preprocess=model.preprocess)
    dm.setup("fit")
    return dm


def test_validation_logs_the_benchmark_metrics_every_epoch_without_accumulating(demo, tmp_path):
    model = TinyModel()
    module = FineTune(model, demo.classes)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=CSVLogger(tmp_path), enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1)
    loader = demo.test_dataloader()
    epochs = []

    class Keep(L.Callback):
        def on_validation_end(self, trainer, pl_module):  # after the module's epoch end
            epochs.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")})

    trainer.callbacks.append(Keep())
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    assert len(epochs) == 3
    assert all(e["val/n_regions"] == 12 and e["val/n_pos"] + e["val/n_neg"] == 12 * 8 for e in epochs)  # reset each epoch
    assert any(not torch.equal(start[k], v) for k, v in model.state_dict().items())  # it trained
    assert epochs[0]["val/dice_best"] != epochs[-1]["val/dice_best"]  # and the numbers follow the weights
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sum(bool(row.get("val/pointing_game")) for row in rows) == 3  # one logged value per epoch
    # exactly the benchmark's numbers: test on the final weights gives the last epoch's values
    tester = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
    tester.test(model, dataloaders=loader, verbose=False)
    compared = [key for key in model.results["demo"]["mean"] if f"val/{key}" in epochs[-1]]
    assert {"pointing_game", "dice@0.5", "dice_best", "tau_best", "auroc", "n_regions"} <= set(compared)
    for key in compared:  # self.log keeps float32
        assert epochs[-1][f"val/{key}"] == pytest.approx(model.results["demo"]["mean"][key], rel=1e-6, abs=1e-7), key


def test_the_docs_show_this_example_verbatim():
    import inspect
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "fit.md").read_text()
    assert inspect.getsource(FineTune) in guide
