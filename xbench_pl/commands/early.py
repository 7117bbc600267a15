"""What ``test`` and ``fit`` check of their command line before Lightning, torch and the model's code load
(LightningCLI takes 10 s and more to load them, a minute on a busy machine), in the words of LightningCLI's own
checks, so that a bad command line ends at once:

* a ``--model``/``--data`` name that is not registered, a ``--config`` file that is not YAML;
* what LightningCLI's parser refuses (``parse_problem``), judged from the table of the registered classes' options
  (``class_options``): a value outside its option's type (``--data.batch_size 0``, ``--model.normalize foo``,
  ``--model.fixed_threshold 1.7``) or an option the class lacks (``--model.nope``), the first in the order given;
  then arguments no option takes (``--modle.x 1``) and a missing ``--model`` or ``--data``;
* an ``--out`` or ``--predictions`` that cannot be written, an ``--out`` holding an earlier run;
* a ``--data.root`` that is no folder; and where nothing else on the command line can stop the run before it builds
  the model and reads the data (``run_problem``), model files the weights cache lacks, a dataset given no root and
  not pulled.

``class_help`` prints ``--model.help NAME`` and ``--data.help NAME`` from the table. What the table cannot judge (a
``--config`` file, a class path, a ``--trainer`` value, a nested or list option) is left to LightningCLI, which
checks everything again once the classes are loaded."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml
from jsonargparse import get_loader
from jsonargparse import typing as restricted

from xbench_pl.commands.arguments import LINKED_OPTIONS, PROG, RUN_OPTIONS, flag_value, is_name, take_option
from xbench_pl.commands.class_options import read_table, render_help, table_entry
from xbench_pl.commands.errors import restriction_text
from xbench_pl.console import is_rank_zero
from xbench_pl.outputs import OutputError, check_not_earlier_run, check_writable
from xbench_pl.registry import RENAMED_ARGS, UnknownName, class_path

#: where these checks keep out: help and config printing write nothing, whatever ``--out`` says
HELP_FLAGS = ("-h", "--help", "--print_config")
#: flags after which the parser itself must answer a help: a class's own help, a printed or read config
PARSER_FLAGS = ("--print_config", "-c", "--config")
#: the number types of init args checked here: jsonargparse's restricted ones, by their names
NUMBER_TYPES = {"int": int, "float": float, **{name: getattr(restricted, name) for name in (
    "PositiveInt", "NonNegativeInt", "PositiveFloat", "NonNegativeFloat", "ClosedUnitInterval", "OpenUnitInterval")}}
#: the options that take a registered name, and the registry kind of their names
NAMED = {"--model": "models", "--data": "data"}
#: the required options, in the order the parser names the missing ones
REQUIRED = ("--data", "--model")
#: the keys jsonargparse takes under a class option besides the class's own: ``--model.class_path`` and the like
SUBCLASS_KEYS = ("class_path", "init_args", "dict_kwargs")
#: a negative number, which argparse takes for a value, not an option (its ``_negative_number_matcher``)
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
#: the types of the command's own options whose values are judged here (the Trainer's and the verb's others are not)
OWN_TYPES = {**{f"--{name}": kind for name, (kind, _, _) in RUN_OPTIONS.items()}, "--seed_everything": int,
             "--ckpt_path": str}
#: options every model (dataset) takes whose value the class judges further than its type: not every model takes
#: every explainer; a dataset's split sets what its folder holds
JUDGED_BY_THE_CLASS = ("--model.explainer", "--data.split")
#: the command's own options that cannot fail once the line parses and ``trainer_problem`` checked ``--out``
#: (``runs_at_once``: a run with only these builds its model and reads its data before anything else can stop it)
SAFE_OWN = ("--out", "--overwrite", "--model_name", "--seed_everything")


def yaml_value(text: str):
    """A command-line value as jsonargparse reads it (its YAML loader: ``1e-12`` is a float)."""
    try:
        return get_loader("yaml")(text)
    except yaml.YAMLError:
        return text


def is_value(arg: str) -> bool:
    """Whether argparse takes ``arg`` for an option's value (or a stray argument), not for an option."""
    return not arg.startswith("-") or bool(NEGATIVE_NUMBER.match(arg))


