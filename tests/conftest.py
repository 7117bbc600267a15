import os

# No network at test time: hubs offline, W&B offline, albumentations' update check off.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import signal  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from background_lane import BackgroundLane  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# A suite started as a background job without job control (`cmd &` in a script) inherits SIGINT ignored, and its
# commands would too: the Ctrl-C test's run would never see its Ctrl-C. Python's own handler, as in a terminal: a
# child then starts with the default disposition and installs its KeyboardInterrupt.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def tracked_files() -> set[str] | None:
    """The files git tracks in the working tree; None outside a git checkout."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True)
    return set(listing.stdout.split("\0")) - {""} if listing.returncode == 0 else None


TRACKED = tracked_files()


class TreeGuard:
    """The files of the working tree that git does not track (untracked or ignored), bytecode, pytest's cache and
    virtual environments aside; empty outside a git checkout. A walk, not ``git status --ignored``, which would list
    every file of a ``.venv`` in the clone. Walked again only when a folder's mtime moved (adding or removing a file
    moves its folder's): between tests that write nothing it costs a stat per folder, not a walk."""

    def __init__(self):
        self.times: dict[str, int] = {}  # each folder walked: its mtime, taken before it was listed
        self.listed: set[str] = set()

    def entries(self) -> set[str]:
        if TRACKED is None:
            return set()
        if not self.times or self.moved():
            self.times, self.listed = {}, set()
            self.walk(str(REPO))
            self.listed -= TRACKED
        return self.listed

    def moved(self) -> bool:
        try:
            return any(os.stat(folder).st_mtime_ns != time for folder, time in self.times.items())
        except FileNotFoundError:
            return True

    def walk(self, folder: str) -> None:
        self.times[folder] = os.stat(folder).st_mtime_ns
        prefix = folder[len(str(REPO)) + 1:] + "/" if folder != str(REPO) else ""
        for entry in os.scandir(folder):
            if not entry.is_dir(follow_symlinks=False):
                self.listed.add(prefix + entry.name)
            elif entry.name not in (".git", "__pycache__", ".pytest_cache") and not os.path.isfile(
                    os.path.join(entry.path, "pyvenv.cfg")):
                self.walk(entry.path)


TREE = TreeGuard()


@pytest.fixture(autouse=True)
def writes_nothing_into_the_tree():
    """Tests write under tmp_path only: a file a test leaves in the working tree fails it."""
    before = TREE.entries()  # a walk lists into a new set: this one stays as it is
    yield
    if new := sorted(TREE.entries() - before):
        pytest.fail(f"the test wrote into the working tree: {new[:5]} (write under tmp_path)", pytrace=False)


def find_real_cxr() -> tuple[Path | None, list[Path]]:
    """The real public samples (``XBENCH_REAL_CXR``, else ``shared/data/real_cxr`` beside the
    clone or one level up), and every place looked at."""
    candidates = [Path(os.environ["XBENCH_REAL_CXR"])] if os.environ.get("XBENCH_REAL_CXR") else []
    candidates += [REPO.parent / "shared" / "data" / "real_cxr", REPO.parent.parent / "shared" / "data" / "real_cxr"]
    return next((path for path in candidates if (path / "README.md").is_file()), None), candidates


@pytest.fixture(scope="session")
def real_cxr() -> Path:
    """The real public samples, which the repository does not ship (they are not ours to
    redistribute). Absent (a user's clone): the test is skipped, saying where it looked.
    Under CI (``CI=true``) absence is a failure, so CI always runs these tests."""
    path, candidates = find_real_cxr()
    if path is not None:
        return path
    where = ", ".join(str(c) for c in candidates)
    message = f"real chest X-ray samples not found (looked in {where}; set XBENCH_REAL_CXR to their folder)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}: CI must run the real-sample tests", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session", autouse=True)
def background_lane(request, tmp_path_factory):
    """The jobs of the selected tests' ``background`` marks (``background_lane``), started with the first test; and the
    session's DDP pair (``test_cli.DDP_PAIR``) where a selected test is marked ``ddp_pair``: its ranks' start-up then
    runs beside the first tests, not in the first DDP test."""
    if any(item.get_closest_marker("ddp_pair") for item in request.session.items):
        from test_cli import DDP_PAIR

        DDP_PAIR.start()
    jobs = dict.fromkeys(mark.kwargs["job"] for item in request.session.items for mark in item.iter_markers("background"))
    lane = BackgroundLane({job: tmp_path_factory.mktemp(job.__name__) for job in jobs})
    yield lane
    lane.stop()


@pytest.fixture
def background(request, background_lane):
    """``(folder, value)``: the folder the job of the test's ``@pytest.mark.background(job=...)`` had and what it
    returned (the lane ran it beside earlier tests)."""
    job = request.node.get_closest_marker("background").kwargs["job"]
    return background_lane.folders[job], background_lane.result(job)


def pytest_collection_modifyitems(config, items):
    """The modules with a background job run last, in their order (the lane then has the session's first minutes for
    its jobs, and a module's fixtures are still made once). ``@pytest.mark.cuda`` tests need a CUDA GPU: skipped
    without one, so the suite needs none."""
    waiting = {item.path for item in items if item.get_closest_marker("background")}
    items.sort(key=lambda item: item.path in waiting)  # stable: the order within each part is kept
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
