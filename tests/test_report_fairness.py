"""The report's "Against a radiologist" (% of reader) and "Fairness: subgroups" sections from fabricated metrics.json:
cells equal the inputs, shares are model ÷ reader × 100 (intervals from shared draws: test_report_reader_ci.py), ``against_reader`` and ``fairness`` in report.json, and
both sections absent without a reader run or ``by_group``."""

import json
from pathlib import Path

import pytest
from test_report_explainers import _tables
from test_report_html import FINDINGS, write_run

from xbench_pl.commands import main as cli_main
from xbench_pl.commands.report.reader import READER_FLOOR, READER_KEYS, is_reader
from xbench_pl.commands.report.runs import find_runs

DATASETS = ("demo", "demo_dicom")
SEX = {"n_images": {"F": 6, "M": 5, "unknown": 1}}


def _edit(folder: Path, change) -> dict:
    metrics = json.loads((folder / "metrics.json").read_text())
    change(metrics)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return metrics


def add_groups(metrics: dict, shift: float) -> None:
    """``by_group`` of sex (F, M, unknown) on demo only: F with a bootstrap interval, M without (ci None), gaps."""
    def row(n, base, ci):
        mean = {"pointing_game": base, "dice_best": base / 2, "auroc": 0.5 + base / 4, "dice@0.5": 0.1}
        return {"n_images": n, "classes": {}, "mean": mean,
                "ci": {"level": 0.95, "mean": {k: [v - 0.05, v + 0.05] for k, v in mean.items()}} if ci else None}

    f, m = row(6, 0.6 + shift, True), row(5, 0.3 + shift, False)
    gap = {k: {"gap": f["mean"][k] - m["mean"][k], "high": "F", "low": "M", "ci": [0.01, 0.2], "p": 0.04}
           for k in ("pointing_game", "dice_best", "auroc")}
    gap["auroc"] = None
    metrics["datasets"]["demo"]["by_group"] = {"sex": {**SEX, "F": f, "M": m, "gap": gap}}


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fair")
    write_run(tmp / "clip", "clip", 11)
    write_run(tmp / "reader", "reader", 12)
    write_run(tmp / "center", "center", 13)

    def reader(m: dict) -> None:  # the reader ran demo only; its Dice of 0 on Nodule leaves the share undefined
        m["datasets"].pop("demo_dicom")
        m["datasets"]["demo"]["classes"]["Nodule"]["dice@0.5"] = 0.0

    metrics = {"clip": _edit(tmp / "clip", lambda m: add_groups(m, 0.0)), "reader": _edit(tmp / "reader", reader),
               "center": _edit(tmp / "center", lambda m: add_groups(m, 0.1))}
    folders = [str(tmp / n) for n in ("clip", "reader", "center")]
    assert cli_main(["report", *folders, "--out", str(tmp / "out")]) == 0
    return tmp, metrics


def test_reader_runs_are_recognised(reported):
    tmp, _ = reported
    runs = find_runs([str(tmp / n) for n in ("clip", "reader", "center")])
    assert [is_reader(r) for r in runs] == [False, True, False]


