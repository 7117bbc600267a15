"""The registered models' and datasets' init options as data (``class_options.json``), so that ``early`` can judge a
``test``/``fit`` command line and print ``--model.help NAME``/``--data.help NAME`` before Lightning, torch and the
classes load (LightningCLI takes 10 s and more for that, 60 s and more on a busy machine).

The table is made from the live classes, through the very parser LightningCLI builds for ``test --model.help NAME``
(and ``--data.help NAME``): per registered name, its class path, each option's flags, type and help as that parser
has them, what the help shows (``render_help`` draws it again at the terminal's width), and for a dataset read from
a folder, what ``--data.root`` must hold (the layout its ``checked_root`` names); beside them, the values of a
``GridThreshold`` and the options every model (``ZeroShotModel``) and dataset (``XBenchData``) takes. Regenerate it
after changing a class's arguments, a config's class path or a registered name, or after upgrading jsonargparse or
Lightning::

    python -m xbench_pl.commands.class_options

``tests/test_early_checks.py`` fails while the shipped table differs from the classes. A name the table lacks, or
whose config names another class (a config edited by hand), is left to LightningCLI.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import sys
from pathlib import Path

from xbench_pl.registry import UnknownName, available, class_path

TABLE = Path(__file__).with_name("class_options.json")
#: each registry kind and the option that takes its names
OPTIONS = {"models": "model", "data": "data"}


@functools.cache
def read_table() -> dict:
    return json.loads(TABLE.read_text())


def table_entry(kind: str, name: str) -> dict | None:
    """The table's entry of the registered ``name`` of ``kind`` ("models", "data"), or None where the table cannot
    speak for it: not registered, not in the table, or its config names another class than the table's."""
    entry = read_table()[kind].get(name)
    try:
        return entry if entry is not None and entry["class_path"] == class_path(kind, name) else None
    except UnknownName:
        return None


class StoredHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter for help texts already expanded (types, defaults, markup removed) when the table was made."""

    def _expand_help(self, action: argparse.Action) -> str:
        return action.help


def render_help(entry: dict) -> str:
    """The help of a table entry as the parser prints it (``--model.help NAME``), at the terminal's width."""
    actions = [argparse.Action(option_strings=a["flags"], dest=a["dest"], nargs=a["nargs"], metavar=a["metavar"],
                               required=a["required"], help=a["help"]) for a in entry["actions"]]
    shown = entry["help"]
    formatter = StoredHelpFormatter(prog=shown["prog"])
    formatter.add_usage(None, [actions[i] for i in shown["usage"]], [])
    formatter.add_text(shown["description"])
    for group in shown["groups"]:
        formatter.start_section(group["title"])
        formatter.add_text(group["description"])
        formatter.add_arguments([actions[i] for i in group["actions"]])
        formatter.end_section()
    formatter.add_text(shown["epilog"])
    return formatter.format_help()


# -- making the table (imports Lightning, torch and every registered class) ----------------------------------------
def class_parsers(kind: str, names: list[str]) -> dict[str, tuple]:
    """Per name, the parser LightningCLI builds for ``test --model.help NAME`` (``--data.help``), and the one
    jsonargparse parses the class's options given on the command line with (``--model.X``: its cached class parser,
    which sees the class's own types, where the help may show them narrowed: ``--model.explainer``). The first help
    parser is built by the command itself, the others by the same help action of the same command parser."""
    from unittest import mock

    from jsonargparse import ArgumentParser
    from jsonargparse._actions import _ActionHelpClassPath

    from xbench_pl.commands.trainer import run_trainer
    from xbench_pl.registry import resolve_class

    class Shown(Exception):
        pass

    caught: dict = {}
    original = _ActionHelpClassPath.print_help

    def keep_command_parser(action, call_args):
        caught.setdefault("call", (action, call_args))
        return original(action, call_args)

    def keep_help_parser(parser, *args, **kwargs):
        caught["parser"] = parser
        raise Shown

    parsers = {}
    flag = f"--{OPTIONS[kind]}.help"
    with (mock.patch.object(_ActionHelpClassPath, "print_help", keep_command_parser),
          mock.patch.object(ArgumentParser, "print_help", keep_help_parser)):
        for name in names:
            try:
                if "call" not in caught:
                    run_trainer("test", [flag, class_path(kind, name)], from_command_line=False)
                else:
                    action, (command_parser, namespace, _, option) = caught["call"]
                    original(action, (command_parser, namespace, class_path(kind, name), option))
            except Shown:
                action, (command_parser, *_) = caught["call"]
                parsing = type(command_parser)(exit_on_error=False)  # as jsonargparse's cached_get_class_parser
                added = {key: set(value) if key == "skip" else value for key, value in action.sub_add_kwargs.items()}
                parsing.add_class_arguments(resolve_class(class_path(kind, name)), **added)
                parsers[name] = (caught.pop("parser"), parsing)
    return parsers


