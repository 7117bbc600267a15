"""Helpers shared by ``cli.py`` and the command modules (``describe``, ``score``, ...), so that no
command module imports the CLI that dispatches to it."""

from __future__ import annotations

PROG = "python -m xbench_pl"


def take_option(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """The value of ``flag VALUE`` (or ``flag=VALUE``) in ``argv``, and ``argv`` without it."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2], argv[:i] + argv[i + 1 :]
    return None, argv


def datamodule_problems(datamodule) -> dict[str, list]:
    return {dm.name: list(dm.problems) for dm in datamodule.datamodules}
