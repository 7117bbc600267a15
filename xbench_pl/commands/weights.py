"""``python -m xbench_pl weights list|pull|verify``: the released weights of the registered models, by name.

Where each model's files come from is data (xbench_pl/models/configs/weights.yaml); they are pulled into one cache
(--dir, else $XBENCH_WEIGHTS_DIR, else ~/.cache/xbench_pl/weights), where ``test --model NAME`` finds them. The
first pull records each file's SHA-256 in the cache's weights.lock.json; ``verify`` re-checks them. A file found in
the cache rather than downloaded is recorded as placed by hand: unverified.
"""

from __future__ import annotations

import sys

from xbench_pl.commands import print_error
from xbench_pl.commands.arguments import PROG, command_help, take_option
from xbench_pl.console import say, wrap

USAGE = "weights {list,pull,verify} [NAME ...] [--dir DIR] [--quiet]"
OPTIONS = {
    "list": "every registered model: the files it reads, their source, licence, size, and whether they are here",
    "pull NAME ...": "download the models' files into the cache (resumes an interrupted pull; checks the lock)",
    "verify [NAME ...]": "re-hash the pulled files (of NAME, else all) against the lock; exit 2 naming a changed file; "
                         "a file placed by hand is named as unverified",
    "--dir DIR": "the cache (default: $XBENCH_WEIGHTS_DIR, else ~/.cache/xbench_pl/weights)",
    "--quiet": "no progress bars",
}


def size_text(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return ""


def status(needs, sources, cache, lock) -> tuple[str, str | None]:
    """``(what is here, pulled size)`` of a model's files."""
    from xbench_pl.weights import HAND, wanted_files

    files = [(s, n) for s, names in wanted_files(needs, sources, cache).items() for n in names]
    present = [(s, n) for s, n in files if (cache / s / n).is_file()]
    if len(present) < len(files):
        return (f"missing {len(files) - len(present)} of {len(files)} file(s): {PROG} weights pull {needs.model}"), None
    recorded = [lock.get(s, {}).get("files", {}).get(n) for s, n in files]
    pulled = size_text(sum((cache / s / n).stat().st_size for s, n in files))
    if any(r is None for r in recorded):
        return "present, not in the lock", pulled
    if any(r["size"] != (cache / s / n).stat().st_size for r, (s, n) in zip(recorded, files)):
        return f"present, CHANGED size since pulled ({PROG} weights verify {needs.model})", pulled
    if any(r.get("placed") == HAND for r in recorded):
        return "present, placed by hand (unverified)", pulled
    return "present, locked (verify re-hashes)", pulled


def list_models(cache) -> int:
    from xbench_pl.registry import available
    from xbench_pl.weights import read_lock, read_sources

    sources, needs = read_sources()
    lock = read_lock(cache)
    say(wrap(f"weights cache: {cache}"))
    for model in available("models"):
        entry = needs.get(model)
        if entry is None:
            say(wrap(f"{model}: no entry in weights.yaml"))
        elif entry.none:
            say(wrap(f"{model}: nothing to pull: {entry.none}"))
        elif not entry.arguments:
            say(wrap(f"{model}: weight-free, nothing to pull"))
        else:
            here, pulled = status(entry, sources, cache, lock)
            used = {ref.partition("/")[0] for refs in entry.arguments.values() for ref in refs}
            licences = "; ".join(f"{s}: {sources[s].licence}" for s in sorted(used))
            published = ", ".join(f"{s} {sources[s].size}" for s in sorted(used) if sources[s].size)
            sizes = "; ".join(x for x in (f"published {published}" if published else "", f"pulled {pulled}" if pulled else "") if x)
            say(wrap(f"{model}: {here}; licence {licences}" + (f"; size {sizes}" if sizes else "")))
            for arg, refs in entry.arguments.items():
                for ref in refs:
                    source = sources[ref.partition("/")[0]]
                    say(wrap(f"  --model.{arg} {ref}  from {source.describe()}"
                             + ("" if "/" in ref else f" ({', '.join(source.files)})")))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(command_help(USAGE, __doc__.split("\n\n", 1)[1], OPTIONS), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    folder, argv = take_option(argv, "--dir")
    quiet = "--quiet" in argv
    action, *names = [a for a in argv if a != "--quiet"]
    unknown = [a for a in names if a.startswith("-")]
    if action not in ("list", "pull", "verify") or unknown or (action == "pull" and not names) or (action == "list" and names):
        print_error(f"usage: {PROG} {USAGE}" + (f" (unknown option {unknown[0]})" if unknown else ""))
        return 2
    # imported here: --help reads no YAML
    from xbench_pl.weights import HAND, WeightsError, cache_dir, lock_entry, pull, read_lock, read_sources, verify

    cache = cache_dir(folder)
    if action == "list":
        return list_models(cache)
    unknown = [n for n in names if n not in read_sources()[1]]
    if unknown:
        print_error(f"weights {action}: unknown model {unknown[0]!r}; models: {', '.join(read_sources()[1])}")
        return 2
    try:
        if action == "pull":
            for name in names:
                placed = pull(name, cache, quiet)
                lock = read_lock(cache)
                by_hand = [str(p.relative_to(cache)) for p in placed if (lock_entry(lock, cache, p) or {}).get("placed") == HAND]
                hand = (f"; {len(by_hand)} placed by hand, not downloaded: unverified ({', '.join(by_hand)}; delete and "
                        "pull again to verify)") if by_hand else ""
                say(wrap(f"{name}: {len(placed)} file(s) in {cache}{hand}" if placed else f"{name}: weight-free, nothing to pull"))
            return 0
        good, unverified, problems = verify(cache, names or None)
    except WeightsError as error:
        print_error(str(error))
        return 2
    for problem in problems:
        print_error(str(problem))
    for path in unverified:
        print(wrap(f"warning: {path}: placed by hand, not downloaded: unverified (it is as it was found; delete it and "
                   "pull again to verify)"), file=sys.stderr)
    say(wrap(f"{len(good)} pulled file(s) match the lock in {cache}"
             + (f"; {len(unverified)} placed by hand, unverified" if unverified else "")
             + (f"; {len(problems)} do not" if problems else "")))
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
