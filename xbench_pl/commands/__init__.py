"""The command line: ``python -m xbench_pl COMMAND ...`` (or ``xbench COMMAND ...``).

Every command is a module of this package with ``main(argv) -> int`` (``test`` and ``fit``
share ``trainer``), imported only when called, so ``--help`` starts without Lightning. The
library below never imports a command.

Expected user errors end the command with one ``error: ...`` line and exit status 2
(``errors.user_error_message``); ``--debug`` (or ``XBENCH_DEBUG=1``) shows the traceback instead.
Ctrl-C (SIGINT) ends it with one line, what the run kept and the command that goes on (``trainer.XBenchCLI``),
and exit status 130 (``INTERRUPTED``). A boolean option of ``test``/``fit``'s own given alone (``--resume``) is on.
Any other exception shows its traceback. Lightning's info chatter (seed, device lines, tips, its
own metric table) is off; the progress bar and warnings stay.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
import warnings

from xbench_pl.commands.arguments import DEBUG_ENV, PROG, SUMMARIES, TRAINER_COMMANDS, bare_flags
from xbench_pl.commands.errors import Interrupted
from xbench_pl.console import is_rank_zero, wrap

#: the exit status of a command stopped by Ctrl-C (SIGINT): 128 + the signal's number, as a shell reports it
INTERRUPTED = 130
#: every command's module
COMMANDS = {"test": "trainer", "fit": "trainer", "describe": "describe", "score": "score", "compare": "compare",
            "sweep": "sweep", "report": "report", "export": "export", "store": "store", "weights": "weights", "data": "data"}


def usage() -> str:
    options = {"--debug": f"show the traceback of an error (also {DEBUG_ENV}=1)", "-h, --help": "this message"}
    width = max(len(name) for name in [*SUMMARIES, *options])
    lines = [f"usage: {PROG} COMMAND [options]      ({PROG} COMMAND --help: the command's options)", "",
             "Zero-shot recognition and grounding benchmark of chest X-ray vision-language models.", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in SUMMARIES.items()]
    lines += ["", "options:", *(f"  {name:<{width}}  {text}" for name, text in options.items())]
    return "\n".join(lines)


def quiet_lightning(short_warnings: bool = True) -> None:
    """Progress bar and warnings only: no seed line, device lines, tips or deprecation notes of Lightning's;
    warnings as one ``warning: ...`` line (without the source line that raised them)."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")  # Lightning vs torch >= 2.10
    warnings.filterwarnings("ignore", message=r".*does not have many workers")
    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training")  # fit's frozen parts
    if short_warnings:
        warnings.formatwarning = lambda message, category, *_, **__: wrap(f"warning: {message}") + "\n"


def print_error(message: str) -> None:
    """One ``error:`` line, wrapped to a terminal's width (``console.wrap``); whole where stderr is a log or a pipe,
    where a program reads it (``sweep`` shows a failed run's line from its log). A DDP rank > 0 stays silent when
    rank 0 (its parent, Lightning's launcher) ends too, as it does for an error every rank hits; an error of its own
    is printed."""
    if not is_rank_zero():
        parent, deadline = os.getppid(), time.monotonic() + 3
        while time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.1)
        if os.getppid() != parent:
            return
        message = f"(rank {os.environ.get('RANK') or os.environ.get('LOCAL_RANK')}) {message}"
    line = f"error: {message}"
    print(wrap(line) if sys.stderr.isatty() else line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if from_command_line else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if debug:
        os.environ[DEBUG_ENV] = "1"  # DDP ranks re-run the command line without --debug
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print_error(f"unknown command {command!r}; commands: {', '.join(SUMMARIES)} (see {PROG} --help)")
        return 2
    if command in TRAINER_COMMANDS:  # before Lightning loads: help, the errors that need no model come at once; pulled files
        from xbench_pl.commands.early import (Released, class_help, released_weights, run_problem, trainer_problem,
                                              wants_quick_help)

        if wants_quick_help(rest):
            from xbench_pl.commands.trainer_help import trainer_help

            print(trainer_help(command))
            return 0
        if (shown := class_help(rest)) is not None:  # --model.help NAME: from the table of the registered classes
            print(shown, end="")
            return 0

        typed, rest = rest, bare_flags(rest)  # typed: for the command a run prints to continue it
        problem = trainer_problem(rest, command)
        released = Released(rest) if problem else released_weights(rest)
        rest, problem = released.argv, problem or released.problem or run_problem(rest, released)
        if problem:
            print_error(problem)
            return 2
    try:
        module = importlib.import_module(f"{__name__}.{COMMANDS[command]}")
        if not debug:  # after the import: importing Lightning sets its loggers' levels
            quiet_lightning(short_warnings=from_command_line)
        if command in TRAINER_COMMANDS:
            return module.run_trainer(command, rest, from_command_line, typed=typed)
        return module.main(rest)
    except KeyboardInterrupt as interrupt:  # Ctrl-C: what is kept and how to go on (trainer.Interrupted), no traceback
        print_error(str(interrupt) if isinstance(interrupt, Interrupted) else "interrupted (Ctrl-C)")
        return INTERRUPTED
    except Exception as error:
        from xbench_pl.commands.errors import user_error_message

        message = None if debug else user_error_message(error, command)
        if message is not None and command in TRAINER_COMMANDS and released.explains(error):
            message = released.message  # the model misses a file of the weights cache: say how to pull it
        if message is None:
            raise
        print_error(message)
        return 2
