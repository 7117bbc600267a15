"""``score --boxes FILE``: boxes predicted elsewhere (CSV / JSON lines) scored like a test run."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from xbench_pl.commands import main
from xbench_pl.data.regions import Box
from xbench_pl.data.synthetic import ensure_demo
from xbench_pl.external_boxes import BoxRow, eval_grid_affine, max_confidence_map, pair_scores, read_rows
from xbench_pl.geometry import warp_to_eval_grid

COLUMNS = ["image_id", "finding", "x_min", "y_min", "x_max", "y_max"]
SMALL = ("--data.eval_size", "64")  # the demo's lesions cover eval-pixel centres down to a 32 grid


@pytest.fixture(scope="module")
def truth() -> list[dict]:
    """The demo's ground-truth boxes as box-file rows (xywh -> corners, as ``nih_bbox`` reads them)."""
    with open(ensure_demo() / "nih" / "BBox_List_2017.csv", newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    out = []
    for image_id, finding, *xywh in rows:
        x, y, w, h = map(float, xywh[:4])
        out.append({"image_id": image_id, "finding": finding, "x_min": x, "y_min": y, "x_max": x + w, "y_max": y + h})
    return out


def write_csv(path: Path, rows: list[dict], extra: list[str] = ()) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, [*COLUMNS, *extra])
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def score(capsys, path: Path, out: Path, *extra: str) -> tuple[int, dict | None, str]:
    """Exit code, the demo's table (None unless 0) and stderr of ``score --boxes path --data demo``."""
    code = main(["score", "--boxes", str(path), "--data", "demo", "--out", str(out), "--bootstrap", "0", *extra])
    err = capsys.readouterr().err
    table = json.loads((out / "metrics.json").read_text())["datasets"]["demo"] if code == 0 else None
    return code, table, err


def test_ground_truth_boxes_score_one_on_the_default_grid(truth, tmp_path, capsys):
    code, table, err = score(capsys, write_csv(tmp_path / "truth.csv", truth), tmp_path / "out")
    assert code == 0, err
    boxed = {row["finding"] for row in truth}
    regions = {name: row for name, row in table["classes"].items() if row["n_regions"]}
    assert len(regions) == len(boxed)  # (NIH's Effusion / Infiltrate are the dataset's spellings)
    for name, row in regions.items():
        assert (row["pointing_game"], row["dice_best"], row["iou_best"]) == (1, 1, 1), name
    assert table["mean"]["auroc"] is None and table["problems"] == []  # no confidence, no score: grounding-only
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["config"]["boxes"] == str(tmp_path / "truth.csv")


def test_json_lines_score_as_the_csv(truth, tmp_path, capsys):
    rows = [{**row, "confidence": 0.25 + 0.05 * n} for n, row in enumerate(truth)]
    rows.append({**truth[0], "finding": "Mass", "confidence": 0.5})  # a wrong finding
    _, from_csv, _ = score(capsys, write_csv(tmp_path / "boxes.csv", rows, ["confidence"]), tmp_path / "csv", *SMALL)
    _, from_json, _ = score(capsys, write_jsonl(tmp_path / "boxes.jsonl", rows), tmp_path / "json", *SMALL)
    assert from_csv == from_json and from_csv["mean"]["auroc"] is not None
    assert from_csv["mean"]["pointing_game"] == 1


def test_the_map_is_the_maximum_confidence_over_the_boxes_at_each_eval_centre():
    boxes = [(Box(0, 0, 4, 3), 0.5), (Box(2, 1, 6, 5), 0.8), (Box(3, 2.5, 5, 4), 0.3), (Box(5.2, 4.2, 5.4, 4.4), 0.9)]
    for height, width, size in ((6, 6, 6), (5, 9, 4), (7, 3, 10)):
        xs, ys = (np.arange(size) + 0.5) * width / size, (np.arange(size) + 0.5) * height / size
        expected = np.zeros((size, size), np.float32)
        for r in range(size):
            for c in range(size):
                hits = [v for b, v in boxes if b.x0 <= xs[c] < b.x1 and b.y0 <= ys[r] < b.y1]
                expected[r, c] = max(hits, default=0.0)
        assert np.array_equal(max_confidence_map(boxes, height, width, size), expected), (height, width, size)
    assert not max_confidence_map([], 4, 4, 4).any()


