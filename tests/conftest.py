import os

# No network at test time: hubs offline, W&B offline, albumentations' update check off.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from background_lane import BackgroundLane  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def tracked_files() -> set[str] | None:
    """The files git tracks in the working tree; None outside a git checkout."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True)
    return set(listing.stdout.split("\0")) - {""} if listing.returncode == 0 else None


TRACKED = tracked_files()


def tree_entries() -> set[str]:
    """The files of the working tree that git does not track (untracked or ignored), bytecode, pytest's cache
    and virtual environments aside; empty outside a git checkout. A walk, not ``git status --ignored``, which
    would list every file of a ``.venv`` in the clone, twice a test."""
    if TRACKED is None:
        return set()
    entries = set()
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [name for name in subfolders if name not in (".git", "__pycache__", ".pytest_cache")
                         and not os.path.isfile(os.path.join(folder, name, "pyvenv.cfg"))]
        relative = os.path.relpath(folder, REPO)
        entries.update(name if relative == "." else f"{relative}/{name}" for name in files)
    return entries - TRACKED


@pytest.fixture(autouse=True)
def writes_nothing_into_the_tree():
    """Tests write under tmp_path only: a file a test leaves in the working tree fails it."""
    before = tree_entries()
    yield
    if new := sorted(tree_entries() - before):
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
    session's DDP pair (``test_cli.DDPPair``) where a selected test is marked ``ddp_pair``: its ranks' start-up then
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
    """``@pytest.mark.cuda`` tests need a CUDA GPU: skipped without one, so the suite needs none."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
