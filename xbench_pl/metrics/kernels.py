"""Fused per-pixel kernels for the grounding metrics: one streaming pass per map, no full-size temporaries.

The plain torch functions in ``functional.py`` are the reference and the fallback; these kernels
(numba, compiled on first use and cached on disk) give the same numbers and are used when numba is
installed, the maps are float32 on the CPU and ``XBENCH_METRIC_KERNELS`` is not ``0``. Float32 maps on
another device (CUDA) take the vectorised torch path of ``device_kernels.py``, which gives the same integer
counts, from which the same functions here derive the statistics (``path`` picks; ``XBENCH_METRIC_KERNELS=torch``
or ``device_path()`` send CPU maps there too).

One pass over a map's pixels, after a first pass for its range, yields every integer count the
statistics need: the Pointing Game's maximal pixels (all, inside the region); per pixel of the
normalised map, how many thresholds it reaches (``functional.thresholds_reached``) and its 8-bit
level (``functional.to_uint8``), each histogrammed inside/outside the region; and the map's positive
mass, inside and in all, as exact sums (below). The pass runs in blocks of ``BLOCK`` pixels: select-only loops
(which LLVM vectorises) compute the normalised values and their bins into L1-resident buffers, then a scalar loop
histograms the bins; the range pass reduces order-preserving integer keys (vectorised, NaN/inf found alike). On
the uniform grid ``k / (T - 1)`` a value's threshold count is ``floor(m (T - 1)) + 1`` corrected by one comparison
either way against the threshold recomputed by the same float32 division, so no table lookup is needed.
Per-map scalars (range, tolerance, normalisation divisor) are computed by the same torch expressions as the reference, on ``[N, 1]`` tensors, and the
per-pixel float32 arithmetic (``(m - lo) / span``, ``m * 255``) is the same IEEE operation, so every
count equals the reference's and every statistic derived from the counts (Dice/IoU curves, Pointing
Game, Otsu Dice/IoU) is bit-identical. Pixel AUROC sorts each map's order-preserving integer keys
(LSD radix sort, the region flag in the lowest bit) and counts the Mann-Whitney sum in int64 exactly
as the reference does: bit-identical.

``energy_pg`` is the one statistic that is not an integer count: the reference divides two float64
sums whose rounding depends on torch's reduction order, which changes with the batch's shape, the
thread count and the CPU's vector width (a map summed alone and within a batch can differ in the last
bit). The kernel sums the float32 masses exactly (a per-exponent integer accumulator) and returns the
correctly rounded ratio of the exact sums: the same value on any machine and for any batching, within
a few units in the last place of the reference's (tested to 1e-15 relative).

Over 500 lines on purpose: the numba kernels share one compile-and-cache setup and one layout of counts, and
each is checked against its reference in ``functional.py``.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from xbench_pl.console import note
from xbench_pl.metrics import device_kernels
from xbench_pl.metrics.device_kernels import normalisation, pointing_scalars, raise_if_bad

try:  # optional at run time: without numba the torch reference path runs
    import numba
except ImportError:  # pragma: no cover - numba is a dependency, but the fallback must keep working
    numba = None

#: ``0`` turns the kernels off (the torch reference path everywhere); ``torch`` sends every float32 map, CPU ones
#: included, to the vectorised torch path (``device_kernels.py``, the one CUDA maps take).
ENV = "XBENCH_METRIC_KERNELS"
_FORCED: str | None = None  # the mode a context manager forces (``disabled``, ``device_path``), before ENV


def default_thresholds(step: float = 0.01, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The threshold grid 0, step, ..., 1 (101 values by default)."""
    count = round(1 / step)
    return (torch.arange(count + 1, dtype=torch.float64) / count).to(dtype)


