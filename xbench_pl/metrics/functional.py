"""Metrics as plain torch functions: the twins of the classes in ``grounding.py`` and ``recognition.py``.

Grounding functions take maps and masks already in one frame: ``maps [N, H, W]`` float,
``masks [N, H, W]`` bool. Recognition functions take one finding's ``scores [N]`` and 0/1
``labels [N]`` and return float64 values computed from exact integer counts (no float32 step).

Over 500 lines on purpose: as in torchmetrics' ``functional/``, every metric class's plain-torch twin lives here,
so the reference definitions are read (and tested) in one place.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import torch
from torchmetrics.functional.classification import binary_calibration_error

from xbench_pl.metrics import kernels
from xbench_pl.metrics.kernels import default_thresholds, otsu_threshold_from_histogram

#: Pixels within this fraction of a map's value range of its maximum count as maximal,
#: and a map whose range is below this fraction of its magnitude counts as constant:
#: bilinear resampling perturbs exact ties and constants by float rounding only.
RELATIVE_TOLERANCE = 1e-6

#: per-map saliency normalisations (``normalize_saliency``)
NormalizeMode = Literal["minmax", "max", "none"]
NORMALIZE_MODES = get_args(NormalizeMode)


def _raise_if_not_finite(per_map: torch.Tensor) -> None:
    """``per_map``: a reduction of each map that NaN/inf anywhere in the map makes non-finite."""
    bad = (~torch.isfinite(per_map)).flatten(1).any(1) if per_map.dim() > 1 else ~torch.isfinite(per_map)
    if bad.any():
        where = bad.nonzero().flatten().tolist()
        raise ValueError(f"saliency maps contain NaN or inf (maps at positions {where[:10]}{'...' if len(where) > 10 else ''})")


def _range(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hi, lo = flat.amax(dim=-1, keepdim=True), flat.amin(dim=-1, keepdim=True)
    _raise_if_not_finite(hi - lo)  # amax/amin propagate NaN; inf makes the span non-finite
    span = hi - lo
    constant = span <= RELATIVE_TOLERANCE * torch.maximum(hi.abs(), lo.abs()).clamp_min(torch.finfo(flat.dtype).tiny)
    return hi, lo, constant


def normalize_saliency(maps: torch.Tensor, mode: str = "minmax") -> torch.Tensor:
    """Per-map normalisation over the last two dims.

    ``"minmax"``: (m - min) / (max - min); a constant map becomes all zeros.
    ``"max"``: m / max; a map whose max is not positive becomes all zeros.
    ``"none"``: unchanged.
    """
    if mode not in NORMALIZE_MODES:
        raise ValueError(f"normalize mode must be one of {NORMALIZE_MODES}, got {mode!r}")
    flat = maps.flatten(-2)
    hi, lo, constant = _range(flat)
    if mode == "none":
        return maps
    if mode == "minmax":
        out = torch.where(constant, torch.zeros_like(flat), (flat - lo) / torch.where(constant, torch.ones_like(hi), hi - lo))
    else:
        positive = hi > 0
        out = torch.where(positive, flat / torch.where(positive, hi, torch.ones_like(hi)), torch.zeros_like(flat))
    return out.view_as(maps)


def pointing_game(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per pair, the fraction of the map's maximal pixels that lie inside the region: ``[N]`` in [0, 1].

    Ties are counted in expectation (a random pick among the maximal pixels), so a constant
    map scores the region's area fraction, i.e. chance. Pairs with an empty region get NaN.
    Invariant to any increasing rescaling of the map, so it is computed on the raw map.
    """
    if kernels.applies(maps, masks):  # the same counts in one streaming pass (kernels.py)
        return kernels.pointing_game(maps, masks)
    flat, region = maps.flatten(1), masks.flatten(1).bool()
    hi, lo, constant = _range(flat)
    maximal = (flat >= hi - RELATIVE_TOLERANCE * (hi - lo)) | constant
    hits = (maximal & region).sum(1).double() / maximal.sum(1).double()
    return torch.where(region.any(1), hits, torch.full_like(hits, float("nan")))


