"""``python -m xbench_pl export --predictions DIR --to npy|cheXlocalize --out DIR [--size N]``.

Writes a prediction store (``test --predictions DIR``) in a layout other tools read, without
xbench_pl (``exports``):

* ``--to npy``: ``OUT/<image_id>/<finding>.npy`` (the stored native maps), ``OUT/scores.csv``
  (``image_id,finding,score``) and ``OUT/preprocess.json``: what ``score --maps`` reads, and
  ``score --maps OUT --data NAME`` then gives the numbers of ``score --predictions DIR`` exactly;
* ``--to cheXlocalize``: CheXlocalize's ``OUT/{cxr_id}_{task}_map.pkl`` per (image, finding), named with
  the dataset's own task names, plain dicts (``map`` ``[1, 1, h, w]`` over the whole original image,
  ``prob``, ``task``, ``gt``, ``cxr_dims``) that their ``eval.py`` and tools read: the native maps where
  they span the whole image (squash), else maps resampled onto the run's eval grid; ``--size S``
  resamples every map onto an ``S x S`` grid.

A store of several datasets is written one folder per dataset (``OUT/<dataset>/``). ``OUT`` must be
empty or new. Every shard must read back intact (otherwise: continue the run with ``--resume``);
format 1 stores are read as they are.
"""

from __future__ import annotations

import sys
from pathlib import Path

from xbench_pl.commands import print_error
from xbench_pl.commands.arguments import PROG, command_help, take_option
from xbench_pl.outputs import check_writable, write_whole

USAGE = "export --predictions DIR --to npy|cheXlocalize --out DIR [--size N]"
OPTIONS = {"--predictions DIR": f"the prediction store ({PROG} test --predictions DIR)",
           "--to npy|cheXlocalize": "the layout: npy (what score --maps reads) or cheXlocalize (their *_map.pkl)",
           "--out DIR": "the folder to write (empty or new)",
           "--size N": "cheXlocalize: resample every map onto an N x N grid over the original image (default: native maps "
                       "that span it as they are, others on the run's eval grid)"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(command_help(USAGE, __doc__.split("\n\n", 1)[1], OPTIONS))
        return 0
    values, rest = {}, argv
    for flag in ("--predictions", "--to", "--out", "--size"):
        values[flag], rest = take_option(rest, flag)
    missing = [flag for flag in ("--predictions", "--to", "--out") if values[flag] is None]
    if missing or rest:
        problem = f"{', '.join(missing)} required" if missing else f"unrecognized arguments: {' '.join(rest)}"
        print_error(f"{problem} (usage: {PROG} {USAGE})")
        return 2
    if values["--to"] not in ("npy", "cheXlocalize"):
        print_error(f"--to must be npy or cheXlocalize, got {values['--to']!r}")
        return 2
    try:
        size = None if values["--size"] is None else int(values["--size"])
        if size is not None and size < 1:
            raise ValueError
    except ValueError:
        print_error(f"--size must be a positive number of pixels, got {values['--size']!r}")
        return 2
    out = Path(values["--out"])
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print_error(f"--out {out}: not an empty folder; choose a new or empty one")
        return 2
    check_writable({"--out": out})
    from xbench_pl.exports import export  # here, not at the top: --help starts without torch
    from xbench_pl.prediction_store import Store, StoreError

    store = Store(values["--predictions"])
    if store.read_manifest() is None:
        print_error(f"{store.manifest_path} not found: {store} is no prediction store")
        return 2
    try:
        written = write_whole(out, lambda folder: export(store, values["--to"], folder, size))
    except StoreError as error:
        print_error(str(error))
        return 2
    print(f"wrote {out} ({values['--to']}: {', '.join(f'{name}: {n} image(s)' for name, n in written.items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
