"""Progress for logs: Lightning's progress bar as plain lines, and ``fit``'s line per validation epoch."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.callbacks.progress import ProgressBar

from xbench_pl.console import ProgressLines, wrap
from xbench_pl.run_files import console_columns, format_value


def dataset_name(trainer, dataloader_idx: int) -> str:
    """The dataset behind an evaluation dataloader (a pooled datamodule has one loader per child)."""
    datamodules = getattr(trainer.datamodule, "datamodules", None) or []
    return datamodules[dataloader_idx].name if dataloader_idx < len(datamodules) else f"dataloader {dataloader_idx}"


class PlainProgressBar(ProgressBar):
    """A line every ``every`` batches of each loop and one when it ends (``console.ProgressLines``), on
    stderr without terminal codes: where the output is a log or a pipe, a live bar shows nothing until the
    end (Rich) or floods the file (tqdm). The CLI's default there; the sanity check is not shown."""

    def __init__(self, every: int | None = None):
        super().__init__()
        self.every = every
        self.enabled = True
        self.lines: ProgressLines | None = None

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def start(self, label: str, total) -> None:
        self.lines = ProgressLines(label, total, every=self.every) if self.enabled else None

    def step(self, extra: str = "") -> None:
        if self.lines is not None:
            self.lines.step(extra=extra)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.start(f"epoch {trainer.current_epoch} train", self.total_train_batches)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = self.get_metrics(trainer, pl_module)
        self.step(", ".join(f"{key} {value:.4g}" for key, value in metrics.items() if isinstance(value, float)))

    def on_validation_start(self, trainer, pl_module) -> None:
        self.reset_dataloader_idx_tracker()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking:
            self.lines = None
        elif self.has_dataloader_changed(dataloader_idx):
            self.start(f"epoch {trainer.current_epoch} validate {dataset_name(trainer, dataloader_idx)}",
                       self.total_val_batches_current_dataloader)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.step()

    def on_test_start(self, trainer, pl_module) -> None:
        self.reset_dataloader_idx_tracker()

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.has_dataloader_changed(dataloader_idx):
            self.start(f"test {dataset_name(trainer, dataloader_idx)}", self.total_test_batches_current_dataloader)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.step()


class ValidationSummary(Callback):
    """After each validation epoch of ``fit`` but the last planned (``max_epochs``: fit's closing table shows that
    one), one line per dataset with the mean of the ``columns`` (``run_files.console_columns``), wrapped to the
    terminal's width, on stdout (a result, like the closing table)."""

    def __init__(self, columns: list[str] | str | None = None):
        self.columns = columns

    def on_validation_end(self, trainer, pl_module) -> None:
        if (trainer.sanity_checking or not trainer.is_global_zero or not getattr(pl_module, "val_history", None)
                or trainer.current_epoch + 1 == trainer.max_epochs):
            return
        last = pl_module.val_history[-1]
        for name, row in last["mean"].items():
            cells = " ".join(f"{key} {format_value(row.get(key))}" for key in console_columns(row, self.columns))
            print(wrap(f"epoch {last['epoch']} validation, {name}: {cells}"), flush=True)
