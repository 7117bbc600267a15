"""Visual callbacks: heatmap samples, calibration plots, W&B offline logging; ECE in metrics.json.

End-to-end runs go through the CLI in subprocesses (DDP inside pytest would re-run the session).
"""

import csv
import json
import random
from pathlib import Path

import pytest
import torch
from torchmetrics.classification import BinaryCalibrationError

from test_cli import ddp_ranks_started, in_process
from xbench_pl.callbacks.heatmaps import Sample, SampleBook, sample_key
from xbench_pl.data.nih_bbox import DemoDataModule
from xbench_pl.metrics import BenchmarkMetrics, Recognition
from xbench_pl.metrics.functional import expected_calibration_error, reliability_bins

REPO = Path(__file__).resolve().parents[1]


# -- ECE ----------------------------------------------------------------------------------------
def test_ece_is_torchmetrics_calibration_error_in_float64():
    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(500, generator=gen, dtype=torch.float64)
    labels = (torch.rand(500, generator=gen, dtype=torch.float64) < scores ** 2).long()
    reference = BinaryCalibrationError(n_bins=15, norm="l1")
    reference.update(scores.float(), labels)
    ece = expected_calibration_error(scores, labels)
    assert ece.dtype == torch.float64 and ece.item() == pytest.approx(reference.compute().item(), abs=1e-6)
    bins = reliability_bins(scores, labels)
    assert int(bins["count"].sum()) == 500
    filled = bins["count"] > 0  # the ECE is the count-weighted gap of the diagram's bins
    gap = ((bins["accuracy"] - bins["confidence"]).abs()[filled] * bins["count"][filled]).sum() / 500
    assert gap.item() == pytest.approx(ece.item(), abs=1e-12)


def test_ece_does_not_depend_on_order_or_split():
    gen = torch.Generator().manual_seed(1)
    scores = torch.rand(301, 2, generator=gen, dtype=torch.float64)
    labels = (torch.rand(301, 2, generator=gen, dtype=torch.float64) < scores).long()
    whole = Recognition(2)
    whole.update(scores, labels)
    split = Recognition(2)
    order = torch.randperm(301, generator=gen)
    for part in order.split(37):
        split.update(scores[part], labels[part])
    a, b = whole.compute(), split.compute()
    assert torch.equal(a["ece"], b["ece"])  # bit for bit
    assert torch.equal(a["n_bin"], b["n_bin"]) and torch.equal(a["bin_confidence"].nan_to_num(-1), b["bin_confidence"].nan_to_num(-1))


def test_ece_is_a_table_key_with_its_curves_beside_the_table():
    bench = BenchmarkMetrics(["A", "B"])
    bench.update(torch.tensor([[0.9, 0.2], [0.1, 0.7]]), torch.tensor([[1, 0], [0, 0]]),
                 torch.rand(1, 8, 8), torch.ones(1, 8, 8, dtype=torch.bool), torch.zeros(1, dtype=torch.long))
    table = bench.compute()
    assert table["classes"]["A"]["ece"] == pytest.approx(0.1) and table["classes"]["B"]["ece"] == pytest.approx(0.45)
    assert table["mean"]["ece"] == pytest.approx(0.275)
    assert "curves" not in table and len(bench.curves["classes"]["A"]["dice"]) == 101
    assert bench.curves["classes"]["B"]["reliability"]["count"][10] == 1  # 0.7 in [0.667, 0.733)


# -- sample choice --------------------------------------------------------------------------------
def _sample(dataset, finding, image_id):
    return Sample(sample_key(dataset, image_id), dataset, finding, image_id, 0.5, 1, 1.0, (4, 4),
                  None, None, None)


def test_sample_choice_is_the_same_for_any_split_and_bounded():
    ids = [f"img{i:03d}" for i in range(200)]
    one = SampleBook(3)
    for i in ids:
        for finding in ("A", "B"):
            one.add(_sample("d", finding, i)) if one.wants(("d", finding), sample_key("d", i)) else None
    assert len(one.samples()) == 6  # bounded by the sample count, not the 400 pairs offered
    shuffled = ids[:]
    random.Random(0).shuffle(shuffled)
    books = [SampleBook(3) for _ in range(3)]
    for n, i in enumerate(shuffled):
        for finding in ("A", "B"):
            book = books[n % 3]
            if book.wants(("d", finding), sample_key("d", i)):
                book.add(_sample("d", finding, i))
    merged = SampleBook.merge(3, [b.samples() for b in books])
    expected = SampleBook.merge(3, [one.samples()])
    assert {g: [s.image_id for s in v] for g, v in merged.items()} == {g: [s.image_id for s in v] for g, v in expected.items()}
    smallest = sorted(ids, key=lambda i: sample_key("d", i))[:3]
    assert [s.image_id for s in merged[("d", "A")]] == smallest


