"""``test --help`` and ``fit --help`` without Lightning, torch or any model's code (building ``XBenchCLI``'s parser
imports them all: 15-20 s). The options are those of that parser: the run's own (``arguments.RUN_OPTIONS``), the
Trainer's ``__init__`` and the verb's (``Trainer.test``/``Trainer.fit``) arguments with their docstrings' text, read
from Lightning's source (``ast``), and the ``--model``/``--data`` choices. The dispatcher shows it where
``early.wants_quick_help``; a model's or dataset's own options come from the table of the classes' options
(``--model.help NAME``: ``early.class_help``), and ``early.parse_problem`` knows the command's flags from
``trainer_parser``. ``tests/test_cli_options.py`` checks that this help and the parser's list the same options."""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
from pathlib import Path
from typing import get_args

import docstring_parser

from xbench_pl.commands.arguments import (FIT_DEFAULT_EPOCHS, FIT_TRAINER_DEFAULTS, LINKED_OPTIONS, NAMES_HELP, PROG, RUN_OPTIONS,
                                         SEED_DEFAULT, SUMMARIES, TRAINER_DEFAULTS, VERB_DEFAULTS, VERB_SKIPPED, plain)
from xbench_pl.options import ExplainerName
from xbench_pl.registry import available

TRAINER_MODULE, TRAINER_CLASS = "lightning.pytorch.trainer.trainer", "Trainer"


@functools.cache
def module_tree(module: str) -> ast.Module | None:
    """The parsed source of ``module`` (a ``.py`` file), or None; parsed once per process. Found on its top package's
    path, not by ``find_spec(module)``, which imports the packages above it (``lightning`` imports torch)."""
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    path = folder.joinpath(*parts[:-1], f"{parts[-1]}.py") if parts else Path(spec.origin)
    if parts and not path.is_file():
        path = folder.joinpath(*parts, "__init__.py")
    return ast.parse(path.read_text()) if path.is_file() and path.suffix == ".py" else None


def signature(method: str) -> list[tuple[str, str, str, str]]:
    """``(name, annotation, default, description)`` of each argument of ``Trainer.<method>`` (without ``self``),
    from Lightning's source."""
    tree = module_tree(TRAINER_MODULE)
    trainer = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == TRAINER_CLASS)
    function = next(node for node in trainer.body if isinstance(node, ast.FunctionDef) and node.name == method)
    described = {p.arg_name: " ".join((p.description or "").split())
                 for p in docstring_parser.parse(ast.get_docstring(function) or "").params}
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    pairs = [*zip(positional, defaults), *zip(arguments.kwonlyargs, arguments.kw_defaults)]
    return [(a.arg, ast.unparse(a.annotation) if a.annotation else "", ast.unparse(d) if d is not None else "",
             described.get(a.arg, "")) for a, d in pairs if a.arg != "self"]


def shown(value) -> str:
    """A default as the parser shows it (YAML's words for None and booleans)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def source_default(text: str) -> str:
    try:
        return shown(ast.literal_eval(text))
    except (ValueError, SyntaxError):
        return text


def metavar(name: str, annotation: str) -> str:
    return {"bool": "{true,false}", "Optional[bool]": "{true,false,null}"}.get(annotation.replace(" ", ""), name.upper())


def type_text(kind) -> str:
    return kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")


def option_help(description: str, annotation: str, default: str) -> str:
    return f"{plain(description)} (type: {annotation}, default: {default})".lstrip()


def trainer_help(command: str) -> str:
    """The ``--help`` of ``test`` or ``fit``."""
    return trainer_parser(command).format_help()


def trainer_parser(command: str) -> argparse.ArgumentParser:
    """A parser with the options of ``test`` or ``fit`` (for their help, and the flags ``early`` knows)."""
    parser = argparse.ArgumentParser(
        prog=f"{PROG} {command}", description=SUMMARIES[command], add_help=False,
        epilog=NAMES_HELP.format(models=", ".join(available("models")), data=", ".join(available("data")),
                                 explainers=", ".join(get_args(ExplainerName))))
    parser.add_argument("-h", "--help", action="help", help="Show this help message and exit.")
    parser.add_argument("-c", "--config", help="a configuration file in JSON or YAML format (--print_config writes one)")
    parser.add_argument("--print_config", metavar="[=flags]", help="print the configuration after applying all other "
                        "arguments and exit; flags: skip_default, skip_unset (comma-separated)")
    parser.add_argument("--seed_everything", metavar="SEED_EVERYTHING", help=option_help(
        "an int seeds every random generator before the model and data are built; true: a random seed",
        "Union[bool, int]", shown(SEED_DEFAULT)))
    for name, (kind, default, text) in RUN_OPTIONS.items():
        parser.add_argument(f"--{name}", metavar=metavar(name, type_text(kind)), help=option_help(text, type_text(kind), shown(default)))

    defaults = FIT_TRAINER_DEFAULTS if command == "fit" else TRAINER_DEFAULTS
    linked = {target.removeprefix("trainer.") for target in LINKED_OPTIONS.values()}
    trainer = parser.add_argument_group("the Trainer's options (lightning.pytorch.Trainer)")
    trainer.add_argument("--trainer", metavar="CONFIG", help="a configuration file of the Trainer's options")
    for name, annotation, default, description in signature("__init__"):
        if name not in linked:
            default = shown(defaults[name]) if name in defaults else source_default(default)
            if command == "fit" and name == "max_epochs":  # XBenchCLI.fit_epochs, not Lightning's 1000
                description = ("Stop training once this number of epochs is reached; -1: no limit. Where neither "
                               "max_epochs nor max_steps nor max_time is given, fit trains "
                               f"{FIT_DEFAULT_EPOCHS} epoch (Lightning's own default: 1000) and says so.")
                default = str(FIT_DEFAULT_EPOCHS)
            trainer.add_argument(f"--trainer.{name}", metavar=metavar(name, annotation),
                                 help=option_help(description, annotation, default))
    for flag, what in (("--model", "model"), ("--data", "dataset")):
        group = parser.add_argument_group(f"the {what}")
        group.add_argument(flag, metavar="NAME | CLASS_PATH | CONFIG",
                           help=f"a registered {what} (below), a class path or a YAML file")
        group.add_argument(f"{flag}.ARG", metavar="V", help=f"one of the {what}'s options (listed by {flag}.help NAME)")
        group.add_argument(f"{flag}.help", metavar="NAME", help=f"show the {what}'s options and exit")

    verb = parser.add_argument_group(f"{command}'s own options (lightning.pytorch.Trainer.{command})")
    for name, annotation, default, description in signature(command):
        if name not in VERB_SKIPPED[command]:
            default = shown(VERB_DEFAULTS[command][name]) if name in VERB_DEFAULTS[command] else source_default(default)
            verb.add_argument(f"--{name}", metavar=metavar(name, annotation), help=option_help(description, annotation, default))
    return parser