def test_share_of_reader_tables_and_json(reported):
    tmp, metrics = reported
    md = (tmp / "out" / "report.md").read_text()
    assert "## Against a radiologist" in md and "from the same bootstrap draws" in md
    assert "### demo (reader: reader)" in md and "### demo_dicom (reader" not in md  # the reader ran demo only
    # these fabricated runs keep no replicates: shares without intervals, and the report says why
    assert "No intervals for clip, center: the reader run kept no bootstrap replicates" in md  # one reason, said once
    ref = metrics["reader"]["datasets"]["demo"]
    (table,) = _tables(md, "demo: macro means, the reader's and each run's value (% of reader [95% CI])")
    assert table[0] == ["run", "PG", "Dice", "IoU", "Dice best"]
    rows = {row[0]: row[1:] for row in table[1:]}
    assert rows["reader"] == [f"{ref['mean'][k]:.3f}" for k in READER_KEYS]
    for model in ("clip", "center"):
        mine = metrics[model]["datasets"]["demo"]["mean"]
        assert rows[model] == [f"{mine[k]:.3f} ({100 * mine[k] / ref['mean'][k]:.1f}%)" for k in READER_KEYS]
        assert min(ref["mean"][k] for k in READER_KEYS) >= READER_FLOOR
    (table,) = _tables(md, "demo: Dice per finding, the reader's value and each run's % of it [95% CI]")
    assert table[0] == ["finding", "reader", "clip", "center"]  # each run by its one label
    for row in table[1:]:
        finding = row[0]
        assert row[1] == f"{ref['classes'][finding]['dice@0.5']:.3f}"
        for cell, model in zip(row[2:], ("clip", "center")):
            value = metrics[model]["datasets"]["demo"]["classes"][finding]["dice@0.5"]
            reference = ref["classes"][finding]["dice@0.5"]  # Nodule's 0: below the floor
            assert cell == ("–†" if reference < READER_FLOOR else f"{100 * value / reference:.1f}%")
    assert [row[0] for row in table[1:]] == FINDINGS
    stored = json.loads((tmp / "out" / "report.json").read_text())["against_reader"]
    assert list(stored) == ["demo"] and stored["demo"]["reader"] == "reader" and stored["demo"]["keys"] == list(READER_KEYS)
    assert stored["demo"]["models"]["clip"]["draws"].startswith("the reader run kept no bootstrap replicates")
    cell = stored["demo"]["models"]["clip"]["mean"]["pointing_game"]
    assert cell["ci"] is None
    assert cell["value"] == metrics["clip"]["datasets"]["demo"]["mean"]["pointing_game"]
    assert cell["percent"] == pytest.approx(100 * cell["value"] / ref["mean"]["pointing_game"], rel=1e-12)
    assert stored["demo"]["models"]["center"]["classes"]["Nodule"]["dice@0.5"]["percent"] is None
    assert "reader" not in stored["demo"]["models"]
    html = (tmp / "out" / "report.html").read_text()
    assert "Against a radiologist" in html and "Fairness: subgroups" in html


def test_fairness_tables_and_json(reported):
    tmp, metrics = reported
    md = (tmp / "out" / "report.md").read_text()
    assert "## Fairness: subgroups" in md and "### demo: sex" in md and "### demo_dicom: sex" not in md
    (counts,) = _tables(md, "demo, sex: images per value")
    assert counts == [["run", "n F", "n M", "n unknown"], ["clip", "6", "5", "1"], ["center", "6", "5", "1"]]
    for key, short in (("pointing_game", "PG"), ("dice_best", "Dice best"), ("auroc", "AUROC")):
        (table,) = _tables(md, f"demo, sex: {short}")
        assert table[0] == ["run", "F", "M", "gap (high − low)", "gap 95% CI", "p"]
        for row in table[1:]:
            group = metrics[row[0]]["datasets"]["demo"]["by_group"]["sex"]
            f, m = group["F"]["mean"][key], group["M"]["mean"][key]
            lo, hi = group["F"]["ci"]["mean"][key]
            assert row[1] == f"{f:.3f} [{lo:.3f}, {hi:.3f}]"
            assert row[2] == f"{m:.3f}"  # no interval: none shown
            gap = group["gap"][key]
            assert row[3:] == (["–", "–", "–"] if gap is None else
                               [f"{gap['gap']:.3f} (F − M)", f"[{gap['ci'][0]:.3f}, {gap['ci'][1]:.3f}]", f"{gap['p']:.3f}"])
    stored = json.loads((tmp / "out" / "report.json").read_text())["fairness"]
    assert list(stored) == ["demo"] and list(stored["demo"]) == ["sex"]
    entry = stored["demo"]["sex"]
    assert entry["values"] == ["F", "M"] and list(entry["runs"]) == ["clip", "center"]
    group = metrics["center"]["datasets"]["demo"]["by_group"]["sex"]
    assert entry["runs"]["center"]["n_images"] == SEX["n_images"]
    assert entry["runs"]["center"]["values"]["F"]["dice_best"] == {"mean": group["F"]["mean"]["dice_best"],
                                                                   "ci": group["F"]["ci"]["mean"]["dice_best"]}
    assert entry["runs"]["center"]["gap"]["pointing_game"] == group["gap"]["pointing_game"]


