"""The report's recognition-vs-grounding statistics (report.json, report.md) against numpy."""

import json

import numpy as np
import pytest
from test_report_html import write_run

from xbench_pl.commands import main as cli_main
from xbench_pl.commands.report.correlation import auroc_pg_points, correlation_stats
from xbench_pl.commands.report.runs import find_runs


def test_pearson_r_and_r2_per_model_and_overall_match_numpy(tmp_path):
    write_run(tmp_path / "a", "clip", 1)
    write_run(tmp_path / "b", "biomedclip", 5)
    assert cli_main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 0
    stats = json.loads((tmp_path / "out" / "report.json").read_text())["auroc_vs_pointing_game"]
    points = auroc_pg_points(find_runs([str(tmp_path / "a"), str(tmp_path / "b")]))
    for name, chosen in (("clip", [p for p in points if p[0] == "clip"]), ("biomedclip", [p for p in points if p[0] == "biomedclip"]),
                         (None, points)):
        x, y = np.array([p[3] for p in chosen]), np.array([p[4] for p in chosen])
        got = stats["overall"] if name is None else stats["models"][name]
        r = np.corrcoef(x, y)[0, 1]
        assert got["n"] == len(chosen) and got["r"] == pytest.approx(r, rel=1e-12) and got["r2"] == pytest.approx(r**2, rel=1e-12)
    assert stats["overall"]["slope"] == pytest.approx(np.polyfit([p[3] for p in points], [p[4] for p in points], 1)[0], rel=1e-9)
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"| clip | {stats['models']['clip']['n']} | {stats['models']['clip']['r']:.3f} | {stats['models']['clip']['r2']:.3f} |" in md


def test_constant_auroc_has_no_correlation():
    points = [("uniform", "demo", f, pg, 0.5) for f, pg in (("A", 0.1), ("B", 0.4), ("C", 0.3))]
    stats = correlation_stats(points)
    assert stats["models"]["uniform"] == {"n": 3, "r": None, "r2": None} and stats["overall"]["n"] == 3
    assert correlation_stats(points[:1])["overall"]["r"] is None