def shown_help(parser, parsing) -> tuple[list[dict], dict]:
    """What ``parser.format_help()`` shows, as data: every action (flags, nargs, metavar, whether required, its help
    expanded, and for a typed one the type ``parsing``, the parser of the command line's values, gives it) and the
    layout (prog, usage, description, groups, epilog) that ``render_help`` draws again."""
    from jsonargparse._typehints import ActionTypeHint

    from xbench_pl.commands.arguments import plain

    expanded, usage = {}, []

    class Usage(argparse.HelpFormatter):  # right above argparse's own: sees the actions jsonargparse's usage lists
        def _format_usage(self, text, actions, groups, prefix):
            usage[:] = [a for a in actions if a.help != argparse.SUPPRESS]
            return super()._format_usage(text, actions, groups, prefix)

    class Recording(parser.formatter_class, Usage):
        def _expand_help(self, action):  # the last call gives what is shown
            expanded[id(action)] = (super()._expand_help(action), action.required)
            return expanded[id(action)][0]

    own, parser.formatter_class = parser.formatter_class, Recording
    try:
        parser.format_help()
    finally:
        parser.formatter_class = own
    formatter = own(prog=parser.prog)
    metavars = {id(a): None if a.nargs == 0 else
                formatter._metavar_formatter(a, formatter._get_default_metavar_for_optional(a))(1)[0]
                for a in parser._actions}
    listed = [a for a in parser._actions if id(a) in expanded or a in usage]
    parsed = {a.dest: a for a in parsing._actions}
    actions = []
    for action in listed:
        help_text, required = expanded.get(id(action), (argparse.SUPPRESS, action.required))
        entry = {"flags": list(action.option_strings), "dest": action.dest, "nargs": action.nargs,
                 "metavar": metavars[id(action)], "required": required, "help": help_text}
        typed = parsed.get(action.dest.partition(".")[2])
        if isinstance(typed, ActionTypeHint):
            entry["type"] = judged_type(typed._typehint)
        actions.append(entry)
    index = {id(a): i for i, a in enumerate(listed)}
    groups = [{"title": plain(g.title) if g.title else g.title,
               "description": plain(g.description) if g.description else g.description,
               "actions": [index[id(a)] for a in g._group_actions if id(a) in index]} for g in parser._action_groups]
    return actions, {"prog": parser.prog, "usage": [index[id(a)] for a in usage],
                     "description": plain(parser.description) if parser.description else parser.description,
                     "groups": groups, "epilog": plain(parser.epilog) if parser.epilog else parser.epilog}


def judged_type(typehint) -> dict:
    """What ``early`` needs to judge a value of ``typehint``: the type's name (``PositiveInt``, ``str``; a
    ``Literal``'s ``choices``) and whether null is a value; ``{}`` for a type it leaves to the parser."""
    from types import NoneType
    from typing import Literal, Union, get_args, get_origin

    args = get_args(typehint)
    null = get_origin(typehint) is Union and NoneType in args
    if null:
        args = tuple(a for a in args if a is not NoneType)
        if len(args) != 1:
            return {}
        typehint = args[0]
    if get_origin(typehint) is Literal:
        choices = list(get_args(typehint))
        return {"choices": choices, "null": null} if all(isinstance(c, (str, int, float)) for c in choices) else {}
    return {"type": typehint.__name__, "null": null} if isinstance(typehint, type) else {}


def root_layout(name: str) -> dict | None:
    """For a dataset read from the folder ``--data.root`` names: its name and what the folder holds (``layout``), as
    its ``checked_root`` says when no root is given (``load_records`` stops there); None for a dataset that reads no
    folder of its own: a demo, which draws itself (into its ``demo_root``), or ``pooled``, whose datasets do."""
    from unittest import mock

    from xbench_pl.data.base import XBenchData
    from xbench_pl.registry import read_data_config

    class Asked(Exception):
        pass

    def asked(self, layout):
        raise Asked({"dataset": self.name, "layout": layout})

    dataset_class, defaults = read_data_config(name)
    dataset = dataset_class(**{**defaults, "root": None})
    if hasattr(dataset, "demo_root"):
        return None
    with mock.patch.object(XBenchData, "checked_root", asked):
        try:
            dataset.load_records()
        except Asked as question:
            return question.args[0]
        except NotImplementedError:
            return None
    return None


def build_table(parsers: dict | None = None) -> dict:
    """The table, from the live classes (``parsers``: ``class_parsers`` of each kind, made here if not given)."""
    import torch

    from xbench_pl.data.base import XBenchData
    from xbench_pl.metrics.kernels import default_thresholds
    from xbench_pl.models.base import ZeroShotModel

    table = {"grid": default_thresholds(dtype=torch.float64).tolist(),  # GridThreshold's values
             "shared_options": {kind: [p for p in inspect.signature(base.__init__).parameters if p != "self"]
                                for kind, base in (("models", ZeroShotModel), ("data", XBenchData))}}
    for kind in OPTIONS:
        names = available(kind)
        made = class_parsers(kind, names) if parsers is None else parsers[kind]
        entries = {}
        for name in names:
            actions, shown = shown_help(*made[name])
            entries[name] = {"class_path": class_path(kind, name), "actions": actions, "help": shown}
            if kind == "data":
                entries[name]["root"] = root_layout(name)
        table[kind] = entries
    return table


def table_text(table: dict) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Rewrite ``class_options.json`` from the live classes."""
    if sys.argv[1:] if argv is None else argv:
        print(f"usage: python -m {__spec__.name}  (rewrites {TABLE} from the registered classes)", file=sys.stderr)
        return 2
    TABLE.write_text(table_text(build_table()))
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
