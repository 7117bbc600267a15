"""% of reader with bootstrap intervals from the same draws: two real benchmark tables on the same images (a reader's
binary maps and a model's) through the report, against a loop over the draws written here; a run on other draws
gets no interval and the report says why (a run over other images: test_report_image_sets.py)."""

import json

import numpy as np
import pytest
import torch
from test_report_explainers import _tables

from xbench_pl.commands import main as cli_main
from xbench_pl.metrics.benchmark import BenchmarkMetrics
from xbench_pl.metrics.functional import bootstrap_weights
from xbench_pl.metrics.resampling import image_key
from xbench_pl.outputs import read_metrics
from xbench_pl.run_files import write_report

CLASSES = ["Nodule", "Mass"]
KEYS = ("pointing_game", "dice@0.5", "iou@0.5")
RESAMPLES, SEED, N_IMAGES, SIZE = 60, 3, 10, 16


def boxes(gen, n):
    out = torch.zeros(n, SIZE, SIZE, dtype=torch.bool)
    for p in range(n):
        y, x = torch.randint(0, SIZE - 5, (2,), generator=gen).tolist()
        h, w = torch.randint(2, 6, (2,), generator=gen).tolist()
        out[p, y:y + h, x:x + w] = True
    return out


def inputs(seed=0):
    """Every (image, finding) pair with a box region; the reader's map covers it and more, the model's is another box."""
    gen = torch.Generator().manual_seed(seed)
    n = N_IMAGES * len(CLASSES)
    masks = boxes(gen, n)  # the reader marks each region and a box beside it: well above the report's floor
    return {"ids": [f"img{i}" for i in range(N_IMAGES)], "masks": masks, "reader": masks | boxes(gen, n), "model": boxes(gen, n),
            "image": torch.arange(N_IMAGES).repeat_interleave(len(CLASSES)), "cls": torch.arange(len(CLASSES)).repeat(N_IMAGES),
            "scores": torch.rand(N_IMAGES, len(CLASSES), generator=gen), "labels": torch.ones(N_IMAGES, len(CLASSES), dtype=torch.long)}


def table(x, maps: str, images: list[int], seed: int = SEED) -> dict:
    bench = BenchmarkMetrics(CLASSES, bootstrap=RESAMPLES, bootstrap_seed=seed)
    rows = torch.isin(x["image"], torch.tensor(images))
    keys = torch.tensor([image_key(i) for i in x["ids"]])
    bench.update(x["scores"][images], x["labels"][images], x[maps][rows].float(), x["masks"][rows], x["cls"][rows],
                 image_keys=keys[x["image"][rows]], sample_keys=keys[images])
    return json.loads(json.dumps(bench.compute()))  # as metrics.json holds it


def write(folder, model, tables: dict) -> None:
    """As ``test`` writes a run: the replicates apart from metrics.json, in replicates.json."""
    write_report({"model": model, "datasets": tables, "config": {}}, folder)
    assert "replicates" not in (folder / "metrics.json").read_text() and (folder / "replicates.json").is_file()
    restored = read_metrics(folder)["datasets"]
    assert json.dumps(restored, sort_keys=True) == json.dumps(tables, sort_keys=True)


def pair_values(x, maps: str) -> np.ndarray:
    """``[P, 3]``: the tie-aware Pointing Game of a binary map (its share inside the region), Dice and IoU of the map."""
    r, g = x[maps].numpy(), x["masks"].numpy()
    inter = (r & g).sum((1, 2))
    return np.stack([inter / r.sum((1, 2)), 2 * inter / (r.sum((1, 2)) + g.sum((1, 2))), inter / (r | g).sum((1, 2))], 1)