def judges(judged: dict, text: str) -> bool:
    """Whether ``value_problem`` can judge ``text`` as a value of the type ``judged`` (``class_options.judged_type``):
    a choice, a number, a threshold of the grid, a string, a bool given as ``true``/``false``; not null where the type
    has none. Other types and values are LightningCLI's to judge."""
    kind = judged.get("type")
    if yaml_value(text) is None and not judged.get("null"):  # null for a type without it: the parser's own words
        return False
    return ("choices" in judged or kind in (*NUMBER_TYPES, "GridThreshold", "str")
            or (kind == "bool" and text in ("true", "false")))


def value_problem(option: str, judged: dict, text: str) -> str | None:
    """The line for ``option``'s value ``text`` outside its type ``judged`` (one ``judges`` takes), or None."""
    if "choices" in judged:
        return choice_problem(option, judged["choices"], judged["null"], text)
    kind = judged["type"]
    if kind == "GridThreshold":
        return number_problem(option, float, False, text) or grid_problem(option, text)
    return number_problem(option, NUMBER_TYPES[kind], judged["null"], text) if kind in NUMBER_TYPES else None


def choice_problem(option: str, choices: list, null: bool, text: str) -> str | None:
    value = yaml_value(text)
    if value in choices or (value is None and null):
        return None
    return f"{option}: expected one of {', '.join(map(repr, choices))}, got {text!r}"


def number_problem(option: str, kind: type, null: bool, text: str) -> str | None:
    value = yaml_value(text)
    if value is None and null:
        return None
    expected = "an int" if issubclass(kind, int) else "a float"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (issubclass(kind, int) and isinstance(value, float)):
        return f"{option}: expected {expected}, got {text!r}"
    try:
        kind(value)
    except ValueError as error:
        refusal = restriction_text(str(error))
        if refusal:
            return f"{option}: {refusal}"
    return None


def grid_problem(option: str, text: str) -> str | None:
    """A ``GridThreshold`` (``xbench_pl.options``) off the metrics' grid, judged as its check judges it (``torch.isclose``
    with ``atol=1e-9`` to the grid's float64 values, which the table holds) without torch."""
    value = yaml_value(text)
    if any(abs(point - value) <= 1e-9 + 1e-5 * abs(value) for point in read_table()["grid"]):
        return None
    return f"{option}: {text} is not on the threshold grid 0, 0.01, ..., 1"


def reads_root(data_class: str | None) -> bool:
    """Whether a registered dataset (its config's class path) reads ``--data.root``: the synthetic demos draw
    themselves into it on first use (their classes are ``*DemoDataModule``); a class path given on the command line
    is left to the datamodule."""
    return data_class is not None and not data_class.endswith("DemoDataModule")


def flags(argv: list[str]) -> list[str]:
    """Each argument's flag, as the parser reads it: ``--model.help=NAME`` is the flag ``--model.help``."""
    return [arg.partition("=")[0] for arg in argv]


def asks_help(argv: list[str]) -> bool:
    """Whether a ``test``/``fit`` command line asks for a help or a printed config: nothing is built or written."""
    return any(flag in HELP_FLAGS or flag.endswith(".help") for flag in flags(argv))


def wants_quick_help(argv: list[str]) -> bool:
    """Whether a ``test``/``fit`` command line asks for the command's help (``-h``/``--help``), which
    ``trainer_help`` answers without the parser, and nothing the parser must answer (``--model.help NAME``,
    ``--print_config``, ``--config``)."""
    given = flags(argv)
    return any(flag in ("-h", "--help") for flag in given) and not any(flag.endswith(".help") or flag in PARSER_FLAGS
                                                                       for flag in given)


def class_help(argv: list[str]) -> str | None:
    """The help of ``--model.help NAME`` (``--data.help NAME``; or ``--model NAME --model.help``) for a registered
    name, drawn from the table (``class_options``) as LightningCLI prints it; as there, the first such flag decides and
    the line's other options are not read. None for a class path, a name the table lacks, or no such flag."""
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        kind = NAMED.get(flag.removesuffix(".help")) if flag.endswith(".help") else None
        if kind is None:
            continue
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value = argv[i + 1]
        value = value or take_option(argv, flag.removesuffix(".help"))[0] or ""
        entry = table_entry(kind, value) if value and is_name(value) else None
        return render_help(entry) if entry is not None else None
    return None


