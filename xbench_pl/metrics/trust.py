"""Is the map the model's? The trust measures as plain functions (batched torch, float64 where sums matter).

- ``ssim``: structural similarity of two maps as ``skimage.metrics.structural_similarity`` computes it with the
  settings of Arun et al.'s code (QTIM-Lab/Assessing-Saliency-Maps, ``scripts/randomization_plot_*.py``): a 7 x 7
  uniform window, sample covariance, K1 = 0.01, K2 = 0.03, the mean over the pixels whose window lies inside the map,
  and ``data_range = 2`` (their skimage took a float image's range from its dtype, [-1, 1]; today's skimage asks for it).
- ``spearman``: rank correlation over the pixels, ties averaged (``scipy.stats.spearmanr``); ``absolute``: of the maps'
  absolute values (Adebayo et al.'s second variant).
- ``perturbation_curve`` / ``curve_auc``: deletion and insertion (Petsiuk et al.'s RISE; Quantus's PixelFlipping is
  deletion), the most relevant pixels first, K steps, replaced by a stated baseline (``blurred_baseline``,
  ``mean_baseline``).
- ``random_pair_baseline``: Arun et al.'s randomization baseline, the mean SSIM of random pairs of the trained
  model's maps of different images (same finding), over the pairs ``random_pair_indices`` draws;
  ``passes_randomization``: below it after the last stage.

NaN where a value is undefined (a constant map's rank correlation, a map smaller than the SSIM window, no pair).
docs/trust.md states the definitions and where they differ from the references.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

#: Arun et al.'s SSIM settings (skimage's defaults of their time): window, constants, data range of [0, 1] maps
SSIM_WINDOW, SSIM_K1, SSIM_K2, SSIM_DATA_RANGE = 7, 0.01, 0.03, 2.0
#: Arun et al.'s random pairs per map for the randomization baseline (``randomization_plot_rsna.py``: 50 per map)
PAIRS_PER_MAP = 50
#: scipy.ndimage.gaussian_filter's default: the kernel reaches 4 sigma
BLUR_TRUNCATE = 4.0


def ssim(x: torch.Tensor, y: torch.Tensor, data_range: float = SSIM_DATA_RANGE, win_size: int = SSIM_WINDOW) -> torch.Tensor:
    """SSIM ``[N]`` of maps ``x``, ``y`` ``[N, H, W]`` (already normalised as the benchmark normalises), in float64.

    ``skimage.metrics.structural_similarity(x, y, win_size=7, data_range=2)`` per pair: local means, variances
    (sample: ``NP / (NP - 1)``) and covariance over a uniform ``win_size`` window, the SSIM map, averaged over the
    pixels at least ``(win_size - 1) // 2`` from the border (skimage crops the rest: their windows reach outside).
    NaN for maps smaller than the window."""
    if x.shape != y.shape or x.dim() != 3:
        raise ValueError(f"ssim takes two [N, H, W] maps of one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if min(x.shape[-2:]) < win_size:
        return torch.full((x.shape[0],), math.nan, dtype=torch.float64, device=x.device)
    x, y = x.double()[:, None], y.double()[:, None]

    def local_mean(t: torch.Tensor) -> torch.Tensor:  # the windows inside the map: skimage's cropped area
        return F.avg_pool2d(t, win_size, stride=1)

    ux, uy = local_mean(x), local_mean(y)
    covariance_norm = win_size**2 / (win_size**2 - 1)
    vx = covariance_norm * (local_mean(x * x) - ux * ux)
    vy = covariance_norm * (local_mean(y * y) - uy * uy)
    vxy = covariance_norm * (local_mean(x * y) - ux * uy)
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    similarity = (2 * ux * uy + c1) * (2 * vxy + c2) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return similarity.flatten(1).mean(1)


def ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks ``[N, P]`` (1-based, float64) of each row of ``values`` ``[N, P]``, ties given their average rank
    (``scipy.stats.rankdata(method="average")``)."""
    n, p = values.shape
    ordered, order = values.sort(dim=1, stable=True)
    new_value = torch.ones_like(ordered, dtype=torch.bool)
    new_value[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group = new_value.flatten().cumsum(0) - 1  # tie groups, numbered across rows (each row starts a group)
    position = torch.arange(1, p + 1, dtype=torch.float64, device=values.device).repeat(n)
    mean_rank = torch.zeros(int(group[-1]) + 1 if group.numel() else 0, dtype=torch.float64, device=values.device)
    mean_rank = mean_rank.scatter_reduce(0, group, position, reduce="mean", include_self=False)
    result = torch.empty((n, p), dtype=torch.float64, device=values.device)
    return result.scatter_(1, order, mean_rank[group].view(n, p))


def spearman(x: torch.Tensor, y: torch.Tensor, absolute: bool = False) -> torch.Tensor:
    """Spearman's rank correlation ``[N]`` over the pixels of maps ``x``, ``y`` ``[N, ...]`` (``scipy.stats.spearmanr``
    of the flattened maps: Pearson's correlation of the average-tie ranks); ``absolute``: of ``|x|`` and ``|y|``.
    NaN where a map is constant."""
    if x.shape != y.shape or x.dim() < 2:
        raise ValueError(f"spearman takes two [N, ...] maps of one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    x, y = x.flatten(1), y.flatten(1)
    if absolute:
        x, y = x.abs(), y.abs()
    return rank_correlation(ranks(x), ranks(y))


def rank_correlation(rx: torch.Tensor, ry: torch.Tensor) -> torch.Tensor:
    """Pearson's correlation ``[N]`` of rank rows ``rx``, ``ry`` ``[N, P]`` (``ranks``): ``spearman``'s last step, for a
    caller that ranks one side once for many comparisons. NaN where a row is constant."""
    rx, ry = rx - rx.mean(1, keepdim=True), ry - ry.mean(1, keepdim=True)
    denominator = (rx.square().sum(1) * ry.square().sum(1)).sqrt()
    correlation = (rx * ry).sum(1) / denominator
    return correlation.where(denominator > 0, torch.full_like(correlation, math.nan))


def removal_ranks(maps: torch.Tensor) -> torch.Tensor:
    """``[N, P]``: each pixel's place in the removal order of its map ``[N, ...]`` (0 = most relevant); ties in
    pixel order (row-major), so the order never depends on the sort's implementation."""
    order = maps.flatten(1).sort(dim=1, descending=True, stable=True).indices
    places = torch.arange(order.shape[1], device=maps.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, places)


def perturbation_curve(target_fn: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, maps: torch.Tensor,
                       steps: int, baseline: torch.Tensor, insertion: bool, batch_size: int | None = None) -> torch.Tensor:
    """The target along deletion or insertion ``[N, steps + 1]`` (float64).

    images ``[N, C, S, S]`` (model input), maps ``[N, S, S]`` on the model-input grid, baseline ``[N, C, S, S]``
    (the replacement pixels). Point k (k = 0 .. steps) perturbs the ``floor(k * S² / steps)`` most relevant
    pixels (all channels; ties in pixel order): deletion replaces them by the baseline's (point 0 is the image,
    point ``steps`` the baseline), insertion starts from the baseline and puts the image's back (point 0 is the
    baseline). ``target_fn(images [M, C, S, S]) -> [M]`` is the finding's logit or score; it gets the perturbed
    inputs ``batch_size`` at a time in (sample, step) order (default ``steps + 1``: one sample's curve per call,
    so a curve does not depend on the other samples of the batch)."""
    n, _, height, width = images.shape
    if maps.shape != (n, height, width) or baseline.shape != images.shape:
        raise ValueError(f"perturbation_curve: images {tuple(images.shape)}, maps {tuple(maps.shape)} and baseline "
                         f"{tuple(baseline.shape)} must be [N, 3, S, S], [N, S, S] and [N, 3, S, S]")
    if steps < 1:
        raise ValueError(f"perturbation_curve needs steps >= 1, got {steps}")
    pixels = height * width
    place = removal_ranks(maps).to(images.device).view(n, 1, height, width)
    removed = torch.arange(steps + 1, device=images.device) * pixels // steps  # pixels perturbed at each point
    first, second = (baseline, images) if insertion else (images, baseline)
    chunk = batch_size or steps + 1
    pairs = [(i, k) for i in range(n) for k in range(steps + 1)]
    values = []
    for start in range(0, len(pairs), chunk):
        sample = torch.tensor([i for i, _ in pairs[start:start + chunk]], device=images.device)
        count = removed[torch.tensor([k for _, k in pairs[start:start + chunk]], device=images.device)]
        perturbed = torch.where(place[sample] < count.view(-1, 1, 1, 1), second[sample], first[sample])
        values.append(target_fn(perturbed).detach().double().flatten())
    return torch.cat(values).view(n, steps + 1)


def curve_auc(curve: torch.Tensor) -> torch.Tensor:
    """Area ``[N]`` under each curve ``[N, K + 1]`` with its points at x = 0, 1/K, ..., 1 (the share of pixels
    perturbed), by the trapezoid rule: the curve's mean height, comparable across step counts. (Quantus's
    ``calculate_auc`` integrates with dx = 1 over its points, which start after the first step.)"""
    curve = curve.double()
    steps = curve.shape[1] - 1
    if steps < 1:
        raise ValueError(f"curve_auc needs at least 2 points per curve, got {curve.shape[1]}")
    return (curve[:, 1:] + curve[:, :-1]).sum(1) / (2 * steps)


def gaussian_kernel(sigma: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """scipy.ndimage's 1-D Gaussian: radius ``int(4 sigma + 0.5)``, normalised to sum 1."""
    radius = int(BLUR_TRUNCATE * sigma + 0.5)
    x = torch.arange(-radius, radius + 1, dtype=torch.float64, device=device)
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    return (kernel / kernel.sum()).to(dtype)


def reflected(length: int, radius: int, device: torch.device) -> torch.Tensor:
    """Indices of a line of ``length`` padded by ``radius`` on each side with scipy's ``mode="reflect"``
    (d c b a | a b c d | d c b a), for any radius."""
    index = torch.arange(-radius, length + radius, device=device) % (2 * length)
    return torch.where(index < length, index, 2 * length - 1 - index)


def blurred_baseline(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """``images`` ``[N, C, H, W]`` blurred by a Gaussian of ``sigma`` pixels per channel
    (``scipy.ndimage.gaussian_filter(image, (0, sigma, sigma))``: truncated at 4 sigma, edges reflected)."""
    if sigma <= 0:
        raise ValueError(f"blurred_baseline needs sigma > 0 (pixels), got {sigma}")
    n, c, height, width = images.shape
    kernel = gaussian_kernel(sigma, images.dtype, images.device)
    radius = kernel.numel() // 2
    out = images.reshape(n * c, 1, height, width)
    out = out[..., reflected(height, radius, images.device), :]
    out = F.conv2d(out, kernel.view(1, 1, -1, 1))
    out = out[..., reflected(width, radius, images.device)]
    out = F.conv2d(out, kernel.view(1, 1, 1, -1))
    return out.view(n, c, height, width)


def mean_baseline(images: torch.Tensor, mean: float | Sequence[float] | torch.Tensor) -> torch.Tensor:
    """A baseline ``[N, C, H, W]`` of one value per channel (``mean``: a number or C numbers, e.g. the dataset's
    mean in the model's input space, which is 0 for a model normalising with that dataset's mean and std)."""
    value = torch.as_tensor(mean, dtype=images.dtype, device=images.device).flatten()
    if value.numel() not in (1, images.shape[1]):
        raise ValueError(f"mean_baseline: mean has {value.numel()} values for {images.shape[1]} channels")
    return value.view(1, -1, 1, 1).expand_as(images).clone()


def random_pairs(groups: list[list[int]], keys: list, per_item: int, generator: torch.Generator) -> torch.Tensor:
    """``[M, 2]``: ``per_item`` pairs per item of each group, drawn uniformly among the group's pairs of items with
    different ``keys`` (as Arun et al.: for each map, ``per_item`` random pairs); none for a group with a single key."""
    codes = {key: code for code, key in enumerate(dict.fromkeys(keys))}
    pairs = []
    for members in groups:
        member_keys = torch.tensor([codes[keys[i]] for i in members])
        if member_keys.unique().numel() < 2:
            continue
        wanted, found, count = per_item * len(members), [], 0
        while count < wanted:
            draw = torch.randint(len(members), (2 * wanted, 2), generator=generator)
            draw = draw[member_keys[draw[:, 0]] != member_keys[draw[:, 1]]]
            found.append(draw)
            count += len(draw)
        pairs.append(torch.tensor(members)[torch.cat(found)[:wanted]])
    return torch.cat(pairs) if pairs else torch.zeros(0, 2, dtype=torch.long)


def random_pair_indices(image_ids: Sequence, finding_ids: Sequence, seed: int,
                        pairs_per_map: int = PAIRS_PER_MAP) -> torch.Tensor:
    """``[M, 2]``: the pairs of maps (indices into ``image_ids``/``finding_ids``) that ``random_pair_baseline`` averages:
    for each map, ``pairs_per_map`` pairs drawn uniformly (``seed``) among its finding's pairs of maps of different
    images, the maps first put in (finding, image) order, so the pairs do not depend on the order they come in."""
    if len(image_ids) != len(finding_ids):
        raise ValueError(f"random pairs: {len(image_ids)} image ids, {len(finding_ids)} finding ids")
    images, findings = [str(i) for i in image_ids], [str(f) for f in finding_ids]
    groups: dict[str, list[int]] = {}
    for i in sorted(range(len(images)), key=lambda i: (findings[i], images[i], i)):
        groups.setdefault(findings[i], []).append(i)
    return random_pairs(list(groups.values()), images, pairs_per_map, torch.Generator().manual_seed(seed))


def random_pair_baseline(maps: torch.Tensor, image_ids: Sequence, finding_ids: Sequence, seed: int,
                         pairs_per_map: int = PAIRS_PER_MAP, batch_size: int = 16) -> float:
    """Arun et al.'s randomization baseline: the mean SSIM of random pairs of the trained model's maps ``[K, H, W]``
    (normalised as the benchmark normalises) of different images and the same finding (``random_pair_indices``);
    NaN without pairs. ``batch_size`` pairs at a time (SSIM holds a few float64 copies of each)."""
    if len(maps) != len(image_ids):
        raise ValueError(f"random_pair_baseline: {len(maps)} maps, {len(image_ids)} image ids")
    pairs = random_pair_indices(image_ids, finding_ids, seed, pairs_per_map).to(maps.device)
    if not len(pairs):
        return math.nan
    total = sum(float(ssim(maps[pairs[s:s + batch_size, 0]], maps[pairs[s:s + batch_size, 1]]).sum())
                for s in range(0, len(pairs), batch_size))
    return total / len(pairs)


def passes_randomization(last_stage_similarity: float, baseline: float) -> bool | None:
    """Whether a map passes the randomization test (Arun et al.): its mean similarity to the trained model's map after
    the last stage falls below the random-pair baseline. None where either is undefined (NaN)."""
    if math.isnan(last_stage_similarity) or math.isnan(baseline):
        return None
    return last_stage_similarity < baseline