def test_sections_absent_without_reader_or_groups(tmp_path):
    write_run(tmp_path / "a", "clip", 1)
    write_run(tmp_path / "b", "biomedclip", 5)
    assert cli_main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    for text in (md, html):
        assert "Against a radiologist" not in text and "Fairness" not in text
    stored = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "against_reader" not in stored and "fairness" not in stored


def test_no_share_of_a_reader_who_marked_nearly_nothing(tmp_path):
    """The reader's Dice of 0.01 on Atelectasis (and its macro IoU of 0.02): "–†" and the floor's note, not 4,000 %;
    report.json's percent None there."""
    write_run(tmp_path / "clip", "clip", 11)
    write_run(tmp_path / "reader", "reader", 12)

    def reader(m: dict) -> None:
        m["datasets"]["demo"]["classes"]["Atelectasis"]["dice@0.5"] = 0.01
        m["datasets"]["demo"]["mean"]["iou@0.5"] = 0.02

    _edit(tmp_path / "reader", reader)
    clip = _edit(tmp_path / "clip", lambda m: m["datasets"]["demo"]["classes"]["Atelectasis"].update({"dice@0.5": 0.4}))
    assert cli_main(["report", str(tmp_path / "clip"), str(tmp_path / "reader"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    (table,) = _tables(md, "demo: Dice per finding, the reader's value and each run's % of it [95% CI]")
    assert dict((row[0], row[1:]) for row in table[1:])["Atelectasis"] == ["0.010", "–†"]
    (table,) = _tables(md, "demo: macro means, the reader's and each run's value (% of reader [95% CI])")
    iou = clip["datasets"]["demo"]["mean"]["iou@0.5"]
    assert table[2][0] == "clip" and table[2][3] == f"{iou:.3f} (–†)"
    note = f"†: no share where the reader's value is below {READER_FLOOR}"
    parts = md.split("## Against a radiologist", 1)[1].split("\n## ", 1)[0].split("\n#### ")[1:]
    assert all(("–†" in part) == (note in part) for part in parts) and sum(note in part for part in parts) >= 2
    cells = json.loads((tmp_path / "out" / "report.json").read_text())["against_reader"]["demo"]["models"]["clip"]
    assert cells["classes"]["Atelectasis"]["dice@0.5"] == {"value": 0.4, "percent": None, "ci": None, "below_floor": True}
    assert cells["mean"]["iou@0.5"]["percent"] is None and cells["mean"]["pointing_game"]["percent"] is not None


def test_a_tied_gap_reads_as_a_tie(tmp_path):
    """Every value's Pointing Game equal: the metrics name F as both high and low; the table says tie, not "F − F"."""
    write_run(tmp_path / "clip", "clip", 11)

    def tied(m: dict) -> None:
        add_groups(m, 0.0)
        group = m["datasets"]["demo"]["by_group"]["sex"]
        group["M"]["mean"]["pointing_game"] = group["F"]["mean"]["pointing_game"]
        group["gap"]["pointing_game"] = {"gap": 0.0, "high": "F", "low": "F", "ci": [0.0, 0.0], "p": 1.0}

    _edit(tmp_path / "clip", tied)
    assert cli_main(["report", str(tmp_path / "clip"), "--out", str(tmp_path / "out")]) == 0
    (table,) = _tables((tmp_path / "out" / "report.md").read_text(), "demo, sex: PG")
    assert table[1][3:] == ["0.000 (tie: F = M)", "[0.000, 0.000]", "1.000"]