def otsu_threshold_from_histogram(hist: torch.Tensor, pixels: int) -> torch.Tensor:
    """``otsu_threshold`` from each map's 256-bin histogram ``[N, 256]`` (int64) of ``pixels`` pixels."""
    hist = hist.double()
    p = hist / pixels
    level = torch.arange(256, dtype=torch.float64, device=hist.device)
    q1 = p.cumsum(1)
    q2 = 1 - q1
    mu = (p * level).sum(1, keepdim=True)
    mu1 = (p * level).cumsum(1) / q1.clamp_min(1e-300)
    mu2 = (mu - q1 * mu1) / q2.clamp_min(1e-300)
    eps = float(torch.finfo(torch.float32).eps)
    valid = (torch.minimum(q1, q2) >= eps) & (torch.maximum(q1, q2) <= 1 - eps)
    sigma = torch.where(valid, q1 * q2 * (mu1 - mu2) ** 2, torch.zeros_like(q1))
    best = sigma.argmax(1)  # first maximum
    return torch.where(sigma.gather(1, best[:, None])[:, 0] > 0, best, torch.zeros_like(best))


def _mode() -> str:
    return _FORCED or os.environ.get(ENV, "1")


def available() -> bool:
    """Whether the numba kernels run for CPU float32 maps."""
    return numba is not None and _mode() not in ("0", "torch")


def path(maps: torch.Tensor, *others: torch.Tensor) -> str | None:
    """Which path computes the counts of float32 ``maps``: ``"numba"`` (everything on the CPU, numba present),
    ``"torch"`` (``device_kernels.py``: maps on another device, or the ``torch`` switch), None (the reference
    in ``functional.py``: float64 maps, the kernels off, or CPU maps without numba)."""
    mode = _mode()
    if mode == "0" or maps.dtype != torch.float32:
        return None
    if mode == "torch" or maps.device.type != "cpu":
        return "torch"
    return "numba" if numba is not None and all(t.device.type == "cpu" for t in others) else None


