"""Grounding metrics against straightforward reference implementations, and their defined edge cases."""

import numpy as np
import pytest
import torch

from xbench_pl.metrics import (
    BenchmarkMetrics,
    DiceIoU,
    PointingGame,
    Recognition,
    default_thresholds,
    dice_iou_curve,
    metric_keys,
    normalize_saliency,
    pointing_game,
)


def reference_curve(m: np.ndarray, g: np.ndarray, thresholds: np.ndarray):
    """Per-threshold loop, one pair at a time: the textbook definition."""
    dice, iou = [], []
    for t in thresholds:
        p = m >= t
        inter, union = (p & g).sum(), (p | g).sum()
        dice.append(2 * inter / (p.sum() + g.sum()))
        iou.append(inter / union)
    return np.array(dice), np.array(iou)


def reference_minmax(m: np.ndarray) -> np.ndarray:
    return (m - m.min()) / (m.max() - m.min())


def random_pairs(n=12, size=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    maps = torch.rand(n, size, size, generator=gen) * 5 - 2
    masks = torch.zeros(n, size, size, dtype=torch.bool)
    for i in range(n):
        y0, x0 = torch.randint(0, size // 2, (2,), generator=gen).tolist()
        h, w = torch.randint(2, size // 2, (2,), generator=gen).tolist()
        masks[i, y0:y0 + h, x0:x0 + w] = True
    return maps, masks


def test_normalize_modes_match_reference():
    maps, _ = random_pairs()
    out = normalize_saliency(maps, "minmax")
    for m, o in zip(maps.numpy(), out.numpy()):
        np.testing.assert_allclose(o, reference_minmax(m), atol=1e-6)
    np.testing.assert_allclose(normalize_saliency(maps, "max").numpy(), (maps / maps.flatten(1).amax(1)[:, None, None]).numpy(), atol=1e-6)
    assert torch.equal(normalize_saliency(maps, "none"), maps)
    with pytest.raises(ValueError, match="normalize mode"):
        normalize_saliency(maps, "zscore")


def test_dice_iou_curve_matches_per_threshold_loop():
    maps, masks = random_pairs(n=20, seed=1)
    norm = normalize_saliency(maps)
    thresholds = default_thresholds()
    dice, iou = dice_iou_curve(norm, masks, thresholds)
    assert dice.shape == iou.shape == (20, 101)
    for i in range(20):
        ref_dice, ref_iou = reference_curve(norm[i].numpy(), masks[i].numpy(), thresholds.numpy())
        np.testing.assert_allclose(dice[i].numpy(), ref_dice, atol=1e-6)
        np.testing.assert_allclose(iou[i].numpy(), ref_iou, atol=1e-6)


@pytest.mark.parametrize("thresholds", [default_thresholds(), default_thresholds(0.05), torch.tensor([0.1, 0.25, 0.7])])
def test_thresholds_reached_is_exact_at_and_next_to_every_threshold(thresholds):
    """The uniform-grid shortcut must agree with comparing m >= t, including values on a step and 1 ulp away."""
    from xbench_pl.metrics.functional import thresholds_reached

    on = thresholds.clone()
    above, below = torch.nextafter(on, torch.tensor(2.0)), torch.nextafter(on, torch.tensor(-2.0))
    values = torch.cat([on, above, below, torch.rand(5000), torch.tensor([-3.0, 0.0, 1.0, 7.5])])[None]
    expected = (values[..., None] >= thresholds).sum(-1)
    assert torch.equal(thresholds_reached(values, thresholds).long(), expected)


def test_pointing_game_random_maps_hit_iff_argmax_inside():
    maps, masks = random_pairs(n=30, seed=2)
    hits = pointing_game(maps, masks)
    for i in range(30):
        flat = maps[i].flatten().argmax()
        assert hits[i].item() == float(masks[i].flatten()[flat])


def test_pointing_game_ties_counted_in_expectation():
    masks = torch.zeros(1, 10, 10, dtype=torch.bool)
    masks[0, :, :3] = True  # 30 % of the image
    constant = torch.full((1, 10, 10), 0.7)
    assert pointing_game(constant, masks).item() == pytest.approx(0.3)
    two_peaks = torch.zeros(1, 10, 10)
    two_peaks[0, 0, 0] = two_peaks[0, 9, 9] = 1.0  # one inside, one outside
    assert pointing_game(two_peaks, masks).item() == pytest.approx(0.5)


def test_constant_map_is_chance_for_pointing_and_all_or_nothing_for_dice():
    masks = torch.zeros(1, 8, 8, dtype=torch.bool)
    masks[0, 2:4, 2:6] = True  # 8 of 64 pixels
    constant = torch.full((1, 8, 8), 3.0)
    dice, iou = dice_iou_curve(normalize_saliency(constant), masks, default_thresholds())
    assert dice[0, 0].item() == pytest.approx(2 * 8 / (64 + 8))  # tau = 0 selects every pixel
    assert iou[0, 0].item() == pytest.approx(8 / 64)
    assert torch.all(dice[0, 1:] == 0) and torch.all(iou[0, 1:] == 0)


def test_region_covering_whole_image():
    maps, _ = random_pairs(n=3, seed=3)
    full = torch.ones(3, 24, 24, dtype=torch.bool)
    assert torch.all(pointing_game(maps, full) == 1)
    norm = normalize_saliency(maps)
    dice, iou = dice_iou_curve(norm, full, default_thresholds())
    assert torch.allclose(dice[:, 0], torch.ones(3, dtype=torch.float64))
    selected = (norm >= 0.5).flatten(1).sum(1).double()
    assert torch.allclose(dice[:, 50], 2 * selected / (selected + 576))


def test_empty_regions_are_nan_in_functional_and_ignored_by_metrics():
    maps, masks = random_pairs(n=4, seed=4)
    masks[1] = False
    assert torch.isnan(pointing_game(maps, masks)[1])
    assert torch.isnan(dice_iou_curve(normalize_saliency(maps), masks, default_thresholds())[0][1]).all()
    metric = PointingGame(num_classes=2)
    metric.update(maps, masks, torch.tensor([0, 1, 0, 1]))
    with_empty = metric.compute()
    metric.reset()
    metric.update(maps[[0, 2, 3]], masks[[0, 2, 3]], torch.tensor([0, 0, 1]))
    assert torch.equal(with_empty, metric.compute())


def test_nan_or_inf_in_a_map_is_a_clear_error():
    maps, masks = random_pairs(n=3, seed=5)
    maps[2, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf.*2"):
        pointing_game(maps, masks)
    maps[2, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        DiceIoU(num_classes=1).update(maps, masks, torch.zeros(3, dtype=torch.long))


def test_dice_iou_metric_per_class_best_threshold_against_reference():
    maps, masks = random_pairs(n=24, seed=6)
    classes = torch.arange(24) % 3
    metric = DiceIoU(num_classes=3)
    for chunk in torch.arange(24).split(5):  # several updates
        metric.update(maps[chunk], masks[chunk], classes[chunk])
    out = metric.compute()
    thresholds = default_thresholds(dtype=torch.float64).numpy()
    for c in range(3):
        curves = [reference_curve(reference_minmax(maps[i].numpy()), masks[i].numpy(), thresholds.astype(np.float32))
                  for i in range(24) if classes[i] == c]
        mean_dice = np.mean([d for d, _ in curves], axis=0)
        mean_iou = np.mean([u for _, u in curves], axis=0)
        best = int(np.argmax(mean_dice))
        assert out["tau_best"][c].item() == pytest.approx(thresholds[best])
        assert out["dice_best"][c].item() == pytest.approx(mean_dice[best], abs=1e-6)
        assert out["iou_best"][c].item() == pytest.approx(mean_iou[best], abs=1e-6)
        assert out["dice_fixed"][c].item() == pytest.approx(mean_dice[50], abs=1e-6)
        assert out["delta_dice"][c].item() == pytest.approx(mean_dice[best] - mean_dice[50], abs=1e-6)
        assert out["n_regions"][c].item() == len(curves)


def test_accumulation_is_bit_identical_however_the_pairs_are_split():
    """What DDP does: each rank accumulates a part, states are summed. Integer states make it exact."""
    maps, masks = random_pairs(n=40, seed=7)
    classes = torch.arange(40) % 4
    whole = DiceIoU(num_classes=4)
    whole.update(maps, masks, classes)
    parts = [DiceIoU(num_classes=4), DiceIoU(num_classes=4)]
    order = torch.randperm(40, generator=torch.Generator().manual_seed(0))
    parts[0].update(maps[order[:17]], masks[order[:17]], classes[order[:17]])
    parts[1].update(maps[order[17:]], masks[order[17:]], classes[order[17:]])
    parts[0].merge_state(parts[1])
    for key, value in whole.compute().items():
        assert torch.equal(value, parts[0].compute()[key]), key


def test_fixed_threshold_must_be_on_the_grid():
    with pytest.raises(ValueError, match="on the threshold grid"):
        DiceIoU(num_classes=1, fixed_threshold=0.505)


def test_recognition_class_without_positives_is_undefined_not_zero():
    scores = torch.tensor([[0.9, 0.2], [0.1, 0.8], [0.7, 0.4]])
    labels = torch.tensor([[1, 0], [0, 0], [1, 0]])
    metric = Recognition(num_classes=2)
    metric.update(scores, labels)
    out = metric.compute()
    assert out["auroc"][0].item() == 1.0 and torch.isnan(out["auroc"][1])
    assert torch.isnan(out["auprc"][1])
    assert out["n_pos"].tolist() == [2, 0] and out["n_neg"].tolist() == [1, 3]
    assert out["hamming_acc"][1].item() == pytest.approx(2 / 3)  # 0.8 > 0.5 is one false positive


def test_recognition_single_class_and_score_range():
    metric = Recognition(num_classes=1)
    metric.update(torch.tensor([[0.2], [0.9], [0.6]]), torch.tensor([[0], [1], [0]]))
    assert metric.compute()["auroc"].reshape(-1).tolist() == [1.0]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        metric.update(torch.tensor([[1.5]]), torch.tensor([[1]]))


def test_benchmark_table_keys_macro_mean_and_counts():
    maps, masks = random_pairs(n=6, seed=8)
    bench = BenchmarkMetrics(["A", "B", "C"])
    scores = torch.rand(4, 3, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 0]])
    bench.update(scores, labels, maps, masks, torch.tensor([0, 0, 1, 1, 0, 1]))
    table = bench.compute()
    expected = set(metric_keys()) | {"n_pos", "n_neg", "n_regions"}
    assert set(table["mean"]) == expected and all(set(row) == expected for row in table["classes"].values())
    c = table["classes"]
    assert c["C"]["pointing_game"] is None and c["C"]["auroc"] is None and c["C"]["n_regions"] == 0
    assert table["mean"]["dice_best"] == pytest.approx((c["A"]["dice_best"] + c["B"]["dice_best"]) / 2)
    assert table["mean"]["n_regions"] == 6 and table["mean"]["n_pos"] == 4
    for row in c.values():
        for key in metric_keys():
            signed = key in ("delta_dice", "pg_lift", "specificity", "map_similarity")  # differences and correlations
            assert row[key] is None or 0.0 <= row[key] <= 1.0 or (signed and -1.0 <= row[key] <= 1.0), key


def test_benchmark_table_for_a_single_class_dataset():
    maps, masks = random_pairs(n=2, seed=9)
    bench = BenchmarkMetrics(["Pneumothorax"])
    bench.update(torch.tensor([[0.8], [0.3], [0.6]]), torch.tensor([[1], [0], [1]]), maps, masks, torch.zeros(2, dtype=torch.long))
    row = bench.compute()["classes"]["Pneumothorax"]
    assert row["auroc"] == 1.0 and row["n_pos"] == 2 and row["n_regions"] == 2
    assert row["pointing_game"] == pytest.approx(pointing_game(maps, masks).mean().item())


def test_recognition_is_float64_from_exact_counts():
    """No float32 step: 1/6 is the double nearest 1/6 (torchmetrics gives 0.1666666716337204)."""
    metric = Recognition(num_classes=2)
    scores = torch.tensor([[0.5, 0.9], [0.5, 0.2], [0.5, 0.7], [0.5, 0.1], [0.5, 0.6], [0.5, 0.3]])
    labels = torch.tensor([[1, 1], [0, 0], [0, 1], [0, 0], [0, 0], [0, 1]])
    metric.update(scores, labels)
    out = metric.compute()
    assert all(v.dtype == torch.float64 for k, v in out.items() if not k.startswith("n_"))
    assert out["auprc"][0].item() == 1 / 6 and out["hamming_acc"][0].item() == 5 / 6 and out["auroc"][0].item() == 0.5
    # class 1: ranks 0.9+ 0.7+ 0.6- 0.3+ 0.2- 0.1-: 8 of 9 pairs ordered; AP = (1 + 1 + 3/4) / 3
    assert out["auroc"][1].item() == 8 / 9 and out["auprc"][1].item() == (1 + 1 + 3 / 4) / 3
    assert out["f1"][1].item() == 4 / 6 and out["hamming_acc"][1].item() == 4 / 6  # tp 2, fp 1 (0.6), fn 1 (0.3)
