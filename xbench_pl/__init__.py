"""xbench_pl: does a chest X-ray vision-language model look where the finding is?"""

import os

# albumentations checks PyPI for a newer release on import; a benchmark run must not phone home.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from xbench_pl.registry import available, create_datamodule, create_model  # noqa: E402

__all__ = ["available", "create_datamodule", "create_model"]
__version__ = "0.1.0"
