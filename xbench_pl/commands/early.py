"""What ``test`` and ``fit`` check of their command line before Lightning, torch and the model's code load
(seconds, more on a busy machine): a ``--model``/``--data`` name that is not registered, a ``--data.root`` that
is no folder, an ``--out`` that cannot be written, a number outside its option's range (``--data.batch_size
0``) and a value outside its option's choices (``--model.normalize foo``) end the command at once, in the words
of LightningCLI's own checks. The number types and choices are read from the classes' signatures in their source
(``init_types``), not imported; LightningCLI checks everything again (and the rest: paths, files) once the
classes are loaded."""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from jsonargparse import typing as restricted

from xbench_pl.commands.arguments import flag_value, is_name, take_option
from xbench_pl.commands.errors import restriction_text
from xbench_pl.console import is_rank_zero
from xbench_pl.outputs import OutputError, check_not_earlier_run, check_writable
from xbench_pl.registry import UnknownName, class_path

#: where these checks keep out: help and config printing write nothing, whatever ``--out`` says
HELP_FLAGS = ("-h", "--help", "--print_config")
#: flags after which the parser itself must answer a help: a class's own help, a printed or read config
PARSER_FLAGS = ("--print_config", "-c", "--config")
#: the number types of init args checked here: jsonargparse's restricted ones, by the name signatures use
NUMBER_TYPES = {"int": int, "float": float, **{name: getattr(restricted, name) for name in (
    "PositiveInt", "NonNegativeInt", "PositiveFloat", "NonNegativeFloat", "ClosedUnitInterval", "OpenUnitInterval")}}


def init_types(class_path: str) -> dict[str, str]:
    """Each ``__init__`` argument of ``class_path`` and its annotation's text, the class's own first, then its bases'
    (as ``**kwargs`` passes them on), read from the modules' source (``ast``): nothing is imported but the packages."""
    module, _, name = class_path.rpartition(".")
    tree = module_tree(module)
    if tree is None:
        return {}
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    imported = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in tree.body
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 for alias in node.names}
    if name not in classes and name.removesuffix("Module") in classes:
        name = name.removesuffix("Module")  # a dataset's LightningDataModule: its plain class's (registry.lightning_datamodules)
    if name not in classes:
        return init_types(imported[name]) if name in imported else {}
    types: dict[str, str] = {}
    for node in classes[name].body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            arguments = node.args.args + node.args.kwonlyargs
            types = {a.arg: literal_alias(ast.unparse(a.annotation), module, imported) for a in arguments
                     if a.annotation is not None}
    for base in classes[name].bases:
        if isinstance(base, ast.Name):
            inherited = init_types(f"{module}.{base.id}" if base.id in classes else imported.get(base.id, ""))
            types = {**inherited, **types}
    return types


@functools.cache
def module_tree(module: str) -> ast.Module | None:
    """The parsed source of ``module`` (a ``.py`` file), or None; parsed once per process. Found on its top package's
    path, not by ``find_spec(module)``, which imports the packages above it (``xbench_pl.metrics`` imports
    torchmetrics)."""
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    path = folder.joinpath(*parts[:-1], f"{parts[-1]}.py") if parts else Path(spec.origin)
    if parts and not path.is_file():
        path = folder.joinpath(*parts, "__init__.py")
    return ast.parse(path.read_text()) if path.is_file() and path.suffix == ".py" else None


def literal_alias(annotation: str, module: str, imported: dict[str, str]) -> str:
    """``annotation`` with a name that ``module`` defines, or imports, as ``NAME = Literal[...]`` replaced by that
    ``Literal[...]`` (``NormalizeMode``: ``Literal['minmax', 'max', 'none']``)."""
    name = re.sub(r"\s*\|\s*None$", "", annotation)
    if not name.isidentifier() or name in NUMBER_TYPES or hasattr(builtins, name):
        return annotation
    home, _, defined = imported.get(name, f"{module}.{name}").rpartition(".")
    tree = module_tree(home)
    for node in tree.body if tree is not None else ():
        if (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [defined]
                and ast.unparse(node.value).startswith("Literal[")):
            return annotation.replace(name, ast.unparse(node.value), 1)
    return annotation


def unwrapped(annotation: str) -> tuple[str, bool]:
    """``annotation`` without ``Optional[...]`` or ``| None``, and whether it had one (null is then a value)."""
    inner = re.sub(r"\s*\|\s*None$|^Optional\[(.*)\]$", r"\1", annotation.strip()).strip()
    return inner, inner != annotation.strip()


def yaml_value(text: str):
    """A command-line value as jsonargparse reads it."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def choice_problem(option: str, annotation: str, text: str) -> str | None:
    """The line for ``option``'s value ``text`` outside its ``Literal[...]`` choices (``annotation``), or None (fine,
    or no such choice: LightningCLI judges it)."""
    inner, optional = unwrapped(annotation)
    match = re.fullmatch(r"Literal\[(.*)\]", inner)
    if match is None:
        return None
    choices, value = ast.literal_eval(f"({match.group(1)},)"), yaml_value(text)
    if value in choices or (value is None and optional):
        return None
    return f"{option}: expected one of {', '.join(map(repr, choices))}, got {text!r}"


def number_problem(option: str, annotation: str, text: str) -> str | None:
    """The line for ``option``'s value ``text`` outside its number type (``annotation``), or None (fine, or not a
    number type: LightningCLI judges it)."""
    inner, optional = unwrapped(annotation)
    kind = NUMBER_TYPES.get(inner)
    if kind is None:
        return None
    value = yaml_value(text)
    if value is None and optional:
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


def trainer_problem(argv: list[str], command: str = "test") -> str | None:
    """The one-line problem of a ``test``/``fit`` command line that needs no model to find, or None. ``test`` into an
    ``--out`` that holds an earlier run is one without ``--overwrite`` (``outputs.check_not_earlier_run``; here where
    the command line names ``--out`` and no ``--config`` may name another, else once the options are parsed)."""
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
    root = take_option(argv, "--data.root")[0]
    if root and reads_root(classes.get("--data")) and not Path(root).is_dir():
        return f"--data.root: {root}: no such folder (give the dataset's folder as it unpacks from its source)"
    for flag, registered in classes.items():
        types = init_types(registered)
        for key, annotation in types.items():
            text = take_option(argv, f"{flag}.{key}")[0]
            problem = None if text is None else (number_problem(f"{flag}.{key}", annotation, text)
                                                 or choice_problem(f"{flag}.{key}", annotation, text))
            if problem:
                return problem
    out = take_option(argv, "--out")[0]
    try:
        check_writable({"--out": out} if out else {})
        configured = any(flag in ("-c", "--config") for flag in flags(argv))
        if command == "test" and out and not configured and is_rank_zero():  # DDP ranks > 0 start once rank 0 checked
            check_not_earlier_run(out, flag_value(argv, "--overwrite"))
    except OutputError as error:
        return str(error)
    return None


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
