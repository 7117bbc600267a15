"""``python -m xbench_pl store upgrade DIR``.

Converts a prediction store of format 1 (``*.xbp`` shards: a ``torch.save`` pickle behind a
checksum) to this version's format (``*.safetensors`` shards, read by ``numpy`` and
``safetensors`` alone; docs/store.md), in place: each shard rewritten atomically, then the
manifest's ``format`` raised, then the old shards removed; safe to run again after a crash, and a
no-op on a current store. A shard that does not read back is moved to ``DIR/corrupt/`` (continue
the run with ``test ... --predictions DIR --resume`` to redo its images). Format 1 stores are read
by ``score``, ``compare`` and ``export`` as they are; ``test --resume`` needs the upgrade.
"""

from __future__ import annotations

import sys

from xbench_pl.commands import print_error
from xbench_pl.commands.arguments import PROG, command_help

USAGE = "store upgrade DIR"
OPTIONS = {"upgrade DIR": "convert the prediction store DIR to the current format, in place"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(command_help(USAGE, __doc__.split("\n\n", 1)[1], OPTIONS))
        return 0
    if len(argv) != 2 or argv[0] != "upgrade":
        print_error(f"usage: {PROG} {USAGE}")
        return 2
    from xbench_pl.prediction_store import FORMAT, Store, StoreError, upgrade  # here: --help starts without torch

    store = Store(argv[1])
    if not store.root.is_dir():
        print_error(f"store upgrade {store}: no such folder")
        return 2
    try:
        converted, bad = upgrade(store)
    except StoreError as error:
        print_error(str(error))
        return 2
    except OSError as error:  # a read-only or full disk: the shards converted so far stay, the rest are as they were
        print_error(f"{store}: cannot write a converted shard ({error}); run store upgrade again once it can")
        return 2
    print(f"{store}: format {FORMAT}, {converted} shard(s) converted"
          + (f"; {len(bad)} unreadable shard(s) set aside in {store.root / 'corrupt'} (redo their images with "
             f"{PROG} test ... --predictions {store} --resume)" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
