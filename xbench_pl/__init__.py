"""xbench_pl: does a chest X-ray vision-language model look where the finding is?"""

from xbench_pl.registry import available, create_datamodule, create_model

__all__ = ["available", "create_datamodule", "create_model"]
__version__ = "0.1.0"
