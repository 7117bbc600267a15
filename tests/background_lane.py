"""The suite's background lane: jobs that start fresh processes (``python -m xbench_pl ...``) and wait for them run
one after the other in a thread from the first test on, beside the tests that run in the test process. A fresh
process spends its first 12-16 s importing, on the core the test process leaves idle; the test that asserts on it
finds it done instead of waiting for it.

A test names its job with ``@pytest.mark.background(job=job)`` and receives ``(the job's folder, its return value)``
from the ``background`` fixture (conftest), or the job's exception. ``job(folder)`` starts its processes with
``test_cli``'s helpers, which give a job the session's environment as it was at the start: a job must not read or
change the test process's state (environment, working folder, ``sys.stdout``), as the tests beside it change them.
The lane starts only the jobs of the tests that were selected, in their order.

The lane runs at a lower priority (nice ``NICENESS``; on Linux niceness is a thread's, and the processes it starts
inherit it): the lane takes the cycles the test process leaves, and the test process's tensor threads are not slowed
by a job that runs beside them."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Job = Callable[[Path], Any]
NICENESS = 10


class BackgroundLane:
    def __init__(self, folders: dict[Job, Path]):
        self.folders = folders
        self.results: dict[Job, tuple[Any, BaseException | None]] = {}
        self.done = {job: threading.Event() for job in folders}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.work, name="background-lane", daemon=True)
        self.thread.start()

    def work(self) -> None:
        if sys.platform == "linux":  # elsewhere os.nice would lower the whole test process
            os.nice(NICENESS)
        try:
            for job, folder in self.folders.items():
                if self.stopping.is_set():
                    break
                try:
                    self.results[job] = (job(folder), None)
                except BaseException as error:  # noqa: BLE001 - raised again in the test that asked for the job
                    self.results[job] = (None, error)
                self.done[job].set()
        finally:
            for event in self.done.values():
                event.set()

    def result(self, job: Job) -> Any:
        """The value ``job`` returned, once it is done; its exception raised again if it raised."""
        self.done[job].wait()
        if job not in self.results:
            raise RuntimeError(f"the background lane stopped before {job.__name__}")
        value, error = self.results[job]
        if error is not None:
            raise error
        return value

    def stop(self) -> None:
        """At the end of the session: start no further job and wait for the one running (its processes end)."""
        self.stopping.set()
        self.thread.join()