def test_the_benchmark_warp_samples_an_eval_grid_map_exactly():
    rng = np.random.default_rng(0)
    for _ in range(50):
        height, width = (int(v) for v in rng.integers(20, 3000, 2))
        size = int(rng.choice([32, 100, 224, 512]))
        x0, x1 = sorted(rng.uniform(0, width, 2))
        y0, y1 = sorted(rng.uniform(0, height, 2))
        grid = torch.from_numpy(max_confidence_map([(Box(x0, y0, x1, y1), 0.7)], height, width, size))
        affine = torch.tensor([eval_grid_affine(height, width, size)], dtype=torch.float64)
        warped = warp_to_eval_grid(grid[None], affine, size, torch.tensor([[height, width]]), size)[0]
        assert torch.equal(warped, grid), (height, width, size)


def test_pair_scores_take_the_score_column_else_the_largest_confidence():
    rows = [BoxRow(2, "a", "Mass", Box(0, 0, 1, 1), 0.3, 0.6), BoxRow(3, "a", "Mass", Box(1, 1, 2, 2), 0.9, 0.6),
            BoxRow(4, "b", "Mass", None, None, 0.1)]
    assert pair_scores(rows, "score") == {("a", "Mass"): 0.6, ("b", "Mass"): 0.1}
    assert pair_scores(rows[:2], "confidence") == {("a", "Mass"): 0.9}
    assert pair_scores(rows, None) == {}


def test_recognition_from_scores_confidences_or_none(truth, tmp_path, capsys):
    confident = [{**row, "confidence": 0.8} for row in truth]
    _, table, _ = score(capsys, write_csv(tmp_path / "c.csv", confident, ["confidence"]), tmp_path / "c", *SMALL)
    assert (table["mean"]["auroc"], table["mean"]["f1"]) == (1, 1)  # positives 0.8, every other pair 0
    # the score column wins over the confidences: positives 0.2 (below the 0.5 threshold of F1)
    scored = [{**row, "score": 0.2} for row in confident]
    negative = next(r for r in truth if r["finding"] != "Mass")["image_id"]
    scored.append({"image_id": negative, "finding": "Mass", "score": 0.7})  # a score without a box
    _, table, _ = score(capsys, write_csv(tmp_path / "s.csv", scored, ["confidence", "score"]), tmp_path / "s", *SMALL)
    assert table["mean"]["f1"] == 0 and table["mean"]["pointing_game"] == 1
    mass = table["classes"]["Mass"]
    assert mass["auroc"] == pytest.approx((mass["n_neg"] - 1) / mass["n_neg"])  # one negative above the positives
    _, table, _ = score(capsys, write_csv(tmp_path / "g.csv", truth), tmp_path / "g", *SMALL)
    assert table["mean"]["auroc"] is None and table["mean"]["ece"] is None and table["mean"]["dice_best"] == 1


BAD_ROWS = [  # (extra cells of a bad row, what its error says)
    ({"x_max": ""}, "x_max missing"),
    ({"x_min": "abc"}, "x_min 'abc' is not a number"),
    ({"x_max": "100", "x_min": "100"}, "needs x_max > x_min"),
    ({"confidence": "1.5"}, "confidence 1.5 is not in [0, 1]"),
    ({"confidence": "-0.1"}, "confidence -0.1 is not in [0, 1]"),
    ({"confidence": "nan"}, "confidence is 'nan', not a finite number"),
    ({"confidence": ""}, "confidence is missing"),
    ({"image_id": "nobody.png"}, "image 'nobody.png' is not an evaluated image of demo"),
    ({"finding": "Banana"}, "finding 'Banana' is none of demo's"),
    ({"x_max": "5000"}, "extends outside the"),
    ({"x_min": "-1"}, "extends outside the"),
    ({"score": "0.3"}, "differs from row 2's 0.9"),
]


def bad_file(truth: list[dict], folder: Path, bad: list[dict]) -> Path:
    rows = [{**row, "confidence": "1", "score": "0.9"} for row in truth]
    rows += [{**rows[0], **cells} for cells in bad]
    return write_csv(folder / "bad.csv", rows, ["confidence", "score"])


