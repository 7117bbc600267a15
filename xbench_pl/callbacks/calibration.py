"""Calibration plots and the per-finding metric table, from the numbers the metrics already computed.

Reads ``pl_module.results`` (the ``metrics.json`` tables) and ``pl_module.curves``
(``BenchmarkMetrics.curves``: Dice and IoU against every threshold, the reliability bins), which
every rank holds after the metric sync; rank zero draws and writes. Per dataset, under
``OUT/calibration/DATASET/``:

- ``threshold_FINDING.png``: threshold calibration, mean Dice and IoU against τ on the 0.01 grid,
  τ = 0.5 and ``tau_best`` marked (the gap is ``delta_dice``); ``threshold_all.png``: every
  finding's Dice curve in one plot;
- ``reliability_FINDING.png``: score calibration, the reliability diagram of the recognition
  scores (fraction positive against mean score per bin, bar width = bin, counts below) with
  ``ece``; ``reliability_all.png`` pools the bins of every finding (its ECE is that of all
  (image, finding) scores together);
- ``metrics.csv``: one row per finding (and ``mean``) with every metric of ``metrics.json``;
  ``curves.json``: the curves and bins drawn.

With a ``WandbLogger``: the PNGs as ``calibration/DATASET/threshold`` and
``calibration/DATASET/reliability`` image lists, and a ``wandb.Table`` ``metrics/DATASET``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import lightning as L

from xbench_pl.callbacks.common import close_own, model_name, new_figure, output_folder, safe_name, wandb_logger
from xbench_pl.outputs import figure_png


def pooled_bins(reliability: list[dict]) -> dict:
    """One reliability diagram from several findings' bins: counts add, means weight by counts."""
    n = len(reliability[0]["count"])
    count = [sum(r["count"][i] for r in reliability) for i in range(n)]

    def weighted(part: str) -> list:
        return [sum(r[part][i] * r["count"][i] for r in reliability if r["count"][i]) / count[i] if count[i] else None
                for i in range(n)]

    return {"count": count, "confidence": weighted("confidence"), "accuracy": weighted("accuracy")}


def ece_of_bins(bins: dict) -> float | None:
    """``sum_b |acc_b - conf_b| n_b / N``: the ECE of the samples behind the bins."""
    total = sum(bins["count"])
    if not total:
        return None
    return sum(abs(a - c) * n for a, c, n in zip(bins["accuracy"], bins["confidence"], bins["count"]) if n) / total


class CalibrationPlots(L.Callback):
    """Threshold and score calibration plots per finding and per dataset, and the per-finding metric table.

    Args:
        dirpath: output folder (default: the trainer's ``default_root_dir``, i.e. ``--out``).
        require_wandb: fail in ``setup`` when the trainer has no ``WandbLogger`` (default: files only then).
    """

    def __init__(self, dirpath: str | None = None, require_wandb: bool = False):
        super().__init__()
        self.dirpath, self.require_wandb = dirpath, require_wandb
        self.written: list[Path] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        wandb_logger(trainer, required=self.require_wandb)

    def on_test_end(self, trainer, pl_module) -> None:
        self.written = []
        if not trainer.is_global_zero:
            return
        logger, name = wandb_logger(trainer), model_name(pl_module)
        outputs = output_folder(trainer, self.dirpath)
        for dataset, table in pl_module.results.items():
            curves = pl_module.curves[dataset]
            folder = Path("calibration") / safe_name(dataset)
            columns, rows = metric_rows(table)
            text = io.StringIO()
            csv.writer(text).writerows([columns, *rows])
            written = [outputs.write(folder / "metrics.csv", text.getvalue()),
                       outputs.write(folder / "curves.json", json.dumps(curves, indent=1) + "\n")]
            threshold, reliability = [], []
            for finding, row in table["classes"].items():
                c = curves["classes"][finding]
                if row["n_regions"]:
                    fig = plot_threshold(f"{name} | {dataset} | {finding}", curves["thresholds"], c["dice"], c["iou"],
                                         curves["fixed_threshold"], row["tau_best"], row["n_regions"])
                    threshold.append(outputs.write(folder / f"threshold_{safe_name(finding)}.png", figure_png(fig)))
                if row["n_pos"] + row["n_neg"]:
                    fig = plot_reliability(f"{name} | {dataset} | {finding}", curves["bin_edges"], c["reliability"], row["ece"],
                                           counted="images")
                    reliability.append(outputs.write(folder / f"reliability_{safe_name(finding)}.png", figure_png(fig)))
            grounded = {f: curves["classes"][f] for f, row in table["classes"].items() if row["n_regions"]}
            if grounded:
                fig = plot_threshold_all(f"{name} | {dataset} | every finding", curves["thresholds"], grounded,
                                         {f: table["classes"][f]["tau_best"] for f in grounded}, curves["fixed_threshold"])
                threshold.insert(0, outputs.write(folder / "threshold_all.png", figure_png(fig)))
            if reliability:
                bins = pooled_bins([c["reliability"] for c in curves["classes"].values()])
                fig = plot_reliability(f"{name} | {dataset} | all findings pooled", curves["bin_edges"], bins, ece_of_bins(bins),
                                       counted="(image, finding) pairs")
                reliability.insert(0, outputs.write(folder / "reliability_all.png", figure_png(fig)))
            self.written += [*written, *threshold, *reliability]
            if logger is not None:
                logger.log_table(key=f"metrics/{dataset}", columns=columns, data=rows)
                for kind, paths in (("threshold", threshold), ("reliability", reliability)):
                    if paths:
                        logger.log_image(key=f"calibration/{dataset}/{kind}", images=[str(p) for p in paths],
                                         caption=[p.stem for p in paths])
        close_own(trainer, outputs)


