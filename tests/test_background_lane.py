"""The suite's background lane (``background_lane``) runs its jobs in order beside the test process, hands each
test its job's value or exception, and gives a job's processes the session's environment, not a test's."""

import os
import subprocess
import sys
import threading

import pytest
from background_lane import NICENESS, BackgroundLane
from test_cli import cli_env


def test_jobs_run_in_order_in_another_thread_and_their_errors_reach_the_test(tmp_path):
    ran = []

    def first(folder):
        ran.append(("first", folder, threading.current_thread() is threading.main_thread()))
        return 1

    def failing(folder):
        ran.append(("failing", folder, threading.current_thread() is threading.main_thread()))
        raise ValueError("the job's own error")

    lane = BackgroundLane({first: tmp_path / "a", failing: tmp_path / "b"})
    with pytest.raises(ValueError, match="the job's own error"):
        lane.result(failing)
    assert lane.result(first) == 1
    lane.stop()
    assert ran == [("first", tmp_path / "a", False), ("failing", tmp_path / "b", False)]


def test_a_job_gets_the_sessions_environment_not_what_a_test_set_meanwhile(monkeypatch):
    monkeypatch.setenv("XBENCH_TEST_SET_BY_A_TEST", "1")
    seen = {}
    job = threading.Thread(target=lambda: seen.update(cli_env(EXTRA="2")))
    job.start()
    job.join()
    assert "XBENCH_TEST_SET_BY_A_TEST" not in seen and seen["EXTRA"] == "2" and seen["HF_HUB_OFFLINE"] == "1"
    assert cli_env()["XBENCH_TEST_SET_BY_A_TEST"] == "1"  # a test's own command sees what the test set


@pytest.mark.skipif(sys.platform != "linux", reason="a thread has a niceness of its own on Linux only")
def test_a_jobs_processes_yield_the_cores_to_the_test_process(tmp_path):
    def niceness(folder):
        return int(subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True, text=True).stdout)

    ours = os.nice(0)
    lane = BackgroundLane({niceness: tmp_path})
    assert lane.result(niceness) == min(ours + NICENESS, 19)
    lane.stop()
    assert os.nice(0) == ours  # the test process keeps its priority