# -- end to end ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 11-image demo split and three findings: without callbacks and with the PNG preset in 1 process, and
    with the W&B preset (offline; it writes the same files under --out) on 2 DDP processes (``ddp_ranks``), as W&B
    runs at scale."""
    tmp = tmp_path_factory.mktemp("callbacks")
    ids = sorted(r.image_id for r in DemoDataModule().load_records())[:11]
    split = tmp / "split.csv"
    split.write_text("image_id\n" + "\n".join(ids) + "\n")
    common = ["test", "--model", "fixture_models.IntensityModel", "--data", "demo", "--data.split_file", str(split),
              "--data.batch_size", "3", "--trainer.accelerator", "cpu",  # findings with 2 and 1 region: fewer figures
              "--data.classes", "[Nodule, Pleural Effusion, Cardiomegaly]"]
    presets = {}  # callbacks/png.yaml and callbacks/wandb.yaml with 2 samples per finding: fewer figures to draw
    for name in ("png", "wandb"):
        presets[name] = ["--config", str(tmp / f"{name}2.yaml")]
        (tmp / f"{name}2.yaml").write_text((REPO / "callbacks" / f"{name}.yaml").read_text().replace("per_finding: 4", "per_finding: 2"))
    wandb = ddp_ranks_started(*common, *presets["wandb"], "--out", str(tmp / "wandb"))  # W&B's run under --out
    results = {"plain": in_process(*common, "--out", str(tmp / "plain")),
               "png": in_process(*common, *presets["png"], "--out", str(tmp / "png")),
               "wandb": wandb()}
    for name, result in results.items():
        assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"
    (tmp / "wandb_console.txt").write_text(results["wandb"].stdout + results["wandb"].stderr)
    return tmp


def _metrics(folder: Path) -> str:
    report = json.loads((folder / "metrics.json").read_text())
    report.pop("provenance")  # start time, wall time, world size
    return json.dumps(report)


def _files(folder: Path, sub: str) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted((folder / sub).rglob("*")) if p.is_file()}


@pytest.mark.ddp_pair  # the runs fixture's W&B run
def test_callbacks_never_change_a_metric(runs):
    assert _metrics(runs / "plain") == _metrics(runs / "png") == _metrics(runs / "wandb")
    assert (runs / "plain" / "metrics.md").read_bytes() == (runs / "png" / "metrics.md").read_bytes()
    assert not (runs / "plain" / "heatmaps").exists() and not (runs / "plain" / "calibration").exists()
    report = json.loads((runs / "plain" / "metrics.json").read_text())
    assert all("ece" in row for row in report["datasets"]["demo"]["classes"].values())


@pytest.mark.ddp_pair
def test_png_fallback_writes_heatmaps_calibration_and_tables(runs):
    heatmaps = sorted((runs / "png" / "heatmaps" / "demo").rglob("*.png"))
    with (runs / "png" / "heatmaps" / "samples.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(heatmaps) == len(rows) and rows
    per_finding = {}
    for row in rows:
        per_finding.setdefault(row["finding"], []).append(row["image_id"])
    assert all(len(v) <= 2 for v in per_finding.values())
    # the chosen images are the smallest keys among those with a region for the finding
    report = json.loads((runs / "png" / "metrics.json").read_text())
    for finding, chosen in per_finding.items():
        assert len(chosen) == min(2, report["datasets"]["demo"]["classes"][finding]["n_regions"])
    calibration = runs / "png" / "calibration" / "demo"
    for name in ("threshold_all.png", "reliability_all.png", "metrics.csv", "curves.json"):
        assert (calibration / name).stat().st_size > 0
    with (calibration / "metrics.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["finding"] for r in table] == [*report["datasets"]["demo"]["classes"], "mean"]
    assert float(table[-1]["ece"]) == report["datasets"]["demo"]["mean"]["ece"]


@pytest.mark.ddp_pair
def test_samples_identical_on_one_and_two_ddp_processes(runs):
    one, two = _files(runs / "png", "heatmaps"), _files(runs / "wandb", "heatmaps")
    assert one.keys() == two.keys() and len(one) > 2
    assert one == two  # the same images, drawn the same, nothing duplicated or lost
    assert _files(runs / "png", "calibration") == _files(runs / "wandb", "calibration")


@pytest.mark.ddp_pair
def test_wandb_offline_run_holds_the_media_and_table(runs):
    run_dirs = list((runs / "wandb" / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1, list((runs / "wandb").rglob("*"))[:20]
    media = run_dirs[0] / "files" / "media"
    images = sorted((media / "images").rglob("*.png"))
    heatmaps = sorted((runs / "wandb" / "heatmaps").rglob("*.png"))
    calibration = sorted((runs / "wandb" / "calibration").rglob("*.png"))
    assert len(images) == len(heatmaps) + len(calibration)
    logged = {p.read_bytes() for p in images}
    assert all(p.read_bytes() in logged for p in heatmaps)
    tables = list((media / "table").rglob("*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"][:2] == ["finding", "pointing_game"] and "ece" in table["columns"]
    assert [row[0] for row in table["data"]][-1] == "mean"
    # W&B quiet: no chatter (W&B's warning about Lightning's anonymous=None argument is all it may print), no
    # terminal codes; our one line says where the run is
    console = (runs / "wandb_console.txt").read_text()
    chatter = [line for line in console.splitlines() if line.startswith("wandb:") and "anonymous setting" not in line]
    assert chatter == [] and "\x1b[" not in console
    assert f"W&B run saved offline in {run_dirs[0]} (upload: wandb sync {run_dirs[0]})" in " ".join(console.split())  # wrapped
