"""Geometry between the original image frame, a model's input, and the evaluation grid.

Coordinates are continuous pixel coordinates: pixel ``i`` spans ``[i, i + 1)``. Every
preprocessing a model may ask for (squash, short-side resize + centre crop, letterbox +
centre crop, letterbox + resize) is an axis-aligned scale and shift, so one
``affine = (sx, sy, tx, ty)`` per sample says where an original point lands in the model
input: ``u = sx * x + tx``, ``v = sy * y + ty``. Saliency is mapped back through that affine
onto the evaluation grid, an ``E x E`` grid that uniformly covers the whole original image
(see ``warp_to_eval_grid``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import cv2
import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # imported where images are preprocessed: reading or scoring a dataset needs none (≈ 1 s of imports)
    import albumentations as A

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: A map is taken to span the whole image (plain bilinear resize) when its affine's shift is
#: zero and its scale maps the image onto the input to this many input pixels.
SPAN_TOLERANCE = 1e-6

_INTERPOLATION = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "area": cv2.INTER_AREA}


@dataclass(frozen=True)
class Preprocess:
    """How a model wants its input image.

    resize:
        ``"squash"``: resize the whole image to ``size x size`` (aspect ratio not kept).
        ``"crop"``: resize the short side to ``canvas`` (default ``size``; long side truncated, as
        torchvision's ``Resize(int)``), then centre-crop ``size x size`` (offset rounded, as torchvision's
        ``CenterCrop``); the image outside the central square is not seen (BioViL: 512, then 480).
        ``"letterbox"``: resize the long side to ``canvas``, zero-pad symmetrically to
        ``canvas x canvas`` (odd pad: the extra pixel goes right/bottom), then centre-crop
        ``size x size``.
        ``"letterbox_resize"``: letterbox to ``canvas x canvas`` as above, then resize that
        canvas to ``size x size`` with ``interpolation`` and never antialiased (torch's
        ``F.interpolate``, as torchvision's ``Resize`` on tensors before 0.17): CheXzero stores
        its images letterboxed at 320 and resizes those tensors to its 224-pixel ViT.
    crop_offset:
        how a centre crop's offset is rounded: ``"round"`` (torchvision's ``CenterCrop``) or ``"floor"``
        (transformers' image processors, ``image_transforms.center_crop``: ``(new - size) // 2``).
    antialias:
        resample as PIL does (torchvision's ``Resize`` on PIL images): when shrinking, the
        bilinear/bicubic kernel widens with the scale factor. Without it cv2 reads only the
        nearest 2x2 / 4x4 pixels, and a 2000-pixel X-ray shrunk to 224 aliases. It applies to
        the resize of the original image (not to ``letterbox_resize``'s second one).
    """

    resize: str = "squash"
    size: int = 224
    canvas: int | None = None
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    antialias: bool = False
    crop_offset: str = "round"

    def __post_init__(self) -> None:
        if self.resize not in ("squash", "crop", "letterbox", "letterbox_resize"):
            raise ValueError(f"Preprocess.resize must be squash, crop or letterbox (or letterbox_resize), got {self.resize!r}")
        if self.resize == "letterbox" and (self.canvas is None or self.canvas < self.size):
            raise ValueError("Preprocess.resize='letterbox' needs canvas >= size")
        if self.resize == "crop" and self.canvas is not None and self.canvas < self.size:
            raise ValueError("Preprocess.resize='crop' needs canvas >= size (or no canvas: the short side to size)")
        if self.resize == "letterbox_resize" and (self.canvas is None or self.canvas < 1):
            raise ValueError("Preprocess.resize='letterbox_resize' needs a positive canvas")
        if self.resize == "letterbox_resize" and self.interpolation not in ("bilinear", "bicubic"):
            # torch's nearest takes the floor, its area pools uneven bins: neither is the affine plan() returns
            raise ValueError("Preprocess.resize='letterbox_resize' needs interpolation 'bilinear' or 'bicubic'")
        if self.interpolation not in _INTERPOLATION:
            raise ValueError(f"Preprocess.interpolation must be one of {sorted(_INTERPOLATION)}")
        if self.antialias and self.interpolation not in ("bilinear", "bicubic"):
            raise ValueError("Preprocess.antialias needs interpolation 'bilinear' or 'bicubic'")
        if self.crop_offset not in ("round", "floor"):
            raise ValueError(f"Preprocess.crop_offset must be round or floor, got {self.crop_offset!r}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError("Preprocess.mean and .std need 3 values (the image is fed as RGB)")

    def plan(self, height: int, width: int) -> tuple[list[A.BasicTransform], tuple[float, float, float, float]]:
        """Albumentations ops for an image of this size, and the affine they realise."""
        import albumentations as A

        size = self.size
        if self.resize == "squash":
            new_h, new_w = size, size
        elif self.resize == "crop":
            short = self.canvas or size
            long = int(short * max(height, width) / min(height, width))  # torchvision's arithmetic, to the pixel
            new_h, new_w = (short, long) if height <= width else (long, short)
        else:
            scale = self.canvas / max(height, width)
            new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
        ops: list[A.BasicTransform] = [A.Resize(new_h, new_w, interpolation=_INTERPOLATION[self.interpolation])]
        pad_x = pad_y = 0
        if self.resize in ("letterbox", "letterbox_resize"):
            pad_x, pad_y = (self.canvas - new_w) // 2, (self.canvas - new_h) // 2
            ops.append(A.Pad(padding=(pad_x, pad_y, self.canvas - new_w - pad_x, self.canvas - new_h - pad_y), fill=0))
            new_h = new_w = self.canvas
        if self.resize == "letterbox_resize":
            ops.append(A.Lambda(image=partial(resize_tensor, size=size, mode=self.interpolation)))
            zoom = size / self.canvas
            return ops, (ops[0].width / width * zoom, ops[0].height / height * zoom, pad_x * zoom, pad_y * zoom)
        offset = (lambda extra: extra // 2) if self.crop_offset == "floor" else (lambda extra: int(round(extra / 2.0)))
        crop_x, crop_y = offset(new_w - size), offset(new_h - size)
        if (new_h, new_w) != (size, size):
            ops.append(A.Crop(crop_x, crop_y, crop_x + size, crop_y + size))
        affine = (ops[0].width / width, ops[0].height / height, float(pad_x - crop_x), float(pad_y - crop_y))
        return ops, affine

    def __call__(self, image: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Grey ``[H, W]`` float image in [0, 1] -> normalised ``[3, size, size]`` tensor and its affine ``[4]``."""
        if image.ndim != 2:
            raise ValueError(f"expected a grey [H, W] image, got shape {image.shape}")
        import albumentations as A

        ops, affine = self.plan(*image.shape)
        image = np.ascontiguousarray(image, dtype=np.float32)
        if self.antialias:
            resize, ops = ops[0], ops[1:]
            image = F.interpolate(torch.from_numpy(image)[None, None], size=(resize.height, resize.width),
                                  mode=self.interpolation, antialias=True)[0, 0].numpy()
        out = A.Compose(ops)(image=image)["image"]
        rgb = torch.from_numpy(np.ascontiguousarray(out)).expand(3, -1, -1)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(3, 1, 1)
        return (rgb - mean) / std, torch.tensor(affine, dtype=torch.float64)


def resize_tensor(image: np.ndarray, size: int, mode: str, **_) -> np.ndarray:
    """``[H, W]`` float image resized to ``size x size`` by torch, without antialiasing."""
    return F.interpolate(torch.from_numpy(image)[None, None], size=(size, size), mode=mode)[0, 0].numpy()


def spans_image(affine: torch.Tensor | None, input_size: int | None, height: int, width: int) -> bool:
    """Whether a map on an ``input_size`` square with this ``affine (sx, sy, tx, ty)`` covers exactly
    the ``height x width`` original (a squashed input); ``affine=None``: yes (an external map)."""
    if affine is None:
        return True
    sx, sy, tx, ty = (float(v) for v in affine)
    return (abs(tx) < SPAN_TOLERANCE and abs(ty) < SPAN_TOLERANCE
            and abs(sx * width - input_size) < SPAN_TOLERANCE * input_size
            and abs(sy * height - input_size) < SPAN_TOLERANCE * input_size)


def eval_pixel_centres(original_size: torch.Tensor, eval_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Original-frame x and y of the eval-grid pixel centres: ``[K, E]`` each, from ``original_size [K, 2] (H, W)``."""
    centres = (torch.arange(eval_size, dtype=torch.float64, device=original_size.device) + 0.5) / eval_size
    size = original_size.to(torch.float64)
    return centres * size[:, 1:2], centres * size[:, 0:1]


def _bilinear_weights(coords: torch.Tensor, cells: int, extent: int) -> torch.Tensor:
    """``[K, E, cells]`` weights that linearly interpolate ``cells`` values spanning ``[0, extent)``
    at ``coords [K, E]`` (cell centres at ``(i + 0.5) * extent / cells``, clamped at the border)."""
    k, e = coords.shape
    if cells == 1:
        return torch.ones(k, e, 1, dtype=torch.float32, device=coords.device)
    p = (coords * cells / extent - 0.5).clamp(0, cells - 1)
    left = p.floor().long().clamp(max=cells - 2)
    right_weight = (p - left).float()
    weights = torch.zeros(k, e, cells, dtype=torch.float32, device=coords.device)
    weights.scatter_(2, left[..., None], (1 - right_weight)[..., None])
    weights.scatter_add_(2, (left + 1)[..., None], right_weight[..., None])
    return weights


def warp_to_eval_grid(
    maps: torch.Tensor, affine: torch.Tensor, input_size: int, original_size: torch.Tensor, eval_size: int
) -> torch.Tensor:
    """Resample native saliency maps onto the evaluation grid of their original images.

    maps ``[K, h, w]`` cover the model input ``input_size x input_size``; ``affine [K, 4]``
    and ``original_size [K, 2] (H, W)`` describe each map's image. Returns ``[K, E, E]``:
    bilinear samples (align_corners=False, border-clamped, as ``F.grid_sample``) at the
    eval-pixel centres; pixels the model never saw (outside a centre crop) get the map's
    minimum, so they count as background. The affine is axis-aligned, so the resampling is
    separable: two small matrix products instead of a per-pixel gather.
    """
    return warped_and_seen(maps, affine, input_size, original_size, eval_size)[0]


def warped_and_seen(
    maps: torch.Tensor, affine: torch.Tensor, input_size: int, original_size: torch.Tensor, eval_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``warp_to_eval_grid``'s maps ``[K, E, E]`` and which of their pixels the model saw ``[K, E, E]`` bool (False
    outside a centre crop: those hold the map's minimum)."""
    u, v = input_coordinates(affine, original_size, eval_size)
    h, w = maps.shape[-2:]
    rows, cols = _bilinear_weights(v, h, input_size), _bilinear_weights(u, w, input_size)
    warped = rows @ maps.float() @ cols.transpose(1, 2)
    floor = maps.flatten(1).amin(dim=1).float()[:, None, None].expand_as(warped)
    seen = seen_pixels(u, v, input_size)
    return torch.where(seen, warped, floor), seen


def input_coordinates(affine: torch.Tensor, original_size: torch.Tensor, eval_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(u [K, E], v [K, E])``: the model-input coordinates of the eval-pixel centres' columns and rows."""
    xs, ys = eval_pixel_centres(original_size, eval_size)
    sx, sy, tx, ty = affine.to(torch.float64).unbind(-1)
    return sx[:, None] * xs + tx[:, None], sy[:, None] * ys + ty[:, None]


def seen_pixels(u: torch.Tensor, v: torch.Tensor, input_size: int) -> torch.Tensor:
    """``[K, E, E]`` bool: the eval pixels whose centre lies in the model input (``input_coordinates``)."""
    return ((v >= 0) & (v <= input_size))[:, :, None] & ((u >= 0) & (u <= input_size))[:, None, :]
