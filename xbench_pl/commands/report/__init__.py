"""``python -m xbench_pl report RUN_DIR... --out DIR``: ``report.md``, a self-contained ``report.html`` and ``report.json``.

A RUN_DIR is a ``test --out`` folder (its ``metrics.json``, and the ``heatmaps/`` and ``calibration/`` files the
visual callbacks wrote and a prediction store, ``--predictions RUN_DIR/store``, if any) or a ``sweep --out`` folder
(every ``runs/*/metrics.json``). The report shows Table 1, models x explainers, the sanity and faithfulness tests
(``--model.trust``), the agreement of the runs' saved maps, each run as a % of a reader, subgroup gaps, AUROC
against Pointing Game and the calibration gap, the per-finding tables and the runs' saved plots; a run has one
label throughout, and a dataset whose runs saw different images is shown once per image set.

The page is a list of sections (``SECTIONS``), each a module whose ``section(runs, figures) -> Section | None``
gives its part (None: nothing to show for these runs):

- ``table1``: the datasets x runs grid of Pointing Game / Dice@0.5 / IoU@0.5 (Table 1 of the paper);
- ``explainers``: where the runs' maps differ in explainer, models x explainers per dataset;
- ``trust``: where runs measured trust (``--model.trust``), Pointing Game beside the sanity and faithfulness tests;
- ``generative``: where runs stated boxes (grounded generative models, ``score --boxes``), the box metrics beside the
  map metrics and the self-consistency of the two, with samples drawing the map, the ground truth and the boxes;
- ``agreement``: where two or more runs saved their maps (a prediction store), the SSIM between their maps;
- ``reader``: where a reader run covers a dataset, each run as a share of the radiologist's values;
- ``fairness``: where runs have ``by_group``, per group value and the gap;
- ``correlation``: AUROC against Pointing Game (Fig. 3, Pearson's r) and the calibration gap (Fig. 4);
- ``findings``: per dataset, the per-finding tables;
- ``saved``: the calibration plots and heatmap samples the runs saved.

``--against paper`` adds ``paper`` after Table 1: each cell beside the value the paper published (``AGAINST``).

Every section names a run by one label (``runs.label_runs``: ``clip [gradcam]``), and a dataset whose runs saw
different images by its image set (``runs.image_sets``: ``demo (8 images)``). ``page`` writes the sections as
markdown and HTML, ``tables`` and ``figures`` hold what the sections' tables and figures share. Figures are drawn
with matplotlib into ``OUT/figures/`` (``report.md`` links them and the runs' own PNGs); ``report.html`` inlines
every image as a data URI, so it opens from a file, offline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from jsonargparse import ArgumentParser

from xbench_pl.commands import print_error
from xbench_pl.commands.parsing import PARSER_KWARGS
from xbench_pl.console import wrap
from xbench_pl.commands.report import (agreement, correlation, explainers, fairness, findings, generative, paper, reader, saved,
                                       table1, trust)
from xbench_pl.commands.report.correlation import r2_text
from xbench_pl.commands.report.page import Section, markdown, page
from xbench_pl.commands.report.runs import Run, find_runs, image_sets
from xbench_pl.outputs import atomic_write, check_writable, write_whole

#: the page's sections in order (after ``opening``)
SECTIONS = (table1, explainers, trust, generative, agreement, reader, fairness, correlation, findings, saved)
#: sections added by ``--against NAME``, after Table 1
AGAINST = {"paper": paper}


def opening(runs: list[Run]) -> Section:
    """The page's title, its runs, and what to read them with: random weights, datasets split by image set."""
    out = Section("XBench report", level=1)
    out.text(f"{len(runs)} run(s): " + ", ".join(f"{r.name} (`{r.folder}`)" for r in runs))
    random_runs = [r.name for r in runs if r.metrics.get("random_weights")]
    if random_runs:
        out.text(f"RANDOM weights (smoke tests, not results): {', '.join(random_runs)}", warn=True)
    for dataset, split in image_sets(runs).items():
        sets = "; ".join(f"{name}: {', '.join(members)}" for name, members in split.items())
        out.text(f"{dataset}: the runs saw different images (their per-finding counts differ), so each image set is a "
                 f"dataset of its own here: {sets}.", warn=True)
    return out


def build(runs: list[Run], out: Path, against: str | None = None) -> dict:
    """Write ``report.md``, ``report.html``, ``report.json`` and ``figures/``; return what ``report.json`` holds.
    ``against``: a key of ``AGAINST``, whose section follows Table 1."""
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    modules = list(SECTIONS)
    if against is not None:
        modules.insert(modules.index(table1) + 1, AGAINST[against])
    sections = [opening(runs), *(s for module in modules if (s := module.section(runs, figures)) is not None)]
    report = {"runs": [{"name": r.name, "folder": str(r.folder), "model": r.model, "explainer": r.explainer,
                        "datasets": list(r.datasets)} for r in runs]}
    for section in sections:
        report.update(section.data)
    atomic_write(out / "report.json", json.dumps(report, indent=1) + "\n")
    atomic_write(out / "report.md", markdown(sections, out))
    atomic_write(out / "report.html", page(sections))
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = ArgumentParser(prog="python -m xbench_pl report", description=__doc__.split("\n\n")[1], **PARSER_KWARGS)
    parser.add_argument("runs", type=str, nargs="+", help="run folders (test --out) or sweep folders (sweep --out)")
    parser.add_argument("--out", type=str, default="report", help="folder for report.md, report.html and figures/")
    parser.add_argument("--against", choices=list(AGAINST), default=None,
                        help="paper: each cell beside the value XBench published (arXiv 2510.19599), with the difference "
                             "and whether it lies in our bootstrap interval")
    try:
        args = parser.parse_args(argv)
    except Exception as error:
        print_error(f"{str(error).splitlines()[0]} (see python -m xbench_pl report --help)")
        return 2
    try:
        runs = find_runs([r for group in args.runs for r in (group if isinstance(group, list) else [group])])
    except (FileNotFoundError, json.JSONDecodeError, KeyError) as error:
        print_error(str(error))
        return 2
    check_writable({"--out": args.out})
    out = Path(args.out)
    report = write_whole(out, lambda folder: build(runs, folder, args.against))
    overall = report["auroc_vs_pointing_game"]["overall"]
    print(f"{len(runs)} run(s); AUROC vs Pointing Game: {overall['n']} points, R² = {r2_text(overall['r2'], overall['n'])}")
    if args.against == "paper":
        s = report["against_paper"]["summary"]
        print(wrap(f"against the paper: {s['cells']} cell(s), {s['inside']} of {s['with_interval']} with an interval hold "
                   f"the paper's value, {s['flagged']} flagged (protocol differs)"))
    print(f"wrote {out / 'report.md'}, {out / 'report.html'} and {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
