"""``python -m xbench_pl data list|pull|verify``: the benchmark's datasets by name.

Where each dataset comes from, its terms and its evaluation sets are data (xbench_pl/data/sources.yaml). ``pull``
downloads what the benchmark reads of a dataset into DIR/NAME (--dir, else $XBENCH_DATA_DIR, else
~/.cache/xbench_pl/data), where ``test --data NAME`` finds it without --data.root; the first pull records each
file's SHA-256 in NAME/xbench_data.lock.json. ``verify`` re-hashes the pulled files and reads the folder with the
dataset's own reader against its evaluation set: one line per missing, changed or extra file or id.
"""

from __future__ import annotations

import sys
from pathlib import Path

from xbench_pl.commands import print_error
from xbench_pl.commands.arguments import PROG, command_help, take_option
from xbench_pl.console import say, wrap

USAGE = "data {list,pull,verify} [NAME ...] [--dir DIR] [--data.root DIR] [--data.split SET] [--quiet]"
OPTIONS = {
    "list": "every dataset pulled by name: host, terms, size, what to do first, its layout and evaluation sets",
    "pull NAME ...": "download what the benchmark reads of each dataset into DIR/NAME (resumes; checks the lock)",
    "verify [NAME ...]": "check a dataset's folder against its lock and its evaluation set; exit 2 naming each problem",
    "--dir DIR": "where datasets are pulled to (default: $XBENCH_DATA_DIR, else ~/.cache/xbench_pl/data)",
    "--data.root DIR": "verify: the dataset's folder, wherever it is (default: DIR/NAME)",
    "--data.split SET": "the evaluation set to pull or verify (default: the dataset's default set)",
    "--quiet": "no progress bars",
}


def list_datasets(folder: Path) -> int:
    from xbench_pl.data.sources import read_lock, read_sources

    say(wrap(f"data folder: {folder}"))
    for name, source in read_sources().items():
        root = folder / name
        pulled = len(read_lock(root)["files"]) if root.is_dir() else 0
        here = f"pulled: {pulled} file(s) in {root}" if pulled else f"not pulled ({PROG} data pull {name})"
        say("")
        say(wrap(f"{name}: {source.title}; {here}"))
        for label, text in (("host", source.host), ("terms", source.terms), ("first", source.first),
                            ("size", source.size), ("layout", source.layout)):
            say(wrap(f"  {label}: {text}"))
        for eval_set in source.sets.values():
            default = " (default)" if eval_set.name == source.default else ""
            say(wrap(f"  --data.split {eval_set.describe()}{default}"))
    return 0


def verify(dataset: str, root: Path, split: str | None = None) -> tuple[list[str], list[str]]:
    """``(what matches, problems)`` of the folder ``root`` for ``dataset``'s evaluation set ``split``: the pulled
    files against the lock, then the folder as the dataset's own reader sees it against the set (its ids, its count,
    its regions' count, every image file); each problem one line naming the file or id."""
    from xbench_pl.data.errors import DataError
    from xbench_pl.data.sources import PULL_COMMAND, compare_ids, eval_set, identity_line, verify_lock

    chosen = eval_set(dataset, split)
    if not root.is_dir():
        return [], [f"{root}: no such folder ({PULL_COMMAND} {dataset}, or give the folder with --data.root)"]
    good, by_hand, problems = verify_lock(root)
    said = [f"{len(good)} pulled file(s) match the lock"] if good else []
    said += [f"{len(by_hand)} file(s) placed by hand, unverified (not downloaded by data pull)"] if by_hand else []
    from xbench_pl.registry import read_data_config

    data_class, defaults = read_data_config(dataset)
    data = data_class(**{**defaults, "root": str(root), "split": split, "on_error": "skip"})
    try:
        records = data.apply_split(data.load_records())  # a set that restricts keeps its pinned ids (absent ones reported)
    except DataError as error:
        return said, [*problems, str(error)]
    problems += [str(problem) for problem in data.problems if problem.action == "skipped"]
    ids = [r.image_id for r in records]
    pinned = chosen.ids()
    if pinned is not None and not chosen.restricts:  # the default set is read whole: any difference from its ids is one
        wanted, here = set(pinned), set(ids)
        problems += [f"{dataset}: {i}: pinned in split {chosen.name} ({chosen.ids_file}), not in the annotations under "
                     f"{root}" for i in sorted(wanted - here)]
        problems += [f"{dataset}: {i}: in the annotations under {root}, not in the pinned split {chosen.name} (extra)"
                     for i in sorted(here - wanted)]
    elif pinned is None and chosen.count is not None and len(records) != chosen.count:
        problems.append(f"{dataset}: {len(records):,} {chosen.unit} under {root}, split {chosen.name} has "
                        f"{chosen.count:,}")
    missing = [r for r in records if not Path(r.path).is_file()]
    problems += [f"{r.path}: missing (image of {r.source})" for r in missing]
    regions = sum(len(rows) for r in records for rows in r.region_sources.values())
    if chosen.regions is not None and not problems and regions != chosen.regions:
        problems.append(f"{dataset}: {regions:,} annotated regions under {root}, split {chosen.name} has "
                        f"{chosen.regions:,}")
    said.append(identity_line(dataset, compare_ids(chosen, ids)))
    if not problems:
        said.append(f"{dataset}: {len(records):,} {chosen.unit} of split {chosen.name}, every image file present"
                    + (f", {regions:,} regions" if chosen.regions is not None else ""))
    return said, problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(command_help(USAGE, __doc__.split("\n\n", 1)[1], OPTIONS), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    folder, argv = take_option(argv, "--dir")
    root, argv = take_option(argv, "--data.root")
    split, argv = take_option(argv, "--data.split")
    quiet = "--quiet" in argv
    action, *names = [a for a in argv if a != "--quiet"]
    unknown = [a for a in names if a.startswith("-")]
    if (action not in ("list", "pull", "verify") or unknown or (action == "pull" and not names)
            or (action == "list" and names) or ((root or split) and len(names) != 1)):
        why = (f" (unknown option {unknown[0]})" if unknown else
               " (--data.root and --data.split name one dataset's folder and set)" if (root or split) and names else "")
        print_error(f"usage: {PROG} {USAGE}{why}")
        return 2
    from xbench_pl.data.sources import DataSourceError, data_dir, eval_set, pull, read_sources

    folder = data_dir(folder)
    if action == "list":
        return list_datasets(folder)
    sources = read_sources()
    for name in names:
        if name not in sources:
            print_error(f"data {action}: unknown dataset {name!r}; datasets pulled by name: {', '.join(sources)}")
            return 2
    try:
        for name in names:
            eval_set(name, split)
    except ValueError as error:
        print_error(f"--data.split: {error}")
        return 2
    try:
        if action == "pull":
            for name in names:
                job = pull(name, folder, split, quiet)
                by_hand = f"; {len(job.by_hand)} already there, placed by hand (unverified)" if job.by_hand else ""
                say(wrap(f"{name}: {job.placed} file(s) downloaded into {job.root}{by_hand}; `{PROG} test --data {name}` "
                         "reads it there"))
            return 0
        problems = []
        for name in names or [n for n in sources if (folder / n).is_dir()]:
            said, found = verify(name, Path(root) if root else folder / name, split)
            for line in said:
                say(wrap(line))
            problems += found
    except DataSourceError as error:
        print_error(str(error))
        return 2
    for problem in problems:
        print_error(str(problem))
    if not names and not problems:
        say(wrap(f"nothing pulled in {folder} yet ({PROG} data pull NAME)"))
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
