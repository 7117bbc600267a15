"""The affine each preprocessing reports is where the pixels really go; maps come back exactly."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF

from xbench_pl.data.regions import Box
from xbench_pl.geometry import Preprocess, warp_to_eval_grid

SPECS = [
    Preprocess(resize="squash", size=64),
    Preprocess(resize="crop", size=64, interpolation="bicubic"),
    Preprocess(resize="letterbox", size=56, canvas=64, interpolation="area"),
]
SHAPES = [(120, 200), (200, 120), (97, 97), (151, 64)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.resize)
@pytest.mark.parametrize("shape", SHAPES)
def test_affine_tracks_a_marker_block(spec, shape):
    h, w = shape
    image = np.zeros(shape, dtype=np.float32)
    y0, x0 = h // 2 - 10, w // 2 + 3  # a 16 x 16 bright block near the centre
    image[y0:y0 + 16, x0:x0 + 16] = 1.0
    pixels, affine = spec(image)
    assert pixels.shape == (3, spec.size, spec.size)
    sx, sy, tx, ty = affine.tolist()
    grey = pixels[0] * spec.std[0] + spec.mean[0]
    ys, xs = torch.nonzero(grey > 0.5, as_tuple=True)
    # centre of the block in the model input, vs the affine image of its centre
    assert xs.float().mean().item() + 0.5 == pytest.approx(sx * (x0 + 8) + tx, abs=0.6)
    assert ys.float().mean().item() + 0.5 == pytest.approx(sy * (y0 + 8) + ty, abs=0.6)


@pytest.mark.parametrize("shape", SHAPES + [(880, 1760), (1760, 880)])  # 880x1760: int(224 * 2.0) vs int(1760 * 224/880) differ
def test_crop_geometry_equals_torchvision_resize_and_centre_crop(shape):
    spec = Preprocess(resize="crop", size=64)
    image = np.random.default_rng(0).random(shape, dtype=np.float32)
    ours, affine = spec(image)
    resized = TF.resize(torch.from_numpy(image)[None], 64, antialias=False)
    theirs = TF.center_crop(resized, 64)[0]
    # same size after resize and the same crop offset: the affine shift matches torchvision's crop
    offset_x = int(round((resized.shape[-1] - 64) / 2.0))
    offset_y = int(round((resized.shape[-2] - 64) / 2.0))
    assert affine[2].item() == -offset_x and affine[3].item() == -offset_y
    assert affine[0].item() == pytest.approx(resized.shape[-1] / shape[1])
    grey = ours[0] * spec.std[0] + spec.mean[0]
    assert torch.allclose(grey, theirs, atol=0.02)


def test_letterbox_pads_and_crops_like_carzero_geometry():
    spec = Preprocess(resize="letterbox", size=224, canvas=256)
    _, affine = spec(np.zeros((300, 500), dtype=np.float32))
    # long side 500 -> 256 (scale 0.512), short 300 -> 154 px, pad (256 - 154) // 2 = 51, crop 16
    assert affine.tolist() == pytest.approx([256 / 500, 154 / 300, -16.0, 51 - 16.0])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.resize)
def test_warp_samples_a_linear_map_exactly(spec):
    """A map linear in input x, warped back, equals that linear function of the affine-mapped eval centres."""
    h, w, e = 120, 200, 40
    _, affine = spec(np.zeros((h, w), dtype=np.float32))
    n = 16  # native grid cells over the input
    cell_centres = (torch.arange(n) + 0.5) * spec.size / n
    ramp = cell_centres[None, :].expand(n, n)[None]
    out = warp_to_eval_grid(ramp, affine[None], spec.size, torch.tensor([[h, w]]), e)[0]
    xs = (torch.arange(e, dtype=torch.float64) + 0.5) * w / e
    u = affine[0] * xs + affine[2]
    seen = (u >= cell_centres[0]) & (u <= cell_centres[-1])  # interior: bilinear is exact on linear data
    assert torch.allclose(out[0, seen].double(), u[seen], atol=1e-3)
    outside = (u < 0) | (u > spec.size)
    assert torch.all(out[:, outside] == ramp.min())  # never seen by the model: counts as background


def test_box_region_and_its_model_input_footprint_coincide_after_warp():
    spec = Preprocess(resize="crop", size=224)
    h, w, e = 300, 400, 100
    box = Box(150.0, 90.0, 260.0, 200.0)
    _, affine = spec(np.zeros((h, w), dtype=np.float32))
    sx, sy, tx, ty = affine.tolist()
    footprint = torch.zeros(1, 224, 224)
    footprint[0, round(sy * box.y0 + ty):round(sy * box.y1 + ty), round(sx * box.x0 + tx):round(sx * box.x1 + tx)] = 1
    warped = warp_to_eval_grid(footprint, affine[None], 224, torch.tensor([[h, w]]), e)[0] >= 0.5
    truth = torch.from_numpy(box.rasterize(h, w, e))
    iou = (warped & truth).sum() / (warped | truth).sum()
    assert iou > 0.95


def test_invalid_preprocess_is_rejected():
    with pytest.raises(ValueError, match="letterbox"):
        Preprocess(resize="letterbox", size=224)
    with pytest.raises(ValueError, match="squash, crop or letterbox"):
        Preprocess(resize="pad")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.resize)
def test_separable_warp_equals_grid_sample(spec):
    h, w, e = 90, 130, 48
    _, affine = spec(np.zeros((h, w), dtype=np.float32))
    maps = torch.randn(3, 7, 7, generator=torch.Generator().manual_seed(0))
    ours = warp_to_eval_grid(maps, affine.expand(3, 4), spec.size, torch.tensor([[h, w]]).expand(3, 2), e)
    xs = (torch.arange(e, dtype=torch.float64) + 0.5) * w / e
    ys = (torch.arange(e, dtype=torch.float64) + 0.5) * h / e
    gx = 2 * (affine[0] * xs + affine[2]) / spec.size - 1
    gy = 2 * (affine[1] * ys + affine[3]) / spec.size - 1
    grid = torch.stack(torch.broadcast_tensors(gx[None, :], gy[:, None]), -1).float()[None].expand(3, e, e, 2)
    reference = F.grid_sample(maps[:, None], grid, mode="bilinear", padding_mode="border", align_corners=False)[:, 0]
    unseen = (gx.abs() > 1)[None, :] | (gy.abs() > 1)[:, None]
    reference = torch.where(unseen, maps.flatten(1).amin(1)[:, None, None], reference)
    assert torch.allclose(ours, reference, atol=1e-5)


def test_letterbox_resize_refuses_an_interpolation_its_affine_does_not_describe():
    for mode in ("nearest", "area"):
        with pytest.raises(ValueError, match="letterbox_resize' needs interpolation 'bilinear' or 'bicubic'"):
            Preprocess("letterbox_resize", 224, 320, interpolation=mode)
    assert Preprocess("letterbox_resize", 224, 320, interpolation="bicubic").canvas == 320
