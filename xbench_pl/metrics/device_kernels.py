"""The grounding metrics' integer counts in vectorised torch: the path for maps on a GPU (or any device).

The numba kernels (``kernels.py``) stream over CPU maps; here the same counts come from whole-batch tensor ops
(reductions, ``searchsorted``, ``scatter_add_`` histograms, one ``sort`` per chunk), chunked by ``CHUNK_PIXELS``
to bound memory, with no per-pair loop and one small device-to-host transfer per batch (the integer counts and
the NaN/inf flags, packed into one int64 tensor; pixel AUROC, computed on the device, reads back its NaN/inf
flags only). The statistics are then derived from the counts on the host by ``kernels.*_from_counts``, the very
code that derives them from numba's counts, and placed back on the maps' device (``[N]`` float64 each). Every step is exact or the same IEEE float32 operation as numba's (``(m - shift) / divisor``, ``m * 255``,
the per-map scalars below, by the same torch expressions), so the counts are equal to numba's, bit for bit: the
thresholds reached are ``#{k: thresholds[k] <= m}`` by ``searchsorted(right=True)`` (what numba's uniform-grid
arithmetic equals by construction), the positive mass is summed per float32 exponent as integer mantissas, and
pixel AUROC counts the Mann-Whitney sum over tie groups in int64 from sorted order-preserving integer keys.
``kernels.path`` picks this module for CUDA maps, and for CPU maps under ``XBENCH_METRIC_KERNELS=torch`` or
``kernels.device_path()`` (the tests compare it with numba that way).
"""

from __future__ import annotations

import torch

RELATIVE_TOLERANCE = 1e-6  # functional.RELATIVE_TOLERANCE (kept equal by a test)
MODES = ("minmax", "max", "none")

#: Pixels per chunk of maps (at least one map): a chunk's int64 temporaries take a few times 8 bytes per pixel.
CHUNK_PIXELS = 1 << 23


def raise_if_bad(bad) -> None:
    """``bad [N]`` (bool tensor or array): which maps hold NaN or inf; the metrics' one error for them."""
    where = torch.as_tensor(bad).nonzero().flatten().tolist()
    if where:
        raise ValueError(f"saliency maps contain NaN or inf (maps at positions {where[:10]}{'...' if len(where) > 10 else ''})")


