"""``describe``: per-class counts and every problem, as text and JSON."""

from __future__ import annotations

import json

from synthetic_dicom import RSNA_LABELS, make_rsna

from xbench_pl import create_datamodule
from xbench_pl.commands.describe import main


def run(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_describe_demo(capsys):
    code, out, _ = run(capsys, ["--data", "demo", "--json"])
    summary = json.loads(out)
    records = create_datamodule("demo").prepare_records()  # the same reading, counted here independently
    assert code == 0 and summary["images"] == len(records) == 12 and summary["problems"] == []
    for finding, counts in summary["classes"].items():
        assert counts == {"images": 12, "positives": sum(r.labels.get(finding, 0) for r in records),
                          "regions": sum(len(r.regions.get(finding, [])) for r in records)}
    assert sum(c["regions"] for c in summary["classes"].values()) == 12  # the demo's 12 boxes
    code, text, _ = run(capsys, ["--data=demo"])
    assert code == 0 and text.startswith("demo: 12 images") and "Cardiomegaly" in text and "0 problem(s)" in text
    assert "phrases" not in summary


def test_describe_counts_a_phrase_dataset_in_pairs_on_images(capsys):
    code, out, _ = run(capsys, ["--data", "ms_cxr_demo", "--json"])
    summary = json.loads(out)
    records = create_datamodule("ms_cxr_demo").prepare_records()
    assert code == 0 and summary["images"] == summary["phrases"] == len(records) == 13
    assert summary["image_files"] == len({r.path for r in records}) == 10
    code, text, _ = run(capsys, ["--data", "ms_cxr_demo"])
    assert code == 0 and text.splitlines()[:2] == ["ms_cxr_demo: 13 (image, phrase) pairs on 10 images",
                                                    "class               pairs  positives  regions"]


def test_describe_reports_every_problem(tmp_path, capsys):
    labels = RSNA_LABELS + "pos,NaN,1,2,3,1\nghost,,,,,0\npos,10,20,30,40,1\n"
    root = make_rsna(tmp_path / "rsna", labels=labels)
    code, out, _ = run(capsys, ["--data", "rsna_pneumonia", "--data.root", str(root), "--json"])
    summary = json.loads(out)
    assert code == 0 and summary["images"] == 2
    assert summary["classes"] == {"Pneumonia": {"images": 2, "positives": 1, "regions": 2}}
    problems = {(p["row"], p["action"]) for p in summary["problems"]}
    assert problems == {("5", "skipped"), ("7", "deduplicated"), ("6", "skipped")}  # ghost.dcm: listed at row 6
    assert any(p["file"].endswith("ghost.dcm") for p in summary["problems"])
    code, text, _ = run(capsys, ["--data", "rsna_pneumonia", "--data.root", str(root)])
    assert "3 problem(s)" in text and "row 5: box xywh" in text and "[deduplicated]" in text
    # --data.on_error raise stops at the first problem, with a message naming file and row
    code, _, err = run(capsys, ["--data", "rsna_pneumonia", "--data.root", str(root), "--data.on_error", "raise"])
    assert code == 2 and err.startswith("error: ") and "stage_2_train_labels.csv, row 5" in err


def test_describe_bad_arguments(capsys):
    assert run(capsys, [])[0] == 2
    code, _, err = run(capsys, ["--data", "no_such_dataset"])
    assert code == 2 and "no_such_dataset" in err and "demo" in err


def test_describe_pooled_describes_each_dataset(tmp_path, capsys):
    root = make_rsna(tmp_path / "rsna", labels=RSNA_LABELS + "pos,NaN,1,2,3,1\n")
    datasets = json.dumps(["demo", {"name": "rsna_pneumonia", "init_args": {"root": str(root)}}])
    code, out, _ = run(capsys, ["--data", "pooled", "--data.datasets", datasets, "--json"])
    summary = json.loads(out)["datasets"]
    assert code == 0 and list(summary) == ["demo", "rsna_pneumonia"]
    assert summary["demo"]["images"] == 12 and summary["demo"]["problems"] == []
    assert summary["rsna_pneumonia"]["images"] == 2 and [p["row"] for p in summary["rsna_pneumonia"]["problems"]] == ["5"]
    code, text, _ = run(capsys, ["--data", "pooled", "--data.datasets", datasets])
    assert code == 0 and text.startswith("demo: 12 images") and "\n\nrsna_pneumonia: 2 images" in text
    # a dataset that cannot be read is named; the others are still described
    with_broken = json.dumps(["demo", "chestx_det10"])
    code, out, err = run(capsys, ["--data", "pooled", "--data.datasets", with_broken, "--json"])
    assert code == 1 and list(json.loads(out)["datasets"]) == ["demo"] and "chestx_det10: " in err and "root not set" in err
