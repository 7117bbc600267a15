"""How long does a callback figure take? Prints the median seconds per PNG of a heatmap sample
(``callbacks.heatmaps.render_sample``: a 1024² image, then a 2500 × 2000 one) and of the three calibration plots
(``callbacks.calibration``: threshold, all findings' thresholds, reliability) as the callbacks draw them (fixed
margins), against the same figures under matplotlib's constrained layout (the baseline: what they used before),
in one process, alternating. Run: ``python benchmarks/bench_figures.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

import numpy as np

from xbench_pl.callbacks import calibration, common, heatmaps
from xbench_pl.outputs import figure_png

FINDINGS = ["Atelectasis", "Cardiomegaly", "Effusion", "Infiltrate", "Mass", "Nodule", "Pneumonia", "Pneumothorax"]


def drawings() -> dict:
    """What to draw, by name: a function returning PNG bytes."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:64, 0:64]
    saliency = np.exp(-((yy - 20) ** 2 + (xx - 30) ** 2) / 80).astype(np.float32)
    region = np.zeros((64, 64), bool)
    region[12:28, 22:40] = True
    image = np.clip(rng.normal(120, 30, (512, 400)), 0, 255).astype(np.uint8)
    caption = "nih_bbox | Cardiomegaly | 00012345_001.png | score 0.731 | label 1 | pointing hit"
    square = heatmaps.Sample(0, "nih_bbox", "Cardiomegaly", "x", 0.7, 1, 1.0, (1024, 1024), image[:400, :400], saliency, region)
    tall = heatmaps.Sample(0, "nih_bbox", "Cardiomegaly", "x", 0.7, 1, 1.0, (2500, 2000), image, saliency, region)
    thresholds = [i / 100 for i in range(101)]
    dice = [max(0.0, 0.6 - (t - 0.4) ** 2 * 3) for t in thresholds]
    curves = {f: {"dice": [d * (0.5 + k / 10) for d in dice]} for k, f in enumerate(FINDINGS)}
    bins = {"count": [1200, 530, 20, 0, 3, 4, 5, 6, 7, 1], "accuracy": [i / 10 for i in range(10)],
            "confidence": [i / 10 + 0.05 for i in range(10)]}
    return {
        "heatmap 1024²": lambda: heatmaps.render_sample(square, caption),
        "heatmap 2500×2000": lambda: heatmaps.render_sample(tall, caption),
        "threshold": lambda: figure_png(calibration.plot_threshold("demo | Cardiomegaly", thresholds, dice,
                                                                   [d * 0.7 for d in dice], 0.5, 0.4, 12)),
        "threshold, all findings": lambda: figure_png(calibration.plot_threshold_all(
            "demo | model", thresholds, curves, {f: 0.4 for f in curves}, 0.5)),
        "reliability": lambda: figure_png(calibration.plot_reliability(
            "demo | Cardiomegaly", [i / 10 for i in range(11)], bins, 0.041, "images")),
    }


def constrained(width, height, margins):
    """The baseline: the figure as drawn before, matplotlib's constrained layout in place of the fixed margins."""
    fig = common.new_figure(width, height, margins)
    fig.set_layout_engine("constrained")
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    figures = drawings()
    times = {}  # (name, layout) -> seconds
    for name, draw in figures.items():
        draw()  # warm: fonts, colour maps
        for _ in range(repeats):
            for layout in ("fixed margins", "constrained"):
                with contextlib.ExitStack() as stack:
                    if layout == "constrained":
                        for module in (heatmaps, calibration):
                            stack.enter_context(mock.patch.object(module, "new_figure", constrained))
                    started = time.perf_counter()
                    draw()
                    times.setdefault((name, layout), []).append(time.perf_counter() - started)
    print(f"{'figure':<26}{'fixed margins s':>16}{'constrained s':>15}{'ratio':>7}")
    for name in figures:
        fixed, baseline = (statistics.median(times[name, layout]) for layout in ("fixed margins", "constrained"))
        print(f"{name:<26}{fixed:>16.3f}{baseline:>15.3f}{baseline / fixed:>6.1f}×")


if __name__ == "__main__":
    main()
