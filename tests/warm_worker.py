"""One rank of the warm processes the tests keep (``test_cli.WarmRanks``): the DDP pair's ranks, or the background lane's
one process. It starts once (a pair's rank joins the process group with the first run) and then runs each command line
the tests put in its inbox by ``main`` in this process, as ``in_process`` runs them in the test process. The start-up
(and a pair's process group) is paid once a session, not once a run.

Inbox protocol: the tests write ``N.json`` for N = 0, 1, ...: ``{"args": [...], "environ": {...}}``, a command line;
``{"call": "module:function", "args": [...]}``, a module-level function of the tests called with JSON arguments, its
JSON value as the answer's stdout; or ``null`` to stop. Rank R (``LOCAL_RANK``, 0 for a process outside DDP) answers
``N.rank<R>.json`` (``{"returncode", "stdout", "stderr"}``), each file written whole (``outputs.atomic_write``). A
rank stops when its parent (the test session) is gone."""

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

from test_cli import in_process

from xbench_pl.outputs import atomic_write


def main(inbox: Path) -> None:
    rank, parent = os.environ.get("LOCAL_RANK", "0"), os.getppid()
    for number in range(sys.maxsize):
        request = inbox / f"{number}.json"
        while not request.exists():
            if os.getppid() != parent:
                return
            time.sleep(0.02)
        command = json.loads(request.read_text())
        if command is None:
            return
        try:
            if "call" in command:
                module, _, name = command["call"].partition(":")
                value = getattr(importlib.import_module(module), name)(*command["args"])
                result = {"returncode": 0, "stdout": json.dumps(value), "stderr": ""}
            else:
                run = in_process(*command["args"], **command["environ"])
                result = {"returncode": run.returncode, "stdout": run.stdout, "stderr": run.stderr}
        except BaseException:  # noqa: BLE001 - the test that sent it reads the traceback
            result = {"returncode": 1, "stdout": "", "stderr": traceback.format_exc()}
        atomic_write(inbox / f"{number}.rank{rank}.json", json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
