"""The section "Recognition against grounding, calibration gap": AUROC against Pointing Game over every (run,
dataset, finding) with both defined, with the least-squares line and its R² (the paper's Fig. 3), Pearson's r,
R² = r² and the number of points per run and overall (``report.json``'s ``auroc_vs_pointing_game``), and Dice at
τ = 0.5 against Dice at ``tau_best`` per run and dataset (Fig. 4: the calibration gap)."""

from __future__ import annotations

import math
from pathlib import Path

from xbench_pl.commands.report.figures import new_figure, save, wrapped
from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run
from xbench_pl.commands.report.tables import cell

TITLE = "Recognition against grounding, calibration gap"
SCATTER, GAP = "auroc_vs_pointing_game.png", "dice_fixed_vs_best.png"


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float | None] | None:
    """Least-squares ``y = a x + b`` and its R² (``1 - SS_res / SS_tot``; None where every y is equal); None for fewer
    than 2 distinct x."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return slope, intercept, (1 - ss_res / ss_tot) if ss_tot > 0 else None


def r2_text(r2: float | None, points: int) -> str:
    """R² as printed: undefined where a side is constant (weight-free baselines: every AUROC 0.5)."""
    return "–" if points < 2 else "undefined (AUROC or Pointing Game constant)" if r2 is None else f"{r2:.3f}"


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's correlation coefficient; None for fewer than 2 points or where either side is constant."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(sxx * syy)


def auroc_pg_points(runs: list[Run]) -> list[tuple[str, str, str, float, float]]:
    """(run, dataset, finding, pointing_game, auroc) for every finding with both defined."""
    return [(run.name, dataset, finding, row["pointing_game"], row["auroc"])
            for run in runs for dataset, table in run.datasets.items() for finding, row in table["classes"].items()
            if row.get("pointing_game") is not None and row.get("auroc") is not None]


def correlation_stats(points: list[tuple[str, str, str, float, float]]) -> dict:
    """AUROC against Pointing Game (``auroc_pg_points``) as statistics: ``overall`` and per run in ``models``
    the number of points ``n``, Pearson's ``r`` and ``r2`` = r² (None where undefined); ``overall`` also the
    least-squares ``slope`` and ``intercept`` of the figure's line."""
    def stats(chosen: list) -> dict:
        r = pearson([p[3] for p in chosen], [p[4] for p in chosen])
        return {"n": len(chosen), "r": r, "r2": None if r is None else r * r}

    fit = fit_line([p[3] for p in points], [p[4] for p in points])
    runs = list(dict.fromkeys(p[0] for p in points))
    return {"overall": {**stats(points), "slope": fit and fit[0], "intercept": fit and fit[1]},
            "models": {m: stats([p for p in points if p[0] == m]) for m in runs}}


def correlation_table(stats: dict) -> tuple[list[str], list[list[str]]]:
    rows = [[name, str(s["n"]), cell(s["r"]), cell(s["r2"])] for name, s in [*stats["models"].items(), ("all runs", stats["overall"])]]
    return ["run", "points", "Pearson r", "R²"], rows


def stacked(xs: list[float], ys: list[float]) -> list[tuple[float, float, int]]:
    """Points as (x, y, how many) with those equal to 3 decimals (as printed) merged: a marker per place."""
    counts: dict[tuple[float, float], int] = {}
    for x, y in zip(xs, ys):
        place = (round(x, 3), round(y, 3))
        counts[place] = counts.get(place, 0) + 1
    return [(x, y, n) for (x, y), n in counts.items()]


MARKER_AREA = 28  # points², of a marker for one point; k points on one place get k times the area


