"""CheXlocalize-comparable grounding: ``cxl_hit_rate``, ``cxl_miou``, ``cxl_miou_all``.

Each (image, finding) is judged as CheXlocalize's public evaluation judges a saliency map
(github rajpurkarlab/cheXlocalize, ``eval.py`` and ``heatmap_to_segmentation.py`` at
``2a79492``; read for the definitions, none of it copied), at the original image's full
resolution, never on the eval grid:

* **Map at full resolution.** A map spanning the whole original image (what CheXlocalize's
  ``*_map.pkl`` hold; a model with ``resize="squash"``) is resized to the original ``H x W``
  by ``F.interpolate(mode="bilinear", align_corners=False)`` in float32, as theirs. A model that
  crops or letterboxes sees only part of the image or more: its map is sampled bilinearly at every
  original pixel centre through the batch's affine (``geometry``), pixels the model never saw
  getting the map's minimum (our extension: CheXlocalize has no such maps).
* **Hit** (``cxl_hit_rate``): 1 if the map's maximum (the first in row-major order, as
  ``np.argmax``) lies inside the region, else 0; a pair whose image has no region of the
  finding is not counted (their ``NaN``).
* **Segmentation**: the map min-max normalised in float32 (``(m - min) / max(m - min)``),
  ``uint8(255 m)`` (truncated), Otsu's threshold (OpenCV ``THRESH_OTSU``: pixels above it),
  then every contour of that binary image (OpenCV ``RETR_TREE``, ``CHAIN_APPROX_SIMPLE``, holes'
  contours included) with more than one point filled as a PIL ``polygon(outline=1, fill=1)``:
  holes are filled and isolated single pixels dropped. A constant map (their 0/0) gives an empty
  segmentation, which is what their ``uint8(NaN)`` does on x86.
* **IoU** of the segmentation and the region, both ``H x W``: ``cxl_miou`` is their default
  ``true_pos_only=True``: only pairs where the region *and* the segmentation are non-empty count;
  ``cxl_miou_all`` is ``true_pos_only=False``: every (image, finding) pair of the evaluated images
  counts unless both are empty, so an image without the finding but with a segmentation scores 0.
* **Per finding** the mean over counted pairs: their per-image point estimate. (Their summary
  table prints the mean of 1,000 bootstrap replicates of it, rounded to 3 decimals, which
  tends to this value; their ``*_results_per_cxr.csv`` holds the per-pair values compared in
  ``tests/test_chexlocalize_mode.py``.) Their optional tuned thresholds, probability cut-offs
  and box smoothing are not reproduced: the numbers are those of their default pipeline.

**The human benchmark** (the ``reader`` model, ``reader_pair``): CheXlocalize judges its second
radiologists (``eval.py --if_human_benchmark``) without any map. Their segmentations
(``hb_segmentations_test.json``) are the segmentation as they are (no Otsu, no contour filling), in
the same IoU; the hit is ``hb_hit`` of their most salient points (``hb_salient_pt_test.json``,
``{cxr_id: {task: [[x, y], ...]}}``): per (image, finding) with a non-empty region, 1 if ANY point
``[x, y]`` lies in it, tested at row ``int(y)``, column ``int(x)`` (original pixels, truncated toward
zero as their ``int()``), 0 if none does or the reader gave no point for that finding (image or task
absent, or an empty list: a miss, as theirs); NaN (not counted) where the region is empty, whatever
the reader marked. Whether the reader also segmented the finding does not enter the hit. A point
outside the image after truncation is an error (their indexing would wrap a negative one or crash).

Cost: about 0.1 s per (image, finding) at CheXlocalize's ~2300 x 2800 on one CPU core, every
finding of every image (``cxl_miou_all`` needs the negatives): minutes for CheXlocalize's test set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torchmetrics import Metric

from xbench_pl.geometry import _bilinear_weights, spans_image
from xbench_pl.metrics.grounding import Records, from_fixed, to_fixed

CXL_KEYS = ("cxl_hit_rate", "cxl_miou", "cxl_miou_all")


# -- functional ---------------------------------------------------------------------------------
def full_resolution_map(native: torch.Tensor, height: int, width: int, affine: torch.Tensor | None = None,
                        input_size: int | None = None) -> torch.Tensor:
    """One saliency map ``[h, w]`` at the original ``height x width``, float32 on the CPU.

    Without an affine (or with one that spans the image) the map covers the whole original and is
    resized as CheXlocalize resizes its maps; otherwise it covers the model input and is sampled at
    the original pixel centres through the affine (pixels outside the input: the map's minimum)."""
    native = native.detach().to("cpu", torch.float32)
    if native.dim() != 2:
        raise ValueError(f"expected one map [h, w], got shape {tuple(native.shape)}")
    if not torch.isfinite(native).all():
        raise ValueError("saliency map contains NaN or inf")
    if spans_image(affine, input_size, height, width):
        return F.interpolate(native[None, None], size=(int(height), int(width)), mode="bilinear", align_corners=False)[0, 0]
    sx, sy, tx, ty = affine.to(torch.float64).cpu().unbind(-1)
    ys = (torch.arange(height, dtype=torch.float64) + 0.5) * sy + ty
    xs = (torch.arange(width, dtype=torch.float64) + 0.5) * sx + tx
    h, w = native.shape
    rows, cols = _bilinear_weights(ys[None], h, input_size)[0], _bilinear_weights(xs[None], w, input_size)[0]
    out = rows @ native @ cols.T
    unseen = ((ys < 0) | (ys > input_size))[:, None] | ((xs < 0) | (xs > input_size))[None, :]
    return torch.where(unseen, native.min(), out)


def cxl_hit(full_map: torch.Tensor, region: np.ndarray | None) -> float:
    """1.0 if the map's first maximum (row-major) lies in ``region`` (bool ``[H, W]``), else 0.0;
    NaN for an empty (or absent) region."""
    if region is None or not region.any():
        return float("nan")
    flat = int(np.argmax(full_map.numpy()))
    return float(bool(region.reshape(-1)[flat]))


def cxl_contours(full_map: torch.Tensor) -> list[np.ndarray]:
    """The contours CheXlocalize fills: those of more than one point of the Otsu-binarised,
    min-max normalised 8-bit map (``[n, 1, 2]`` int32 (x, y) each)."""
    shifted = full_map - full_map.min()
    top = shifted.max()
    if not top > 0:  # constant map: their 0/0 casts to an all-zero 8-bit map, which has no contour
        return []
    unit = shifted.div(top).numpy()
    eight = (255 * unit).astype(np.uint8)  # float32 product, truncated
    _, binary = cv2.threshold(eight, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    found = cv2.findContours(binary, cv2.RETR_TREE, cv2.CHAIN_APPROX_SIMPLE)
    contours = found[0] if len(found) == 2 else found[1]  # OpenCV 4 / 3
    return [c for c in contours if len(c) > 1]


def cxl_segmentation(full_map: torch.Tensor) -> np.ndarray:
    """CheXlocalize's default binarisation of a full-resolution map: bool ``[H, W]``, each contour of
    ``cxl_contours`` filled as a PIL polygon with its outline."""
    height, width = full_map.shape
    canvas = Image.new("1", (width, height))
    draw = ImageDraw.Draw(canvas)
    for contour in cxl_contours(full_map):
        draw.polygon([(int(x), int(y)) for x, y in contour[:, 0, :]], outline=1, fill=1)
    return np.asarray(canvas, dtype=bool)


def cxl_iou(segmentation: np.ndarray, region: np.ndarray, true_pos_only: bool = True) -> float:
    """IoU of two bool ``[H, W]`` masks as CheXlocalize's ``calculate_iou``: NaN where either is empty
    (``true_pos_only``) or where both are (otherwise)."""
    p, g = int(segmentation.sum()), int(region.sum())
    if (true_pos_only and (p == 0 or g == 0)) or p + g == 0:
        return float("nan")
    inter = int(np.logical_and(segmentation, region).sum())
    return inter / (p + g - inter)


def cxl_pair(full_map: torch.Tensor, region: np.ndarray | None) -> tuple[float, float, float]:
    """``(hit, iou, iou_all)`` of one (image, finding): ``cxl_hit``, ``cxl_iou`` with
    ``true_pos_only`` True and False. ``region``: bool ``[H, W]``, None where the image has none
    (then only whether the segmentation is empty is needed, and no polygon is drawn)."""
    if region is None or not region.any():
        return float("nan"), float("nan"), (0.0 if cxl_contours(full_map) else float("nan"))
    segmentation = cxl_segmentation(full_map)
    return cxl_hit(full_map, region), cxl_iou(segmentation, region, True), cxl_iou(segmentation, region, False)


def hb_hit(points, region: np.ndarray | None) -> float:
    """CheXlocalize's human-benchmark hit (module docstring): NaN where ``region`` (bool ``[H, W]``) is None or
    empty; else 1.0 if any of ``points`` (``[x, y]`` in original pixels) lies in it, 0.0 if none does or there is
    none. ``ValueError`` for a point outside the image."""
    if region is None or not region.any():
        return float("nan")
    height, width = region.shape
    cells = []
    for point in points:
        row, col = int(point[1]), int(point[0])
        if not (0 <= row < height and 0 <= col < width):
            raise ValueError(f"salient point {list(point)} lies outside the {width}x{height} image")
        cells.append((row, col))
    return float(any(region[row, col] for row, col in cells))


def reader_pair(annotation: np.ndarray, region: np.ndarray | None, points=None) -> tuple[float, float, float]:
    """``(hit, iou, iou_all)`` of a reader's annotation (bool ``[H, W]`` at full resolution) judged as CheXlocalize
    judges its human benchmark: the annotation is the segmentation (``cxl_iou``, both ``true_pos_only``); the hit is
    ``hb_hit`` of ``points`` (the reader's salient points of this finding, ``()`` where it gave none), or, with
    ``points=None`` (no salient-point file), ``cxl_hit`` of the annotation taken as a 0/1 map, as a model's map."""
    if region is None or not region.any():
        return float("nan"), float("nan"), (0.0 if annotation.any() else float("nan"))
    hit = cxl_hit(torch.from_numpy(annotation.astype(np.float32)), region) if points is None else hb_hit(points, region)
    return hit, cxl_iou(annotation, region, True), cxl_iou(annotation, region, False)


def cxl_means(maps: Iterable[torch.Tensor], regions: Iterable[np.ndarray | None], class_index: Iterable[int],
              num_classes: int) -> dict[str, torch.Tensor]:
    """Direct per-class means of ``cxl_pair`` over pairs (NaN-skipping), float64 ``[C]`` per key:
    the loop ``CheXlocalizeMode`` must equal."""
    values = {k: [[] for _ in range(num_classes)] for k in CXL_KEYS}
    for full_map, region, c in zip(maps, regions, class_index):
        for key, value in zip(CXL_KEYS, cxl_pair(full_map, region)):
            if not np.isnan(value):
                values[key][int(c)].append(value)
    return {k: torch.tensor([float(np.mean(v)) if v else float("nan") for v in per_class], dtype=torch.float64)
            for k, per_class in values.items()}


# -- the metric ---------------------------------------------------------------------------------
class CheXlocalizeMode(Metric):
    """Per class, the means of ``cxl_pair``'s hit, IoU (``true_pos_only``) and IoU (all pairs) in
    int64 fixed point with their counts: DDP sums are exact. ``update`` takes pairs one at a time
    (an iterable of ``(full_map [H, W], region bool [H, W] or None, class)``) so that a batch's
    full-resolution maps are never all held at once. With ``units`` (each pair's bootstrap unit, ``resampling.unit_key``)
    it also keeps every pair's values (``records``) for the bootstrap intervals of ``BenchmarkMetrics``."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False
    plot_lower_bound, plot_upper_bound = 0.0, 1.0

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        for key in CXL_KEYS:
            self.add_state(f"{key}_total", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
            self.add_state(f"{key}_pairs", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.pairs = CheXlocalizePairs()
        self.keyed = True  # every update gave units

    def reset(self) -> None:
        super().reset()
        self.pairs.reset()
        self.keyed = True

    def update(self, pairs: Iterable, units: list[int] | None = None, judged: bool = False) -> None:
        """``pairs``: ``(full_map, region, class)`` judged by ``cxl_pair``; with ``judged``, pairs judged elsewhere:
        ``(values, class)``, ``values`` a ``cxl_pair``-like ``(hit, iou, iou_all)`` (the reader's ``reader_pair``)."""
        if not judged:
            pairs = ((cxl_pair(full_map, region), c) for full_map, region, c in pairs)
        totals = {k: torch.zeros(self.num_classes, dtype=torch.long) for k in CXL_KEYS}
        counts = {k: torch.zeros(self.num_classes, dtype=torch.long) for k in CXL_KEYS}
        classes, values = [], []
        for pair, c in pairs:
            classes.append(int(c))
            values.append(pair)
            for key, value in zip(CXL_KEYS, pair):
                if not np.isnan(value):
                    totals[key][int(c)] += int(to_fixed(torch.tensor(value, dtype=torch.float64)))
                    counts[key][int(c)] += 1
        if units is None:
            self.keyed = False
        else:
            if len(units) != len(classes):
                raise ValueError(f"CheXlocalizeMode.update: {len(units)} units for {len(classes)} pairs")
            self.pairs.update(torch.tensor(units, dtype=torch.long), torch.tensor(classes, dtype=torch.long),
                              torch.tensor(values, dtype=torch.float64).reshape(-1, len(CXL_KEYS)))
        for key in CXL_KEYS:  # out of place, as every metric here
            setattr(self, f"{key}_total", getattr(self, f"{key}_total") + totals[key].to(self.device))
            setattr(self, f"{key}_pairs", getattr(self, f"{key}_pairs") + counts[key].to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        """``{key: [C]}`` float64, NaN for a class without a counted pair."""
        return {k: from_fixed(getattr(self, f"{k}_total"), getattr(self, f"{k}_pairs")) for k in CXL_KEYS}


class CheXlocalizePairs(Records):
    """Every judged pair's bootstrap ``unit``, class ``cls`` and ``CXL_KEYS`` values in fixed point with a
    defined flag ``[P, 3]``; ``compute`` returns them synced (their sums do not depend on the order)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_records()

    def shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        k = len(CXL_KEYS)
        return {"unit": ((0,), torch.long), "cls": ((0,), torch.long), "values": ((0, k), torch.long), "defined": ((0, k), torch.long)}

    def update(self, unit: torch.Tensor, cls: torch.Tensor, values: torch.Tensor) -> None:
        for name, value in (("unit", unit), ("cls", cls), ("values", to_fixed(torch.nan_to_num(values, nan=0.0))),
                            ("defined", (~torch.isnan(values)).long())):
            getattr(self, name).append(value.to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        return self._gathered()


def region_mask(regions, height: int, width: int) -> np.ndarray | None:
    """The union of one finding's regions at the original resolution (``regions.rasterize_original``),
    None when there is none or it is empty."""
    from xbench_pl.data.regions import rasterize_original

    if not regions:
        return None
    mask = rasterize_original(regions, height, width)
    return mask if mask.any() else None


def full_resolution_pairs(saliency: torch.Tensor, affine: torch.Tensor | None, input_size: int | None,
                          original_size: torch.Tensor, regions: list[dict[str, list]], classes: list[str]
                          ) -> Iterator[tuple[torch.Tensor, np.ndarray | None, int]]:
    """Every (image, finding) of a batch at full resolution, lazily: ``saliency [B, C, h, w]`` native
    maps, ``affine [B, 4]`` (None: the maps span the whole images), ``original_size [B, 2] (H, W)``,
    ``regions``: each image's ``Record.regions`` (finding -> regions in original pixels)."""
    for b in range(saliency.shape[0]):
        height, width = (int(v) for v in original_size[b])
        for c, name in enumerate(classes):
            full = full_resolution_map(saliency[b, c], height, width, None if affine is None else affine[b], input_size)
            yield full, region_mask(regions[b].get(name), height, width), c