@pytest.mark.parametrize("cells, says", BAD_ROWS, ids=[says.split(" ")[0] + str(n) for n, (_, says) in enumerate(BAD_ROWS)])
def test_a_bad_row_is_one_line_naming_file_and_row(truth, tmp_path, capsys, cells, says):
    path = bad_file(truth, tmp_path, [cells])
    code, _, err = score(capsys, path, tmp_path / "out", *SMALL)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith(f"error: {path}, row {len(truth) + 2}: ")
    assert says in errors[0]


@pytest.mark.parametrize("text, says", [
    ('{"image_id": "phantom_000.png", "finding": "Nodule", "x_min": 1, "y_min": 1, "x_max": 2\n', "not JSON"),
    ('{"image_id": "phantom_000.png", "finding": "Nodule", "x_min": 1, "y_min": 1, "x_max": 2}\n', "y_max missing"),
    ('[1, 2]\n', "not a JSON object"),
    ('"hello there"\n', "not a JSON object"),
    ('{"image_id": "phantom_000.png", "finding": "Nodule", "x_min": true, "y_min": 1, "x_max": 2, "y_max": 3}\n', "x_min True is not"),
])
def test_a_bad_json_line_is_named(truth, tmp_path, capsys, text, says):
    path = write_jsonl(tmp_path / "bad.jsonl", truth)
    path.write_text(path.read_text() + "\n" + text)  # a blank line, then the bad one
    code, _, err = score(capsys, path, tmp_path / "out", *SMALL)
    assert code == 2 and err.strip().splitlines()[-1].startswith(f"error: {path}, row {len(truth) + 2}: ")
    assert says in err


def test_skip_mode_counts_every_bad_row_in_the_problems(truth, tmp_path, capsys):
    path = bad_file(truth, tmp_path, [cells for cells, _ in BAD_ROWS])
    code, table, err = score(capsys, path, tmp_path / "out", *SMALL, "--data.on_error", "skip")
    assert code == 0, err
    problems = [p for p in table["problems"] if p["file"] == str(path)]
    assert [p["row"] for p in problems] == [str(len(truth) + 2 + n) for n in range(len(BAD_ROWS))]
    assert all(p["action"] == "skipped" for p in problems)
    for problem, (_, says) in zip(problems, BAD_ROWS):
        assert says in problem["reason"]
    assert table["mean"]["pointing_game"] == 1 and table["mean"]["auroc"] == 1  # what was left is the truth


def test_a_file_without_a_box_column_or_of_another_kind_is_refused(truth, tmp_path, capsys):
    path = tmp_path / "boxes.csv"
    path.write_text("image_id,finding,x_min,y_min,x_max\nphantom_000.png,Nodule,1,1,2\n")
    code, _, err = score(capsys, path, tmp_path / "out", "--data.on_error", "skip")
    assert code == 2 and f"error: {path}, row 1: no column y_max" in err
    other = write_csv(tmp_path / "boxes.txt", truth)
    assert score(capsys, other, tmp_path / "out")[0] == 2
    assert score(capsys, tmp_path / "absent.csv", tmp_path / "out")[0] == 2
    assert main(["score", "--boxes", str(path)]) == 2  # no --data
    marked = tmp_path / "excel.csv"  # a spreadsheet's byte-order mark is not part of the first column's name
    marked.write_text("image_id,finding,x_min,y_min,x_max,y_max\nphantom_000.png,Nodule,1,1,2,2\n", encoding="utf-8-sig")
    assert read_rows(marked)[1] == [(2, {"image_id": "phantom_000.png", "finding": "Nodule", "x_min": "1", "y_min": "1",
                                         "x_max": "2", "y_max": "2"})]


def test_a_box_too_small_for_the_grid_is_recorded(truth, tmp_path, capsys):
    rows = [*truth, {**truth[0], "x_max": truth[0]["x_min"] + 0.5, "y_max": truth[0]["y_min"] + 0.5}]
    code, table, err = score(capsys, write_csv(tmp_path / "boxes.csv", rows), tmp_path / "out", *SMALL)
    assert code == 0, err
    assert [p["action"] for p in table["problems"]] == ["empty_on_grid"]