def pointing_game_any_tie(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per pair, 1 if ANY of the map's maximal pixels lies inside the region, else 0: ``[N]`` (float64).

    The rule of Quantus' ``PointingGame`` and of MedKLIP's RSNA script, beside the tie-aware
    ``pointing_game``: the maximal pixels are the same (within ``RELATIVE_TOLERANCE`` of the range of
    the max; a constant map is maximal everywhere), but one inside is a full hit. So a constant map
    scores 1 on any non-empty region, where ``pointing_game`` gives the region's area fraction; without
    ties the two agree. Pairs with an empty region get NaN. Computed on the raw map.
    """
    if kernels.applies(maps, masks):  # the maximal-pixel counts of the same streaming pass (kernels.py)
        return kernels.pointing_game_any_tie(maps, masks)
    flat, region = maps.flatten(1), masks.flatten(1).bool()
    hi, lo, constant = _range(flat)
    maximal = (flat >= hi - RELATIVE_TOLERANCE * (hi - lo)) | constant
    hits = (maximal & region).any(1).double()
    return torch.where(region.any(1), hits, torch.full_like(hits, float("nan")))


def thresholds_reached(flat: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """For each value, how many thresholds it reaches (``#{k: thresholds[k] <= m}``), as int32.

    ``searchsorted`` in general. On the uniform grid 0, 1/(T-1), ..., 1 the count is
    ``floor(m * (T-1)) + 1``, which is 3-4x cheaper; float rounding can only misplace values
    within 1e-4 of a grid step, and those few are recounted with ``searchsorted``, so the
    result is exactly that of comparing ``m >= t`` for every threshold.
    """
    thresholds = thresholds.to(flat.dtype).contiguous()
    t = thresholds.numel()
    if t < 2 or not torch.equal(thresholds, default_thresholds(1 / (t - 1), flat.dtype).to(flat.device)):
        return torch.searchsorted(thresholds, flat, right=True, out_int32=True)
    scaled = flat * (t - 1)
    steps = scaled.floor()
    near_step = scaled.sub_(steps).sub_(0.5).abs_() > 0.5 - 1e-4
    reached = steps.to(torch.int32).add_(1).clamp_(0, t)
    recount = near_step.nonzero(as_tuple=True)
    reached[recount] = torch.searchsorted(thresholds, flat[recount].contiguous(), right=True, out_int32=True)
    return reached


def dice_iou_curve(maps: torch.Tensor, masks: torch.Tensor, thresholds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dice and IoU of ``B_t = {m >= t}`` against each mask, for every threshold: two ``[N, T]``.

    ``maps`` are normalised maps; ``thresholds`` ascending. One pass over the pixels for all
    thresholds: each pixel's bin (how many thresholds it reaches) is histogrammed per map,
    and suffix sums give |B_t| and |B_t ∩ G|. Pairs with an empty region get NaN.
    """
    if kernels.applies(maps, masks):  # the same histogram in one streaming pass (kernels.py)
        return kernels.dice_iou_curve(maps, masks, thresholds)
    n, t = maps.shape[0], thresholds.numel()
    flat, region = maps.flatten(1).contiguous(), masks.flatten(1).bool()
    _raise_if_not_finite(flat.sum(1))
    reached = thresholds_reached(flat, thresholds)  # pixel in B_t[k] iff k < reached
    # one histogram row per (map, inside the region or not): bin = reached + (t + 1) * (2 * map + inside)
    row_start = (torch.arange(n, dtype=torch.int32, device=flat.device) * (2 * (t + 1)))[:, None]
    bins = reached.add_(row_start).add_(region.int() * (t + 1))
    hist = torch.bincount(bins.flatten(), minlength=2 * n * (t + 1)).view(n, 2, t + 1)
    suffix = hist.flip(-1).cumsum(-1).flip(-1)[..., 1:].double()  # pixels with reached > k, i.e. in B_t[k]
    inter = suffix[:, 1]
    predicted = suffix[:, 0] + inter
    truth = region.sum(1, keepdim=True).double()
    dice = 2 * inter / (predicted + truth)
    iou = inter / (predicted + truth - inter)
    empty = truth == 0
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=flat.device)
    return torch.where(empty, nan, dice), torch.where(empty, nan, iou)


def best_threshold(mean_dice: torch.Tensor, thresholds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index and value of the threshold maximising mean Dice, per row of ``[C, T]`` (lowest on ties)."""
    index = torch.nan_to_num(mean_dice, nan=-1.0).argmax(dim=-1)
    return index, thresholds.to(mean_dice.device, torch.float64)[index]


# -- beyond the paper: chance, energy, Otsu, threshold-free, specificity, size, bootstrap -------
def area_fraction(masks: torch.Tensor) -> torch.Tensor:
    """Per pair, the share of the image the region covers ``[N]`` (float64): the Pointing Game's
    chance level (a map pointing uniformly at random hits with this probability)."""
    region = masks.flatten(1).bool()
    pixels = kernels.region_pixels(region) if kernels.available() and region.device.type == "cpu" else region.sum(1)
    return pixels.double() / region.shape[1]


def pointing_lift(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Chance-corrected Pointing Game per pair: ``pointing_game - area_fraction`` ``[N]`` in [-1, 1];
    0 for a constant map, NaN for an empty region."""
    return pointing_game(maps, masks) - area_fraction(masks)


def uniform_dice(masks: torch.Tensor) -> torch.Tensor:
    """Per pair, the Dice the ``uniform`` baseline (a constant map) scores at its best threshold ``[N]``
    (float64): normalised, a constant map is 0 everywhere (``normalize_saliency``), so ``{m >= 0}`` is the
    whole image and every higher threshold selects nothing (Dice 0); the whole image against a region of
    area fraction ``a`` has Dice ``2a / (1 + a)``. NaN for an empty region."""
    a = area_fraction(masks)
    return torch.where(a > 0, 2 * a / (1 + a), torch.full_like(a, float("nan")))


#: the largest ``cnr`` counted: a map that separates region and background with (almost) no noise scores this, not
#: infinity (its fixed-point sums would overflow), far above what models reach (about 1 on MS-CXR, Boecking et al.)
CNR_CAP = 1000.0


def contrast_to_noise(maps: torch.Tensor, masks: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Contrast-to-noise ratio per pair (BioViL, Boecking et al. ECCV 2022; MS-CXR): on the raw map,
    ``|mean_in - mean_out| / sqrt(var_in + var_out)`` over the pixels inside / outside the region, with population
    variances (``ddof=0``) ``[N]`` float64, at most ``CNR_CAP`` (a noiseless map with contrast scores it; a map without
    contrast scores 0). ``seen [N, H, W]`` bool (optional): only these pixels count, the ones the model saw (BioViL's
    maps leave what a centre crop cut off undefined); default every pixel. Unchanged by any ``a * m + b`` with
    ``a != 0``, so by the normalisations. NaN where no pixel of the region, or none outside it, counts.
    Computed per map in float64 by numpy's pairwise sums, whose order depends only on the map's size: the same
    value for a map alone or in any batch, on any thread count (the DDP-exact fixed-point sums need that)."""
    flat = maps.detach().flatten(1).cpu().double().numpy()
    region = masks.flatten(1).bool().cpu().numpy()
    counted = np.ones_like(region) if seen is None else seen.flatten(1).bool().cpu().numpy()
    _raise_if_not_finite(torch.from_numpy(flat.sum(1)))
    inside, outside = region & counted, ~region & counted
    n_in, n_out = inside.sum(1), outside.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_in = np.where(inside, flat, 0.0).sum(1) / n_in
        mean_out = np.where(outside, flat, 0.0).sum(1) / n_out
        var_in = np.where(inside, (flat - mean_in[:, None]) ** 2, 0.0).sum(1) / n_in
        var_out = np.where(outside, (flat - mean_out[:, None]) ** 2, 0.0).sum(1) / n_out
        contrast, noise = np.abs(mean_in - mean_out), np.sqrt(var_in + var_out)
        cnr = np.minimum(np.where(contrast > 0, contrast / noise, 0.0), CNR_CAP)  # contrast / 0 = inf: the cap
    return torch.from_numpy(np.where((n_in > 0) & (n_out > 0), cnr, np.nan))


def negative_map_stats(maps: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For normalised maps of (image, finding) pairs where the finding is absent ``[N, H, W]``: the
    fraction of pixels the map marks at ``threshold`` (``m >= threshold``, Dice's rule: any marked pixel
    is a false positive) and the mean of ``max(m, 0)`` (its mass as a share of an all-ones map), two ``[N]``
    float64, in [0, 1] for maps normalised to [0, 1]."""
    flat = maps.flatten(1)
    _raise_if_not_finite(flat.sum(1))
    marked = (flat >= torch.tensor(threshold, dtype=flat.dtype, device=flat.device)).sum(1)
    return marked.double() / flat.shape[1], flat.double().clamp_min(0).mean(1)


def energy_pointing(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Energy pointing game per pair: the share of the map's mass inside the region,
    ``sum_G m+ / sum m+`` with ``m+ = max(m, 0)`` ``[N]`` (float64) in [0, 1]. Pass normalised maps
    (min-max maps are non-negative). A map without positive mass spreads it evenly: it scores
    the region's area fraction, as the Pointing Game does for a constant map. NaN for an empty region.
    With the kernels (``kernels.py``) both sums are exact: within a few ulp of this reference."""
    if kernels.applies(maps, masks):
        return kernels.energy_pointing(maps, masks)
    flat, region = maps.flatten(1).double(), masks.flatten(1).bool()
    _raise_if_not_finite(flat.sum(1))
    mass = flat.clamp_min(0)
    total, inside = mass.sum(1), (mass * region).sum(1)
    value = torch.where(total > 0, inside / total.clamp_min(torch.finfo(torch.float64).tiny), area_fraction(masks))
    return torch.where(region.any(1), value, torch.full_like(value, float("nan")))


def to_uint8(maps: torch.Tensor) -> torch.Tensor:
    """``uint8(255 * m)`` as numpy casts (truncation) for maps in [0, 1]: CheXlocalize's 8-bit map."""
    return (maps * 255).clamp(0, 255).to(torch.uint8)


def otsu_threshold(maps8: torch.Tensor) -> torch.Tensor:
    """Per 8-bit map ``[N, H, W]`` uint8, Otsu's threshold ``[N]`` (int64) as OpenCV's
    ``cv2.threshold(..., THRESH_OTSU)`` picks it: the first grey level maximising the between-class
    variance of its 256-bin histogram, 0 for a constant map. Binarise with ``maps8 > threshold``."""
    n = maps8.shape[0]
    flat = maps8.flatten(1).long()
    rows = torch.arange(n, device=flat.device)[:, None] * 256
    return otsu_threshold_from_histogram(torch.bincount((flat + rows).flatten(), minlength=256 * n).view(n, 256), flat.shape[1])


def otsu_dice_iou(maps: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dice and IoU per pair ``[N]`` (float64) of the Otsu mask ``uint8(255 m) > otsu_threshold`` of
    normalised maps in [0, 1] (OpenCV's Otsu on CheXlocalize's 8-bit map, without its contour
    filling); an empty prediction scores 0; NaN for an empty region."""
    if kernels.applies(maps, masks):  # the same histograms in one streaming pass (kernels.py)
        return kernels.otsu_dice_iou(maps, masks)
    _raise_if_not_finite(maps.flatten(1).sum(1))
    maps8 = to_uint8(maps)
    predicted = (maps8 > otsu_threshold(maps8)[:, None, None]).flatten(1)
    region = masks.flatten(1).bool()
    inter = (predicted & region).sum(1).double()
    p, g = predicted.sum(1).double(), region.sum(1).double()
    dice, iou = 2 * inter / (p + g).clamp_min(1), inter / (p + g - inter).clamp_min(1)
    nan = torch.full_like(dice, float("nan"))
    return torch.where(g > 0, dice, nan), torch.where(g > 0, iou, nan)


def pixel_auroc(maps: torch.Tensor, masks: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """Per pair, the ROC AUC of the map's pixel values against the region's pixels ``[N]`` (float64):
    the chance that a random region pixel outscores a random pixel outside it, ties counted half
    (Quantus' ``AUC``; invariant to any increasing rescaling, so computed on raw maps). Twice the
    area times ``P * N`` is summed exactly in int64. NaN if the region is empty or the whole image."""
    if kernels.applies(maps, masks):  # the same count from one radix sort per map (kernels.py)
        return kernels.pixel_auroc(maps, masks)
    flat, region = maps.flatten(1), masks.flatten(1).bool()
    _raise_if_not_finite(flat.sum(1))
    out = []
    for start in range(0, flat.shape[0], chunk):
        v, y = flat[start:start + chunk], region[start:start + chunk]
        n, p = v.shape
        v, order = v.sort(dim=1)  # tied values form one group whatever their order
        y = y.gather(1, order).long()
        new = torch.ones_like(y, dtype=torch.bool)
        new[:, 1:] = v[:, 1:] != v[:, :-1]
        group = (new.long().cumsum(1) - 1) + torch.arange(n, device=v.device)[:, None] * p
        positives = torch.zeros(n * p, dtype=torch.long, device=v.device).index_add_(0, group.flatten(), y.flatten()).view(n, p)
        count = torch.bincount(group.flatten(), minlength=n * p).view(n, p)
        negatives = count - positives
        below = negatives.cumsum(1) - negatives  # negatives in lower-valued groups
        twice = (2 * below * positives + positives * negatives).sum(1)
        pos, neg = y.sum(1), p - y.sum(1)
        defined = (pos > 0) & (neg > 0)
        auc = twice.double() / (2 * pos * neg).clamp_min(1).double()
        out.append(torch.where(defined, auc, torch.full_like(auc, float("nan"))))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def dice_auc(curves: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Area under Dice (or IoU) against the threshold, trapezoidal over ``thresholds`` (the grid spans
    [0, 1], so the area is a mean Dice over thresholds): ``curves [..., T]`` -> ``[...]`` float64."""
    return torch.trapezoid(curves.double(), thresholds.to(curves.device, torch.float64), dim=-1)


def finding_specificities(maps: torch.Tensor, masks: torch.Tensor, groups: list[torch.Tensor]) -> list[torch.Tensor]:
    """``finding_specificity`` of each group of rows of ``maps``/``masks`` (one image's pairs each, CPU index tensors,
    two or more rows), ``[K]`` float64 on the CPU per group: on the fast paths from the integer counts of all groups at
    once (``kernels.maximal_overlaps``; no per-image transfer on a GPU), with the same arithmetic on them."""
    if kernels.applies(maps, masks):
        return [_specificity(inside.double() / maximal[:, None].double()) for inside, maximal in kernels.maximal_overlaps(maps, masks, groups)]
    return [finding_specificity(maps[rows.to(maps.device)], masks[rows.to(masks.device)]).cpu() for rows in groups]


def _specificity(hits: torch.Tensor) -> torch.Tensor:
    """From ``hits [K, K]`` (share of map a's maximal pixels inside region b): own minus the mean of the others."""
    own = hits.diagonal()
    return own - (hits.sum(1) - own) / (hits.shape[0] - 1)


def finding_specificity(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """For the pairs of ONE image ``[K, H, W]`` (finding k's map, finding k's region), how much more
    each map points at its own finding than at the image's other findings:
    ``pg(map_k, region_k) - mean_{j != k} pg(map_k, region_j)`` ``[K]`` (float64, in [-1, 1]), with the
    Pointing Game's tie rule (``pointing_game``). NaN unless the image has two or more regions."""
    flat, region = maps.flatten(1), masks.flatten(1).bool()
    k = flat.shape[0]
    if k < 2:
        return torch.full((k,), float("nan"), dtype=torch.float64)
    if kernels.applies(maps, masks):  # the same counts in one pass (kernels.py)
        return finding_specificities(maps, masks, [torch.arange(k)])[0]
    hi, lo, constant = _range(flat)
    maximal = (flat >= hi - RELATIVE_TOLERANCE * (hi - lo)) | constant
    # hits[a, b]: share of map a's maximal pixels inside region b (integer counts: exact)
    inside = torch.stack([(maximal & region[b]).sum(1) for b in range(k)], dim=1).double()
    return _specificity(inside / maximal.sum(1, keepdim=True).double())


def map_similarity(saliency: torch.Tensor) -> torch.Tensor:
    """Per image of ``saliency [B, C, h, w]``, per finding c, the mean Pearson correlation of map c with
    the image's other findings' maps ``[B, C]`` (float64, in [-1, 1]): 1 means the model draws the same
    map whatever the finding. Two constant maps correlate 1, a constant and a varying map 0. NaN for one finding."""
    b, c = saliency.shape[:2]
    if c < 2:
        return torch.full((b, c), float("nan"), dtype=torch.float64)
    x = saliency.flatten(2).double()
    x = x - x.mean(-1, keepdim=True)
    norm = x.pow(2).sum(-1).sqrt()
    hi = saliency.flatten(2).double().abs().amax(-1)
    constant = norm <= RELATIVE_TOLERANCE * hi.clamp_min(torch.finfo(torch.float64).tiny) * x.shape[-1] ** 0.5
    z = torch.where(constant[..., None], torch.zeros_like(x), x / torch.where(constant, torch.ones_like(norm), norm)[..., None])
    corr = z @ z.transpose(1, 2)  # [B, C, C] (a product of all pairs at once would hold B * C * C maps)
    both_constant = constant[:, :, None] & constant[:, None, :]
    corr = torch.where(both_constant, torch.ones_like(corr), corr.clamp(-1, 1))
    eye = torch.eye(c, dtype=torch.bool, device=corr.device)
    return corr.masked_fill(eye, 0).sum(-1) / (c - 1)


def size_stratum(fraction: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """Size stratum per pair from the region's area fraction: 0 small (< bounds[0]), 1 medium, 2 large (>= bounds[1])."""
    edges = torch.tensor(bounds, dtype=torch.float64, device=fraction.device)
    return torch.bucketize(fraction.double(), edges, right=True)


def bootstrap_weights(n_units: int, resamples: int, seed: int = 0) -> torch.Tensor:
    """How often each of ``n_units`` units is drawn in each of ``resamples`` resamples with replacement
    of ``n_units`` units ``[resamples, n_units]`` (int64), from a seeded generator: the same on any machine."""
    gen = torch.Generator().manual_seed(seed)
    draws = torch.randint(n_units, (resamples, n_units), generator=gen)
    return torch.zeros(resamples, n_units, dtype=torch.long).scatter_add_(1, draws, torch.ones_like(draws))


def percentile_interval(replicates: torch.Tensor, level: float = 0.95) -> torch.Tensor:
    """The percentile interval ``[..., 2]`` of bootstrap replicates ``[R, ...]`` (float64, NaN replicates
    ignored; linear interpolation, ``numpy.nanquantile``'s default); NaN where none is defined."""
    tail = (1 - level) / 2
    q = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    return torch.nanquantile(replicates.double(), q, dim=0).movedim(0, -1)


# -- recognition ------------------------------------------------------------------------------
def ranking_counts(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """True and false positives (int64) at each distinct score, from the highest down: ``tps, fps``.

    The counts at a threshold do not depend on the order of tied or equal-scored samples, so
    they are the same however the samples were split or ordered (torchmetrics' ``_binary_clf_curve``).
    """
    order = torch.argsort(scores, descending=True, stable=True)
    ranked, positive = scores[order], labels[order].long()
    last = torch.nonzero(ranked[1:] != ranked[:-1]).flatten()  # last index of each distinct score
    last = torch.cat([last, torch.tensor([ranked.numel() - 1], device=last.device)])
    tps = positive.cumsum(0)[last]
    return tps, last + 1 - tps


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Area under the ROC curve (trapezoidal, ties half-counted), float64; NaN without positives or negatives.

    The trapezoid sum times 2·P·N is an integer, summed exactly in int64: one final division.
    """
    if scores.numel() == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    tps, fps = ranking_counts(scores, labels)
    p, n = int(tps[-1]), int(fps[-1])
    if p == 0 or n == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    zero = tps.new_zeros(1)
    tps, fps = torch.cat([zero, tps]), torch.cat([zero, fps])
    twice_area = ((fps[1:] - fps[:-1]) * (tps[1:] + tps[:-1])).sum()
    return torch.tensor(int(twice_area) / (2 * p * n), dtype=torch.float64)


def average_precision(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Average precision ``sum_k (R_k - R_(k-1)) P_k`` over the distinct scores, float64 (as
    torchmetrics and scikit-learn define it); NaN without positives."""
    if scores.numel() == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    tps, fps = ranking_counts(scores, labels)
    p = int(tps[-1])
    if p == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    gained = torch.diff(tps, prepend=tps.new_zeros(1)).double()
    precision = tps.double() / (tps + fps).double()
    return (gained * precision).sum() / p


def f1_accuracy(scores: torch.Tensor, labels: torch.Tensor, threshold: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """F1 and accuracy of ``score > threshold`` per column of ``[N, C]``, float64 from integer counts.

    F1 is 0 where nothing is predicted or labelled positive (torchmetrics' ``zero_division=0``);
    both are NaN for a column without samples.
    """
    predicted, positive = scores > threshold, labels.bool()
    tp = (predicted & positive).sum(0)
    fp = (predicted & ~positive).sum(0)
    fn = (~predicted & positive).sum(0)
    tn = (~predicted & ~positive).sum(0)
    f1 = torch.where(2 * tp + fp + fn > 0, (2 * tp).double() / (2 * tp + fp + fn).clamp_min(1).double(), 0.0)
    total = (tp + fp + fn + tn).double()
    accuracy = torch.where(total > 0, (tp + tn).double() / total.clamp_min(1), float("nan"))
    return f1, accuracy


def max_f1_from_counts(tps: torch.Tensor, fps: torch.Tensor, distinct: torch.Tensor,
                       present: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``max_f1`` per row from cumulative counts: ``tps, fps [R, D]`` (int64) true and false positives among the
    samples scoring at least each of the ``distinct [D]`` scores, highest first (``ranking_counts``, or weighted
    counts of bootstrap replicates); ``present [R, D]``: whether row r has samples at that score (default: all),
    a score without any is no threshold of that row. Returns ``f1, threshold, accuracy`` ``[R]`` float64."""
    p, n = tps[:, -1], fps[:, -1]
    ps = tps + fps
    # scikit-learn's precision_recall_curve and the model papers' F1, operation for operation in float64
    precision = torch.where(ps != 0, tps.double() / ps.clamp_min(1).double(), 0.0)
    recall = tps.double() / p.clamp_min(1).double()[:, None]
    numerator, denominator = 2 * recall * precision, recall + precision
    f1 = torch.where(denominator != 0, numerator / torch.where(denominator != 0, denominator, 1.0), 0.0)
    if present is not None:
        f1 = torch.where(present, f1, float("-inf"))
    # np.argmax over thresholds in ascending order: the lowest threshold among equal F1 values
    ascending = f1.flip(1).argmax(1)
    best = f1.shape[1] - 1 - ascending
    rows = torch.arange(f1.shape[0], device=f1.device)
    zero = torch.zeros_like(p)
    above = best > 0  # samples strictly above the threshold: those counted at the next higher distinct score
    tp_above = torch.where(above, tps[rows, (best - 1).clamp_min(0)], zero)
    fp_above = torch.where(above, fps[rows, (best - 1).clamp_min(0)], zero)
    defined = p > 0
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=f1.device)
    accuracy = (tp_above + n - fp_above).double() / (p + n).clamp_min(1).double()
    return (torch.where(defined, f1[rows, best], nan), torch.where(defined, distinct.double()[best], nan),
            torch.where(defined, accuracy, nan))


def max_f1(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One finding's best F1 over every threshold, the threshold, and the accuracy of ``score > threshold``:
    three float64 scalars, as MedKLIP's, KAD's and MAVL's zero-shot test scripts compute them.

    Their code: ``precision, recall, thresholds = precision_recall_curve(labels, scores)``, F1 =
    ``2 recall precision / (recall + precision)`` (0 where the sum is 0), the threshold at ``np.argmax``
    of F1 (the lowest threshold among equal values: scikit-learn's thresholds are the distinct scores in
    ascending order), and ``accuracy_score(labels, scores > threshold)``: strictly greater, so the samples
    scoring exactly the threshold count as negative although the F1 counted them positive. Computed here
    from the integer counts at the distinct scores (``ranking_counts``) with the same float64 operations:
    the same bits as their code, and the same on any split or sample order. The threshold is chosen on
    the evaluated samples: an oracle, like ``dice_best``. NaN, all three, for a finding without positives
    (scikit-learn then sets recall to 1 and their F1 is 0 at an arbitrary threshold; undefined here, as
    ``average_precision``)."""
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    if scores.numel() == 0:
        return nan, nan, nan
    scores, labels = scores.double().flatten(), labels.long().flatten()
    tps, fps = ranking_counts(scores, labels)
    distinct = scores.sort(descending=True).values.unique_consecutive()
    f1, threshold, accuracy = max_f1_from_counts(tps[None], fps[None], distinct)
    return f1[0], threshold[0], accuracy[0]


#: Confidence bins of the reliability diagram and ``ece`` (torchmetrics' default for calibration error).
CALIBRATION_BINS = 15


def _sorted_pairs(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (float64) and labels ordered by (score, label): one order for any split or sample order,
    so float sums over them give the same digits on 1 or N processes."""
    scores, labels = scores.double(), labels.long()
    order = torch.argsort(labels, stable=True)
    scores, labels = scores[order], labels[order]
    order = torch.argsort(scores, stable=True)
    return scores[order], labels[order]


def expected_calibration_error(scores: torch.Tensor, labels: torch.Tensor, n_bins: int = CALIBRATION_BINS) -> torch.Tensor:
    """Expected calibration error of one finding's probabilities ``scores [N]`` against 0/1 ``labels [N]``:
    ``sum_b |acc_b - conf_b| * n_b / N`` over ``n_bins`` equal-width confidence bins (torchmetrics'
    ``binary_calibration_error``, ``norm="l1"``), float64 on the samples sorted by (score, label);
    NaN without samples."""
    if scores.numel() == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    scores, labels = _sorted_pairs(scores, labels)
    return binary_calibration_error(scores, labels, n_bins=n_bins, norm="l1").double()


def reliability_bins(scores: torch.Tensor, labels: torch.Tensor, n_bins: int = CALIBRATION_BINS) -> dict[str, torch.Tensor]:
    """The reliability diagram of one finding: per equal-width confidence bin (torchmetrics' binning,
    a score of 1 in the last bin) the sample count (int64), the mean score and the fraction of
    positives (float64, NaN for an empty bin); ``edges`` ``[n_bins + 1]``."""
    scores, labels = _sorted_pairs(scores, labels)
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    index = (torch.bucketize(scores, edges, right=True) - 1).clamp(0, n_bins - 1)
    count = torch.bincount(index, minlength=n_bins)
    positives = torch.bincount(index, weights=labels.double(), minlength=n_bins)
    total = torch.zeros(n_bins, dtype=torch.float64).index_add(0, index, scores)
    empty = count == 0
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    return {
        "edges": edges,
        "count": count,
        "confidence": torch.where(empty, nan, total / count.clamp_min(1)),
        "accuracy": torch.where(empty, nan, positives / count.clamp_min(1)),
    }
