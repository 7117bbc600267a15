"""The trust measures (``xbench_pl.metrics.trust``) against their yardsticks: skimage's SSIM with Arun et al.'s
settings, scipy's Spearman and Gaussian filter, Quantus's PixelFlipping, Model Parameter Randomisation Test and
Random Logit on a tiny torch model, and the closed form of an exact-attribution linear model."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
import torch
from torch import nn

from xbench_pl.metrics.trust import (SSIM_DATA_RANGE, blurred_baseline, curve_auc, mean_baseline, perturbation_curve,
                                     random_pair_baseline, random_pair_indices, spearman, ssim)
from xbench_pl.models.randomization import randomized_copy

quantus = pytest.importorskip("quantus")
skimage_metrics = pytest.importorskip("skimage.metrics")
scipy_stats = pytest.importorskip("scipy.stats")
scipy_ndimage = pytest.importorskip("scipy.ndimage")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")

SIZE = 8  # the tiny model's input side


def normalised(maps: torch.Tensor) -> torch.Tensor:
    """Min-max per map, as the benchmark normalises (``normalize="minmax"``)."""
    flat = maps.flatten(1)
    low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    return ((flat - low) / (high - low)).view_as(maps)


class TinyNet(nn.Sequential):
    """Two convolutions and a linear head over 3 classes, with its cascade declared top first."""

    RANDOMIZATION_STAGES = (("head", ("5",)), ("conv 2", ("2",)), ("conv 1", ("0",)))

    def __init__(self, channels: int = 3):
        super().__init__(nn.Conv2d(channels, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * SIZE * SIZE, 3))


@pytest.fixture
def net() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet().eval()


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.rand(4, 3, SIZE, SIZE, generator=generator), torch.tensor([0, 1, 2, 1])


def input_x_gradient(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Input x gradient of each image's target logit, summed over channels ``[N, S, S]``."""
    images = images.clone().requires_grad_(True)
    logits = model(images)
    (gradient,) = torch.autograd.grad(logits.gather(1, targets[:, None]).sum(), images)
    return (images * gradient).sum(1).detach()


def quantus_explainer(model, inputs, targets, **_) -> np.ndarray:
    """Quantus's ``explain_func``: ``input_x_gradient`` as ``[N, 1, S, S]`` numpy."""
    maps = input_x_gradient(model, torch.as_tensor(inputs, dtype=torch.float32), torch.as_tensor(targets).long())
    return maps[:, None].numpy()


