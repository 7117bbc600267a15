"""Reading native files: images as grey float arrays in [0, 1] and annotation tables.

Structural problems (a missing table or column, an empty split) always raise ``DataError``.
Per-row and per-image problems go through a ``report`` callable (the datamodule's
``report``): it raises, or with ``on_error="skip"`` records a ``Problem`` and the caller
drops the row or image. A problem that is corrected (a box clipped to its image, an exact
duplicate row dropped) is always recorded, with its ``action``, and never raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from xbench_pl.data.dicom import read_dicom, read_dicom_header, read_dicom_size
from xbench_pl.data.errors import DataError


Report = Callable[[DataError], None]


def raise_error(error: DataError) -> None:
    """The strict ``report``: every problem stops the run."""
    raise error


def read_image(path: str | Path) -> np.ndarray:
    """Decode an image file to a grey ``[H, W]`` float32 array in [0, 1].

    PNG/JPEG (8 or 16 bit, grey, RGB or RGBA: colour is converted to luminance) through
    Pillow; DICOM through ``xbench_pl.data.dicom``. Raises ``DataError`` naming the file.
    """
    return _read(path, header_only=False)


def read_image_size(path: str | Path) -> tuple[int, int]:
    """``(H, W)`` from the file header alone (no pixel decoding); ``DataError`` naming the file."""
    return _read(path, header_only=True)


def read_image_header(path: str | Path, dicom_groups: bool = False) -> tuple[tuple[int, int], dict[str, str] | None]:
    """``((H, W), groups)`` from the file header alone: ``groups`` are a DICOM's PatientSex, PatientAge and
    ViewPosition as ``metadata_groups`` when ``dicom_groups`` (the same single header read as the size),
    else None; ``DataError`` naming the file."""
    path = Path(path)
    if dicom_groups and path.is_file() and is_dicom(path):
        return read_dicom_header(path)
    return read_image_size(path), None


def _read(path: str | Path, header_only: bool):
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "image file not found")
    if is_dicom(path):
        return read_dicom_size(path) if header_only else read_dicom(path)
    try:
        with Image.open(path) as image:
            return (image.height, image.width) if header_only else _grey_pixels(image)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DataError(path, f"cannot decode image ({error})") from error


def _grey_pixels(image: Image.Image) -> np.ndarray:
    image.load()
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        array = np.asarray(image, dtype=np.float32)
        peak = 65535.0 if image.mode.startswith("I;16") else max(float(array.max()), 1.0)
        return np.clip(array / peak, 0.0, 1.0)
    return np.asarray(image.convert("L"), dtype=np.float32) / 255.0


def is_dicom(path: Path) -> bool:
    return path.suffix.lower() in (".dcm", ".dicom")


def read_table(path: str | Path, columns: Sequence[str]) -> pd.DataFrame:
    """A CSV annotation table (``.gz``/``.zip`` too) as strings, with a ``row`` column.

    Column names are matched after stripping blanks (SIIM writes ``" EncodedPixels"``) and
    come back stripped; ``row`` is each record's line in the file (header = 1); blank lines
    are dropped. A missing file or column raises ``DataError``.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "annotation table not found")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False)
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError) as error:
        raise DataError(path, f"cannot read table ({error})") from error
    table.columns = [str(c).strip() for c in table.columns]
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}; found {list(table.columns)}")
    table = table.apply(lambda column: column.str.strip())
    table["row"] = range(2, len(table) + 2)
    return table[(table.drop(columns="row") != "").any(axis=1)]


def drop_duplicate_rows(table: pd.DataFrame, columns: Sequence[str], path: str | Path, report: Report) -> pd.DataFrame:
    """Rows repeating an earlier row on ``columns`` are dropped (kept once) and always recorded."""
    first_row: dict[tuple, int] = {}
    keep = []
    for key, row in zip(table[list(columns)].itertuples(index=False, name=None), table["row"]):
        keep.append(key not in first_row)
        if keep[-1]:
            first_row[key] = row
        else:
            report(DataError(path, f"duplicate of row {first_row[key]}; dropped", row=row, action="deduplicated"))
    return table[keep]


def parse_floats(values: Sequence[str], what: str) -> tuple[float, ...]:
    """Finite floats from table cells; ``ValueError`` saying which ``what`` is malformed."""
    try:
        numbers = tuple(float(v) for v in values)
    except ValueError:
        raise ValueError(f"{what} {tuple(values)} is not numeric") from None
    if not all(np.isfinite(numbers)):
        raise ValueError(f"{what} {tuple(values)} is not finite")
    return numbers
