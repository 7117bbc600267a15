"""``python -m xbench_pl describe --data NAME [--data.root DIR] [--data.ARG ...] [--json]``.

Reads a registered dataset exactly as ``test`` would (tables, split, image check) and prints,
per class, the evaluated images, the positives (label 1) and the region instances (boxes,
polygons, mask rows), then every problem found. ``describe`` collects all problems rather
than stopping at the first (``--data.on_error skip`` is its default; pass ``raise`` to stop).
``--json`` prints ``{"images": N, "classes": {CLASS: {"images", "positives", "regions"}},
"problems": [{"file", "row", "reason", "action"}, ...]}`` (a phrase dataset, MS-CXR: N counts its (image,
phrase) pairs, and ``phrases`` and ``image_files`` are added).

``--data pooled`` describes each pooled dataset in turn (one such summary per dataset; with
``--json``: ``{"datasets": {NAME: summary, ...}}``). A dataset that cannot be read at all (no
root, missing table) is named on stderr (``error: NAME: ...``) and the others are still
described; the exit status is then 1. A single dataset that cannot be read, like any user
error, ends with one ``error: ...`` line and exit status 2.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from jsonargparse import ArgumentParser

from xbench_pl.commands import print_error
from xbench_pl.commands.arguments import command_help, take_option
from xbench_pl.commands.parsing import PARSER_KWARGS
from xbench_pl.data.errors import DataError, Problem
from xbench_pl.data.sources import compare_ids, identity_line
from xbench_pl.registry import available, read_data_config

if TYPE_CHECKING:  # the data classes import torch: --help starts without it
    from xbench_pl.data.base import Record, XBenchData


def summarize(records: list[Record], classes: list[str], problems: list[Problem]) -> dict:
    """The ``--json`` summary of evaluated records; a phrase dataset's items are (image, phrase) pairs, so its summary
    also has ``phrases`` (the items with a phrase) and ``image_files`` (the distinct images they are on)."""
    phrases = sum(bool(r.queries) for r in records)
    return {
        "images": len(records),
        **({"phrases": phrases, "image_files": len({r.path for r in records})} if phrases else {}),
        "classes": {
            c: {
                "images": len(records),
                "positives": sum(r.labels.get(c, 0) for r in records),
                "regions": sum(len(r.regions.get(c, [])) for r in records),
            }
            for c in classes
        },
        "problems": [p.to_dict() for p in problems],
    }


def format_summary(name: str, summary: dict) -> str:
    width = max([len("class")] + [len(c) for c in summary["classes"]])
    items = "pairs" if "phrases" in summary else "images"
    title = (f"{summary['images']} (image, phrase) pairs on {summary['image_files']} images" if "phrases" in summary
             else f"{summary['images']} images")
    lines = [f"{name}: {title}", f"{'class':<{width}}  {items:>7}  {'positives':>9}  {'regions':>7}"]
    for c, counts in summary["classes"].items():
        lines.append(f"{c:<{width}}  {counts['images']:>7}  {counts['positives']:>9}  {counts['regions']:>7}")
    lines.append(f"{len(summary['problems'])} problem(s)")
    lines += [f"- {Problem(**p)} [{p['action']}]" for p in summary["problems"]]
    return "\n".join(lines)


def build_parser(dataset_class: type, defaults: dict) -> ArgumentParser:
    parser = ArgumentParser(prog="python -m xbench_pl describe --data NAME", description=__doc__.split("\n\n")[1],
                            **PARSER_KWARGS)
    parser.add_class_arguments(dataset_class, "data", skip={"preprocess"})
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults({f"data.{k}": v for k, v in {"on_error": "skip", **defaults}.items()})
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    name, rest = take_option(argv, "--data")
    if name is None and any(a in ("-h", "--help") for a in rest):
        print(command_help("describe --data NAME [--data.ARG V ...] [--json]", __doc__.split("\n\n", 1)[1], {
            "--data NAME": f"the dataset: {', '.join(available('data'))}",
            "--data.ARG V": "one of its settings (--data.root DIR, ...; describe --data NAME --help lists them)",
            "--json": "print the summary as JSON"}))
        return 0
    if name is None:
        print_error(f"--data NAME is required; available: {available('data')}")
        return 2
    try:
        dataset_class, defaults = read_data_config(name)
    except KeyError as error:
        print_error(f"--data: {error}")
        return 2
    args = build_parser(dataset_class, defaults).parse_args(rest)
    datamodule: XBenchData = dataset_class(**args.data.as_dict())
    pooled = datamodule.datamodules != [datamodule]
    summaries, failed = {}, False
    for child in datamodule.datamodules:
        try:
            records = child.prepare_records()
        except DataError as error:
            print_error(f"{child.name + ': ' if pooled else ''}{error}")
            failed = True
            continue
        summaries[child.name] = summarize(records, child.classes, child.problems)
        if child.eval_set is not None:  # which images, against the evaluation set (as metrics.json records it)
            summaries[child.name]["evaluated"] = compare_ids(child.eval_set, [r.image_id for r in records])
    if args.json and (pooled or summaries):
        print(json.dumps({"datasets": summaries} if pooled else summaries[datamodule.name], indent=2))
    elif summaries:
        print("\n\n".join(format_summary(name, summary) + (f"\n{identity_line(name, summary['evaluated'])}"
                                                            if "evaluated" in summary else "")
                            for name, summary in summaries.items()))
    return (1 if summaries else 2) if failed else 0


if __name__ == "__main__":
    sys.exit(main())
