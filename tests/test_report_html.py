"""``python -m xbench_pl report``: report.md and a self-contained report.html from fixture runs, checked in a
real headless browser (Debian's ``chromium``, a system package the project does not install: that one test
is skipped where it is absent; the page's self-containment and every embedded PNG are checked without it)."""

import base64
import csv
import io
import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from xbench_pl.commands import main as cli_main
from xbench_pl.callbacks.calibration import plot_reliability
from xbench_pl.commands.report.correlation import auroc_pg_points, figure_auroc_pg, figure_dice_gap, fit_line
from xbench_pl.commands.report.runs import find_runs
from xbench_pl.commands.report.tables import COLUMNS_PER_TABLE

FINDINGS = ["Atelectasis", "Cardiomegaly", "Nodule", "Pneumothorax"]


def _row(rng):
    pg = rng.random()
    return {"pointing_game": pg, "dice@0.5": rng.random() * 0.5, "iou@0.5": rng.random() * 0.3, "dice_best": 0.6,
            "iou_best": 0.4, "tau_best": 0.3, "delta_dice": 0.1, "auroc": min(1.0, 0.4 + 0.5 * pg + 0.1 * rng.random()),
            "auprc": None, "f1": 0.0, "hamming_acc": 0.5, "ece": 0.2, "n_pos": 3, "n_neg": 5, "n_regions": 3}


def write_run(folder: Path, model: str, seed: int, images: bool = False) -> None:
    rng = random.Random(seed)
    datasets = {}
    for dataset in ("demo", "demo_dicom"):
        classes = {f: _row(rng) for f in FINDINGS}
        mean = {k: (sum(r[k] for r in classes.values() if r[k] is not None) / 4 if classes["Nodule"][k] is not None else None)
                for k in classes["Nodule"]}
        datasets[dataset] = {"classes": classes, "mean": mean, "problems": []}
    classes["Nodule"]["auroc"] = None  # undefined: left out of the fit
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"model": model, "random_weights": seed == 2, "datasets": datasets,
                                                     "config": {}}))
    if images:
        calibration = folder / "calibration" / "demo"
        calibration.mkdir(parents=True)
        heatmaps = folder / "heatmaps" / "demo" / "Nodule"
        heatmaps.mkdir(parents=True)
        for path in (calibration / "threshold_all.png", calibration / "reliability_all.png", heatmaps / "img1.png"):
            Image.fromarray((np.random.default_rng(seed).random((60, 80, 3)) * 255).astype(np.uint8)).save(path)
        with (folder / "heatmaps" / "samples.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["dataset", "finding", "image_id", "score", "label", "pointing_game", "file"])
            writer.writerow(["demo", "Nodule", "img1", 0.7, 1, 1.0, "demo/Nodule/img1.png"])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    write_run(tmp / "a", "clip", 1, images=True)
    write_run(tmp / "b", "biomedclip", 2)
    write_run(tmp / "sweep" / "runs" / "r1", "center", 3)
    write_run(tmp / "sweep" / "runs" / "r2", "center", 4)
    (tmp / "sweep" / "runs" / "r1" / "params.json").write_text(json.dumps({"model.sigma": 0.1}))
    assert cli_main(["report", str(tmp / "a"), str(tmp / "b"), str(tmp / "sweep"), "--out", str(tmp / "out")]) == 0
    return tmp


def test_report_tables_and_r2(report):
    runs = find_runs([str(report / "a"), str(report / "b"), str(report / "sweep")])
    assert [r.name for r in runs] == ["clip", "biomedclip", "center (model.sigma=0.1)", "center"]  # r2: no params.json
    points = auroc_pg_points(runs)
    assert len(points) == 4 * 2 * 4 - 4  # Nodule of demo_dicom has no AUROC
    x, y = np.array([p[3] for p in points]), np.array([p[4] for p in points])
    slope, intercept, r2 = fit_line(list(x), list(y))
    assert r2 == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2, rel=1e-12)
    assert (slope, intercept) == pytest.approx(tuple(np.polyfit(x, y, 1)), rel=1e-9)
    md = (report / "out" / "report.md").read_text()
    assert f"R² = {r2:.3f}" in md and "| model | demo PG | demo Dice | demo IoU | demo_dicom PG |" in md
    assert "RANDOM weights" in md and "### demo_dicom" in md and "Heatmap samples, demo" in md
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (report / "out" / link).is_file(), link


