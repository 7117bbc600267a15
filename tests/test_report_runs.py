"""The report's runs: one label per run in every section, and runs over different images of a dataset kept apart
(never averaged or set side by side as one dataset)."""

import json
import re
from pathlib import Path

from test_report_explainers import _tables, explained_run
from test_report_fairness import _edit, add_groups
from test_report_html import write_run
from test_report_trust import add_trust

from xbench_pl.commands import main as cli_main
from xbench_pl.commands.report.runs import datasets, find_runs, image_sets

PROMPTS = ("{}", "There is {}")


def _config(prompt: str, explainer: str) -> dict:
    return {"model": {"class_path": "x.Model", "init_args": {"positive": prompt, "explainer": explainer}}, "data": {"k": 1}}


def test_one_run_has_one_label_in_every_section(tmp_path):
    """A sweep over prompts x explainers (no params.json), a repeat of one of its runs elsewhere, with subgroups, and a
    reader: Table 1, the per-finding, explainer, fairness and reader tables, the figures' runs and report.json name
    each run alike; the model x explainer rows are those labels without the explainer."""
    for i, (prompt, explainer) in enumerate((p, e) for p in PROMPTS for e in ("native", "gradcam")):
        explained_run(tmp_path / "sweep" / "runs" / f"r{i}", "clip", explainer, 40 + i, _config(prompt, explainer))
        _edit(tmp_path / "sweep" / "runs" / f"r{i}", lambda m: add_groups(m, 0.01 * i))
    explained_run(tmp_path / "again", "clip", "gradcam", 50, _config("{}", "gradcam"))
    write_run(tmp_path / "reader", "reader", 51)
    folders = [str(tmp_path / "sweep"), str(tmp_path / "again"), str(tmp_path / "reader")]
    assert cli_main(["report", *folders, "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    names = [run["name"] for run in report["runs"]]
    assert names == ["clip (model.positive={})", "clip [gradcam] (model.positive={}, r1)", "clip (model.positive=There is {})",
                     "clip [gradcam] (model.positive=There is {})", "clip [gradcam] (model.positive={}, again)", "reader"]
    md = (tmp_path / "out" / "report.md").read_text()
    table1 = md.split("## Grounding per dataset and model", 1)[1].split("\n## ", 1)[0]
    assert [row[0] for table in _table_blocks(table1) for row in table[1:]] == names
    for dataset in ("demo", "demo_dicom"):
        (table,) = _tables(md, f"{dataset}: PG")
        assert table[0][1:] == names
    (used,) = _tables_after(md, "### Where each run's maps come from")
    assert [row[0] for row in used[1:]] == names
    assert [row["label"] for row in report["model_x_explainer"]["rows"]] == ["clip (model.positive={})", "clip (model.positive=There is {})",
                                                                        "reader"]
    assert list(report["fairness"]["demo"]["sex"]["runs"]) == names[:4]
    (table,) = _tables(md, "demo, sex: PG")
    assert [row[0] for row in table[1:]] == names[:4]
    (table,) = _tables(md, "demo: Dice per finding, the reader's value and each run's % of it [95% CI]")
    assert table[0][1:] == names[-1:] + names[:-1]
    assert list(report["auroc_vs_pointing_game"]["models"]) == names


def _table_blocks(text: str) -> list[list[list[str]]]:
    blocks = re.findall(r"(?:^\|.*\|\n?)+", text, flags=re.M)
    return [[[c.strip() for c in line.strip("|").split("|")] for line in b.strip().splitlines() if not line.startswith("|---")]
            for b in blocks]


def _tables_after(text: str, heading: str) -> list[list[list[str]]]:
    return _table_blocks(text.split(f"{heading}\n", 1)[1].split("\n#", 1)[0])


def fewer_images(metrics: dict, dataset: str = "demo") -> None:
    """The run saw 2 negative images fewer on ``dataset`` (as ``--data.limit`` or another split would)."""
    for row in [*metrics["datasets"][dataset]["classes"].values(), metrics["datasets"][dataset]["mean"]]:
        row["n_neg"] -= 2


def test_runs_over_other_images_are_another_dataset(tmp_path):
    """clip and center saw demo's 8 images, biomedclip 6 of them: demo is two datasets in every section (Table 1's
    columns, the per-finding tables, Fig. 4's bars), each named by its image count, and the page says so once.
    demo_dicom, seen alike by all, keeps its name."""
    write_run(tmp_path / "clip", "clip", 1)
    write_run(tmp_path / "biomedclip", "biomedclip", 2)
    write_run(tmp_path / "center", "center", 3)
    _edit(tmp_path / "biomedclip", fewer_images)
    folders = [str(tmp_path / n) for n in ("clip", "biomedclip", "center")]
    assert cli_main(["report", *folders, "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    table1 = md.split("## Grounding per dataset and model", 1)[1].split("\n## ", 1)[0]
    tables = _table_blocks(table1)
    header = [h for table in tables for h in table[0][1:]]
    assert header == [f"{d} {k}" for d in ("demo (8 images)", "demo (6 images)", "demo_dicom") for k in ("PG", "Dice", "IoU")]
    rows = {row[0]: row[1:] for table in tables for row in table[1:]}
    assert rows["biomedclip"][:3] == ["–"] * 3 and rows["clip"][3:6] == ["–"] * 3  # never one column of both
    assert ("demo: the runs saw different images (their per-finding counts differ), so each image set is a dataset of its "
            "own here: demo (8 images): clip, center; demo (6 images): biomedclip.") in md
    (table,) = _tables(md, "demo (6 images): PG")
    assert table[0] == ["finding", "biomedclip"]
    (table,) = _tables(md, "demo (8 images): PG")
    assert table[0] == ["finding", "clip", "center"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["datasets"] for r in report["runs"]] == [["demo (8 images)", "demo_dicom"], ["demo (6 images)", "demo_dicom"],
                                                       ["demo (8 images)", "demo_dicom"]]


def test_a_reader_is_compared_on_its_own_images_only(tmp_path):
    """A reader over 6 of demo's 8 images: % of reader only for runs on those 6 (here: none on demo)."""
    write_run(tmp_path / "clip", "clip", 1)
    write_run(tmp_path / "reader", "reader", 2)
    _edit(tmp_path / "reader", fewer_images)
    assert cli_main(["report", str(tmp_path / "clip"), str(tmp_path / "reader"), "--out", str(tmp_path / "out")]) == 0
    stored = json.loads((tmp_path / "out" / "report.json").read_text())["against_reader"]
    assert list(stored) == ["demo (6 images)", "demo_dicom"]
    assert stored["demo (6 images)"]["models"] == {} and list(stored["demo_dicom"]["models"]) == ["clip"]


def test_image_sets_of_as_many_images_are_numbered(tmp_path):
    """8 images each, but other positives: two image sets, told apart by a number."""
    write_run(tmp_path / "clip", "clip", 1)
    write_run(tmp_path / "center", "center", 3)

    def other_images(metrics: dict) -> None:
        for row in metrics["datasets"]["demo"]["classes"].values():
            row.update(n_pos=row["n_pos"] + 1, n_neg=row["n_neg"] - 1)

    _edit(tmp_path / "center", other_images)
    runs = find_runs([str(tmp_path / "clip"), str(tmp_path / "center")])
    assert image_sets(runs) == {"demo": {"demo (8 images, set 1)": ["clip"], "demo (8 images, set 2)": ["center"]}}
    assert [list(r.datasets) for r in runs] == [["demo (8 images, set 1)", "demo_dicom"], ["demo (8 images, set 2)", "demo_dicom"]]
    assert datasets(runs) == ["demo (8 images, set 1)", "demo (8 images, set 2)", "demo_dicom"]


def test_a_truncated_metrics_json_is_one_line_naming_the_file_and_line(tmp_path, capsys):
    """A run whose metrics.json was cut short (its run killed while writing, a copy interrupted): one error naming the
    file and where it breaks, exit 2, no traceback."""
    write_run(tmp_path / "a", "clip", 1)
    whole = (tmp_path / "a" / "metrics.json").read_text()
    (tmp_path / "a" / "metrics.json").write_text(whole[: len(whole) // 2])
    assert cli_main(["report", str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert f"{tmp_path / 'a' / 'metrics.json'}: not a complete metrics.json" in " ".join(err.split()) and "line 1" in err


def paper_sweep_run(sweep: Path, model: str, dataset: str, seed: int, explainer: str = "native") -> Path:
    """A run of ``sweeps/xbench_paper.yaml``'s layout: one model on one dataset (``--data pooled --data.datasets
    [NAME]``, its ``params.json``), here one of the fabricated runs' two datasets."""
    folder = sweep / "runs" / f"{model}-{dataset}-{explainer}"
    data = {"class_path": "xbench_pl.data.pooled.PooledDataModule", "init_args": {"datasets": [dataset], "root": "/data"}}
    explained_run(folder, model, explainer, seed, {"model": {"class_path": "x.Model", "init_args": {"explainer": explainer}},
                                                   "data": data})
    _edit(folder, lambda m: [m["datasets"].pop(d) for d in list(m["datasets"]) if d != dataset])
    (folder / "params.json").write_text(json.dumps({"model": model, "data.datasets": f"[{dataset}]",
                                                    "model.explainer": explainer}))
    return folder


def test_a_models_runs_on_other_datasets_are_one_row(tmp_path):
    """The paper's sweep: each run one model on one dataset. Runs that differ only in their dataset are one model: one
    row of Table 1 per model, a column group per dataset (not a diagonal of one row per run, each labelled
    ``clip (data.datasets=['demo'])``); so too in the trust section and the model x explainer rows."""
    metrics = {(model, dataset, explainer): json.loads((paper_sweep_run(tmp_path / "sweep", model, dataset, 60 + i, explainer)
                                                        / "metrics.json").read_text())
               for i, (model, dataset, explainer) in enumerate((m, d, e) for m in ("clip", "kad") for d in ("demo", "demo_dicom")
                                                               for e in ("native", "gradcam"))}
    for folder in (tmp_path / "sweep" / "runs").iterdir():
        add_trust(folder, 7, passes=True)
    assert cli_main(["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [run["name"] for run in report["runs"]] == ["clip [gradcam]", "clip"] * 2 + ["kad [gradcam]", "kad"] * 2  # params' order
    md = (tmp_path / "out" / "report.md").read_text()
    table1 = md.split("## Grounding per dataset and model", 1)[1].split("\n## ", 1)[0]
    tables = _table_blocks(table1)
    assert [h for table in tables for h in table[0][1:]] == [f"{d} {k}" for d in ("demo", "demo_dicom") for k in ("PG", "Dice", "IoU")]
    rows = {}
    for table in tables:
        for row in table[1:]:
            rows.setdefault(row[0], []).extend(row[1:])
    assert list(rows) == ["clip [gradcam]", "clip", "kad [gradcam]", "kad"]
    for (model, dataset, explainer), run in metrics.items():
        name = model if explainer == "native" else f"{model} [{explainer}]"
        at = 3 * ("demo", "demo_dicom").index(dataset)
        assert rows[name][at] == f"{run['datasets'][dataset]['mean']['pointing_game']:.3f}"
    assert [row["label"] for row in report["model_x_explainer"]["rows"]] == ["clip", "kad"]
    assert report["model_x_explainer"]["runs"] == {m: {"native": 1, "gradcam": 1} for m in ("clip", "kad")}  # not repeats
    for dataset in ("demo", "demo_dicom"):
        trust = report["trust"][dataset]
        assert [(r["run"], r["model"]) for r in trust] == [("clip [gradcam]", "clip"), ("clip", "clip"),
                                                           ("kad [gradcam]", "kad"), ("kad", "kad")]


def test_table1_lists_the_papers_models_in_its_order(tmp_path):
    """Sweep folders come in parameter order (kad before medklip); Table 1 prints the paper's order (MedKLIP, then
    KAD), a model the paper lacks after them."""
    for i, model in enumerate(("kad", "medklip", "chexzero")):
        paper_sweep_run(tmp_path / "sweep", model, "demo", 70 + i)
    assert cli_main(["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    table1 = md.split("## Grounding per dataset and model", 1)[1].split("\n## ", 1)[0]
    assert [row[0] for table in _table_blocks(table1) for row in table[1:]] == ["medklip", "kad", "chexzero"]


def test_runs_of_one_dataset_that_differ_in_data_keep_it_in_their_label(tmp_path):
    """Runs over the same dataset that differ in a data setting (an eval grid size) are two settings, not one model."""
    for size in (256, 512):
        explained_run(tmp_path / "sweep" / "runs" / f"s{size}", "clip", "native", size,
                      {"model": {"class_path": "x.Model", "init_args": {}}, "data": {"init_args": {"eval_size": size}}})
    runs = find_runs([str(tmp_path / "sweep")])
    assert [(r.name, r.unique_name) for r in runs] == [(f"clip (data.eval_size={s})",) * 2 for s in (256, 512)]
