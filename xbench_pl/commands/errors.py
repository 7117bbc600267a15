"""One ``error: ...`` line for an expected user error (a bad option value, a missing file or folder,
bad data, a checkpoint that does not fit), or None for an unexpected exception, which shows its
traceback."""

from __future__ import annotations

import inspect
import re
import sys
import traceback
from argparse import ArgumentError
from pathlib import Path
from typing import get_args

from xbench_pl.commands.arguments import PROG, TRAINER_COMMANDS
from xbench_pl.registry import UnknownName


class UsageError(ValueError):
    """A user error whose message is ready to print (an option, a file and what to do)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped a run; the message (one line) says what it kept and the command that goes on."""


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from (or while handling), outermost first."""
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return seen


def _own_errors() -> tuple[type, ...]:
    from xbench_pl.data.errors import DataError
    from xbench_pl.models.checkpoints import CheckpointError
    from xbench_pl.outputs import OutputError

    return DataError, CheckpointError, OutputError, UsageError, UnknownName


def _init_arguments(cls: type) -> set[str]:
    """Every argument of ``cls``'s ``__init__`` and its bases' (a family passes the base's on)."""
    names = set()
    for base in cls.__mro__:
        if "__init__" in vars(base):
            try:
                names |= set(inspect.signature(base.__init__).parameters) - {"self", "args", "kwargs"}
            except (TypeError, ValueError):
                pass
    return names


def _option_of(error: BaseException, message: str) -> tuple[str, str]:
    """The option and the message for ``error`` raised while building a datamodule or a model: ``--data.ARG`` or
    ``--model.ARG`` for the class's argument ARG that the message is about, else ``--data`` or ``--model``; no
    option for an error raised elsewhere. The message is about ARG where it begins with ARG (named once: the
    message goes on after it), says ``ARG=...``, or begins with ARG's value (a file)."""
    from xbench_pl.data.base import XBenchData

    models = sys.modules.get("xbench_pl.models.base")  # not imported: no model was built (describe, score)
    owners = (XBenchData, models.ZeroShotModel) if models is not None else (XBenchData,)
    for frame, _ in traceback.walk_tb(error.__traceback__):
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name != "__init__" or not isinstance(owner, owners):
            continue
        if message.startswith("--"):  # it names its option itself
            return "", message
        option, arguments = "--data" if isinstance(owner, XBenchData) else "--model", _init_arguments(type(owner))
        leading = re.match(r"([a-z_][a-z0-9_]*)(:\s*|\s+)(?=\S)", message)
        if leading and leading.group(1) in arguments:
            return f"{option}.{leading.group(1)}", message[leading.end():]
        said = [name for name in re.findall(r"\b([a-z_][a-z0-9_]*)=", message) if name in arguments]
        valued = [name for name in arguments if isinstance(frame.f_locals.get(name), (str, Path))
                  and len(str(frame.f_locals[name])) > 1 and message.startswith(str(frame.f_locals[name]))]
        return (f"{option}.{(said or valued)[0]}" if said or valued else option), message
    return "", message


def _last_line(message: str) -> str:
    """A re-raised worker error carries the worker's traceback: its last line is the message."""
    if "Traceback (most recent call last)" in message:
        lines = [line for line in message.strip().splitlines() if line.strip()]
        message = re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1].strip())
    return " ".join(message.split())


def restriction_text(message: str) -> str | None:
    """A restricted number type's refusal (jsonargparse.typing: "V does not conform to restriction v>0 and v<1") as
    "must be > 0 and < 1, got V"; None for any other message."""
    restricted = re.match(r"^(.*) does not conform to restriction (.+)$", message)
    if restricted is None:
        return None
    bounds = re.sub(r"v([<>=!]+)", r"\1 ", restricted.group(2))  # "v>=0 and v<=1": ">= 0 and <= 1"
    return f"must be {bounds}, got {restricted.group(1)}"


