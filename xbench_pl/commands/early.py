"""What ``test`` and ``fit`` check of their command line before Lightning, torch and the model's code load
(seconds, more on a busy machine): a ``--model``/``--data`` name that is not registered, a ``--data.root`` that
is no folder and an ``--out`` that cannot be written end the command at once. LightningCLI checks the same
again (and everything else: option types, numbers) once the classes are loaded."""

from __future__ import annotations

from pathlib import Path

from xbench_pl.commands.arguments import is_name, take_option
from xbench_pl.outputs import OutputError, check_writable
from xbench_pl.registry import UnknownName, config_path

#: where these checks keep out: help and config printing write nothing, whatever ``--out`` says
HELP_FLAGS = ("-h", "--help", "--print_config")


def trainer_problem(argv: list[str]) -> str | None:
    """The one-line problem of a ``test``/``fit`` command line that needs no model to find, or None."""
    for flag, kind in (("--model", "models"), ("--data", "data"), ("--model.help", "models"), ("--data.help", "data")):
        value = take_option(argv, flag)[0]
        if value and is_name(value):
            try:
                config_path(kind, value)
            except UnknownName as error:
                return str(error)
    if any(arg.split("=")[0] in HELP_FLAGS or arg.endswith(".help") for arg in argv):
        return None
    root = take_option(argv, "--data.root")[0]
    if root and not Path(root).is_dir():
        return f"--data.root: {root}: no such folder (give the dataset's folder as it unpacks from its source)"
    out = take_option(argv, "--out")[0]
    try:
        check_writable({"--out": out} if out else {})
    except OutputError as error:
        return str(error)
    return None
