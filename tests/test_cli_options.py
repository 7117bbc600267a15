"""Option values are checked while parsing, before anything is built, and each error names its option;
options are spelled out in full; every command's help lists its options (registered models and
datasets included) without docstring markup, and every command's help starts without Lightning (that of test and
fit lists the options of their parser)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import REPO, in_process

from xbench_pl.commands import SUMMARIES, TRAINER_COMMANDS, main
from xbench_pl.commands.trainer import XBenchCLI, run_trainer
from xbench_pl.commands.trainer_help import trainer_help
from xbench_pl.registry import available


@pytest.fixture
def nothing_built(monkeypatch):
    """Fails the test if the CLI gets as far as building the model, the datamodule or the trainer."""
    def refuse(self):
        raise AssertionError("classes were instantiated: the option was not refused while parsing")

    monkeypatch.setattr(XBenchCLI, "instantiate_classes", refuse)


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("option, value, line", [
    ("--model.normalize", "foo", "--model.normalize: expected one of 'minmax', 'max', 'none', got 'foo'"),
    ("--model.bootstrap", "-1", "--model.bootstrap: must be >= 0, got -1"),
    ("--model.fixed_threshold", "1.7", "--model.fixed_threshold: 1.7 is not on the threshold grid 0, 0.01, ..., 1"),
    ("--model.fixed_threshold", "0.505", "--model.fixed_threshold: 0.505 is not on the threshold grid 0, 0.01, ..., 1"),
    ("--model.score_threshold", "1.5", "--model.score_threshold: must be >= 0 and <= 1, got 1.5"),
    ("--model.size_strata", "[0.01, 2]", "--model.size_strata: must be > 0 and < 1, got 2"),
    ("--model.lr", "0", "--model.lr: must be > 0, got 0"),
    ("--model.weight_decay", "-0.1", "--model.weight_decay: must be >= 0, got -0.1"),
    ("--model.sigma", "0", "--model.sigma: must be > 0, got 0"),
    ("--model.grid", "x", "--model.grid: expected an int, got 'x'"),
    ("--data.batch_size", "0", "--data.batch_size: must be > 0, got 0"),
    ("--data.num_workers", "-1", "--data.num_workers: must be >= 0, got -1"),
    ("--data.eval_size", "0", "--data.eval_size: must be > 0, got 0"),
    ("--data.max_side", "0", "--data.max_side: must be > 0, got 0"),
    ("--data.on_error", "stop", "--data.on_error: expected one of 'raise', 'skip', got 'stop'"),
    ("--data.val_fraction", "1", "--data.val_fraction: must be > 0 and < 1, got 1"),
    ("--data.negatives", "-2", "--data.negatives: must be >= 0, got -2"),
])
def test_a_bad_option_value_is_refused_while_parsing_naming_the_option(capsys, nothing_built, option, value, line):
    code, _, err = run(capsys, "test", "--model", "center", "--data", "demo", option, value)
    assert (code, err) == (2, f"error: {line}\n")


@pytest.mark.parametrize("argv, line", [
    (["--model", "kad", "--model.query_set", "all"], "--model.query_set: expected one of 'authors', 'requested', got 'all'"),
    (["--model", "mavl", "--model.score_mode", "x"], "--model.score_mode: expected one of 'feature', 'text', got 'x'"),
    (["--model", "clip", "--model.score", "x"], "--model.score: expected one of 'softmax', 'softmax_cosine', 'cosine', got 'x'"),
    (["--model", "clip", "--model.text_batch_size", "0"], "--model.text_batch_size: must be > 0, got 0"),
    (["--model", "clip", "--model.image_size", "0"], "--model.image_size: must be > 0, got 0"),
    (["--model", "carzero", "--model.image_size", "-1"], "--model.image_size: must be > 0, got -1"),
    (["--model", "location_prior", "--model.image_size", "0"], "--model.image_size: must be > 0, got 0"),
    (["--model", "center", "--data", "chexlocalize", "--data.split", "train"], "--data.split: expected one of 'test', 'val', got 'train'"),
    (["--model", "center", "--data", "chexlocalize", "--data.regions", "x"],
     "--data.regions: expected one of 'segmentations', 'annotations', got 'x'"),
    (["--model", "center", "--data", "covid_rural", "--data.regions", "x"], "--data.regions: expected one of 'masks', 'polygons', got 'x'"),
    (["--model", "center", "--data", "chestx_det10", "--data.split", "val"], "--data.split: expected one of 'test', 'train', got 'val'"),
    (["--model", "center", "--data", "pooled", "--data.batch_size", "0"], "--data.batch_size: must be > 0, got 0"),
])
def test_every_constrained_option_of_the_models_and_datasets_is_checked_while_parsing(capsys, nothing_built, argv, line):
    argv = argv if "--data" in argv else [*argv, "--data", "demo"]
    code, _, err = run(capsys, "test", *argv)
    assert (code, err) == (2, f"error: {line}\n")


def test_a_bad_value_stops_before_the_trainer_starts(tmp_path):
    """The issue's case, end to end: one line, exit 2, and no progress bar (the test loop never started); on the
    command line (checked before Lightning loads, test_console_runs) and in a --config file (LightningCLI's check)."""
    config = tmp_path / "model.yaml"
    config.write_text("model:\n  class_path: xbench_pl.models.baselines.CenterBaseline\n  init_args:\n    normalize: foo\n")
    out = tmp_path / "out"
    for given in (["--model", "center", "--model.normalize", "foo"], ["--config", str(config)]):
        result = in_process("test", *given, "--data", "demo", "--out", str(out))
        assert (result.returncode, result.stderr) == (2, "error: --model.normalize: expected one of 'minmax', 'max', 'none', got 'foo'\n")
        assert "Testing" not in result.stdout and not out.exists()


@pytest.mark.parametrize("given, resume, overwrite", [
    (["--resume"], "true", "false"),  # the messages say "pass --resume": the flag alone means true
    (["--resume", "--overwrite"], "true", "true"),
    (["--overwrite", "--resume", "false"], "false", "true"),
    (["--resume=false", "--overwrite", "true"], "false", "true"),
    (["--resume", "true", "--overwrite=false"], "true", "false"),
])
def test_a_bare_boolean_run_option_means_true(given, resume, overwrite):
    shown = in_process("test", "--model", "center", "--data", "demo", *given, "--print_config")
    assert (shown.returncode, shown.stderr) == (0, "")
    assert f"\nresume: {resume}\n" in shown.stdout and f"\noverwrite: {overwrite}\n" in shown.stdout


def test_score_checks_its_metric_options_while_parsing(capsys, tmp_path):
    code, _, err = run(capsys, "score", "--maps", str(tmp_path), "--data", "demo", "--normalize", "foo")
    assert (code, err) == (2, "error: --normalize: expected one of 'minmax', 'max', 'none', got 'foo'\n")
    code, _, err = run(capsys, "score", "--maps", str(tmp_path), "--data", "demo", "--bootstrap", "-5")
    assert (code, err) == (2, "error: --bootstrap: must be >= 0, got -5\n")


@pytest.mark.parametrize("argv, line", [
    (["test", "--model", "center", "--data", "demo", "--trainer.max_epoch", "3"],
     "unrecognized arguments: --trainer.max_epoch 3 (see python -m xbench_pl test --help)"),
    (["test", "--model", "center", "--data", "demo", "--predictions_dt", "float32"],
     "unrecognized arguments: --predictions_dt float32 (see python -m xbench_pl test --help)"),
    (["describe", "--data", "demo", "--js"], "unrecognized arguments: --js (see python -m xbench_pl describe --help)"),
    (["report", str(REPO), "--ou", "x"], "unrecognized arguments: --ou x (see python -m xbench_pl report --help)"),
    (["sweep", "x.yaml", "--dry"], "unrecognized arguments: --dry (see python -m xbench_pl sweep --help)"),
])
def test_abbreviated_options_are_refused_and_the_hint_names_the_command(capsys, nothing_built, argv, line):
    code, _, err = run(capsys, *argv)
    assert (code, err) == (2, f"error: {line}\n")


@pytest.mark.parametrize("argv, shown, hidden", [
    (["--model.help", "center"], ["--model.sigma", "the Gaussian's standard deviation"], []),
    (["--model", "center", "--model.help"], ["--model.sigma", "--model.normalize"], []),
    # beside a run's options (spelled with "=" too, and a --data.root that is no folder): a help builds nothing
    (["--model.help", "center", "--data", "demo"], ["--model.sigma"], ["--data.negatives"]),
    (["--model.help=center", "--data", "nih_bbox", "--data.root", "/no/such/folder"], ["--model.sigma"], []),
    (["--model.help", "kad"], ["--model.query_set", "--model.normalize"], ["--model.sigma"]),
    (["--data.help", "demo"], ["--data.negatives", "--data.batch_size"], []),
    (["--data", "chexlocalize", "--data.help"], ["--data.regions", "--data.split"], ["--data.negatives"]),
])
def test_help_of_a_registered_name_shows_its_class_options(capsys, argv, shown, hidden):
    code, out, _ = run(capsys, "test", *argv)  # drawn from the table of the classes' options (early.class_help)
    assert code == 0
    assert all(text in out for text in shown) and not any(text in out for text in hidden)
    assert "``" not in out


def test_trainer_help_describes_the_command_and_lists_registered_names(capsys):
    for command in TRAINER_COMMANDS:
        code, out, err = run(capsys, command, "--help")
        out = " ".join(out.split())
        assert (code, err) == (0, "") and SUMMARIES[command] in out
        assert all(name in out for name in available("models") + available("data"))
        assert "``" not in out and ":class:`" not in out


def listed_options(text: str) -> set[str]:
    """The options a help lists (the first spelling of each; a Trainer option's ``.help``, which only class-valued
    options have, and ``--model.ARG``, which stands for the model's options, left out)."""
    options = set(re.findall(r"^  (-[-\w.]+)", text, re.M))
    return {o for o in options if not (o.startswith("--trainer.") and o.endswith(".help"))
            and not re.search(r"\.[A-Z]+$", o)}


@pytest.mark.parametrize("command", TRAINER_COMMANDS)
def test_quick_trainer_help_lists_the_options_of_the_parser_with_our_defaults(capsys, command):
    """``test --help`` is rendered without Lightning (``trainer_help``): the options are those the parser lists."""
    with pytest.raises(SystemExit) as exited:
        run_trainer(command, ["--help"], from_command_line=False)
    parsers = capsys.readouterr().out
    quick = trainer_help(command)
    assert exited.value.code == 0 and len(listed_options(parsers)) > 50
    assert listed_options(quick) == listed_options(parsers)
    flat = " ".join(quick.split())
    assert re.search(r"--trainer\.devices DEVICES .*?default: 1\)", flat)
    assert re.search(r"--weights_only \{true,false,null\} .*?default: true\)", flat)  # ours (VERB_DEFAULTS), not Lightning's


@pytest.mark.parametrize("argv, options", [
    (["describe", "--help"], ["--data NAME", "--data.ARG V", "--json"]),
    (["score", "--help"], ["--predictions DIR", "--data NAME", "--out DIR", "--normalize M", "--fixed_threshold T", "--maps DIR"]),
    (["score", "--maps", "DIR", "--help"], ["--maps DIR", "--data NAME", "--cxl true", "--bootstrap N"]),
    (["compare", "--help"], ["--predictions A B", "--data NAME", "--out DIR", "--bootstrap N", "--seed S"]),
])
def test_help_of_the_other_commands_lists_their_options(capsys, argv, options):
    code, out, err = run(capsys, *argv)
    listed = out.split("\noptions:\n")[1]
    assert (code, err) == (0, "") and all(f"\n  {option}  " in f"\n{listed}" for option in options)
    assert "``" not in out
    if argv[0] == "describe":
        assert all(name in listed for name in available("data"))


def test_help_starts_without_lightning():
    """The dispatcher's help and the help of every command, test and fit included, import no Lightning: one fresh
    process shows them one after the other, saying after each whether Lightning was imported so far."""
    commands = [[], *[[c] for c in SUMMARIES], ["score", "--maps", "DIR"]]
    probe = ("import sys\nfrom xbench_pl.commands import main\n"
             f"for command in {commands!r}:\n"
             "    try:\n        code = main([*command, '--help'])\n"
             "    except SystemExit as exit_:\n        code = exit_.code\n"
             "    print(f'{command} exit {code} lightning {\"lightning\" in sys.modules}', file=sys.stderr)\n"
             "    print('--- end of help ---', flush=True)\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.splitlines() == [f"{command} exit 0 lightning False" for command in commands]
    helps = result.stdout.split("--- end of help ---")[:-1]
    assert len(helps) == len(commands) and all("usage:" in text for text in helps), result.stdout[-2000:]


def test_compare_with_one_store_says_two_are_needed(capsys, tmp_path):
    code, _, err = run(capsys, "compare", "--predictions", str(tmp_path), "--out", str(tmp_path / "out"))
    assert (code, err) == (2, "error: --predictions A B is required: two stores written by python -m xbench_pl test ... "
                              "--predictions DIR on the same data\n")


def test_a_wrong_data_root_says_what_is_wrong_and_what_the_folder_should_hold(capsys, tmp_path):
    layout = "BBox_List_2017.csv and the images*/ folders of PNGs"
    code, _, err = run(capsys, "describe", "--data", "nih_bbox")
    pulled = Path.home() / ".cache" / "xbench_pl" / "data" / "nih_bbox"
    assert (code, err) == (2, f"error: --data.root: nih_bbox root not set: give the folder holding {layout} (or `python "
                              f"-m xbench_pl data pull nih_bbox` fills {pulled})\n")
    code, _, err = run(capsys, "describe", "--data", "nih_bbox", "--data.root", str(tmp_path / "missing"))
    assert (code, err) == (2, f"error: --data.root: {tmp_path / 'missing'}: no such folder (give nih_bbox's folder, holding {layout})\n")
    code, _, err = run(capsys, "describe", "--data", "nih_bbox", "--data.root", str(tmp_path))
    assert (code, err) == (2, f"error: {tmp_path / 'BBox_List_2017.csv'}: not found under --data.root {tmp_path}, "
                              f"which should hold {layout}\n")


def test_a_box_that_does_not_parse_claims_no_action_in_raise_mode(capsys, tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "BBox_List_2017.csv").write_text("Image Index,Finding Label,Bbox [x,y,w,h],,,\nb.png,Mass,1,2,nan,10\n")
    code, _, err = run(capsys, "describe", "--data", "nih_bbox", "--data.root", str(tmp_path), "--data.on_error", "raise")
    assert code == 2 and err.startswith(f"error: {tmp_path / 'BBox_List_2017.csv'}, row 2: Mass ")
    assert err.endswith("(on_error=skip drops the box and keeps the label)\n") and "dropped" not in err
