"""Weight-free baselines: maps that ignore the image.

Every VLM's grounding must beat these to show it looks at the image at all. Their scores
are a constant 0.5 (AUROC 0.5; F1 0 at the default 0.5 threshold, which needs score > 0.5).
They read no pixels, so their input is a tiny squash (the map covers the whole original).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from jsonargparse.typing import PositiveFloat, PositiveInt

from xbench_pl.data.annotations import parse_box
from xbench_pl.data.errors import DataError
from xbench_pl.data.nih_bbox import read_box_table
from xbench_pl.data.vocabulary import canonical
from xbench_pl.geometry import Preprocess
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput
from xbench_pl.outputs import atomic_write, file_bytes


class MapBaseline(ZeroShotModel):
    """A fixed map per class, broadcast over the batch, with constant scores.

    Args:
        random_init: accepted so that every model takes the same smoke command; a baseline has no weights.
        **kwargs: ``ZeroShotModel`` arguments.
    """

    def __init__(self, random_init: bool = False, **kwargs):
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
    """A centred isotropic Gaussian (in image-relative coordinates).

    Args:
        sigma: the Gaussian's standard deviation, a fraction of the image side.
        grid: the side of the map.
    """

    def __init__(self, sigma: PositiveFloat = 0.25, grid: PositiveInt = 64, **kwargs):
        super().__init__(**kwargs)
        if sigma <= 0:
            raise ValueError("sigma must be positive")
        centres = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid - 0.5
        self.register_buffer("gaussian", torch.exp(-(centres[:, None] ** 2 + centres[None, :] ** 2) / (2 * sigma**2)).float())

    def class_map(self, name: str) -> torch.Tensor:
        return self.gaussian


PRIOR_GRID, PRIOR_IMAGE_SIZE = 64, 1024


def prior_asset() -> Path:
    """The stored NIH location prior: derived counts, not the table (``write_prior`` makes it)."""
    return Path(str(resources.files("xbench_pl.models") / "assets" / "location_prior_nih.npz"))


def box_occupancy(table: str | Path, exclude: Iterable[str] = (), image_size: int = PRIOR_IMAGE_SIZE,
                  grid: int = PRIOR_GRID) -> dict[str, tuple[np.ndarray, int]]:
    """Per canonical finding of an NIH-format box table: ``(counts, images)``, where ``counts``
    ``[grid, grid]`` int64 sums over the ``images`` images with that finding the raster of the
    union of their boxes (boxes in an ``image_size``² frame; grid-cell centres sampled).
    A malformed row or unknown finding is a ``DataError`` naming file and row."""
    boxes = read_box_table(table)
    boxes = boxes[~boxes["image_id"].isin(set(exclude))]
    occupancy: dict[tuple[str, str], np.ndarray] = {}
    for row in boxes.itertuples(index=False):
        try:
            key = (canonical(row.finding), row.image_id)
            box = parse_box((row.x, row.y, row.w, row.h), "xywh")
        except (KeyError, ValueError) as error:
            raise DataError(table, str(error).strip('"'), row=row.row) from None
        mask = box.rasterize(image_size, image_size, grid)
        occupancy[key] = occupancy.get(key, np.zeros_like(mask)) | mask
    out: dict[str, tuple[np.ndarray, int]] = {}
    for (finding, _), mask in sorted(occupancy.items()):
        counts, images = out.get(finding, (np.zeros((grid, grid), np.int64), 0))
        out[finding] = (counts + mask, images + 1)
    return out


def write_prior(table: str | Path, out: str | Path | None = None) -> Path:
    """Store ``box_occupancy(table)`` (grid 64, 1024² frame) as the packaged prior: uint16 counts
    per finding and image counts, from which the prior is exact (counts / images)."""
    occupancy = box_occupancy(table)
    out = Path(out) if out is not None else prior_asset()
    out.parent.mkdir(parents=True, exist_ok=True)
    findings = sorted(occupancy)
    counts = np.stack([occupancy[f][0] for f in findings])
    if counts.max() > np.iinfo(np.uint16).max:
        raise ValueError("occupancy counts overflow uint16")
    arrays = {"findings": np.array(findings), "counts": counts.astype(np.uint16),
              "images": np.array([occupancy[f][1] for f in findings], np.int64),
              "image_size": np.int64(PRIOR_IMAGE_SIZE), "grid": np.int64(PRIOR_GRID),
              "source": np.array(f"NIH ChestX-ray14 {Path(table).name}: {sum(occupancy[f][1] for f in findings)} "
                                 "(finding, image) pairs")}
    # into a file object: numpy adds no ".npz" and the bytes depend only on the data
    atomic_write(out, file_bytes(lambda file: np.savez_compressed(file, **arrays)))
    return out


def read_prior(path: str | Path | None = None) -> dict[str, tuple[np.ndarray, int]]:
    """The stored prior as ``box_occupancy`` returns it."""
    with np.load(path or prior_asset(), allow_pickle=False) as data:
        return {str(f): (c.astype(np.int64), int(n)) for f, c, n in zip(data["findings"], data["counts"], data["images"])}


class LocationPriorBaseline(MapBaseline):
    """Per-class mean region occupancy: where this finding's boxes usually are, in image-relative coordinates.

    Default: the full public NIH ``BBox_List_2017.csv`` (880 images, 984 boxes), stored in the
    package only as derived figures (``models/assets/location_prior_nih.npz``: per finding, the
    64 x 64 occupancy counts and the number of images; ``python -m xbench_pl.models.baselines
    BBox_List_2017.csv.gz`` regenerates it, and a test recomputes it from the table). Or any
    NIH-format ``table``, minus the ``exclude`` image ids, at any ``grid``. Each image's boxes of
    a finding are united on a ``grid x grid`` raster of the ``image_size``² frame; the prior is
    their mean. A finding the table lacks gets the mean over all findings (warned, listed in
    ``fallback_classes``).
    """

    def __init__(self, table: str | None = None, exclude: list[str] | None = None, image_size: PositiveInt = PRIOR_IMAGE_SIZE,
                 grid: PositiveInt = PRIOR_GRID, **kwargs):
        super().__init__(**kwargs)
        if table is None:
            if exclude or (image_size, grid) != (PRIOR_IMAGE_SIZE, PRIOR_GRID):
                raise ValueError(f"the stored NIH prior is the whole table on a {PRIOR_GRID}x{PRIOR_GRID} grid of the "
                                 f"{PRIOR_IMAGE_SIZE}² frame; for exclude/grid/image_size pass table=BBox_List_2017.csv")
            occupancy = read_prior()
        else:
            occupancy = box_occupancy(table, exclude or (), image_size, grid)
        if not occupancy:
            raise ValueError("location prior: the box table has no boxes left after exclusion")
        self.priors = {k: torch.from_numpy(counts / images).float() for k, (counts, images) in occupancy.items()}
        total = sum(counts for counts, _ in occupancy.values())
        self.pooled = torch.from_numpy(total / sum(images for _, images in occupancy.values())).float()
        self.fallback_classes: list[str] = []

    def class_map(self, name: str) -> torch.Tensor:
        if name not in self.priors:
            if name not in self.fallback_classes:
                warnings.warn(f"location_prior: no boxes of {name!r} in the table; using the all-findings prior")
                self.fallback_classes.append(name)
            return self.pooled
        return self.priors[name]


if __name__ == "__main__":  # python -m xbench_pl.models.baselines BBox_List_2017.csv[.gz] [OUT]: regenerate the stored prior
    print(write_prior(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