def argument_message(error: ArgumentError, command: str) -> str:
    """jsonargparse's nested parse error of ``command``'s options as one line: the option and the innermost complaint."""
    text = str(error)
    keys = [k for k in re.findall(r'Parser key "([^"]+)"', text) if k not in TRAINER_COMMANDS]
    innermost = _chain(error)[-1]
    message = str(innermost).strip().splitlines()[0] if str(innermost).strip() else text.strip().splitlines()[0]
    message = re.sub(r"<class '([\w.]+)'>", r"\1", message)
    message = re.sub(r"\b(?:test|fit)\.(\w)", r"--\1", message)  # "required: test.data" -> "--data"
    class_path = re.search(r"Problem with given class_path '([\w.]+)'", text)
    if class_path and isinstance(innermost, ImportError):
        message = f"cannot import {class_path.group(1)}: {message}"
    elif class_path and "is not accepted" in message:
        keys.append(re.search(r"Option '([^']+)'", message).group(1))
        message = f"not an option of {class_path.group(1)} (its options: {PROG} {command} --{keys[0]}.help {class_path.group(1)})"
    message = re.sub(r"^Expected a typing\.Literal\[(.+)\]\. Got value: (.*)$", r"expected one of \1, got '\2'", message)
    message = re.sub(r"^Expected a (.+)\. Got value: (.*)$", r"expected a \1, got '\2'", message)
    message = restriction_text(message) or message
    message = re.sub(r"^(?:could not convert string to (float)|invalid literal for (int)\(\) with base 10): (.*)$",
                     r"expected a \1\2, got \3", message)
    message = re.sub(r"^expected a (?=[aeiou])", "expected an ", message)
    if message.startswith("unrecognized arguments"):
        message += f" (see {PROG} {command} --help)"
    option = "--" + ".".join(keys) if keys else ""
    got = re.search(r"got ('.*')$", message)
    if option == "--trainer.precision" and got:  # jsonargparse names one of the Literals of its Union only
        message = f"expected one of {precision_values()}, got {got.group(1)}"
    return f"{option}: {message}" if option else message


def precision_values() -> str:
    """Every ``--trainer.precision`` value Lightning accepts: its names, then their short aliases."""
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    return f"{', '.join(get_args(_PRECISION_INPUT_STR))} (or {', '.join(get_args(_PRECISION_INPUT_STR_ALIAS))})"


def user_error_message(error: BaseException, command: str) -> str | None:
    """The one line for an expected user error of ``command``, or None for an unexpected exception."""
    chain = _chain(error)
    if any(isinstance(e, RuntimeError) and "remote worker crash" in str(e) for e in chain):
        return "another DDP rank stopped (its error: above); this rank could not go on without it"
    if isinstance(error, ArgumentError) or any(isinstance(e, ArgumentError) for e in chain[:1]):
        return argument_message(error, command)
    own = next((e for e in chain if isinstance(e, _own_errors())), None)
    loading = next((e for e in chain if isinstance(e, RuntimeError) and str(e).startswith("Error(s) in loading state_dict")),
                   None)
    if own is None and loading is not None:  # Lightning's strict load of a --ckpt_path into --model
        details = " ".join(line.strip() for line in str(loading).splitlines()[1:])
        return f"--ckpt_path: the checkpoint does not fit --model: {details[:400]}{' ...' if len(details) > 400 else ''}"
    if own is None:  # the innermost plain user error: jsonargparse wraps a class's own ValueError in its own
        own = next((e for e in reversed(chain) if isinstance(e, (ValueError, FileNotFoundError, NotADirectoryError))), None)
    if own is None:
        return None
    message = _last_line(own.args[0] if isinstance(own, KeyError) and own.args else str(own))
    if isinstance(own, UnknownName):
        return f"{own.option}: {message}"
    option, message = ("", message) if isinstance(own, UsageError) else _option_of(own, message)
    return f"{option}: {message}" if option else message
