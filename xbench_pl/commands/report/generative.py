"""The section "Generative models": where runs stated boxes (a grounded generative model, ``score --boxes``).

Per dataset, a row per such run: the stated-box metrics (``metrics.boxes``: box accuracy at IoU 0.5, best-match IoU,
COCO mAP at 0.5 and 0.5:0.95, RadFact's box precision and recall), the map metrics of the same run (Pointing Game,
Dice at the best tau), and whether the map looks where the box points (``self_consistency_mass``,
``self_consistency_pg``), beside the parse failures and the boxes drawn for absent findings; each mean with its
bootstrap interval. A run whose box and map disagree by more than ``DISAGREEMENT`` (box accuracy against the map's
Pointing Game) is named: its box is right where its map is elsewhere, or the reverse. Then the run's saved samples
(``heatmaps/``): the image, the map, the ground truth (lime) and the stated boxes (dashed magenta) drawn together.
"""

from __future__ import annotations

import csv
from pathlib import Path

from xbench_pl.commands.report.page import Section
from xbench_pl.commands.report.runs import Run, datasets
from xbench_pl.commands.report.tables import cell
from xbench_pl.commands.report.trust import with_interval

#: the columns, in order: the boxes, the map, the two together, the answers
KEYS = ("box_acc@0.5", "box_miou", "box_map50", "box_map", "box_precision", "box_recall", "pointing_game", "dice_best",
        "self_consistency_mass", "self_consistency_pg", "parse_failure_rate", "box_absent_drawn")
HEADERS = {"box_acc@0.5": "box acc@0.5", "box_miou": "box mIoU", "box_map50": "mAP@0.5", "box_map": "mAP@0.5:0.95",
           "box_precision": "box precision (RadFact)", "box_recall": "box recall (RadFact)", "pointing_game": "map: Pointing Game",
           "dice_best": "map: Dice (best tau)", "self_consistency_mass": "map mass in own box",
           "self_consistency_pg": "map peak in own box", "parse_failure_rate": "unparsed answers",
           "box_absent_drawn": "box for an absent finding"}
#: how far box accuracy and the map's Pointing Game may differ before the run is named
DISAGREEMENT = 0.25
#: samples shown per run and dataset
SAMPLES = 4


def states_boxes(table: dict) -> bool:
    """Whether a dataset's table has the stated-box keys (its run stated boxes)."""
    return "box_acc@0.5" in table.get("mean", {})


def disagreement(run: str, table: dict) -> str | None:
    """A sentence where the box and the map disagree (``DISAGREEMENT``), None where they agree or one is undefined."""
    box, pointing = table["mean"].get("box_acc@0.5"), table["mean"].get("pointing_game")
    if box is None or pointing is None or abs(box - pointing) <= DISAGREEMENT:
        return None
    where = "its boxes are right where its maps look elsewhere" if box > pointing else "its maps find what its boxes miss"
    return f"{run}: {where} (box acc@0.5 {cell(box)}, map Pointing Game {cell(pointing)})."


def samples(run: Run, dataset: str) -> list[tuple[Path, str]]:
    """Up to ``SAMPLES`` of the run's saved samples of ``dataset`` that show stated boxes (``heatmaps/samples.csv``)."""
    listed = run.folder / "heatmaps" / "samples.csv"
    if not listed.is_file():
        return []
    with listed.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["dataset"] == dataset and r.get("stated_boxes") not in (None, "")]
    return [(run.folder / "heatmaps" / r["file"], f"{r['finding']} | {r['image_id']} | {r['stated_boxes']} stated box(es) | "
             f"PG {float(r['pointing_game']):.2f}") for r in rows[:SAMPLES]]


def section(runs: list[Run], figures: Path) -> Section | None:
    """None where no run stated boxes."""
    names = [d for d in datasets(runs) if any(states_boxes(r.datasets[d]) for r in runs if d in r.datasets)]
    if not names:
        return None
    out = Section("Generative models: the boxes they state, the maps they compute, and whether the two agree",
                  data={"generative": {}})
    out.text("Per run that stated boxes (a grounded generative model, or `score --boxes`): box accuracy at IoU 0.5 and the "
             "best-match IoU against the ground truth, COCO mAP (torchmetrics), RadFact's box precision and recall; the "
             "same run's map (attention of the answer to the image, or the explainer's) by Pointing Game and Dice; and "
             "whether the map looks where the model points: the share of the map's mass inside its own boxes and whether "
             "its peak is there. Unparsed answers count as no box. Macro means over findings, 95 % bootstrap intervals "
             "in brackets (none for mAP); – where undefined.")
    for dataset in names:
        rows = [(r, r.datasets[dataset]) for r in runs if dataset in r.datasets and states_boxes(r.datasets[dataset])]
        out.data["generative"][dataset] = [{"run": r.name, **{k: t["mean"].get(k) for k in KEYS}} for r, t in rows]
        out.heading(dataset)
        out.table(["run", *(HEADERS[k] for k in KEYS)], [[r.name, *(with_interval(t, k) for k in KEYS)] for r, t in rows])
        for run, table in rows:
            if text := disagreement(run.name, table):
                out.text(text, warn=True)
        for run, _ in rows:
            if shown := samples(run, dataset):
                out.heading(f"{run.name}: the map, the ground truth (lime) and the stated boxes (dashed magenta)", 4)
                out.images(shown, gallery=True)
    return out