def test_help_names_the_file_format(capsys):
    assert main(["score", "--boxes", "FILE", "--help"]) == 0
    out = capsys.readouterr().out
    assert "image_id,finding,x_min,y_min,x_max,y_max[,confidence][,score]" in out and "\n  --boxes FILE  " in out
    assert main(["score", "--help"]) == 0
    assert "\n  --boxes FILE  " in capsys.readouterr().out


def test_a_flag_without_its_value_is_named(capsys):
    assert main(["score", "--data", "demo", "--boxes"]) == 2
    assert capsys.readouterr().err.strip() == "error: --boxes needs a value: score --boxes FILE --data NAME"


def test_the_stated_box_metrics_of_a_box_file_equal_torchmetrics_map(truth, tmp_path, capsys):
    """``score --boxes`` judges the boxes themselves with the generative family's box metrics (``metrics.boxes``): the
    ground truth kept for half the findings, shifted for the others, plus a spurious box with a lower confidence; each
    finding's ``box_map50``/``box_map`` equals torchmetrics' ``MeanAveragePrecision`` on the same boxes."""
    from torchmetrics.detection import MeanAveragePrecision

    rows = []
    for n, row in enumerate(truth):
        shift = 0.0 if n % 2 == 0 else 0.4 * (row["x_max"] - row["x_min"])
        rows.append({**row, "x_min": row["x_min"] + shift, "x_max": row["x_max"] + shift, "confidence": 0.9})
        if n % 3 == 0:
            rows.append({**row, "x_min": 1.0, "y_min": 1.0, "x_max": 40.0, "y_max": 40.0, "confidence": 0.3})
    code, table, err = score(capsys, write_csv(tmp_path / "boxes.csv", rows, ["confidence"]), tmp_path / "out")
    assert code == 0, err
    from xbench_pl.external_maps import finding_name
    from xbench_pl.metrics.resampling import image_key

    for finding in {row["finding"] for row in truth}:
        ours = table["classes"][finding_name(finding, "demo", list(table["classes"]))]  # NIH's spellings (Infiltrate)
        metric = MeanAveragePrecision(iou_type="bbox")
        # in the metrics' image order (image_key): COCO breaks ties between equal confidences by the order of the images
        images = sorted({r["image_id"] for r in truth if r["finding"] == finding} | {r["image_id"] for r in rows if r["finding"] == finding},
                        key=image_key)
        corners = lambda r: [r["x_min"], r["y_min"], r["x_max"], r["y_max"]]  # noqa: E731
        preds = [{"boxes": torch.tensor([corners(r) for r in rows if r["image_id"] == i and r["finding"] == finding]).reshape(-1, 4),
                  "scores": torch.tensor([r["confidence"] for r in rows if r["image_id"] == i and r["finding"] == finding]),
                  "labels": torch.zeros(sum(r["image_id"] == i and r["finding"] == finding for r in rows), dtype=torch.long)}
                 for i in images]
        targets = [{"boxes": torch.tensor([corners(r) for r in truth if r["image_id"] == i and r["finding"] == finding]).reshape(-1, 4),
                    "labels": torch.zeros(sum(r["image_id"] == i and r["finding"] == finding for r in truth), dtype=torch.long)}
                   for i in images]
        metric.update(preds, targets)
        expected = metric.compute()
        assert ours["box_map50"] == pytest.approx(float(expected["map_50"]), abs=1e-6), finding
        assert ours["box_map"] == pytest.approx(float(expected["map"]), abs=1e-6), finding
        # kept boxes are found, boxes shifted by 0.4 of their width are not (IoU 0.6 / 1.4 < 0.5): one box per pair here
        kept = [n % 2 == 0 for n, r in enumerate(truth) if r["finding"] == finding]
        assert ours["box_acc@0.5"] == pytest.approx(sum(kept) / len(kept)), finding
        assert ours["box_miou"] == pytest.approx((sum(kept) + (len(kept) - sum(kept)) * 0.6 / 1.4) / len(kept), abs=1e-9)
    assert table["mean"]["parse_failure_rate"] == 0