def applies(maps: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether a fast path (numba or the vectorised torch one) takes these tensors."""
    return path(maps, *others) is not None


@contextlib.contextmanager
def _forced(mode: str):
    global _FORCED
    before, _FORCED = _FORCED, mode
    try:
        yield
    finally:
        _FORCED = before


def disabled():
    """Run the torch reference path inside the block (tests, benchmarks)."""
    return _forced("0")


def device_path():
    """Run the vectorised torch path (``device_kernels.py``) inside the block, for CPU maps too (tests, benchmarks)."""
    return _forced("torch")


# -- numba kernels -------------------------------------------------------------------------------
if numba is not None:
    _jit = numba.njit(cache=True, nogil=True)

    @_jit
    def _row_range(keys):
        """Largest and smallest order-preserving key of one map's float32 bits, and whether any value is
        NaN or inf: integer reductions, which vectorise (float ones would need fast-math)."""
        top, bottom, special = -(1 << 31), (1 << 31) - 1, 0
        for j in range(keys.shape[0]):
            b = keys[j]
            k = b ^ ((b >> 31) & 0x7FFFFFFF)  # signed order of k = float order of the value
            top = max(top, k)
            bottom = min(bottom, k)
            special |= (b & 0x7F800000) == 0x7F800000
        return top, bottom, special

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _range_kernel(keys, hi, lo, bad):
        for i in numba.prange(keys.shape[0]):
            hi[i], lo[i], bad[i] = _row_range(keys[i])

    COPIES = 4  # interleaved sub-histograms: neighbouring pixels (smooth maps) rarely wait on one counter
    BLOCK = 1024  # pixels per block: its per-pixel values stay in L1 between the vectorised and the histogram loops

    @_jit
    def _normalise(row, shift, divisor, nothing, out):
        zero = np.float32(0.0)
        for j in range(row.shape[0]):
            out[j] = zero if nothing else (row[j] - shift) / divisor

    @_jit
    def _uniform_bins(m, inside, steps, stride, bins):
        """bins[j] = #{k: k / steps <= m[j]} (the uniform grid's thresholds, by the same float32 division) + stride
        if inside: floor(m * steps) + 1, corrected by one comparison either way; select-only, so it vectorises."""
        zero, one, last = np.float32(0.0), np.float32(1.0), steps + np.float32(1.0)
        for j in range(m.shape[0]):
            v = m[j]
            guess = v * steps
            guess = guess if guess > zero else zero  # also NaN -> 0 (such maps raise): the bin stays in range
            guess = guess if guess < steps else steps
            r = np.floor(guess) + one
            r = r + (one if r / steps <= v else zero)
            r = r if r < last else last
            r = r - (one if (r - one) / steps > v else zero)
            bins[j] = np.int32(r) + stride * np.int32(inside[j])

    @_jit
    def _searched_bins(m, inside, thresholds, stride, bins):
        """bins[j] = #{k: thresholds[k] <= m[j]} + stride if inside, by binary search (any ascending grid)."""
        t = thresholds.shape[0]
        for j in range(m.shape[0]):
            v, r, top = m[j], 0, t
            while r < top:
                middle = (r + top) >> 1
                if thresholds[middle] <= v:
                    r = middle + 1
                else:
                    top = middle
            bins[j] = r + stride * np.int32(inside[j])

    @_jit
    def _level_bins(m, inside, bins):
        """bins[j] = uint8(255 * m[j]) (clamped, truncated: functional.to_uint8) + 256 if inside."""
        zero, c255 = np.float32(0.0), np.float32(255.0)
        for j in range(m.shape[0]):
            q = m[j] * c255
            q = q if q > zero else zero
            q = q if q < c255 else c255
            bins[j] = np.int32(q) + 256 * np.int32(inside[j])

    @_jit
    def _histogram(bins, hist):
        width = hist.shape[0] // COPIES
        for j in range(bins.shape[0]):
            hist[(j & (COPIES - 1)) * width + bins[j]] += 1

    @_jit
    def _merge(copies, out):
        """out += the sum of the COPIES sub-histograms laid end to end in ``copies``."""
        width = out.shape[0]
        for u in range(COPIES):
            for k in range(width):
                out[k] += copies[u * width + k]

    @_jit
    def _add_mass(m, inside, acc):
        """acc[copy, inside, exponent] += mantissa of every positive m (exact: a float32 is mantissa * 2**(exponent - 150))."""
        bits = m.view(np.uint32)
        for j in range(m.shape[0]):
            if m[j] > 0:
                b = bits[j]
                exponent = (b >> 23) & 0xFF
                mantissa = b & 0x7FFFFF
                if exponent > 0:
                    mantissa |= 0x800000
                else:
                    exponent = 1
                acc[j & (COPIES - 1), inside[j], exponent] += mantissa

    @_jit
    def _count_maximal(row, inside, floor, everything):
        count, count_in = 0, 0
        for j in range(row.shape[0]):
            hit = 1 if everything or row[j] >= floor else 0
            count += hit
            count_in += hit & inside[j]
        return count, count_in

    @_jit
    def _fused_maps(first, last, flat, region, max_floor, all_maximal, shift, divisor, zero_map, thresholds, uniform, want,
                    maximal, curve_hist, level_hist, mass):
        p, t = flat.shape[1], thresholds.shape[0]
        steps = np.float32(t - 1)
        curve = np.empty(COPIES * 2 * (t + 1), dtype=np.int32)
        level = np.empty(COPIES * 2 * 256, dtype=np.int32)
        acc = np.empty((COPIES, 2, 255), dtype=np.int64)
        m = np.empty(BLOCK, dtype=np.float32)
        bins = np.empty(BLOCK, dtype=np.int32)
        for i in range(first, last):
            curve[:] = 0
            if want & 2:
                level[:] = 0
            if want & 4:
                acc[:] = 0
            row, inside = flat[i], region[i].view(np.uint8)
            if want & 1:
                maximal[i, 0], maximal[i, 1] = _count_maximal(row, inside, max_floor[i], all_maximal[i])
            for start in range(0, p, BLOCK):
                n = min(BLOCK, p - start)
                values, flags, block, where = m[:n], inside[start:start + n], bins[:n], row[start:start + n]
                _normalise(where, shift[i], divisor[i], zero_map[i], values)
                if uniform:
                    _uniform_bins(values, flags, steps, np.int32(t + 1), block)
                else:
                    _searched_bins(values, flags, thresholds, np.int32(t + 1), block)
                _histogram(block, curve)
                if want & 2:
                    _level_bins(values, flags, block)
                    _histogram(block, level)
                if want & 4:
                    _add_mass(values, flags, acc)
            _merge(curve, curve_hist[i].ravel())
            if want & 2:
                _merge(level, level_hist[i].ravel())
            if want & 4:
                _merge(acc.ravel(), mass[i].ravel())

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _fused_kernel(flat, region, max_floor, all_maximal, shift, divisor, zero_map, thresholds, uniform, want,
                      maximal, curve_hist, level_hist, mass, chunks):
        """Per map i: maximal[i] = (#maximal, #maximal inside); curve_hist[i, inside, reached];
        level_hist[i, inside, uint8 level]; mass[i, inside, exponent] += mantissa of the positive normalised value."""
        n = flat.shape[0]
        for c in numba.prange(chunks):  # one set of scratch buffers per chunk of maps
            _fused_maps(c * n // chunks, (c + 1) * n // chunks, flat, region, max_floor, all_maximal, shift, divisor, zero_map,
                        thresholds, uniform, want, maximal, curve_hist, level_hist, mass)

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _count_kernel(flags, counts):
        for i in numba.prange(flags.shape[0]):
            row, total = flags[i], 0
            for j in range(row.shape[0]):
                total += row[j]
            counts[i] = total

    @_jit
    def _auroc_maps(first, last, flat, region, twice, positives):
        """Maps first..last-1: twice the Mann-Whitney count (ties half) and the region's pixel count, via an LSD
        radix sort of 33-bit keys (order-preserving float32 bits, then the region flag)."""
        p = flat.shape[1]
        keys = np.empty(p, dtype=np.uint64)
        other = np.empty(p, dtype=np.uint64)
        counts = np.zeros((3, 2048), dtype=np.int64)
        offsets = np.empty(2048, dtype=np.int64)
        box = np.zeros(1, dtype=np.float32)
        bits = box.view(np.uint32)
        for i in range(first, last):
            counts[:] = 0
            pos = 0
            for j in range(p):
                v = flat[i, j]
                box[0] = v if v != 0 else np.float32(0.0)  # -0 and +0 tie
                b = np.uint64(bits[0])
                key = (b ^ np.uint64(0xFFFFFFFF)) if b & np.uint64(0x80000000) else (b | np.uint64(0x80000000))
                g = 1 if region[i, j] else 0
                pos += g
                key = (key << np.uint64(1)) | np.uint64(g)
                keys[j] = key
                counts[0, key & np.uint64(2047)] += 1
                counts[1, (key >> np.uint64(11)) & np.uint64(2047)] += 1
                counts[2, (key >> np.uint64(22)) & np.uint64(2047)] += 1
            src, dst = keys, other
            for d in range(3):
                if counts[d].max() == p:  # one digit value: this pass would not move anything
                    continue
                start = 0
                for k in range(2048):
                    offsets[k] = start
                    start += counts[d, k]
                shift = np.uint64(11 * d)
                for j in range(p):
                    key = src[j]
                    k = (key >> shift) & np.uint64(2047)
                    dst[offsets[k]] = key
                    offsets[k] += 1
                src, dst = dst, src
            total, below, j = 0, 0, 0
            while j < p:
                value = src[j] >> np.uint64(1)
                group_pos, group_neg = 0, 0
                while j < p and (src[j] >> np.uint64(1)) == value:
                    if src[j] & np.uint64(1):
                        group_pos += 1
                    else:
                        group_neg += 1
                    j += 1
                total += 2 * below * group_pos + group_pos * group_neg
                below += group_neg
            twice[i], positives[i] = total, pos

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _auroc_kernel(flat, region, twice, positives, chunks):
        n = flat.shape[0]
        for c in numba.prange(chunks):  # one scratch buffer per chunk of maps
            _auroc_maps(c * n // chunks, (c + 1) * n // chunks, flat, region, twice, positives)

    @_jit
    def _overlap_kernel(flat, region, max_floor, all_maximal, inside, maximal):
        """inside[a, b]: maximal pixels of map a inside region b; maximal[a]: all maximal pixels of map a."""
        k, p = flat.shape
        for a in range(k):
            for j in range(p):
                if all_maximal[a] or flat[a, j] >= max_floor[a]:
                    maximal[a] += 1
                    for b in range(k):
                        if region[b, j]:
                            inside[a, b] += 1


# -- torch-facing functions ----------------------------------------------------------------------
def _flat(maps: torch.Tensor, masks: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    return maps.flatten(1).contiguous().numpy(), masks.flatten(1).bool().contiguous().numpy()


def region_pixels(masks: torch.Tensor) -> torch.Tensor:
    """Pixels of each mask ``[N, ...]`` (CPU), int64 ``[N]``: ``masks.flatten(1).sum(1)``, which torch runs at
    a fraction of memory speed on bool."""
    flags = masks.flatten(1).bool().contiguous().numpy().view(np.uint8)
    counts = np.zeros(flags.shape[0], np.int64)
    if flags.size:
        _threads(flags.shape[0])
        _count_kernel(flags, counts)
    return torch.from_numpy(counts)


def map_range(flat: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``hi, lo`` ``[N, 1]`` float32 of each row (``amax``/``amin``); ValueError for NaN or inf."""
    n = flat.shape[0]
    hi, lo, bad = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.bool_)
    if flat.shape[1]:
        _threads(n)
        _range_kernel(flat.view(np.int32), hi, lo, bad)
    raise_if_bad(bad)
    # back from keys to float32 (the key map is its own inverse); of -0 and +0 it keeps +0 as the max and -0 as the
    # min, which no count depends on (every comparison, the sign-free tolerance and m > 0 treat them alike)
    hi, lo = ((k ^ ((k >> 31) & 0x7FFFFFFF)).astype(np.int32).view(np.float32) for k in (hi, lo))
    return torch.from_numpy(hi)[:, None], torch.from_numpy(lo)[:, None]


def _uniform(thresholds: torch.Tensor) -> bool:
    """Whether ``thresholds`` (float32) are ``k / (T - 1)`` as float32 divisions, as ``_uniform_bins`` computes them
    (``default_thresholds`` rounds from float64, which gives the same values for every grid tested)."""
    t = thresholds.numel()
    return t >= 2 and torch.equal(thresholds, torch.arange(t, dtype=torch.float32) / torch.tensor(t - 1, dtype=torch.float32))


def cached_on_disk(dispatchers) -> bool:
    """Whether numba's disk cache holds a compiled version of each dispatcher for its current source (else
    its first call compiles). True where numba's cache internals are not as expected: then nothing is said."""
    try:
        return all(d._cache._cache_file._load_index() for d in dispatchers)  # {} when missing or stale
    except (AttributeError, OSError):
        return True


_COMPILE_NOTED = False


def _note_compiling() -> None:
    """Say once per process when the kernels are about to be compiled: the first run pauses for it."""
    global _COMPILE_NOTED
    if not _COMPILE_NOTED:
        _COMPILE_NOTED = True
        if not cached_on_disk([_fused_kernel]):  # the one every run calls, and most of the compile time
            note("compiling the metric kernels (numba; first run only, about 20 s, then cached on disk)")


def _threads(n: int) -> int:
    """numba threads for n maps: torch's thread count (a DDP rank's share), at most one per map. Every kernel
    call comes after it, so it says when they compile (``_note_compiling``)."""
    _note_compiling()
    k = max(1, min(n, torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(k)
    return k


#: What ``grounding_counts`` fills (bit flags): maximal pixels, 8-bit levels, positive mass; the curve always.
WANT_MAXIMAL, WANT_LEVELS, WANT_MASS = 1, 2, 4
WANT_ALL = WANT_MAXIMAL | WANT_LEVELS | WANT_MASS


def grounding_counts(maps: torch.Tensor, masks: torch.Tensor, thresholds: torch.Tensor | None = None,
                     normalize: str = "none", want: int = WANT_ALL) -> dict[str, torch.Tensor]:
    """The fused pass over ``maps [N, H, W]`` float32 and ``masks [N, H, W]``: integer counts per map.

    ``maximal [N, 2]`` (maximal pixels of the raw map: all, inside); ``curve [N, 2, T + 1]`` (pixels of the
    ``normalize``d map by thresholds reached, outside/inside); ``levels [N, 2, 256]`` (its 8-bit levels,
    outside/inside); ``mass [N, 2, 255]`` (its positive values' mantissas summed per float32 exponent,
    outside/inside); ``region [N]`` (region pixels); ``device``, the maps' (the ``*_from_counts`` statistics go
    there). Float32 maps: numba on the CPU, ``device_kernels.grounding_counts`` elsewhere (``path``), the same counts.
    """
    if thresholds is None:
        thresholds = default_thresholds()
    if path(maps, masks) == "torch":
        return device_kernels.grounding_counts(maps, masks, thresholds, normalize, want)
    flat, region = _flat(maps, masks)
    n, p = flat.shape
    hi, lo = map_range(flat)
    constant, max_floor = pointing_scalars(hi, lo)
    thresholds = thresholds.to("cpu", torch.float32).contiguous()
    shift, divisor, zero = normalisation(hi, lo, constant, normalize)
    t = thresholds.numel()
    maximal = np.zeros((n, 2), np.int64)
    curve = np.zeros((n, 2, t + 1), np.int64)
    levels = np.zeros((n, 2, 256), np.int64)
    mass = np.zeros((n, 2, 255), np.int64)
    if n and p:
        _fused_kernel(flat, region, max_floor[:, 0].numpy(), constant[:, 0].numpy(), shift[:, 0].contiguous().numpy(),
                      divisor[:, 0].contiguous().numpy(), zero[:, 0].contiguous().numpy(), thresholds.numpy(), _uniform(thresholds),
                      want, maximal, curve, levels, mass, _threads(n))
    curve, levels = torch.from_numpy(curve), torch.from_numpy(levels)
    return {"maximal": torch.from_numpy(maximal), "curve": curve, "levels": levels, "mass": mass,
            "region": curve[:, 1].sum(1), "pixels": p, "device": maps.device}


# -- statistics from the counts: the reference's own arithmetic on them -------------------------------
# The counts live on the CPU whichever path made them: the statistics are computed there by the same code (so the
# same bits) and placed on the maps' device (``counts["device"]``), as the reference path returns them.
def _placed(counts: dict, *values: torch.Tensor):
    out = tuple(v.to(counts["device"]) for v in values)
    return out if len(out) > 1 else out[0]


def pointing_from_counts(counts: dict) -> torch.Tensor:
    return _placed(counts, _pointing(counts))


def _pointing(counts: dict) -> torch.Tensor:
    maximal = counts["maximal"]
    hits = maximal[:, 1].double() / maximal[:, 0].double()
    return torch.where(counts["region"] > 0, hits, torch.full_like(hits, float("nan")))


def any_tie_from_counts(counts: dict) -> torch.Tensor:
    """``functional.pointing_game_any_tie``: a hit when any maximal pixel is inside the region."""
    hits = (counts["maximal"][:, 1] > 0).double()
    return _placed(counts, torch.where(counts["region"] > 0, hits, torch.full_like(hits, float("nan"))))


def lift_from_counts(counts: dict) -> torch.Tensor:
    """``functional.pointing_lift``: the Pointing Game minus the region's area fraction."""
    return _placed(counts, _pointing(counts) - counts["region"].double() / counts["pixels"])


def curve_from_counts(counts: dict) -> tuple[torch.Tensor, torch.Tensor]:
    hist = counts["curve"]
    suffix = hist.flip(-1).cumsum(-1).flip(-1)[..., 1:].double()  # pixels with reached > k, i.e. in B_t[k]
    inter = suffix[:, 1]
    predicted = suffix[:, 0] + inter
    truth = counts["region"][:, None].double()
    dice = 2 * inter / (predicted + truth)
    iou = inter / (predicted + truth - inter)
    empty = truth == 0
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    return _placed(counts, torch.where(empty, nan, dice), torch.where(empty, nan, iou))


def otsu_from_counts(counts: dict) -> tuple[torch.Tensor, torch.Tensor]:
    levels = counts["levels"]
    threshold = otsu_threshold_from_histogram(levels.sum(1), counts["pixels"])
    above = torch.arange(256)[None, :] > threshold[:, None]
    inter = (levels[:, 1] * above).sum(1).double()
    p, g = (levels.sum(1) * above).sum(1).double(), counts["region"].double()
    dice, iou = 2 * inter / (p + g).clamp_min(1), inter / (p + g - inter).clamp_min(1)
    nan = torch.full_like(dice, float("nan"))
    return _placed(counts, torch.where(g > 0, dice, nan), torch.where(g > 0, iou, nan))


def _exact(accumulator: np.ndarray) -> int:
    """The exact sum, in units of 2**-149, of mantissas accumulated per float32 exponent."""
    return sum(int(c) << (e - 1) for e, c in enumerate(accumulator.tolist()) if c)


def energy_from_counts(counts: dict) -> torch.Tensor:
    mass, region, pixels = counts["mass"], counts["region"], counts["pixels"]
    values = []
    for i in range(mass.shape[0]):
        inside = _exact(mass[i, 1])
        total = inside + _exact(mass[i, 0])
        values.append(inside / total if total > 0 else int(region[i]) / pixels)
    value = torch.tensor(values, dtype=torch.float64)
    return _placed(counts, torch.where(region > 0, value, torch.full_like(value, float("nan"))))


# -- functional twins ------------------------------------------------------------------------------
def pointing_game(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    return pointing_from_counts(grounding_counts(maps, masks, want=WANT_MAXIMAL))


def pointing_game_any_tie(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    return any_tie_from_counts(grounding_counts(maps, masks, want=WANT_MAXIMAL))


def dice_iou_curve(maps: torch.Tensor, masks: torch.Tensor, thresholds: torch.Tensor, normalize: str = "none"):
    return curve_from_counts(grounding_counts(maps, masks, thresholds, normalize, want=0))


def energy_pointing(maps: torch.Tensor, masks: torch.Tensor, normalize: str = "none") -> torch.Tensor:
    return energy_from_counts(grounding_counts(maps, masks, None, normalize, want=WANT_MASS))


def otsu_dice_iou(maps: torch.Tensor, masks: torch.Tensor, normalize: str = "none"):
    return otsu_from_counts(grounding_counts(maps, masks, None, normalize, want=WANT_LEVELS))


def pixel_auroc(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per pair ``functional.pixel_auroc`` ``[N]`` float64, on the maps' device."""
    if path(maps, masks) == "torch":
        return device_kernels.pixel_auroc(maps, masks)
    flat, region = _flat(maps, masks)
    n, p = flat.shape
    map_range(flat)  # NaN/inf check, as the reference
    twice, positives = np.zeros(n, np.int64), np.zeros(n, np.int64)
    if n and p:
        _auroc_kernel(flat, region, twice, positives, _threads(n))
    twice, pos = torch.from_numpy(twice), torch.from_numpy(positives)
    neg = p - pos
    defined = (pos > 0) & (neg > 0)
    auc = twice.double() / (2 * pos * neg).clamp_min(1).double()
    return torch.where(defined, auc, torch.full_like(auc, float("nan")))


def maximal_overlap(maps: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For K maps and K regions of one image: ``inside [K, K]`` (maximal pixels of map a in region b) and
    ``maximal [K]``, both int64."""
    flat, region = _flat(maps, masks)
    k = flat.shape[0]
    hi, lo = map_range(flat)
    constant, max_floor = pointing_scalars(hi, lo)
    inside, maximal = np.zeros((k, k), np.int64), np.zeros(k, np.int64)
    if k and flat.shape[1]:
        _overlap_kernel(flat, region, max_floor[:, 0].numpy(), constant[:, 0].numpy(), inside, maximal)
    return torch.from_numpy(inside), torch.from_numpy(maximal)


def maximal_overlaps(maps: torch.Tensor, masks: torch.Tensor, groups: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``maximal_overlap`` of the rows of each group (one image's pairs; CPU index tensors), on the CPU: per group
    with numba, all groups at once on the torch path (one transfer per batch)."""
    if path(maps, masks) == "torch":
        return device_kernels.maximal_overlaps(maps, masks, groups)
    return [maximal_overlap(maps[rows], masks[rows]) for rows in groups]


def grounding_statistics(maps: torch.Tensor, masks: torch.Tensor, thresholds: torch.Tensor, normalize: str) -> dict[str, torch.Tensor]:
    """Every per-pair statistic of ``BenchmarkMetrics`` but specificity, from one fused pass (and the AUROC sort):
    ``pointing_game, pg_any_tie, dice, iou`` (curves of the ``normalize``d map), ``energy_pg, dice_otsu, iou_otsu``
    (of the ``normalize``d map), ``pixel_auroc`` (raw map)."""
    counts = grounding_counts(maps, masks, thresholds, normalize)
    dice, iou = curve_from_counts(counts)
    dice_otsu, iou_otsu = otsu_from_counts(counts)
    return {"pointing_game": pointing_from_counts(counts), "pg_any_tie": any_tie_from_counts(counts), "dice": dice, "iou": iou,
            "energy_pg": energy_from_counts(counts), "dice_otsu": dice_otsu, "iou_otsu": iou_otsu,
            "pixel_auroc": pixel_auroc(maps, masks)}