# -- SSIM and Spearman -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 16, 16), (2, 23, 9), (1, 7, 7)])
def test_ssim_is_skimages_with_arun_et_als_settings(shape):
    generator = torch.Generator().manual_seed(sum(shape))
    x = normalised(torch.rand(shape, generator=generator, dtype=torch.float64))
    y = normalised(x + 0.3 * torch.rand(shape, generator=generator, dtype=torch.float64))
    y[0, :3] = y[0, 0, 0]  # a constant patch: SSIM stays defined
    reference = [skimage_metrics.structural_similarity(a.numpy(), b.numpy(), win_size=7, data_range=SSIM_DATA_RANGE)
                 for a, b in zip(x, y)]
    torch.testing.assert_close(ssim(x, y), torch.tensor(reference, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(ssim(x, x), torch.ones(shape[0], dtype=torch.float64), rtol=0, atol=1e-12)


def test_ssim_is_nan_for_maps_smaller_than_the_window_and_checks_shapes():
    assert torch.isnan(ssim(torch.rand(2, 6, 9), torch.rand(2, 6, 9))).all()
    with pytest.raises(ValueError, match=r"\[N, H, W\]"):
        ssim(torch.rand(2, 9, 9), torch.rand(2, 9, 8))


def test_spearman_is_scipys_with_ties_and_absolute_values():
    generator = torch.Generator().manual_seed(2)
    x = torch.randint(-3, 4, (5, 6, 7), generator=generator).double()  # many ties, signs
    y = x + torch.randint(-2, 3, (5, 6, 7), generator=generator).double()
    for absolute in (False, True):
        a, b = (x.abs(), y.abs()) if absolute else (x, y)
        reference = [scipy_stats.spearmanr(p.flatten().numpy(), q.flatten().numpy())[0] for p, q in zip(a, b)]
        torch.testing.assert_close(spearman(x, y, absolute=absolute), torch.tensor(reference, dtype=torch.float64),
                                   rtol=0, atol=1e-12)
    constant = spearman(torch.ones(1, 4, 4), torch.rand(1, 4, 4))
    assert torch.isnan(constant).all()


# -- baselines -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.6, 2.0, 9.0])  # 9: the kernel reaches past the 12 x 10 image, reflected again
def test_blurred_baseline_is_scipys_gaussian_filter(sigma):
    images = torch.rand(2, 3, 12, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    reference = scipy_ndimage.gaussian_filter(images.numpy(), (0, 0, sigma, sigma), mode="reflect", truncate=4.0)
    torch.testing.assert_close(blurred_baseline(images, sigma), torch.from_numpy(reference), rtol=0, atol=1e-12)


def test_mean_baseline_fills_each_channel():
    images = torch.rand(2, 3, 4, 4)
    baseline = mean_baseline(images, [0.1, -0.2, 0.3])
    assert baseline.shape == images.shape and torch.equal(baseline[1, 2], torch.full((4, 4), 0.3))
    assert torch.equal(mean_baseline(images, 0.0), torch.zeros_like(images))
    with pytest.raises(ValueError, match="2 values for 3 channels"):
        mean_baseline(images, [0.0, 1.0])


# -- deletion and insertion --------------------------------------------------------------------------------
def test_deletion_curve_is_quantus_pixel_flipping(batch):
    """Quantus's PixelFlipping (most relevant first, a constant baseline, the logit) gives our curve after its first
    point; our AUC is the trapezoid over all points on x in [0, 1], Quantus's ``calculate_auc`` over its own points
    with dx = 1. One input channel: Quantus flips channel values one by one (its step must divide S x S), we flip
    whole pixels; with one channel both flip pixels."""
    torch.manual_seed(0)
    net = TinyNet(channels=1).eval()
    images, targets = batch[0][:, :1], batch[1]
    maps = input_x_gradient(net, images, targets)
    steps, value = 16, 0.25
    pixel_flipping = quantus.PixelFlipping(features_in_step=SIZE * SIZE // steps, perturb_baseline=value, normalise=False,
                                           abs=False, disable_warnings=True)
    theirs = np.array(pixel_flipping(model=net, x_batch=images.numpy(), y_batch=targets.numpy(), a_batch=maps[:, None].numpy(),
                                     softmax=False, channel_first=True, device="cpu"))

    def logit(perturbed: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return net(perturbed)[torch.arange(len(perturbed)), targets[sample]]

    curves = []
    for sample in range(len(images)):  # one sample at a time: the target of each sample's class
        curves.append(perturbation_curve(logit, images[sample:sample + 1], maps[sample:sample + 1], steps,
                                         mean_baseline(images[sample:sample + 1], value), insertion=False))
    curve = torch.cat(curves)
    np.testing.assert_allclose(curve[:, 1:].numpy(), theirs, rtol=0, atol=1e-5)
    with torch.no_grad():
        unperturbed = net(images)[torch.arange(4), targets].double()
    torch.testing.assert_close(curve[:, 0], unperturbed)
    full = np.concatenate([unperturbed.numpy()[:, None], theirs], axis=1)
    # quantus.helpers.utils.calculate_auc is np.trapz(values, dx=1), which numpy 2 renamed np.trapezoid
    np.testing.assert_allclose(curve_auc(curve).numpy(), np.trapezoid(full, dx=1, axis=1) / steps, rtol=0, atol=1e-5)


def linear_toy(seed: int = 4, n: int = 3, size: int = 6):
    """An exact-attribution model: score = sum(w * x); relative to a baseline b, pixel p's attribution
    sum_c w (x - b) is exactly what replacing it by b removes from the score."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(3, size, size, generator=generator, dtype=torch.float64)
    images = torch.rand(n, 3, size, size, generator=generator, dtype=torch.float64)
    return weights, images, lambda x: (x * weights).sum((1, 2, 3))


@pytest.mark.parametrize("steps", [36, 5])
def test_deleting_the_most_relevant_pixels_drops_the_score_as_the_closed_form_says(steps):
    weights, images, score = linear_toy()
    baseline = blurred_baseline(images, 1.5)
    maps = ((images - baseline) * weights).sum(1)  # [N, S, S]
    pixels = maps[0].numel()
    top_first = maps.flatten(1).sort(dim=1, descending=True).values
    removed = torch.arange(steps + 1) * pixels // steps
    dropped = torch.cat([torch.zeros(len(images), 1, dtype=torch.float64), top_first.cumsum(1)], dim=1)[:, removed]

    deletion = perturbation_curve(score, images, maps, steps, baseline, insertion=False)
    torch.testing.assert_close(deletion, score(images)[:, None] - dropped, rtol=0, atol=1e-12)
    insertion = perturbation_curve(score, images, maps, steps, baseline, insertion=True)
    torch.testing.assert_close(insertion, score(baseline)[:, None] + dropped, rtol=0, atol=1e-12)
    # the trapezoid on x in [0, 1]
    expected_auc = ((deletion[:, 1:] + deletion[:, :-1]) / 2).sum(1) / steps
    torch.testing.assert_close(curve_auc(deletion), expected_auc, rtol=0, atol=1e-12)
    assert (curve_auc(deletion) < curve_auc(insertion)).all()  # a faithful map: deletion falls fast, insertion rises fast


def test_insertion_is_deletion_from_the_baseline_and_batching_changes_nothing():
    weights, images, score = linear_toy(seed=5, n=4)
    baseline = mean_baseline(images, 0.5)
    maps = torch.rand(4, 6, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    inserted = perturbation_curve(score, images, maps, 9, baseline, insertion=True)
    torch.testing.assert_close(inserted, perturbation_curve(score, baseline, maps, 9, images, insertion=False), rtol=0, atol=0)
    calls = []

    def counted(x):
        calls.append(len(x))
        return score(x)

    for batch_size in (1, 7, 40):
        torch.testing.assert_close(perturbation_curve(counted, images, maps, 9, baseline, True, batch_size=batch_size),
                                   inserted, rtol=0, atol=0)
    assert max(calls) == 40 and calls[:2] == [1, 1]
    calls.clear()
    perturbation_curve(counted, images, maps, 9, baseline, True)
    assert calls == [10] * 4  # by default one sample's curve per call


def test_tied_relevance_is_removed_in_pixel_order():
    images = torch.arange(1, 5, dtype=torch.float64).view(1, 1, 2, 2).expand(1, 3, 2, 2).contiguous()
    curve = perturbation_curve(lambda x: x[:, 0].flatten(1) @ torch.tensor([1.0, 10, 100, 1000], dtype=torch.float64),
                               images, torch.zeros(1, 2, 2), 4, torch.zeros_like(images), insertion=False)
    assert curve.tolist() == [[4321.0, 4320.0, 4300.0, 4000.0, 0.0]]


# -- randomization: Quantus's MPRT -----------------------------------------------------------------------------
def test_cascade_similarity_is_quantus_mprt_given_the_same_seeds(net, batch):
    """Quantus's MPRT (cascading, top down, Spearman of absolute values) randomizes each layer with
    ``reset_parameters`` after ``torch.manual_seed(seed + 1)``, the same seed for every layer; our stage i draws from
    ``seed + i``. With Quantus's seeds replaced by ours, every layer's similarities are equal."""
    images, targets = batch
    seed = 7
    original = input_x_gradient(net, images, targets)
    ours = [spearman(original, input_x_gradient(randomized_copy(net, stage, seed), images, targets), absolute=True)
            for stage in range(3)]
    real_seed, calls = torch.manual_seed, []

    def our_seeds(seed=None):  # Quantus passes seed + 1 for every layer
        calls.append(seed)
        return real_seed(7 + len(calls) - 1)

    mprt = quantus.MPRT(layer_order="top_down", seed=seed - 1, abs=True, normalise=True, disable_warnings=True)
    with mock.patch.object(torch, "manual_seed", our_seeds):
        theirs = mprt(model=net, x_batch=images.numpy(), y_batch=targets.numpy(), a_batch=original[:, None].numpy(),
                      explain_func=quantus_explainer, softmax=False, channel_first=True, device="cpu")
    assert calls == [seed] * 3
    layers = [name for name in theirs if name != "original"]
    assert layers == ["5", "2", "0"]  # the stages of TinyNet, in its declared order
    for stage, layer in enumerate(layers):
        np.testing.assert_allclose(ours[stage].numpy(), theirs[layer], rtol=0, atol=1e-6)


def test_random_target_similarity_against_quantus_random_logit(net, batch):
    """Quantus's Random Logit compares the map of the explained class with the map of a random other class (its
    seed picks it) by ``quantus.ssim``: skimage's SSIM of the *flattened* maps (a 1-D signal) with the pair's own
    data range. Ours compares the same two maps as images (7 x 7 windows) with Arun et al.'s data range (2), so a
    score does not depend on the pair's range; on the same pair both are what skimage says."""
    images, targets = batch
    explained = []

    def recording(model, inputs, targets, **_):
        explained.append(np.asarray(targets).copy())
        return normalised(torch.from_numpy(quantus_explainer(model, inputs, targets)).double()).numpy()

    a_batch = normalised(input_x_gradient(net, images, targets).double())[:, None].numpy()
    random_logit = quantus.RandomLogit(num_classes=3, seed=11, normalise=False, abs=False, disable_warnings=True)
    theirs = random_logit(model=net, x_batch=images.numpy(), y_batch=targets.numpy(), a_batch=a_batch,
                          explain_func=recording, softmax=False, channel_first=True, device="cpu")
    other = torch.from_numpy(explained[-1]).long()
    assert (other != targets).all()
    first = torch.from_numpy(a_batch[:, 0])
    second = normalised(input_x_gradient(net, images, other).double())
    flat = [(a.flatten().numpy(), b.flatten().numpy()) for a, b in zip(first, second)]
    quantus_definition = [skimage_metrics.structural_similarity(a, b, data_range=float(np.ptp(np.concatenate([a, b]))))
                          for a, b in flat]
    np.testing.assert_allclose(theirs, quantus_definition, rtol=0, atol=1e-6)
    ours = ssim(first, second)
    reference = [skimage_metrics.structural_similarity(a.numpy(), b.numpy(), win_size=7, data_range=2.0)
                 for a, b in zip(first, second)]
    torch.testing.assert_close(ours, torch.tensor(reference, dtype=torch.float64), rtol=0, atol=1e-12)
    assert not np.allclose(ours.numpy(), theirs, atol=1e-3)  # the two definitions are not the same number


# -- Arun et al.'s randomization baseline ---------------------------------------------------------------------
def test_random_pair_baseline_pairs_different_images_of_one_finding():
    generator = torch.Generator().manual_seed(8)
    patterns = normalised(torch.rand(2, 9, 9, generator=generator, dtype=torch.float64))
    # every map of a finding is that finding's pattern: pairs within a finding have SSIM 1, across findings less
    maps = patterns[[0, 0, 0, 1, 1]]
    value = random_pair_baseline(maps, ["a", "b", "c", "a", "b"], ["x", "x", "x", "y", "y"], seed=0)
    assert value == pytest.approx(1.0, abs=1e-12)
    assert float(ssim(patterns[:1], patterns[1:])) < 0.5
    # two maps of one image are never paired: the other finding's pair decides
    maps = torch.cat([patterns[[0, 1]], patterns[[1, 1]]])
    assert random_pair_baseline(maps, ["a", "a", "b", "c"], ["x", "x", "y", "y"], seed=0) == pytest.approx(1.0, abs=1e-12)
    assert math.isnan(random_pair_baseline(maps[:2], ["a", "a"], ["x", "x"], seed=0))


def test_random_pair_baseline_is_arun_et_als_mean_and_ignores_input_order():
    generator = torch.Generator().manual_seed(9)
    maps = normalised(torch.rand(12, 9, 9, generator=generator, dtype=torch.float64))
    images = [f"img{i // 2}" for i in range(12)]
    findings = ["x", "y"] * 6
    value = random_pair_baseline(maps, images, findings, seed=3)
    pairs = random_pair_indices(images, findings, seed=3)
    assert pairs.shape == (12 * 50, 2)  # 50 per map (Arun et al.'s count)
    assert all(findings[i] == findings[j] and images[i] != images[j] for i, j in pairs.tolist())
    assert value == pytest.approx(float(ssim(maps[pairs[:, 0]], maps[pairs[:, 1]]).mean()), abs=1e-12)
    order = torch.randperm(12, generator=generator).tolist()
    assert random_pair_baseline(maps[order], [images[i] for i in order], [findings[i] for i in order], seed=3) == value
    assert random_pair_baseline(maps, images, findings, seed=4) != value
    # the mean over many random pairs tends to the mean over all pairs of different images, same finding
    all_pairs = [(i, j) for i in range(12) for j in range(12) if i != j and findings[i] == findings[j]]
    exact = float(ssim(maps[[i for i, _ in all_pairs]], maps[[j for _, j in all_pairs]]).mean())
    assert random_pair_baseline(maps, images, findings, seed=3, pairs_per_map=400) == pytest.approx(exact, abs=6e-3)