def pointing_scalars(hi: torch.Tensor, lo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``functional._range``'s ``constant`` and the Pointing Game's ``hi - tol * (hi - lo)``, by the same torch ops."""
    span = hi - lo
    constant = span <= RELATIVE_TOLERANCE * torch.maximum(hi.abs(), lo.abs()).clamp_min(torch.finfo(torch.float32).tiny)
    return constant, hi - RELATIVE_TOLERANCE * (hi - lo)


def normalisation(hi, lo, constant, normalize: str):
    """Per map ``shift, divisor, zero`` with ``normalize_saliency(m) = 0 if zero else (m - shift) / divisor``."""
    if normalize == "minmax":
        return lo, torch.where(constant, torch.ones_like(hi), hi - lo), constant
    if normalize == "max":
        positive = hi > 0
        return torch.zeros_like(hi), torch.where(positive, hi, torch.ones_like(hi)), ~positive
    if normalize == "none":
        return torch.zeros_like(hi), torch.ones_like(hi), torch.zeros_like(constant)
    raise ValueError(f"normalize mode must be one of {MODES}, got {normalize!r}")


def map_range(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``hi, lo`` ``[N, 1]`` (``amax``/``amin``) and ``bad [N]``, whether a map holds NaN or inf (amax/amin
    propagate NaN), on the maps' device: nothing is raised here, so no transfer."""
    hi, lo = flat.amax(1, keepdim=True), flat.amin(1, keepdim=True)
    return hi, lo, ~(torch.isfinite(hi) & torch.isfinite(lo))[:, 0]


def _chunks(n: int, p: int):
    step = max(1, CHUNK_PIXELS // max(p, 1))
    return (slice(start, min(start + step, n)) for start in range(0, n, step))


def _histogram(index: torch.Tensor, bins: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """int64 counts (or integer ``weights`` summed) per bin of ``index``: ``bincount`` without its host sync
    (it reads the largest index back) and exact for int64 weights."""
    index = index.flatten()
    weights = torch.ones(1, dtype=torch.long, device=index.device).expand_as(index) if weights is None else weights.flatten()
    return torch.zeros(bins, dtype=torch.long, device=index.device).scatter_add_(0, index, weights)


def _binned(values: torch.Tensor, inside: torch.Tensor, first: torch.Tensor, width: int) -> torch.Tensor:
    """Each pixel's bin ``values`` moved to its histogram row of ``width`` bins, ``first + inside`` (in place where
    ``values`` is int64 already: fewer passes over the pixels)."""
    return values.long().add_(inside, alpha=width).add_(first * width)


def _flat(maps: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return maps.flatten(1), masks.flatten(1).to(maps.device, torch.bool)


WANT_MAXIMAL, WANT_LEVELS, WANT_MASS = 1, 2, 4  # kernels.WANT_* (the same bits)


def grounding_counts(maps: torch.Tensor, masks: torch.Tensor, thresholds: torch.Tensor, normalize: str = "none",
                     want: int = 7) -> dict:
    """``kernels.grounding_counts`` for float32 maps on any device: the same counts (on the CPU, ``mass`` as
    numpy like numba's) and ``device``, where the statistics derived from them go."""
    flat, region = _flat(maps, masks)
    n, p = flat.shape
    device = flat.device
    thresholds = thresholds.to(device, torch.float32).contiguous()
    t = thresholds.numel()
    widths = (2, 2 * (t + 1), 2 * 256, 2 * 255, 1)  # maximal, curve, levels, mass, bad
    packed = torch.zeros(n, sum(widths), dtype=torch.long, device=device)
    maximal, curve, levels, mass, bad = packed.split(widths, 1)
    if n and p:
        hi, lo, flags = map_range(flat)
        bad.copy_(flags[:, None])
        constant, max_floor = pointing_scalars(hi, lo)
        shift, divisor, zero = normalisation(hi, lo, constant, normalize)
        zero = zero | flags[:, None]  # a bad map raises below: zeros keep its bins in range meanwhile
        for rows in _chunks(n, p):
            f, g = flat[rows], region[rows]
            c = f.shape[0]
            if want & WANT_MAXIMAL:
                top = (f >= max_floor[rows]) | constant[rows]
                maximal[rows, 0], maximal[rows, 1] = top.sum(1), (top & g).sum(1)
            m = (f - shift[rows]).div_(divisor[rows]).masked_fill_(zero[rows], 0.0)  # numba's _normalise, same float32 ops
            first = torch.arange(c, device=device)[:, None] * 2  # each map's first histogram row (outside; then inside)
            reached = torch.searchsorted(thresholds, m, right=True)  # #{k: thresholds[k] <= m}
            curve[rows] = _histogram(_binned(reached, g, first, t + 1), c * 2 * (t + 1)).view(c, -1)
            if want & WANT_LEVELS:  # numba's _level_bins: uint8(255 m), clamped by selects (NaN -> 0)
                q = m * 255
                q = torch.where(q > 0, q, 0.0)
                q = torch.where(q < 255, q, 255.0).to(torch.int32)
                levels[rows] = _histogram(_binned(q, g, first, 256), c * 512).view(c, -1)
            if want & WANT_MASS:  # numba's _add_mass: a positive float32 is mantissa * 2**(exponent - 150)
                bits = m.view(torch.int32)
                exponent = (bits >> 23) & 0xFF
                mantissa = torch.where(exponent > 0, (bits & 0x7FFFFF) | 0x800000, bits & 0x7FFFFF)
                mantissa = torch.where(m > 0, mantissa, 0).long()
                mass[rows] = _histogram(_binned(exponent.clamp_(1, 254), g, first, 255), c * 510, mantissa).view(c, -1)
    host = packed.cpu()  # the batch's one transfer
    maximal, curve, levels, mass, bad = host.split(widths, 1)
    raise_if_bad(bad[:, 0])
    curve = curve.reshape(n, 2, t + 1)
    return {"maximal": maximal.contiguous(), "curve": curve, "levels": levels.reshape(n, 2, 256),
            "mass": mass.reshape(n, 2, 255).numpy(), "region": curve[:, 1].sum(1), "pixels": p, "device": device}


def pixel_auroc(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``kernels.pixel_auroc`` for float32 maps on any device, ``[N]`` float64 there: per chunk one sort of
    33-bit keys (order-preserving float32 bits, then the region flag) per map; in sorted order a region pixel
    outscores the negatives of lower-valued tie groups (counted twice) and ties those of its own group, which
    the flag sorts before it, so twice its count is ``negatives before it + negatives before its group``."""
    flat, region = _flat(maps, masks)
    n, p = flat.shape
    twice = torch.zeros(n, dtype=torch.long, device=flat.device)
    if n and p:
        bad = map_range(flat)[2]
        for rows in _chunks(n, p):
            f = flat[rows]
            bits = torch.where(f == 0, 0.0, f).view(torch.int32)  # -0 and +0 tie
            keys = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).long() * 2 + region[rows]  # signed order = float order
            keys = keys.sort(1).values
            positive, value = keys & 1, keys >> 1
            negatives = 1 - positive
            before = negatives.cumsum(1) - negatives  # negatives before each position
            new = torch.ones_like(keys, dtype=torch.bool)
            new[:, 1:] = value[:, 1:] != value[:, :-1]
            start = torch.where(new, torch.arange(p, device=flat.device), 0).cummax(1).values  # its tie group's first
            twice[rows] = (positive * (before + before.gather(1, start))).sum(1)
        raise_if_bad(bad.cpu())
    pos = region.sum(1)
    neg = p - pos
    auc = twice.double() / (2 * pos * neg).clamp_min(1).double()
    return torch.where((pos > 0) & (neg > 0), auc, torch.full_like(auc, float("nan")))


def maximal_overlaps(maps: torch.Tensor, masks: torch.Tensor, groups: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``kernels.maximal_overlap`` of every group of rows at once (``groups``: CPU index tensors, one per image):
    per group ``inside [K, K]`` and ``maximal [K]`` int64 on the CPU, after one transfer."""
    sizes = [len(g) for g in groups]
    if not sizes:
        return []
    offsets = torch.tensor([0] + sizes[:-1]).cumsum(0).tolist()
    a = torch.cat([o + torch.arange(k).repeat_interleave(k) for o, k in zip(offsets, sizes)])  # map of each (a, b)
    b = torch.cat([o + torch.arange(k).repeat(k) for o, k in zip(offsets, sizes)])  # region of each (a, b)
    rows = torch.cat(groups).to(maps.device)
    flat, region = _flat(maps[rows], masks[rows.to(masks.device)])
    hi, lo, bad = map_range(flat)
    constant, max_floor = pointing_scalars(hi, lo)
    top = (flat >= max_floor) | constant
    a, b = a.to(flat.device), b.to(flat.device)
    inside = torch.cat([(top[a[s]] & region[b[s]]).sum(1) for s in _chunks(len(a), flat.shape[1])])
    host = torch.cat([inside, top.sum(1), bad.long()]).cpu()  # the one transfer
    inside, maximal, bad = host.split([len(a), len(rows), len(rows)])
    raise_if_bad(bad)
    inside = inside.split([k * k for k in sizes])
    return [(square.view(k, k), count) for square, count, k in zip(inside, maximal.split(sizes), sizes)]