def metric_rows(table: dict) -> tuple[list[str], list[list]]:
    """``finding`` + every key of the ``metrics.json`` rows; one row per finding, then ``mean``."""
    rows = {**table["classes"], "mean": table["mean"]}
    keys = list(next(iter(rows.values())))
    return ["finding", *keys], [[finding, *(row[k] for k in keys)] for finding, row in rows.items()]


def _fmt(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


PLOT_MARGINS = (0.75, 0.5, 0.2, 0.42)  # inches: tick labels (0.0-1.0, counts) and an axis label; a two-line title


def plot_threshold(title: str, thresholds: list, dice: list, iou: list, fixed: float, tau_best, n_regions: int):
    fig = new_figure(4.6, 3.4, PLOT_MARGINS)
    ax = fig.add_subplot()
    nan = float("nan")
    ax.plot(thresholds, [nan if v is None else v for v in dice], color="tab:blue", label="Dice")
    ax.plot(thresholds, [nan if v is None else v for v in iou], color="tab:orange", label="IoU")
    fixed_index = min(range(len(thresholds)), key=lambda i: abs(thresholds[i] - fixed))
    ax.axvline(fixed, color="gray", linestyle="--", linewidth=1)
    ax.plot([fixed], [dice[fixed_index]], "o", color="gray", label=f"τ = {fixed:g}: Dice {_fmt(dice[fixed_index])}")
    if tau_best is not None:
        best_index = min(range(len(thresholds)), key=lambda i: abs(thresholds[i] - tau_best))
        ax.axvline(tau_best, color="tab:green", linestyle=":", linewidth=1.2)
        ax.plot([tau_best], [dice[best_index]], "*", color="tab:green", markersize=11,
                label=f"tau_best = {tau_best:.2f}: Dice {_fmt(dice[best_index])}")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="threshold τ on the normalised map", ylabel="mean over pairs")
    ax.set_title(f"{title}\nthreshold calibration ({n_regions} region pair(s))", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    return fig


def plot_threshold_all(title: str, thresholds: list, curves: dict, tau_best: dict, fixed: float):
    fig = new_figure(5.2, 3.6, PLOT_MARGINS)
    ax = fig.add_subplot()
    for finding, c in curves.items():
        line, = ax.plot(thresholds, [float("nan") if v is None else v for v in c["dice"]], linewidth=1.2, label=finding)
        if tau_best[finding] is not None:
            i = min(range(len(thresholds)), key=lambda j: abs(thresholds[j] - tau_best[finding]))
            ax.plot([thresholds[i]], [c["dice"][i]], "*", color=line.get_color(), markersize=9)
    ax.axvline(fixed, color="gray", linestyle="--", linewidth=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="threshold τ (star: tau_best)", ylabel="mean Dice")
    ax.set_title(f"{title}\nDice against τ", fontsize=8)
    ax.legend(fontsize=6, loc="upper right", ncol=2)
    ax.grid(alpha=0.3)
    return fig


def plot_reliability(title: str, edges: list, bins: dict, ece, counted: str):
    """The reliability diagram over the histogram of what its bins hold (``counted``: images of one finding,
    or (image, finding) pairs when pooled)."""
    fig = new_figure(4.6, 4.2, PLOT_MARGINS)
    ax, counts = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1], gridspec_kw={"hspace": 0.3})
    widths = [b - a for a, b in zip(edges[:-1], edges[1:])]
    filled = [i for i, n in enumerate(bins["count"]) if n]
    ax.bar([edges[i] for i in filled], [bins["accuracy"][i] for i in filled], width=[widths[i] for i in filled],
           align="edge", color="tab:blue", alpha=0.75, edgecolor="black", linewidth=0.5, label="fraction positive")
    ax.bar([edges[i] for i in filled], [bins["confidence"][i] - bins["accuracy"][i] for i in filled],
           bottom=[bins["accuracy"][i] for i in filled], width=[widths[i] for i in filled], align="edge",
           color="tab:red", alpha=0.3, edgecolor="tab:red", linewidth=0.5, label="gap to mean score")
    ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1, label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="fraction positive")
    ax.set_title(f"{title}\nscore calibration: ECE {_fmt(ece)}", fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    counts.bar(edges[:-1], bins["count"], width=widths, align="edge", color="gray", edgecolor="black", linewidth=0.5)
    counts.set(xlim=(0, 1), xlabel="recognition score (bin)", ylabel="count")
    counts.set_title(f"{counted} per bin", fontsize=8, loc="left")
    return fig
