import os

# No network at test time: hubs offline, W&B offline, albumentations' update check off.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def real_cxr() -> Path:
    """The real public samples in ../shared/data/real_cxr (CI clones the repo with shared/ beside it)."""
    candidates = [Path(os.environ["XBENCH_REAL_CXR"])] if "XBENCH_REAL_CXR" in os.environ else []
    candidates += [REPO.parent / "shared" / "data" / "real_cxr", REPO.parent.parent / "shared" / "data" / "real_cxr"]
    for path in candidates:
        if (path / "README.md").is_file():
            return path
    raise FileNotFoundError(f"real chest X-ray samples not found in {[str(c) for c in candidates]}; set XBENCH_REAL_CXR")
