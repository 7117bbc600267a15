"""Weight-free baselines: maps that ignore the image.

Every VLM's grounding must beat these to show it looks at the image at all. Their scores
are a constant 0.5 (AUROC 0.5; F1 0 at the default 0.5 threshold, which needs score > 0.5).
They read no pixels, so their input is a tiny squash (the map covers the whole original).
"""

from __future__ import annotations

import warnings
from importlib import resources

import numpy as np
import torch

from xbench_pl.data.annotations import parse_box
from xbench_pl.data.io import DataError
from xbench_pl.data.nih_bbox import read_box_table
from xbench_pl.data.vocabulary import canonical
from xbench_pl.geometry import Preprocess
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput


class MapBaseline(ZeroShotModel):
    """A fixed map per class, broadcast over the batch, with constant scores."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.preprocess = Preprocess(resize="squash", size=32)

    def class_map(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        maps = torch.stack([self.class_map(name) for name in classes]).to(images.device)
        b = images.shape[0]
        return ZeroShotOutput(
            scores=torch.full((b, len(classes)), 0.5, device=images.device),
            saliency=maps[None].expand(b, -1, -1, -1),
        )


class UniformBaseline(MapBaseline):
    """A constant map: every pixel maximal, so Pointing Game = the region's area fraction (chance)."""

    def class_map(self, name: str) -> torch.Tensor:
        return torch.ones(1, 1)


class CenterBaseline(MapBaseline):
    """A centred isotropic Gaussian (in image-relative coordinates), ``sigma`` a fraction of the image side."""

    def __init__(self, sigma: float = 0.25, grid: int = 64, **kwargs):
        super().__init__(**kwargs)
        if sigma <= 0:
            raise ValueError("sigma must be positive")
        centres = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid - 0.5
        self.register_buffer("gaussian", torch.exp(-(centres[:, None] ** 2 + centres[None, :] ** 2) / (2 * sigma**2)).float())

    def class_map(self, name: str) -> torch.Tensor:
        return self.gaussian


def shipped_box_table() -> str:
    return str(resources.files("xbench_pl.data") / "assets" / "nih_boxes" / "BBox_List_2017.csv")


def demo_image_ids() -> list[str]:
    return read_box_table(resources.files("xbench_pl.data") / "assets" / "demo" / "BBox_List_2017.csv")["image_id"].unique().tolist()


class LocationPriorBaseline(MapBaseline):
    """Per-class mean region occupancy: where this finding's boxes usually are, in image-relative coordinates.

    Estimated from an NIH-format box table (default: the full public NIH ``BBox_List_2017.csv``
    shipped with the package) minus the ``exclude`` image ids (default: the ``demo`` images, so
    the prior never sees the images it is evaluated on). Each image's boxes of a finding are
    united on a ``grid x grid`` raster of the 1024² frame; the prior is their mean. A finding
    the table lacks gets the mean over all findings (warned, listed in ``fallback_classes``).
    """

    def __init__(self, table: str | None = None, exclude: list[str] | None = None, image_size: int = 1024, grid: int = 64, **kwargs):
        super().__init__(**kwargs)
        table = table or shipped_box_table()
        boxes = read_box_table(table)
        excluded = set(demo_image_ids() if exclude is None else exclude)
        boxes = boxes[~boxes["image_id"].isin(excluded)]
        occupancy: dict[tuple[str, str], np.ndarray] = {}
        for row in boxes.itertuples(index=False):
            try:
                key = (canonical(row.finding), row.image_id)
                box = parse_box((row.x, row.y, row.w, row.h), "xywh")
            except (KeyError, ValueError) as error:
                raise DataError(table, str(error).strip('"'), row=row.row) from None
            mask = box.rasterize(image_size, image_size, grid)
            occupancy[key] = occupancy.get(key, np.zeros_like(mask)) | mask
        per_class: dict[str, list[np.ndarray]] = {}
        for (finding, _), mask in occupancy.items():
            per_class.setdefault(finding, []).append(mask)
        if not per_class:
            raise ValueError("location prior: the box table has no boxes left after exclusion")
        self.priors = {k: torch.from_numpy(np.mean(v, axis=0, dtype=np.float64)).float() for k, v in per_class.items()}
        self.pooled = torch.from_numpy(np.mean([m for v in per_class.values() for m in v], axis=0, dtype=np.float64)).float()
        self.fallback_classes: list[str] = []

    def class_map(self, name: str) -> torch.Tensor:
        if name not in self.priors:
            if name not in self.fallback_classes:
                warnings.warn(f"location_prior: no boxes of {name!r} in the table; using the all-findings prior")
                self.fallback_classes.append(name)
            return self.pooled
        return self.priors[name]
