"""DICOM pixels -> grey float32 ``[H, W]`` in [0, 1], as a radiologist's viewer would show them.

Pipeline (pydicom 3 ``pydicom.pixels``; JPEG transfer syntaxes decode through pylibjpeg):

1. decode the stored values (``Dataset.pixel_array``: native, RLE, JPEG Baseline/Lossless,
   JPEG-LS/2000 where a plugin is installed);
2. modality LUT: ``RescaleSlope``/``RescaleIntercept`` or a Modality LUT Sequence;
3. VOI: the first VOI LUT, else the first ``WindowCenter``/``WindowWidth`` (values outside the
   window are clipped by the window);
4. ``MONOCHROME1`` (high value = dark) is inverted;
5. scale to [0, 1] by **min-max over the image**. Steps 4 and 5 are done as min-max then
   ``1 - x``, which is the same thing; so a constant image becomes 0 (MONOCHROME2) or 1
   (MONOCHROME1).

Why min-max rather than dividing by ``2**BitsStored``: ``BitsStored`` often overstates the
range actually used (VinDr-CXR stores 12-bit data in 14-16-bit declarations), which would
leave an unwindowed image nearly black; after windowing, min-max maps the window onto
[0, 1]; and the models were trained on full-range 8-bit exports. For the 8-bit NIH-derived
RSNA and SIIM files, which span 0..255 (the real SIIM sample does), it equals the ``/255``
used for NIH PNGs, so NIH, RSNA and SIIM pixels agree. The image keeps its stored
``Rows x Columns`` grid: annotations are in those pixel coordinates (never PixelSpacing).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydicom import dcmread
from pydicom.errors import InvalidDicomError
from pydicom.pixels import apply_modality_lut, apply_voi_lut

from xbench_pl.data.errors import DataError
from xbench_pl.data.groups import metadata_groups

GREY = ("MONOCHROME1", "MONOCHROME2")


def read_dicom(path: str | Path) -> np.ndarray:
    """Decode a single-frame greyscale DICOM to float32 ``[H, W]`` in [0, 1] (see module doc).

    Raises ``DataError`` naming the file when it is not DICOM, is truncated or corrupt, has
    no pixel data, or is not a single-frame MONOCHROME1/2 image.
    """
    path = Path(path)
    try:
        dataset = dcmread(path)
    except (InvalidDicomError, OSError, EOFError, ValueError) as error:
        raise DataError(path, f"not a readable DICOM file ({error})") from error
    if "PixelData" not in dataset:
        raise DataError(path, "DICOM file has no pixel data (or it is truncated)")
    photometric = str(dataset.get("PhotometricInterpretation", ""))
    if photometric not in GREY or int(dataset.get("NumberOfFrames", 1) or 1) != 1:
        raise DataError(path, f"expected a single-frame MONOCHROME1/2 image, got {photometric or 'no'} "
                              f"photometric interpretation and {dataset.get('NumberOfFrames', 1)} frame(s)")
    try:
        stored = dataset.pixel_array
        values = apply_voi_lut(apply_modality_lut(stored, dataset), dataset).astype(np.float64)
    except Exception as error:  # pydicom and its decoder plugins raise many types on damaged pixel data
        raise DataError(path, f"cannot decode DICOM pixel data ({type(error).__name__}: {error})") from error
    if values.ndim != 2:
        raise DataError(path, f"expected a 2-D image, decoded shape {values.shape}")
    low, high = values.min(), values.max()
    image = ((values - low) / (high - low) if high > low else np.zeros_like(values)).astype(np.float32)
    return 1.0 - image if photometric == "MONOCHROME1" else image


def read_dicom_size(path: str | Path) -> tuple[int, int]:
    """``(Rows, Columns)`` from the header only; ``DataError`` naming the file if unreadable."""
    return read_dicom_header(path, groups=False)[0]


#: the header tags of a record's subgroups (``xbench_pl.data.groups``): sex, age (``nnnY``), view
GROUP_TAGS = ("PatientSex", "PatientAge", "ViewPosition")


def read_dicom_header(path: str | Path, groups: bool = True) -> tuple[tuple[int, int], dict[str, str] | None]:
    """``((Rows, Columns), groups)`` from one header read (no pixel data): ``groups`` is the image's
    ``metadata_groups`` from PatientSex, PatientAge and ViewPosition (a missing or empty tag is
    ``unknown``), None when not asked for; ``DataError`` naming the file if unreadable."""
    path = Path(path)
    tags = ["Rows", "Columns", *(GROUP_TAGS if groups else ())]
    try:
        dataset = dcmread(path, stop_before_pixels=True, specific_tags=tags)
        size = int(dataset.Rows), int(dataset.Columns)
        if not groups:
            return size, None
        cells = [dataset.get(tag) for tag in GROUP_TAGS]  # the value, None where the tag is absent
        return size, metadata_groups(*(None if value in (None, "") else value for value in cells))
    except (InvalidDicomError, OSError, EOFError, ValueError, AttributeError, TypeError) as error:
        raise DataError(path, f"not a readable DICOM file ({error})") from error
