"""The section "Do the maps agree across models?": where two or more runs saved their maps (a prediction store in the
run folder: ``test ... --predictions RUN/store --out RUN``), per dataset the matrix of SSIM between two runs' maps of
the same (image, finding) (``metrics.agreement``): models, or explainers of one model, in rows and columns, so
"reproducible across architectures" has a number. Runs that saw different images are named, not compared
(``report.json``: ``agreement``)."""

from __future__ import annotations

import json
from pathlib import Path

from xbench_pl.commands.report.figures import new_figure, save, wrapped
from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run
from xbench_pl.commands.report.tables import cell

#: the eval grid where the runs record none (``--data.eval_size``'s default)
DEFAULT_EVAL_SIZE = 512


def run_store(run: Run) -> Path | None:
    """The prediction store in a run's folder: the one sub-folder with a ``manifest.json`` and ``shards/`` (None
    where there is none; ``ValueError`` naming them where there are several: which holds the run's maps?)."""
    stores = sorted(p.parent for p in run.folder.glob("*/manifest.json") if (p.parent / "shards").is_dir())
    if len(stores) > 1:
        raise ValueError(f"{run.folder} holds {len(stores)} prediction stores ({', '.join(s.name for s in stores)}): "
                         "keep the one its run wrote")
    return stores[0] if stores else None


def eval_size(stores: dict[str, Path]) -> int:
    """The grid the maps are compared on: the largest eval grid the stores' runs used (``DEFAULT_EVAL_SIZE`` where
    none records one)."""
    sizes = []
    for folder in stores.values():
        config = json.loads((folder / "manifest.json").read_text()).get("config") or {}
        size = ((config.get("data") or {}).get("init_args") or {}).get("eval_size")
        if size:
            sizes.append(int(size))
    return max(sizes, default=DEFAULT_EVAL_SIZE)


def matrix_table(result) -> tuple[list[str], list[list[str]]]:
    """An ``Agreement`` as a table: each cell the mean SSIM, its interval and the (image, finding) pairs compared."""
    rows = []
    for i, name in enumerate(result.names):
        cells = []
        for j in range(len(result.names)):
            value, bounds, pairs = result.ssim[i][j], result.interval[i][j], result.pairs[i][j]
            cells.append("–" if value is None else f"{cell(value)} [{bounds[0]:.2f}, {bounds[1]:.2f}] (n={pairs})")
        rows.append([name, *cells])
    return ["run", *result.names], rows


def figure_agreement(result, path: Path, dataset: str):
    """An ``Agreement`` as a heatmap, returned: a cell per pair of runs, its mean SSIM written in it (grey: not
    compared)."""
    import numpy as np

    m = len(result.names)
    values = np.array([[np.nan if v is None else v for v in row] for row in result.ssim], dtype=float)
    side = 1.6 + 0.55 * m
    fig = new_figure(side + 1.6, side)
    ax = fig.subplots()
    ax.set_facecolor("#dddddd")
    low = min(0.0, float(np.nanmin(values))) if not np.isnan(values).all() else 0.0  # SSIM may be negative
    image = ax.imshow(np.ma.masked_invalid(values), vmin=low, vmax=1, cmap="viridis")
    for i in range(m):
        for j in range(m):
            text = "–" if np.isnan(values[i, j]) else f"{values[i, j]:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="black" if np.isnan(values[i, j]) or values[i, j] > low + 0.6 * (1 - low) else "white")
    labels = [wrapped(name) for name in result.names]
    ax.set_xticks(range(m), labels, rotation=45, ha="right", fontsize=6)
    ax.set_yticks(range(m), labels, fontsize=6)
    fig.colorbar(image, ax=ax, label="SSIM (mean over pairs)")
    ax.set_title(f"{dataset}: agreement of the runs' maps", fontsize=8)
    save(fig, path)
    return fig


def section(runs: list[Run], figures: Path) -> Section | None:
    """None where fewer than two runs saved their maps."""
    from xbench_pl.metrics.agreement import agreement

    stores = {run.unique_name: store for run in runs if (store := run_store(run)) is not None}
    if len(stores) < 2:
        return None
    size = eval_size(stores)
    results = agreement(stores, size)
    out = Section("Do the maps agree across models? SSIM between runs' maps",
                  data={"agreement": {"eval_size": size, "stores": {name: str(p) for name, p in stores.items()},
                                      "datasets": {d: r.as_dict() for d, r in results.items()}}})
    out.text(f"For every run that saved its maps (a prediction store in its folder): the SSIM of two runs' maps of the "
             f"same (image, finding), over the findings each image is labelled with, on the {size} × {size} eval grid "
             "over the whole image, each map normalised as its run's benchmark normalises it. Mean over the pairs, 95 % "
             "bootstrap interval over images in brackets, n pairs. 1: the same map; the diagonal compares a run with "
             "itself. Runs that saw different images are not compared (–).")
    for i, (dataset, result) in enumerate(results.items()):
        out.heading(dataset)
        out.table(*matrix_table(result))
        for text in result.mismatches:
            out.text(text, warn=True)
        path = figures / f"agreement_{i}.png"
        figure_agreement(result, path, dataset)
        out.figure(path, f"{dataset}: mean SSIM between two runs' maps of the same (image, finding); – not compared")
    return out