def config_problem(argv: list[str]) -> str | None:
    """A ``--config`` (``-c``) file that is not YAML, named with its line and column (jsonargparse's own message names
    neither the file nor the place), or None."""
    rest = list(argv)
    for flag in ("--config", "-c"):
        while True:
            value, rest = take_option(rest, flag)
            if value is None:
                break
            path = Path(value).expanduser()
            if not path.is_file():
                continue  # jsonargparse also takes a config as a string; a missing file is its message
            try:
                yaml.safe_load(path.read_text())
            except UnicodeDecodeError as error:
                return f"{flag} {value}: not a YAML file (not text: {error.reason})"
            except yaml.YAMLError as error:
                mark = getattr(error, "problem_mark", None)
                where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                return f"{flag} {value}: not valid YAML ({getattr(error, 'problem', None) or error}{where})"
    return None


def action_of(entry: dict, flag: str) -> dict | None:
    """The option of a table entry that ``flag`` names (``--model.sigma``), or None."""
    return next((action for action in entry["actions"] if flag in action["flags"]), None)


def judges_own(flag: str, text: str) -> bool:
    """Whether the parser takes ``text`` for the command's own option ``flag`` whatever it says (a string; a bool given
    as ``true``/``false``; an int), so that ``parse_problem`` can judge the options after it."""
    kind = OWN_TYPES.get(flag)
    if kind in (str, Optional[str]):
        return True
    return (kind is bool and text in ("true", "false")) or (kind is int and re.fullmatch(r"-?\d+", text) is not None)


def parse_problem(argv: list[str], command: str) -> str | None:
    """What LightningCLI's parser says first of ``argv``, in its words, where the table of the registered classes'
    options (``class_options``) can tell: a value outside its option's type, or an option the class lacks, in the order
    given (as the parser meets them; one the table cannot judge before it may be the parser's first instead); then,
    where every option could be judged, the arguments no option takes (``unrecognized arguments: --modle.x 1``) and a
    missing ``--model`` or ``--data``. None where there is none, or where what the table cannot judge comes first: a
    ``--config``, a class path or file for ``--model``/``--data``, a class option before its ``--model NAME``, an old
    option name (``registry.RENAMED_ARGS``: its note comes first), a nested or list option (``SUBCLASS_KEYS``), an
    option without its value."""
    from xbench_pl.commands.trainer_help import trainer_parser

    given: dict[str, dict] = {}  # --model / --data -> the table's entry of the name given
    extras: list[str] = []  # what no option takes, in order, as argparse collects it
    judged_all = True  # every option so far judged: an end-of-parse line is then the parser's first
    known = set(trainer_parser(command)._option_string_actions)
    linked = {f"--{target}" for target in LINKED_OPTIONS.values()}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if is_value(arg):
            extras.append(arg)
            continue
        flag, eq, text = arg.partition("=")
        option, _, key = flag.partition(".")
        if not flag.startswith("--") or " " in arg or flag in PARSER_FLAGS:
            return None
        if flag not in NAMED and option not in NAMED and flag not in known:
            if flag in linked or option == "--trainer" and f"--trainer.{re.split(r'[.+]', key)[0]}" in known:
                return None  # a nested Trainer option (--trainer.logger.init_args.x, --trainer.callbacks+=...)
            extras.append(arg)  # no option of the parser's: what follows it is left over too
            continue
        if not eq:  # an option the parser knows takes one value
            if i == len(argv) or not is_value(argv[i]):
                return None
            text, i = argv[i], i + 1
        if flag in NAMED:
            entry = table_entry(NAMED[flag], text) if is_name(text) else None
            if entry is None or flag in given:
                return None
            given[flag] = entry
        elif option in NAMED:
            entry = given.get(option)
            if entry is None or key.split(".")[0] in SUBCLASS_KEYS or (option == "--model" and key in RENAMED_ARGS):
                return None
            action = action_of(entry, flag)
            if action is None and key.isidentifier():
                return (f"{flag}: not an option of {entry['class_path']} (its options: {PROG} {command} {option}.help "
                        f"{entry['class_path']})")
            if action is None or action["nargs"] is not None:
                return None
            judged = action.get("type", {})
            if not judges(judged, text):
                judged_all = False
            elif problem := value_problem(flag, judged, text):
                return problem
        elif not judges_own(flag, text):
            judged_all = False
    if not judged_all:
        return None
    if extras:
        return f"unrecognized arguments: {' '.join(extras)} (see {PROG} {command} --help)"
    missing = [flag for flag in REQUIRED if flag not in given]
    return f"the following arguments are required: {', '.join(missing)}" if missing else None