def figure_auroc_pg(runs: list[Run], path: Path):
    """Fig. 3: returns the figure and the fit's numbers (``points``, ``slope``, ``intercept``, ``r2``). Markers are
    not cut at the axes, and points on one place are one marker whose area counts them (``stacked``)."""
    points = auroc_pg_points(runs)
    fit = fit_line([p[3] for p in points], [p[4] for p in points])
    columns = 2 if max(len(run.name) for run in runs) <= 40 else 1  # the legend's: as wide as the figure at most
    fig = new_figure(6, 4.4 + 0.16 * math.ceil((len(runs) + 1) / columns))  # room for the legend's rows
    ax = fig.add_subplot()
    placed = {run.name: stacked([p[3] for p in points if p[0] == run.name], [p[4] for p in points if p[0] == run.name])
              for run in runs}
    for name, mine in placed.items():
        if mine:
            ax.scatter([x for x, _, _ in mine], [y for _, y, _ in mine], s=[MARKER_AREA * n for *_, n in mine], alpha=0.6,
                       edgecolors="black", linewidths=0.4, clip_on=False, label=name)
    if fit is not None:
        slope, intercept, r2 = fit
        ax.plot([0, 1], [intercept, slope + intercept], "k--", linewidth=1,
                label=f"fit: AUROC = {slope:.2f} PG + {intercept:.2f}, R² = {r2_text(r2, len(points))}")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="Pointing Game (per finding)", ylabel="AUROC (per finding)")
    merged = any(n > 1 for mine in placed.values() for *_, n in mine)
    ax.set_title(f"Recognition against grounding: {len(points)} (run, dataset, finding) points"
                 + ("\n(a larger marker: several points on one place)" if merged else ""), fontsize=9)
    ax.grid(alpha=0.3)
    if points:  # below the axes: over them it would hide points
        fig.legend(fontsize=7, loc="outside lower center", ncols=columns, markerscale=0.8)
    save(fig, path)
    return fig, {"points": len(points), "slope": fit and fit[0], "intercept": fit and fit[1], "r2": fit and fit[2]}


def figure_dice_gap(runs: list[Run], path: Path):
    """Fig. 4, returned: a pair of horizontal bars per (run, dataset), labelled on the left by its run and
    dataset, each wrapped, one row per pair however many there are (labels never overlap)."""
    labels, fixed, best = [], [], []
    for run in runs:
        for dataset, table in run.datasets.items():
            labels.append(f"{wrapped(run.name)}\n{wrapped(dataset)}")
            fixed.append(table["mean"].get("dice@0.5") or 0.0)
            best.append(table["mean"].get("dice_best") or 0.0)
    lines = max(label.count("\n") + 1 for label in labels) if labels else 1
    fig = new_figure(7, 1.4 + len(labels) * max(0.3, 0.13 * lines))  # every row room for the longest label's lines
    ax = fig.add_subplot()
    ys = list(range(len(labels)))
    ax.barh([y - 0.2 for y in ys], fixed, height=0.4, label="Dice at τ = 0.5", color="tab:gray")
    ax.barh([y + 0.2 for y in ys], best, height=0.4, label="Dice at tau_best (oracle)", color="tab:green")
    for y, a, b in zip(ys, fixed, best):
        ax.annotate(f"Δ {b - a:+.3f}", (max(a, b) + 0.01, y), va="center", fontsize=7)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.margins(y=0.01)
    ax.invert_yaxis()  # the first run on top, as in the tables
    ax.set(xlim=(0, 1), xlabel="mean Dice over findings")
    ax.set_title("Calibration gap: Dice at the fixed threshold vs at the best one", fontsize=9)
    fig.legend(fontsize=7, loc="outside lower center", ncols=2)
    ax.grid(alpha=0.3, axis="x")
    save(fig, path)
    return fig


def section(runs: list[Run], figures: Path) -> Section:
    stats = correlation_stats(auroc_pg_points(runs))
    out = Section(TITLE, data={"auroc_vs_pointing_game": stats})
    figure_auroc_pg(runs, figures / SCATTER)
    figure_dice_gap(runs, figures / GAP)
    overall = stats["overall"]
    out.figure(figures / SCATTER, f"AUROC against Pointing Game per (run, dataset, finding): {overall['n']} points, "
                                  f"R² = {r2_text(overall['r2'], overall['n'])} (Fig. 3)")
    out.figure(figures / GAP, "Dice at τ = 0.5 vs at tau_best per run and dataset (Fig. 4)")
    out.heading("AUROC against Pointing Game per finding: Pearson r (undefined: a constant side)")
    out.table(*correlation_table(stats))
    return out