def test_report_html_is_self_contained(report):
    page = (report / "out" / "report.html").read_text()
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert len(sources) == 2 + 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    for source in sources:  # every figure is a PNG that decodes
        image = Image.open(io.BytesIO(base64.b64decode(source.partition(",")[2])))
        image.load()
        assert image.format == "PNG" and min(image.size) > 16
    assert "http://" not in page and "https://" not in page


def _chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("no chromium (apt-get install -y chromium) for the browser test")
    return found


def test_report_renders_in_a_headless_browser(report):
    chromium = _chromium()
    page = (report / "out" / "report.html").resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2200"]
    shot = report / "shot.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", page], capture_output=True, timeout=120, check=True)
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10 and (pixels < 128).mean() > 0.01  # text, tables and figures: not a blank page
    dom = subprocess.run([chromium, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=True).stdout
    loaded = re.search(r'data-images="(\d+)/(\d+)"', dom)
    assert loaded and loaded.group(1) == loaded.group(2) == "5"  # every figure decoded


def test_report_refuses_a_folder_without_runs(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no metrics.json" in capsys.readouterr().err


# -- a report of many runs reads on a 1,400 px screen ---------------------------------------------------
@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A sweep of 12 runs with long names, in folders whose (hash) names are not their parameters' order."""
    tmp = tmp_path_factory.mktemp("wide")
    sigmas, sizes = [0.5, 2, 10, 0.05], [224, 448, 672]
    for i in range(12):
        folder = tmp / "sweep" / "runs" / f"h{(i * 7) % 12:02d}"
        write_run(folder, "a_rather_long_model_name_of_a_sweep", i + 10)
        (folder / "params.json").write_text(json.dumps({"model.sigma": sigmas[i % 4], "data.eval_size": sizes[i // 4]}))
    write_run(tmp / "a", "clip", 1, images=True)
    assert cli_main(["report", str(tmp / "a"), str(tmp / "sweep"), "--out", str(tmp / "out")]) == 0
    return tmp


def test_sweep_runs_are_ordered_by_their_parameters(wide):
    params = [json.loads((run.folder / "params.json").read_text()) for run in find_runs([str(wide / "sweep")])]
    assert [(p["model.sigma"], p["data.eval_size"]) for p in params] == sorted((p["model.sigma"], p["data.eval_size"]) for p in params)
    md = (wide / "out" / "report.md").read_text()
    assert md.index("model.sigma=0.05, data.eval_size=224") < md.index("model.sigma=0.5, data.eval_size=224") \
        < md.index("model.sigma=2, data.eval_size=224") < md.index("model.sigma=10, data.eval_size=224")


def test_every_table_is_narrow_and_the_page_fits_1400_px(wide):
    page = (wide / "out" / "report.html").read_text().replace("<wbr>", "")  # a header may break after "_"
    tables = re.findall(r"<table>.*?</table>", page)
    widths = [len(re.findall(r"<th>", re.search(r"<thead>.*?</thead>", t).group(0))) for t in tables]
    assert max(widths) <= COLUMNS_PER_TABLE + 1 and len(tables) > 8  # split, not dropped:
    assert page.count("a_rather_long_model_name_of_a_sweep (model.sigma=0.05, data.eval_size=224)") >= 1 + 4 * 2
    chromium = _chromium()
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,2000", "--dump-dom",
                          (wide / "out" / "report.html").resolve().as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert int(re.search(r'data-width="(\d+)"', dom).group(1)) <= 1400  # no horizontal scrolling


#: records, on load, every table header that a line break cuts inside a word (not after a space, "_", "/", "=" or ".")
BROKEN_WORDS = """<script>
window.addEventListener("load", function () {
  var broken = [];
  document.querySelectorAll("th").forEach(function (th) {
    var walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT), node, last = null, space = false;
    while ((node = walker.nextNode())) {
      for (var i = 0; i < node.length; i++) {
        var range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        var box = range.getClientRects()[0], c = node.data[i];
        if (!box || box.width === 0) { space = space || /\\s/.test(c); continue; }
        if (last && box.top > last.top + 2 && !space && !/[\\s_\\/=.]/.test(last.c) && !/\\s/.test(c)) broken.push(th.textContent);
        last = {c: c, top: box.top};
        space = /\\s/.test(c);
      }
    }
  });
  document.body.setAttribute("data-broken", JSON.stringify(broken));
});
</script>"""


def test_headers_wrap_between_words(wide, tmp_path):
    """The wide report's headers (long run names) in a 1,400 px window: lines break between words only."""
    chromium = _chromium()
    page = tmp_path / "report.html"
    page.write_text((wide / "out" / "report.html").read_text().replace("</body>", BROKEN_WORDS + "</body>"))
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,2000", "--dump-dom",
                          page.resolve().as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    broken = re.search(r'data-broken="([^"]*)"', dom)
    assert broken and json.loads(broken.group(1).replace("&quot;", '"')) == []


def _boxes(texts, figure):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    return [t.get_window_extent(renderer) for t in texts if t.get_text()]


def test_bar_labels_do_not_overlap_and_stay_in_the_figure(wide, tmp_path):
    figure = figure_dice_gap(find_runs([str(wide / "a"), str(wide / "sweep")]), tmp_path / "gap.png")
    ax = figure.axes[0]
    boxes = _boxes(ax.get_yticklabels(), figure)
    assert len(boxes) == 13 * 2
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    width, height = figure.canvas.get_width_height()
    assert all(b.x0 >= 0 and b.y0 >= 0 and b.x1 <= width and b.y1 <= height for b in boxes)


def test_scatter_markers_are_not_cut_and_stacked_points_show(report, tmp_path):
    runs = find_runs([str(report / "a")])
    twin = find_runs([str(report / "a")])[0]  # the same points again: every marker stacks two
    twin.name = "clip again"
    figure, numbers = figure_auroc_pg(runs + [twin], tmp_path / "scatter.png")
    scatters = figure.axes[0].collections
    assert numbers["points"] == 2 * len(auroc_pg_points(runs)) and all(not c.get_clip_on() for c in scatters)
    one, two = (sorted(c.get_sizes()) for c in scatters)
    assert one == two and len(one) == len(auroc_pg_points(runs))  # one marker per place ...
    figure, _ = figure_auroc_pg(runs, tmp_path / "one.png")
    runs[0].metrics["datasets"]["demo"]["classes"]["Nodule"].update(pointing_game=0.25, auroc=0.75)
    runs[0].metrics["datasets"]["demo"]["classes"]["Cardiomegaly"].update(pointing_game=0.25, auroc=0.75)
    figure, _ = figure_auroc_pg(runs, tmp_path / "stacked.png")
    sizes = figure.axes[0].collections[0].get_sizes()
    assert len(sizes) == len(auroc_pg_points(runs)) - 1 and max(sizes) == 2 * min(sizes)  # ... whose area counts them


def test_reliability_histogram_says_what_it_counts():
    bins = {"count": [3, 0, 5, 2], "confidence": [0.1, None, 0.6, 0.9], "accuracy": [0.0, None, 0.4, 1.0]}
    figure = plot_reliability("m | d | all findings pooled", [0, 0.25, 0.5, 0.75, 1], bins, 0.1,
                              counted="(image, finding) pairs")
    assert figure.axes[1].get_title(loc="left") == "(image, finding) pairs per bin"