def folder_problem(entry: dict, root: str | None) -> str | None:
    """The line of a dataset's ``--data.root`` (None: not given, so the folder ``data pull`` fills) as its
    ``checked_root`` says it (``sources.root_problem``), or None; a dataset that reads no folder of its own: None."""
    from xbench_pl.data import sources

    if entry["root"] is None:
        return None
    dataset, layout = entry["root"]["dataset"], entry["root"]["layout"]
    folder = sources.default_root(dataset) if root is None else Path(root)
    problem = sources.root_problem(dataset, folder, layout)
    return f"--data.root: {problem}" if problem else None


def trainer_problem(argv: list[str], command: str = "test") -> str | None:
    """The one-line problem of a ``test``/``fit`` command line that needs no model to find, or None. An ``--out`` that
    holds an earlier run is one without ``--overwrite`` (``outputs.check_not_earlier_run``; here where the command
    line names ``--out`` and no ``--config`` may name another, else once the options are parsed)."""
    if problem := config_problem(argv):
        return problem
    classes = {}  # flag -> its registered name's class path
    for flag, kind in (("--model", "models"), ("--data", "data"), ("--model.help", "models"), ("--data.help", "data")):
        value = take_option(argv, flag)[0]
        if value and is_name(value):
            try:
                classes[flag] = class_path(kind, value)
            except UnknownName as error:
                return f"{flag}: {error}"
    if asks_help(argv):
        return None
    if problem := parse_problem(argv, command):
        return problem
    out = take_option(argv, "--out")[0]
    predictions = take_option(argv, "--predictions")[0]
    configured = any(flag in ("-c", "--config") for flag in flags(argv))
    try:
        check_writable({**({"--out": out} if out else {}), **({"--predictions": predictions} if predictions else {})})
        if out and not configured and is_rank_zero():  # DDP ranks > 0 start once rank 0 checked
            check_not_earlier_run(out, flag_value(argv, "--overwrite"), command)
    except OutputError as error:
        return str(error)
    root = take_option(argv, "--data.root")[0]
    data = table_entry("data", take_option(argv, "--data")[0]) if "--data" in classes else None
    return folder_problem(data, root) if root and yaml_value(root) is not None and data is not None else None


def runs_at_once(argv: list[str]) -> bool:
    """Whether LightningCLI, given ``argv``, goes straight from parsing it to building the model and reading the data,
    with nothing on the line that could stop it before: it holds nothing but a registered ``--model`` and ``--data``
    (in the table), the options every model (dataset) takes (``ZeroShotModel``'s, ``XBenchData``'s) that take
    numbers, choices or bools, but those the class judges further (``JUDGED_BY_THE_CLASS``), ``--data.root`` and
    ``SAFE_OWN``; and the line parses (``trainer_problem`` found nothing)."""
    names = {flag: take_option(argv, flag)[0] for flag in NAMED}
    entries = {flag: table_entry(kind, names[flag]) if names[flag] and is_name(names[flag]) else None
               for flag, kind in NAMED.items()}
    if None in entries.values():
        return False
    shared = read_table()["shared_options"]
    i = 0
    while i < len(argv):
        flag, eq, _ = argv[i].partition("=")
        if not flag.startswith("--") or not eq and (i + 1 == len(argv) or not is_value(argv[i + 1])):
            return False
        i += 1 if eq else 2
        option, _, key = flag.partition(".")
        if flag in NAMED or flag in SAFE_OWN or flag == "--data.root":
            continue
        if option not in NAMED or key not in shared[NAMED[option]] or flag in JUDGED_BY_THE_CLASS:
            return False
        judged = (action_of(entries[option], flag) or {}).get("type", {})
        if not ("choices" in judged or judged.get("type") in (*NUMBER_TYPES, "GridThreshold", "bool")):
            return False
    return True


def run_problem(argv: list[str], released: Released) -> str | None:
    """What the run would stop on once it builds the model and reads the data, said now where nothing else on the
    command line can stop it first (``runs_at_once``): the model's released files that the weights cache lacks
    (``released.message``, which the dispatcher would print when the model fails on the first), else a registered
    dataset given no ``--data.root`` and not pulled (``sources.default_root``), as its ``checked_root`` says it. None
    otherwise; and with ``--debug``, which shows the traceback of the run's error."""
    from xbench_pl.commands.arguments import DEBUG_ENV

    if os.environ.get(DEBUG_ENV) or asks_help(argv) or not runs_at_once(argv):
        return None
    if released.missing:
        return released.message
    root = take_option(argv, "--data.root")[0]
    data = table_entry("data", take_option(argv, "--data")[0])
    return folder_problem(data, None) if root is None or yaml_value(root) is None else None


