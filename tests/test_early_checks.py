"""A bad ``test``/``fit`` command line ends with LightningCLI's own line before Lightning loads (``commands.early``,
issue 43's late checks). The table of the registered classes' options (``commands.class_options``) is made again
from the classes and must equal the shipped one; the help drawn from it is the parser's at any width; each line the
early checks answer is the line LightningCLI answers; the issue's eight cases end in a fresh process that imports
neither Lightning nor torch; what the table cannot judge is left to LightningCLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_cli import REPO

from xbench_pl.commands import DEBUG_ENV, early, main
from xbench_pl.commands import trainer as trainer_command
from xbench_pl.commands.class_options import TABLE, build_table, class_parsers, render_help, table_entry, table_text
from xbench_pl.commands.early import Released, parse_problem, run_problem
from xbench_pl.commands.score import UsageProblem, open_store
from xbench_pl.data.sources import data_dir
from xbench_pl.registry import available

NIH_LAYOUT = "BBox_List_2017.csv and the images*/ folders of PNGs"


@pytest.fixture(scope="module")
def parsers():
    """Per kind and name, the parser of ``--model.help NAME`` (``--data.help``) and that of the class's values."""
    return {kind: class_parsers(kind, available(kind)) for kind in ("models", "data")}


@pytest.fixture
def unpulled(tmp_path, monkeypatch):
    """No dataset pulled and no weights in the cache; no --debug."""
    monkeypatch.setenv("XBENCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("XBENCH_WEIGHTS_DIR", str(tmp_path / "weights"))
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    return tmp_path


def test_the_shipped_table_is_the_one_the_classes_make(parsers):
    made, shipped = json.loads(table_text(build_table(parsers))), json.loads(TABLE.read_text())
    stale = [f"{kind}.{name}" for kind in ("models", "data") for name in {*made[kind], *shipped[kind]}
             if made[kind].get(name) != shipped[kind].get(name)]
    stale += [key for key in {*made, *shipped} - {"models", "data"} if made.get(key) != shipped.get(key)]
    assert not stale, f"{TABLE.name} differs from the classes in {sorted(stale)}: python -m xbench_pl.commands.class_options"


@pytest.mark.parametrize("columns", ["60", "100", "200"])
def test_the_help_drawn_from_the_table_is_the_parsers(parsers, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)  # argparse's width (shutil.get_terminal_size)
    for kind, made in parsers.items():
        for name, (help_parser, _) in made.items():
            assert render_help(table_entry(kind, name)) == help_parser.format_help(), (kind, name)


def answer(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # a help LightningCLI printed
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.err, captured.out


@pytest.mark.parametrize("argv, runs", [
    (["test", "--model", "clip", "--data", "demo", "--modle.x", "1"], False),
    (["test", "--model", "center", "--data", "nih_bbox", "--out", "{tmp}/out"], True),
    (["fit", "--model", "center", "--data", "vindr_cxr", "--data.batch_size", "2", "--out", "{tmp}/out"], True),
    (["test", "--data", "demo"], False),
    (["test"], False),
    (["test", "--model", "center", "--data", "demo", "--model.fixed_threshold", "1.7"], False),
    (["test", "--model", "center", "--data", "demo", "--data.batch_size", "0", "--model.sigma", "abc"], False),
    (["test", "--model", "center", "--data", "demo", "--data.nope", "1", "--modle", "1"], False),
    (["test", "--model", "center", "--data", "demo", "--predictions", "{tmp}/a_file/store"], False),
    (["test", "--model", "chexzero", "--data", "demo", "--out", "{tmp}/out"], False),
    (["test", "--model", "clip", "--model.help"], False),
    (["fit", "--model.help", "center"], False),
    (["test", "--model", "center", "--data", "demo", "--data.help"], False),
])
def test_what_the_early_checks_say_is_what_lightningcli_says(capsys, monkeypatch, unpulled, argv, runs):
    """The early checks answer each line without LightningCLI; LightningCLI, the early checks off, answers the same
    (the runs that get as far as reading the data stop there: no root)."""
    (unpulled / "a_file").write_text("a regular file\n")
    argv = [arg.format(tmp=unpulled) for arg in argv]

    def refuse(*args, **kwargs):
        raise AssertionError("the early checks left the line to LightningCLI")

    with monkeypatch.context() as patched:
        patched.setattr(trainer_command, "run_trainer", refuse)
        early_answer = answer(capsys, argv)

    def stop_before_running(cli, subcommand):
        raise AssertionError(f"{argv} ran its subcommand")

    for name in ("trainer_problem", "run_problem", "class_help"):
        monkeypatch.setattr(early, name, lambda *args, **kwargs: None)
    if not runs:
        monkeypatch.setattr(trainer_command.XBenchCLI, "_run_subcommand", stop_before_running)
    assert early_answer == answer(capsys, argv)


#: one fresh process runs the issue's eight cases through the dispatcher, saying after each what it answered and
#: whether Lightning or torch were imported so far
PROBE = """
import io, json, sys
from contextlib import redirect_stderr, redirect_stdout
from xbench_pl.commands import main
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    print(json.dumps([code, err.getvalue(), out.getvalue()[:200], "lightning" in sys.modules, "torch" in sys.modules]))
"""


def test_the_issues_eight_cases_end_before_lightning_or_torch_load(unpulled):
    file, folder, weights = unpulled / "a_file", unpulled / "no_store", unpulled / "weights"
    file.write_text("a regular file\n")
    folder.mkdir()
    prog = "python -m xbench_pl"
    cases = [
        (["test", "--model", "clip", "--data", "demo", "--modle.x", "1"],
         f"error: unrecognized arguments: --modle.x 1 (see {prog} test --help)\n"),
        (["test", "--model", "center", "--data", "nih_bbox"],
         f"error: --data.root: nih_bbox root not set: give the folder holding {NIH_LAYOUT} (or `{prog} data pull "
         f"nih_bbox` fills {unpulled / 'data' / 'nih_bbox'})\n"),
        (["test", "--data", "demo"], "error: the following arguments are required: --model\n"),
        (["test", "--model", "center", "--data", "demo", "--model.fixed_threshold", "1.7"],
         "error: --model.fixed_threshold: 1.7 is not on the threshold grid 0, 0.01, ..., 1\n"),
        (["test", "--model", "center", "--data", "demo", "--predictions", f"{file}/store"],
         f"error: --predictions {file}/store: cannot create it: {file} is a file, not a folder; choose another folder\n"),
        (["test", "--model", "chexzero", "--data", "demo"],
         f"error: --model chexzero: its released files are not in the weights cache {weights} (1 missing"),
        (["score", "--predictions", str(folder), "--data", "demo"],
         f"error: {folder / 'manifest.json'} not found: {folder} is no prediction store (write one with {prog} test ... "
         f"--predictions {folder})\n"),
        (["test", "--model", "clip", "--model.help"], f"usage: {prog} --model.architecture ARCHITECTURE"),
        (["test", "--model", "center", "--data", "demo", "--data.help"], f"usage: {prog} [--data.root ROOT]"),
    ]
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps([argv for argv, _ in cases])], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    answers = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(answers) == len(cases)
    for (argv, said), (code, err, out, lightning, torch) in zip(cases, answers):
        helps = said.startswith("usage:")
        assert (code, (out if helps else err).startswith(said), lightning, torch) == (0 if helps else 2, True, False, False), \
            (argv, err, out)


def test_score_says_what_it_said_once_torch_had_loaded(capsys, tmp_path):
    """``score`` on a folder that is no store: the line of its early check is the one the store's reader gives."""
    code = main(["score", "--predictions", str(tmp_path), "--data", "demo"])
    with pytest.raises(UsageProblem) as refused:
        open_store(str(tmp_path), ["--data", "demo"])
    assert (code, capsys.readouterr().err) == (2, f"error: {refused.value}\n")


@pytest.mark.parametrize("argv", [
    ["--config", "run.yaml", "--modle", "1"],  # a config may give anything
    ["--model", "xbench_pl.models.baselines.CenterBaseline", "--data", "demo", "--modle", "1"],  # a class path
    ["--model", "center", "--data", "demo", "--trainer.precision", "bf17", "--modle", "1"],  # a Trainer value first
    ["--model", "center", "--data", "demo", "--model.cxl", "maybe", "--modle", "1"],  # a bool the parser judges
    ["--model.sigma", "abc", "--model", "center", "--data", "demo"],  # before its --model: the base class's options
    ["--model", "center", "--data", "demo", "--model.init_args.nope", "1"],  # nested
    ["--model", "center", "--data", "demo", "--model.class_path", "xbench_pl.models.baselines.UniformBaseline",
     "--modle", "1"],
    ["--model", "center", "--data", "demo", "--model.sigma"],  # no value
    ["--model", "clip", "--data", "demo", "--model.tokenizer", "x", "--modle", "1"],  # an old name: its note first
    ["--model", "center", "--data", "demo", "--trainer.logger.init_args.x", "1", "--modle", "1"],
])
def test_what_the_table_cannot_judge_is_left_to_lightningcli(argv):
    assert parse_problem(argv, "test") is None


@pytest.mark.parametrize("extra", [
    ["--trainer.accelerator", "cpu"],  # the Trainer's hardware is checked before the data are read
    ["--data.split", "boxed"],  # sets what the folder holds
    ["--model.sigma", "0.3"],  # one model's own option: its class may refuse it when built
    ["--model.explainer", "gradcam"],  # the model judges which explainers it takes
    ["--predictions", "{tmp}/store"],
    ["--columns", "all"],
    ["--data.help"],
])
def test_a_dataset_without_its_root_is_said_early_only_where_nothing_else_can_stop_the_run(unpulled, extra):
    argv = ["--model", "center", "--data", "nih_bbox", "--out", str(unpulled / "out")]
    pull = f" (or `python -m xbench_pl data pull nih_bbox` fills {data_dir() / 'nih_bbox'})"
    said = f"--data.root: nih_bbox root not set: give the folder holding {NIH_LAYOUT}{pull}"
    assert run_problem([*argv, "--model.bootstrap", "0", "--data.batch_size", "2"], Released(argv)) == said
    assert run_problem([*argv, *(arg.format(tmp=unpulled) for arg in extra)], Released(argv)) is None
    (data_dir() / "nih_bbox").mkdir(parents=True)  # pulled: read from there
    assert run_problem(argv, Released(argv)) is None


def test_debug_leaves_the_run_to_fail_with_its_traceback(unpulled, monkeypatch):
    argv = ["--model", "center", "--data", "nih_bbox"]
    assert run_problem(argv, Released(argv)) is not None
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert run_problem(argv, Released(argv)) is None


def test_a_data_root_that_is_no_folder_is_named_as_the_dataset_names_it(capsys, unpulled):
    """The early line is the dataset's own (``checked_root``: what the folder holds) for every registered dataset that
    reads a folder; a demo draws itself into any root, pooled finds its datasets' folders in it."""
    rooted = [name for name in available("data") if table_entry("data", name)["root"] is not None]
    assert "nih_bbox" in rooted and not {"demo", "demo_dicom", "ms_cxr_demo", "pooled"} & set(rooted)
    for name in rooted:
        root = table_entry("data", name)["root"]
        code = main(["test", "--model", "center", "--data", name, "--data.root", str(unpulled / "missing")])
        assert (code, capsys.readouterr().err) == (2, f"error: --data.root: {unpulled / 'missing'}: no such folder "
                                                      f"(give {root['dataset']}'s folder, holding {root['layout']})\n"), name