def direct_share_intervals(x) -> dict:
    """The loop: per draw, each run's per-class weighted means and their macro mean, the model's ÷ the reader's × 100;
    the 2.5 and 97.5 percentiles of those shares (numpy's linear interpolation)."""
    units = sorted({image_key(i) for i in x["ids"]})
    column = np.array([units.index(image_key(x["ids"][i])) for i in x["image"].tolist()])
    weights = bootstrap_weights(len(units), RESAMPLES, SEED).numpy()
    values = {run: pair_values(x, run) for run in ("reader", "model")}
    cls = x["cls"].numpy()
    shares = {(f, k): [] for f in CLASSES + ["mean"] for k in KEYS}
    for w in weights:
        means = {}
        for run, v in values.items():
            per_class = []
            for c in range(len(CLASSES)):
                drawn = w[column] * (cls == c)
                per_class.append((drawn[:, None] * v).sum(0) / drawn.sum() if drawn.sum() else np.full(len(KEYS), np.nan))
            means[run] = np.array(per_class)
        for j, k in enumerate(KEYS):
            for c, f in enumerate(CLASSES):
                if means["reader"][c, j] > 0:
                    shares[(f, k)].append(100 * means["model"][c, j] / means["reader"][c, j])
            reader_mean, model_mean = np.nanmean(means["reader"][:, j]), np.nanmean(means["model"][:, j])
            if reader_mean > 0:
                shares[("mean", k)].append(100 * model_mean / reader_mean)
    return {key: np.quantile(s, [0.025, 0.975]).tolist() for key, s in shares.items()}


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reader_ci")
    x = inputs()
    every = list(range(N_IMAGES))
    write(tmp / "reader", "reader", {"demo": table(x, "reader", every)})
    write(tmp / "clip", "clip", {"demo": table(x, "model", every)})
    write(tmp / "center", "center", {"demo": table(x, "model", every, seed=SEED + 1)})  # other draws
    assert cli_main(["report", *(str(tmp / n) for n in ("reader", "clip", "center")), "--out", str(tmp / "out")]) == 0
    return tmp, x


def test_share_intervals_equal_a_loop_over_the_draws(reported):
    tmp, x = reported
    entry = json.loads((tmp / "out" / "report.json").read_text())["against_reader"]["demo"]
    clip = entry["models"]["clip"]
    assert clip["draws"] == "shared"
    want = direct_share_intervals(x)
    for k in KEYS:
        assert clip["mean"][k]["ci"] == pytest.approx(want[("mean", k)], rel=1e-9), k  # fixed point: 1e-12 per value
        for f in CLASSES:
            assert clip["classes"][f][k]["ci"] == pytest.approx(want[(f, k)], rel=1e-9), (f, k)
        lo, hi = clip["mean"][k]["ci"]
        assert lo < hi  # a real spread, not a degenerate draw


def test_report_shows_the_intervals_and_why_a_run_has_none(reported):
    tmp, _ = reported
    md = (tmp / "out" / "report.md").read_text()
    entry = json.loads((tmp / "out" / "report.json").read_text())["against_reader"]["demo"]
    clip, center = entry["models"]["clip"], entry["models"]["center"]
    assert center["draws"] == f"other draws (resamples {RESAMPLES}, seed {SEED + 1} here; {RESAMPLES}, {SEED} in the reader run)"
    assert f"No intervals for center: {center['draws']}." in md
    assert all(center["mean"][k]["ci"] is None and center["mean"][k]["percent"] is not None for k in KEYS)
    (means,) = _tables(md, "demo: macro means, the reader's and each run's value (% of reader [95% CI])")
    rows = {row[0]: row[1:] for row in means[1:]}
    cell = clip["mean"]["pointing_game"]
    lo, hi = cell["ci"]
    assert rows["clip"][0] == f"{cell['value']:.3f} ({cell['percent']:.1f}% [{lo:.1f}, {hi:.1f}])"
    assert rows["center"][0] == f"{center['mean']['pointing_game']['value']:.3f} ({center['mean']['pointing_game']['percent']:.1f}%)"
    (dice,) = _tables(md, "demo: Dice per finding, the reader's value and each run's % of it [95% CI]")
    for row in dice[1:]:
        c = clip["classes"][row[0]]["dice@0.5"]
        assert row[2] == f"{c['percent']:.1f}% [{c['ci'][0]:.1f}, {c['ci'][1]:.1f}]"