@dataclass
class Released:
    """``released_weights``' answer: the command line to run, a problem line to stop with now, and for files the
    cache lacks the line to print if the model then fails on one of them (``message``, ``explains``)."""

    argv: list[str]
    problem: str | None = None
    missing: tuple[str, ...] = ()
    message: str | None = None

    def explains(self, error: BaseException) -> bool:
        """Whether ``error`` is the model refusing one of the given cache paths that lack a file."""
        from xbench_pl.commands.errors import _chain

        return any(isinstance(e, FileNotFoundError) and any(path in str(e) for path in self.missing) for e in _chain(error))


def released_weights(argv: list[str]) -> Released:
    """``argv`` with a registered ``--model NAME``'s files in the weights cache (weights.yaml) for each of its file
    arguments not given, placed right after ``--model NAME`` so that any later option or ``--config`` wins; and a
    ``--model.checkpoint hf-hub:ORG/NAME`` downloaded and replaced by its local folder. Files the cache lacks are
    given too (without a checkpoint on the command line): the model refuses the first it reads after every option
    has been checked, and the dispatcher prints ``message`` instead, which names the pull command. ``random_init``
    needs no files."""
    from xbench_pl.console import note
    from xbench_pl.weights import (CACHE_ENV, HUB, PULL_COMMAND, Needs, WeightsError, cache_dir, cached_arguments, check_cached,
                                   hub_folder, read_sources)

    if asks_help(argv):
        return Released(argv)
    checkpoint = take_option(argv, "--model.checkpoint")[0]
    if checkpoint and checkpoint.startswith(HUB):
        index = next(i for i, arg in enumerate(argv) if arg in ("--model.checkpoint", f"--model.checkpoint={checkpoint}"))
        try:
            folder = str(hub_folder(checkpoint))
        except WeightsError as error:
            return Released(argv, f"--model.checkpoint: {error}")
        argv = [*argv[:index], "--model.checkpoint", folder, *argv[index + (1 if "=" in argv[index] else 2):]]
    name = take_option(argv, "--model")[0]
    random_init = take_option(argv, "--model.random_init")[0]
    if not name or not is_name(name) or (random_init is not None and yaml.safe_load(random_init) is True):
        return Released(argv)
    needs = read_sources()[1].get(name)
    wanted = {} if needs is None else {arg: refs for arg, refs in needs.arguments.items()
                                       if take_option(argv, f"--model.{arg}")[0] is None}
    if not wanted:
        return Released(argv)
    cache = cache_dir()
    values, missing = cached_arguments(Needs(name, wanted, needs.listed), cache)
    def lacks(ref: str) -> bool:  # a missing file, or a release folder lacking one
        return any(p == cache / ref or cache / ref in p.parents for p in missing)

    chosen = "checkpoint" not in wanted or any(a == "--config" or a.startswith("--config=") for a in argv)
    if chosen:  # the user's own checkpoint (or a config that may name one): only what the cache holds comes along
        wanted = {arg: refs for arg, refs in wanted.items() if not any(lacks(ref) for ref in refs)}
    try:  # the cached files about to be loaded, against the lock: a changed one stops the run, one placed by hand is named
        unverified = check_cached(Needs(name, wanted, needs.listed), cache)
    except WeightsError as error:
        return Released(argv, str(error))
    if unverified:
        note(f"warning: {unverified}")
    index = next(i for i, arg in enumerate(argv) if arg in ("--model", f"--model={name}"))
    after = index + (1 if "=" in argv[index] else 2)
    argv = [*argv[:after], *(x for arg in wanted for x in (f"--model.{arg}", values[arg])), *argv[after:]]
    if not missing or chosen:
        return Released(argv)
    return Released(argv, None, tuple(str(cache / ref) for refs in wanted.values() for ref in refs if lacks(ref)),
                    f"--model {name}: its released files are not in the weights cache {cache} ({len(missing)} missing, "
                    f"e.g. {missing[0].relative_to(cache)}): run `{PULL_COMMAND} {name}` (same ${CACHE_ENV}), or give "
                    "--model.checkpoint PATH, or --model.random_init true for a smoke run with random weights")
