"""The decode cache: same pixels as decoding, memory-mapped entries keyed by file size and
mtime, bounded size with exact geometry, and DataLoader workers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image
from synthetic_dicom import grey, make_rsna, write_dicom

from xbench_pl import create_datamodule
from xbench_pl.data.cache import ImageStore, quantize
from xbench_pl.data.io import read_image
from xbench_pl.geometry import Preprocess


def test_cached_pixels_equal_decoded_pixels(tmp_path):
    png = tmp_path / "a.png"
    Image.fromarray(grey(40, 30)).save(png)
    dicom = write_dicom(tmp_path / "b.dcm", grey(20, 50, dtype=np.uint16), "MONOCHROME1", bits_stored=12)
    plain, cached = ImageStore(), ImageStore(tmp_path / "cache")
    for path in (png, dicom):
        first, size = cached(path)
        again, _ = cached(path)
        reference, _ = plain(path)
        assert size == read_image(path).shape
        np.testing.assert_array_equal(first, reference)
        np.testing.assert_array_equal(again, reference)
        np.testing.assert_allclose(reference, read_image(path), atol=0.5 / 65535)
    np.testing.assert_array_equal(plain(png)[0], read_image(png))  # 8-bit: lossless
    entries = sorted((tmp_path / "cache").rglob("*.npy"))
    assert len(entries) == 2
    assert {np.load(e, mmap_mode="r").dtype for e in entries} == {np.dtype(np.uint8), np.dtype(np.uint16)}
    assert isinstance(cached.load(png)[0], np.memmap)


def test_entries_are_keyed_by_size_and_mtime(tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(path)
    store = ImageStore(tmp_path / "cache")
    assert store(path)[0].max() == 0
    stat = path.stat()
    Image.fromarray(np.full((16, 16), 255, np.uint8)).save(path)  # same byte size? not guaranteed: force mtime back
    if path.stat().st_size == stat.st_size:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert store(path)[0].max() == 0  # same key: the cached pixels, no decoding
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert store(path)[0].min() == 1.0  # new mtime: decoded again


def test_damaged_entry_is_rebuilt(tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(grey(12, 12)).save(path)
    store = ImageStore(tmp_path / "cache")
    expected = store(path)[0]
    entry = store.entry(path)
    entry.write_bytes(b"garbage")
    np.testing.assert_array_equal(store(path)[0], expected)
    assert np.load(entry).shape == (12, 12)


@pytest.mark.parametrize("preprocess", [Preprocess(size=32), Preprocess(resize="crop", size=32),
                                        Preprocess(resize="letterbox", size=32, canvas=40)], ids=lambda p: p.resize)
def test_max_side_keeps_geometry_exact(tmp_path, preprocess):
    root = make_rsna(tmp_path / "rsna")  # 96 x 128 images; "pos" becomes a smooth ramp to compare pixels
    ramp = np.add.outer(np.arange(96), 2 * np.arange(128)).astype(np.uint16)
    write_dicom(root / "stage_2_train_images" / "pos.dcm", ramp)
    batches = {}
    for max_side in (None, 50):  # stored 38 x 50: scaled by 38/96 and 50/128, not one uniform factor
        dm = create_datamodule("rsna_pneumonia", root=str(root), preprocess=preprocess, eval_size=32,
                               max_side=max_side, cache_dir=str(tmp_path / f"cache{max_side}"))
        dm.setup()
        batches[max_side] = next(iter(dm.test_dataloader()))
    full, small = batches[None], batches[50]
    assert ImageStore(max_side=50)(root / "stage_2_train_images" / "pos.dcm")[0].shape == (38, 50)
    assert torch.equal(small.original_size, full.original_size)
    torch.testing.assert_close(small.affine, full.affine)  # original -> model input, whatever was stored
    assert torch.equal(small.region_masks, full.region_masks)
    assert (small.images[0] - full.images[0]).abs().max() < 0.05  # same picture, resampled twice


def test_cache_with_dataloader_workers(tmp_path):
    root = make_rsna(tmp_path / "rsna", labels="patientId,x,y,width,height,Target\n" +
                     "".join(f"p{i},,,,,0\n" for i in range(6)), images=tuple(f"p{i}" for i in range(6)))
    runs = []
    for cache_dir in (tmp_path / "cache", tmp_path / "cache", None):
        dm = create_datamodule("rsna_pneumonia", root=str(root), preprocess=Preprocess(size=16), eval_size=8,
                               batch_size=2, num_workers=2, cache_dir=None if cache_dir is None else str(cache_dir))
        dm.setup()
        runs.append(torch.cat([b.images for b in dm.test_dataloader()]))
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 6
    assert not list((tmp_path / "cache").rglob(".tmp-*"))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_quantize_picks_the_lossless_depth():
    eight = np.arange(256, dtype=np.float32) / 255.0
    assert quantize(eight).dtype == np.uint8
    assert quantize(np.float32([0.5, 0.25])).dtype == np.uint16
