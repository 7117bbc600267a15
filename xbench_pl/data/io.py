"""Reading images as grey float arrays in [0, 1], and the errors bad input raises."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError


class DataError(ValueError):
    """Bad input: the message names the file (and row) and says what is wrong."""

    def __init__(self, file: str | Path, reason: str, row: int | str | None = None):
        self.problem = Problem(str(file), None if row is None else str(row), reason)
        super().__init__(str(self.problem))


@dataclass(frozen=True)
class Problem:
    """One bad input found while reading a dataset (a skipped row or image)."""

    file: str
    row: str | None
    reason: str

    def __str__(self) -> str:
        where = self.file if self.row is None else f"{self.file}, row {self.row}"
        return f"{where}: {self.reason}"

    def to_dict(self) -> dict:
        return asdict(self)


def read_image(path: str | Path) -> np.ndarray:
    """Decode an image file to a grey ``[H, W]`` float32 array in [0, 1].

    PNG/JPEG (8 or 16 bit, grey, RGB or RGBA: colour is converted to luminance) through
    Pillow; DICOM through ``xbench_pl.data.dicom``. Raises ``DataError`` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "image file not found")
    if path.suffix.lower() in (".dcm", ".dicom"):
        from xbench_pl.data.dicom import read_dicom

        return read_dicom(path)
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode in ("I;16", "I;16B", "I;16L", "I"):
                array = np.asarray(image, dtype=np.float32)
                peak = 65535.0 if image.mode.startswith("I;16") else max(float(array.max()), 1.0)
                return np.clip(array / peak, 0.0, 1.0)
            return np.asarray(image.convert("L"), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DataError(path, f"cannot decode image ({error})") from error
