"""DICOM decoding: the real SIIM file (JPEG Baseline) and its MONOCHROME1 twin, synthetic
12-16 bit files with rescale and window, RLE Lossless, and damaged files."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest
from synthetic_dicom import write_dicom

from xbench_pl.data.dicom import read_dicom, read_dicom_size
from xbench_pl.data.errors import DataError
from xbench_pl.data.io import read_image

SIIM_FILE = "1.2.276.0.7230010.3.1.4.8323329.6904.1517875201.850819.dcm"


def test_real_siim_jpeg_baseline_decodes_to_unit_range(real_cxr):
    path = real_cxr / "siim" / SIIM_FILE
    assert pydicom.dcmread(path).file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.50"
    image = read_image(path)
    stored = pydicom.dcmread(path).pixel_array
    assert image.dtype == np.float32 and image.shape == (1024, 1024) == read_dicom_size(path)
    # 8-bit and spanning 0..255: min-max equals /255, as for the NIH PNGs
    assert stored.min() == 0 and stored.max() == 255
    np.testing.assert_allclose(image, stored / 255.0, atol=1e-6)


def test_monochrome1_twin_is_the_inverse(real_cxr):
    original = read_dicom(real_cxr / "siim" / SIIM_FILE)
    twin = read_dicom(real_cxr / "siim" / "Fake_MONOHR1.dcm")
    assert pydicom.dcmread(real_cxr / "siim" / "Fake_MONOHR1.dcm").PhotometricInterpretation == "MONOCHROME1"
    np.testing.assert_allclose(twin, 1.0 - original, atol=1e-6)
    assert not np.allclose(twin, original)


def linear_window(x: np.ndarray, center: float, width: float) -> np.ndarray:
    """DICOM PS3.3 C.11.2.1.2.1 LINEAR window, normalised to [0, 1]."""
    return np.clip((x - (center - 0.5)) / (width - 1) + 0.5, 0.0, 1.0)


@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_rescale_then_window_then_inversion(tmp_path, photometric):
    rng = np.random.default_rng(0)
    stored = rng.integers(0, 4096, size=(40, 56), dtype=np.uint16)
    stored[0, 0], stored[0, 1] = 0, 4095  # values on both sides of the window
    slope, intercept, center, width = 2.0, -1024.0, 2000.0, 3001.0
    path = write_dicom(tmp_path / "w.dcm", stored, photometric, bits_stored=12, rescale=(slope, intercept),
                       window=(center, width))
    expected = linear_window(stored * slope + intercept, center, width)
    if photometric == "MONOCHROME1":
        expected = 1.0 - expected
    np.testing.assert_allclose(read_dicom(path), expected, atol=1e-6)


def test_unwindowed_16bit_is_min_max_scaled(tmp_path):
    stored = np.arange(100, 100 + 30 * 20, dtype=np.uint16).reshape(30, 20) * 3
    image = read_dicom(write_dicom(tmp_path / "a.dcm", stored, bits_stored=16))
    np.testing.assert_allclose(image, (stored - stored.min()) / (stored.max() - stored.min()), atol=1e-6)
    assert image.min() == 0.0 and image.max() == 1.0


def test_rle_lossless_equals_uncompressed(tmp_path):
    stored = np.random.default_rng(1).integers(0, 65535, size=(33, 47), dtype=np.uint16)
    plain = write_dicom(tmp_path / "plain.dcm", stored)
    packed = write_dicom(tmp_path / "rle.dcm", stored, rle=True)
    assert pydicom.dcmread(packed).file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.5"
    np.testing.assert_array_equal(read_dicom(packed), read_dicom(plain))


def test_constant_image_is_zero_then_inverted_for_monochrome1(tmp_path):
    image = read_dicom(write_dicom(tmp_path / "c.dcm", np.full((8, 8), 7, np.uint8)))
    assert image.shape == (8, 8) and not image.any()
    inverted = read_dicom(write_dicom(tmp_path / "c1.dcm", np.full((8, 8), 7, np.uint8), "MONOCHROME1"))
    assert (inverted == 1.0).all()


@pytest.mark.filterwarnings("ignore:End of file reached before delimiter")  # pydicom on the file truncated here
def test_damaged_files_raise_data_error_naming_the_file(tmp_path, real_cxr):
    not_dicom = tmp_path / "text.dcm"
    not_dicom.write_text("this is not a DICOM file")
    truncated = tmp_path / "truncated.dcm"  # JPEG fragment cut: pydicom drops the pixel data element
    truncated.write_bytes((real_cxr / "siim" / SIIM_FILE).read_bytes()[:60_000])
    native = write_dicom(tmp_path / "native.dcm", np.zeros((64, 64), np.uint16))
    truncated_native = tmp_path / "truncated_native.dcm"
    truncated_native.write_bytes(native.read_bytes()[:-2000])
    no_pixels = tmp_path / "nopixels.dcm"
    ds = pydicom.dcmread(real_cxr / "siim" / SIIM_FILE)
    del ds.PixelData
    ds.save_as(no_pixels)
    for path, reason in [(not_dicom, "not a readable DICOM"), (truncated, "no pixel data .or it is truncated"),
                         (truncated_native, "cannot decode DICOM pixel data"),
                         (no_pixels, "no pixel data"), (tmp_path / "absent.dcm", "not found")]:
        with pytest.raises(DataError, match=reason) as caught:
            read_image(path)
        assert caught.value.problem.file == str(path)
