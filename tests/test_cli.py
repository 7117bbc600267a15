"""The CLI end to end: in subprocesses where the process itself is tested (DDP inside pytest would re-run
the whole session), else by ``main`` in this process, which spares the start-up and imports of a new one."""

import atexit
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest

from xbench_pl.commands import main
from xbench_pl.data.nih_bbox import DemoData
from xbench_pl.metrics import metric_keys
from xbench_pl.outputs import atomic_write

REPO = Path(__file__).resolve().parents[1]
ROW_KEYS = set(metric_keys()) | {"n_pos", "n_neg", "n_regions"}
SESSION_ENVIRON = dict(os.environ)  # as conftest set it: what the background lane's processes get


def cli_env(**extra) -> dict[str, str]:
    """The environment of a command the tests start: this one, offline, with the tests' fixture models importable.
    A background job (``background_lane``) gets the session's, not what a test beside it has set meanwhile."""
    environ = os.environ if threading.current_thread() is threading.main_thread() else SESSION_ENVIRON
    return {**environ, "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "NO_ALBUMENTATIONS_UPDATE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", **extra}


def cli(*args, timeout=300, **extra):
    """``python -m xbench_pl ARGS`` in a new process, ``extra`` added to its environment."""
    return python("-m", "xbench_pl", *args, timeout=timeout, **extra)


def python(*args, timeout=300, **extra) -> subprocess.CompletedProcess:
    """``python ARGS`` in a new process in the repository, with ``cli_env(**extra)``; its output captured."""
    return subprocess.run([sys.executable, *args], cwd=REPO, env=cli_env(**extra), capture_output=True, text=True,
                          timeout=timeout)


def start(args, **extra) -> subprocess.Popen:
    """``python -m xbench_pl ARGS`` started in a new process, ``extra`` added to its environment; ``finish`` waits
    for it. Its output goes to temporary files, not pipes: a rank blocked on a full pipe would stop in a collective,
    and so would the others."""
    output = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    process = subprocess.Popen([sys.executable, "-m", "xbench_pl", *args], cwd=REPO, env=cli_env(**extra),
                               stdout=output[0], stderr=output[1], text=True)
    process.output = output
    return process


def finish(processes: list[subprocess.Popen], timeout=300) -> list[subprocess.CompletedProcess]:
    """Each ``start``ed process's exit status and output. Once one fails, or ``timeout`` seconds have passed, the
    others are killed, the reason added to their stderr: a rank whose peer is gone would wait for it for ever."""
    deadline, reason = time.monotonic() + timeout, ""
    while any(process.poll() is None for process in processes) and not reason:
        if any(process.returncode for process in processes):
            reason = "killed: another process failed"
        elif time.monotonic() > deadline:
            reason = f"killed: not done after {timeout} s"
        time.sleep(0.1)
    finished = []
    for process in processes:
        killed = process.poll() is None
        if killed:
            process.kill()
            process.wait()
        out, err = (read_and_close(stream) for stream in process.output)
        finished.append(subprocess.CompletedProcess(process.args, process.returncode, out,
                                                    err + (f"\n{reason}\n" if killed else "")))
    return finished


def read_and_close(stream) -> str:
    with stream:
        stream.seek(0)
        return stream.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lightning_ddp(*args, **extra) -> subprocess.CompletedProcess:
    """``test|fit ARGS`` on 2 DDP processes as a user starts it: Lightning's launcher starts rank 1 once rank 0 has
    loaded the model."""
    return cli(*args, "--trainer.devices", "2", "--trainer.strategy", "ddp", **extra)


class WarmRanks:
    """``world`` processes of ``tests/warm_worker.py`` kept for the session, each running the command lines handed to it
    by ``main``, as ``in_process`` does: the start-up (seconds of imports) is paid once, not once a run. Two of them are
    the DDP pair (``DDP_PAIR``), started at once as torchrun starts them: each has the variables Lightning's launcher
    gives a rank (``LOCAL_RANK`` and the ``MASTER_ADDR``/``MASTER_PORT``/``NODE_RANK``/``WORLD_SIZE`` rank 0 also
    reads), and the process group is paid once too. One (``WARM_PROCESS``) has no DDP variables: the background lane's
    single-process runs. Started on first use, and afresh after a run that failed or ran out of time: its ranks are
    killed, as a rank whose peer failed may wait in a collective for ever."""

    def __init__(self, world: int):
        self.world = world
        self.ranks: list[subprocess.Popen] = []
        self.inbox, self.sent = Path(), 0

    def start(self) -> None:
        self.inbox, self.sent = Path(tempfile.mkdtemp(prefix=f"xbench-warm{self.world}-")), 0
        ddp = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0",
               "WORLD_SIZE": str(self.world)} if self.world > 1 else {}
        for rank in range(self.world):
            with open(self.inbox / f"rank{rank}.log", "w") as log:
                environment = cli_env(**ddp, LOCAL_RANK=str(rank)) if ddp else cli_env()
                self.ranks.append(subprocess.Popen([sys.executable, str(REPO / "tests" / "warm_worker.py"), str(self.inbox)],
                                                   cwd=REPO, env=environment, stdin=subprocess.DEVNULL, stdout=log, stderr=log))

    def send(self, command) -> int:
        number, self.sent = self.sent, self.sent + 1
        atomic_write(self.inbox / f"{number}.json", json.dumps(command))
        return number

    def submit(self, command: dict) -> int:
        """Give the ranks a command (``tests/warm_worker.py``) and return at once; ``wait`` for its number."""
        if not self.ranks:
            self.start()
        return self.send(command)

    def wait(self, number: int, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        answers = [self.inbox / f"{number}.rank{rank}.json" for rank in range(self.world)]
        deadline, problem = time.monotonic() + timeout, ""
        while not all(answer.exists() for answer in answers):
            if any(answer.exists() and json.loads(answer.read_text())["returncode"] for answer in answers):
                problem = "killed: the other rank failed"
            elif any(rank.poll() is not None for rank in self.ranks):
                problem = "killed: the other rank's process ended"
            elif time.monotonic() > deadline:
                problem = f"killed: not done after {timeout} s"
            if problem:
                break
            time.sleep(0.05)
        results = [json.loads(answer.read_text()) if answer.exists() else
                   {"returncode": -9, "stdout": "", "stderr": read_tail(self.inbox / f"rank{rank}.log") + problem + "\n"}
                   for rank, answer in enumerate(answers)]
        code = next((result["returncode"] for result in results if result["returncode"]), 0)
        if code:
            self.stop(kill=True)
        return subprocess.CompletedProcess(["xbench_pl", *args], code, "".join(r["stdout"] for r in results),
                                           "".join(r["stderr"] for r in results))

    def stop(self, kill=False) -> None:
        """Ask the ranks to end (``kill``: end them now), wait for them and remove their inbox."""
        if self.ranks and not kill:
            self.send(None)
        for rank in self.ranks:
            try:
                rank.wait(timeout=0 if kill else 10)
            except subprocess.TimeoutExpired:
                rank.kill()
                rank.wait()
        if self.ranks:
            shutil.rmtree(self.inbox, ignore_errors=True)
        self.ranks = []


def read_tail(path: Path, characters=3000) -> str:
    return path.read_text()[-characters:] if path.exists() else ""


DDP_PAIR, WARM_PROCESS = WarmRanks(2), WarmRanks(1)
atexit.register(DDP_PAIR.stop)
atexit.register(WARM_PROCESS.stop)


def warm_process(*args, timeout=300, **extra) -> subprocess.CompletedProcess:
    """``in_process(*args)`` in the session's warm process (``WARM_PROCESS``), ``extra`` added to its environment: what
    a background job runs, on the core the test process leaves idle, without a start-up of its own."""
    number = WARM_PROCESS.submit({"args": list(args), "environ": extra})
    return WARM_PROCESS.wait(number, list(args), timeout)


def warm_call(function: Callable, *args, timeout=300) -> subprocess.CompletedProcess:
    """``function(*args)`` in the session's warm process: ``function`` a module-level function of the tests, ``args``
    and its value JSON. Its value is the JSON of the result's stdout (exit status 0); an exception, its traceback in
    stderr (exit status 1)."""
    command = {"call": f"{function.__module__}:{function.__qualname__}", "args": list(args)}
    return WARM_PROCESS.wait(WARM_PROCESS.submit(command), [command["call"], *map(str, args)], timeout)


def ddp_ranks(*args, timeout=300, **extra) -> subprocess.CompletedProcess:
    """``lightning_ddp(*args)`` on the session's two DDP ranks (``DDP_PAIR``), ``extra`` added to their environment
    meanwhile. Exit status: the first non-zero; output: rank 0's, then rank 1's."""
    return ddp_ranks_started(*args, timeout=timeout, **extra)()


def ddp_ranks_started(*args, timeout=300, **extra) -> Callable[[], subprocess.CompletedProcess]:
    """``ddp_ranks(*args)`` handed to the pair now, to compute while this process goes on (with its one-process run,
    say): call what it returns for the run."""
    args = [*args, "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    number = DDP_PAIR.submit({"args": args, "environ": extra})
    return lambda: DDP_PAIR.wait(number, args, timeout)


def in_process(*args, **environ) -> subprocess.CompletedProcess:
    """``cli(*args)`` run by ``main`` in this process with ``environ`` added to the environment: its exit
    status, stdout and stderr, warnings on stderr as the command line prints them (``warning: ...``). pytest's
    own arguments are out of ``sys.argv`` meanwhile, as they are out of the command line."""
    out, err, saved = io.StringIO(), io.StringIO(), {name: os.environ.get(name) for name in environ}
    os.environ.update(environ)
    try:
        with (warnings.catch_warnings(record=True) as caught, redirect_stdout(out), redirect_stderr(err),
              mock.patch.object(sys, "argv", sys.argv[:1])):
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", DeprecationWarning)  # as on the command line: libraries' notes to their users' code
            try:
                code = main(list(args))
            except SystemExit as exit_:  # --help, --print_config
                code = exit_.code or 0
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    stderr = err.getvalue() + "".join(f"warning: {w.message}\n" for w in caught)
    return subprocess.CompletedProcess(["xbench_pl", *args], code, out.getvalue(), stderr)


def run_sweep_in_process(sweep_file: Path, out: Path) -> int:
    """``sweep SWEEP_FILE --out OUT`` with each run's ``python -m xbench_pl ...`` command run by ``in_process`` (its
    output into the run's log, as the subprocess writes it), not in a new process: the runs' commands, folders and
    summary as the sweep makes them, without a start-up per run. test_sweep runs sweeps in real subprocesses."""
    from xbench_pl.commands import sweep

    def run(command, stdout, stderr, env):
        assert command[:3] == [sys.executable, "-m", "xbench_pl"], command
        result = in_process(*command[3:], WANDB_MODE=env["WANDB_MODE"])
        stdout.write(result.stdout + result.stderr)
        return result

    with mock.patch.object(sweep, "subprocess", mock.Mock(run=run, STDOUT=subprocess.STDOUT)):
        return sweep.main([str(sweep_file), "--out", str(out)])


def one_and_two_processes(out: Path, *args, two: subprocess.CompletedProcess | None = None):
    """Run ``test ARGS`` in 1 process and in 2 DDP processes: (report of 1, report of 2, the DDP run), each report
    without its ``provenance`` (times, world size), which is checked and dropped. The one process is this one: the 2
    DDP processes are compared with the code the other tests run in process. They are the session's ``ddp_ranks``,
    computing while this one does, or ``two``: a run made already, out in ``out/two``."""
    pair = ddp_ranks_started(*args, "--out", str(out / "two")) if two is None else lambda: two
    one = in_process(*args, "--out", str(out / "one"))
    two = pair()
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = (json.loads((out / run / "metrics.json").read_text()) for run in ("one", "two"))
    assert (a.pop("provenance")["world_size"], b.pop("provenance")["world_size"]) == (1, 2)
    return a, b, two


def test_demo_benchmark_writes_metrics_json_and_table(tmp_path):
    result = in_process("test", "--model", "location_prior", "--data", "demo", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["model"] == "location_prior"
    demo = report["datasets"]["demo"]
    assert set(demo["mean"]) == ROW_KEYS and demo["problems"] == []
    assert len(demo["classes"]) == 8 and all(set(row) == ROW_KEYS for row in demo["classes"].values())
    assert demo["mean"]["n_regions"] == 12 and demo["mean"]["auroc"] == 0.5
    assert report["config"]["data"]["init_args"]["eval_size"] == 512
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert table[2].startswith("| demo ") and "| Cardiomegaly |" in (tmp_path / "metrics.md").read_text()


def one_image_on_lightnings_launcher(folder: Path) -> tuple[list[str], subprocess.CompletedProcess]:
    """The background job of the test below: ``test`` on one demo image in 2 DDP processes as a user starts them
    (Lightning's launcher), out in ``folder/two``; (the run's options, the run)."""
    split = folder / "split.csv"
    split.write_text("image_id\n" + min(r.image_id for r in DemoData().load_records()) + "\n")
    common = ["test", "--model", "fixture_models.IntensityModel", "--data", "demo", "--data.split_file", str(split),
              "--data.batch_size", "3", "--trainer.accelerator", "cpu"]
    return common, lightning_ddp(*common, "--out", str(folder / "two"))


@pytest.mark.background(job=one_image_on_lightnings_launcher)
def test_one_and_two_process_ddp_give_identical_metrics(background):
    """One image: rank 1 gets only the sampler's padding copy of it. (The odd split, 11 images over 2 ranks, is
    test_multinode's and, on one node, test_callbacks' runs.)"""
    folder, (common, two) = background
    a, b, two = one_and_two_processes(folder, *common, two=two)
    assert json.dumps(a) == json.dumps(b)  # every number, byte for byte
    assert "sync_dist" not in two.stderr and "Test metric" not in two.stdout  # quiet under DDP too
    mean = a["datasets"]["demo"]["mean"]
    assert mean["n_pos"] + mean["n_neg"] == 8  # the image exactly once, not its padding copy


def test_print_config_and_unknown_names():
    shown = in_process("test", "--model", "center", "--data", "demo", "--print_config")
    assert shown.returncode == 0 and "CenterBaseline" in shown.stdout and "sigma: 0.25" in shown.stdout
    unknown = in_process("test", "--model", "no_such_model", "--data", "demo")
    assert unknown.returncode != 0 and "no_such_model" in unknown.stderr


