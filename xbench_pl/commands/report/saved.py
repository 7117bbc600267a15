"""The runs' own pictures: per run, the calibration plots and heatmap samples its visual callbacks saved
(``calibration/``, ``heatmaps/samples.csv``), under each run's label."""

from __future__ import annotations

import csv
from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run
from xbench_pl.console import QUIET_SECONDS, ProgressLines


def saved_images(run: Run) -> dict[str, list[tuple[Path, str]]]:
    """The run's calibration plots and heatmap samples, per section title: (file, caption)."""
    sections: dict[str, list[tuple[Path, str]]] = {}
    for folder in sorted((run.folder / "calibration").glob("*")):
        files = [folder / "threshold_all.png", folder / "reliability_all.png"]
        found = [(f, f"{folder.name}: {f.stem.replace('_all', ' (every finding)')}") for f in files if f.is_file()]
        if found:
            sections[f"Calibration, {folder.name}"] = found
    samples = run.folder / "heatmaps" / "samples.csv"
    if samples.is_file():
        with samples.open() as f:
            for row in csv.DictReader(f):
                caption = (f"{row['finding']} | {row['image_id']} | score {float(row['score']):.3f} | label {row['label']} | "
                           f"PG {float(row['pointing_game']):.2f}")
                sections.setdefault(f"Heatmap samples, {row['dataset']}", []).append((run.folder / "heatmaps" / row["file"], caption))
    return sections


def section(runs: list[Run], figures: Path) -> Section | None:
    """A heading per run with saved pictures (a line on the console when reading them takes long)."""
    out = Section("The runs' saved plots and samples")
    progress = ProgressLines("report: saved plots and samples", len(runs), "runs", after=QUIET_SECONDS)
    for run in runs:
        found = saved_images(run)
        progress.step()
        if found:
            out.heading(run.unique_name)
        for title, images in found.items():
            out.heading(title, 4)
            out.images(images, gallery=title.startswith("Heatmap"))
    return out if out.blocks else None
