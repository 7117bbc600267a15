"""The stated-box metrics: how a model's own boxes (a grounded generative model's, or ``score --boxes``') match the
ground truth, and whether its map looks where its box points. Functional twins first, then the per-dataset state.

Boxes are ``[N, 4]`` float64 ``(x0, y0, x1, y1)`` in continuous original pixels (pixel ``i`` spans ``[i, i + 1)``, as
``regions.Box``). A finding's ground truth is every instance of its region (a polygon or a mask by its bounding box).

Per (image, finding) pair (``BOX_PAIR_KEYS``; each a mean over the pairs where it is defined, with bootstrap intervals
on the dataset's draws like every pair key):

- ``box_acc@0.5``: 1 where the best IoU of any stated box with any ground-truth box is >= 0.5, else 0 (no box: 0);
  pairs with a region.
- ``box_miou``: that best IoU (no box: 0); pairs with a region.
- ``box_precision``, ``box_recall``: RadFact's box metrics (microsoft/RadFact ``metric/box_metrics.py``,
  ``compute_box_metrics``): the union of the stated boxes P and of the ground-truth boxes G, each box normalised by
  the image size and rasterised on a ``RADFACT_MASK_SIZE`` square as ``mask[int(y0 s):int(y1 s), int(x0 s):int(x1 s)]``;
  precision ``|P & G| / |P|`` (undefined without a stated pixel), recall ``|P & G| / |G|``; pairs with a region.
- ``self_consistency_mass``: the share of the map's mass inside the union of the model's own stated boxes
  (``functional.energy_pointing`` of the normalised map on the eval grid); every pair with a stated box.
- ``self_consistency_pg``: the Pointing Game of the map against that union (``functional.pointing_game``); the same
  pairs.
- ``parse_failure_rate``: 1 where the model's answer could not be parsed (scored as no box), else 0; every pair.
- ``box_absent_drawn``: 1 where a box was stated for a finding the image does not have (label 0, no region), else 0.

Per dataset and finding (after the sync, from every stated and ground-truth box, sorted by image: the same order on 1
or N processes): ``box_map50`` and ``box_map``, torchmetrics' ``MeanAveragePrecision(iou_type="bbox")`` ``map_50`` and
``map`` (COCO, IoU 0.5 and 0.5:0.95) of that finding's boxes over all the dataset's images, each stated box scored by
its confidence (1 where the model gives none), the images in the order of their keys (``resampling.image_key``: COCO
breaks ties between equal confidences by image order, so a fixed order makes the value one number); undefined for a
finding without a ground-truth box. The mean row is
the mean over the findings where it is defined, which is COCO's mean over categories with ground truth. No bootstrap
interval (a COCO evaluation per replicate).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from xbench_pl.metrics.functional import energy_pointing, normalize_saliency, pointing_game
from xbench_pl.metrics.grounding import Records, to_fixed
from xbench_pl.metrics.resampling import class_means, resampled_means

#: the side of RadFact's box masks (``compute_box_metrics``' default ``mask_size``)
RADFACT_MASK_SIZE = 224
#: the IoU a stated box needs to count as found (``box_acc@0.5``)
ACCURACY_IOU = 0.5
BOX_PAIR_KEYS = ("box_acc@0.5", "box_miou", "box_precision", "box_recall", "self_consistency_mass", "self_consistency_pg",
                 "parse_failure_rate", "box_absent_drawn")
BOX_MAP_KEYS = ("box_map50", "box_map")
BOX_KEYS = BOX_PAIR_KEYS + BOX_MAP_KEYS


# -- functional ------------------------------------------------------------------------------------
def box_iou(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``[N, M]`` float64 IoU of boxes ``[N, 4]`` and ``[M, 4]`` (areas in continuous coordinates, as COCO's)."""
    from torchvision.ops import box_iou as iou

    if first.numel() == 0 or second.numel() == 0:
        return torch.zeros(first.shape[0], second.shape[0], dtype=torch.float64)
    return iou(first.double(), second.double())


def best_iou(stated: torch.Tensor, truth: torch.Tensor) -> float:
    """The largest IoU of any stated box with any ground-truth box: 0 without a stated box, NaN without ground truth."""
    if truth.shape[0] == 0:
        return float("nan")
    return float(box_iou(stated, truth).max()) if stated.shape[0] else 0.0


def radfact_mask(boxes: torch.Tensor, height: int, width: int, size: int = RADFACT_MASK_SIZE) -> np.ndarray:
    """The union of ``boxes`` (original pixels of a ``height x width`` image) on RadFact's ``size`` square: each box
    normalised by the image size, then ``mask[int(y0 s):int(y1 s), int(x0 s):int(x1 s)] = True`` (truncation, as
    RadFact's ``get_mask_from_boxes``). Boxes must lie inside the image (``clip_boxes``)."""
    mask = np.zeros((size, size), dtype=bool)
    for x0, y0, x1, y1 in boxes.double().tolist():
        mask[int(y0 / height * size):int(y1 / height * size), int(x0 / width * size):int(x1 / width * size)] = True
    return mask


def box_precision_recall(stated: torch.Tensor, truth: torch.Tensor, height: int, width: int,
                         size: int = RADFACT_MASK_SIZE) -> tuple[float, float]:
    """RadFact's box precision and recall of the stated boxes against the ground truth (``radfact_mask``): ``|P & G|
    / |P|`` and ``|P & G| / |G|``, NaN where the denominator is 0."""
    pred, true = radfact_mask(stated, height, width, size), radfact_mask(truth, height, width, size)
    both = float((pred & true).sum())
    return (both / pred.sum() if pred.any() else float("nan"), both / true.sum() if true.any() else float("nan"))


def clip_boxes(boxes: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``boxes [N, 4]`` with their corners put in order (a model may state x1 < x0) and clipped to the ``height x
    width`` image, boxes left without area dropped (they state nothing inside the image); and which were kept ``[N]``."""
    boxes = boxes.double().reshape(-1, 4)
    x0, x1 = torch.minimum(boxes[:, 0], boxes[:, 2]).clamp(0, width), torch.maximum(boxes[:, 0], boxes[:, 2]).clamp(0, width)
    y0, y1 = torch.minimum(boxes[:, 1], boxes[:, 3]).clamp(0, height), torch.maximum(boxes[:, 1], boxes[:, 3]).clamp(0, height)
    kept = (x1 > x0) & (y1 > y0)
    return torch.stack((x0, y0, x1, y1), dim=1)[kept], kept


def stated_in_original(stated: torch.Tensor, affine, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A pair's stated boxes ``[n, 5]`` (model-input pixels, confidence) in the original ``height x width`` image: through
    the preprocessing ``affine`` ``(sx, sy, tx, ty)`` (``x = (u - tx) / sx``), then ``clip_boxes``: ``([m, 4], kept [n])``."""
    sx, sy, tx, ty = (float(v) for v in affine)
    raw = stated.double().reshape(-1, 5).cpu()
    original = torch.stack(((raw[:, 0] - tx) / sx, (raw[:, 1] - ty) / sy, (raw[:, 2] - tx) / sx, (raw[:, 3] - ty) / sy), dim=1)
    return clip_boxes(original, height, width)


def box_raster(boxes: torch.Tensor, height: int, width: int, eval_size: int) -> torch.Tensor:
    """The union of ``boxes`` on the ``eval_size`` grid of a ``height x width`` image, by the ground truth's own rule
    (``regions.Box.rasterize``: an eval pixel is inside when its centre is): ``[E, E]`` bool."""
    from xbench_pl.data.regions import Box

    out = np.zeros((eval_size, eval_size), dtype=bool)
    for x0, y0, x1, y1 in boxes.double().tolist():
        out |= Box(x0, y0, x1, y1).rasterize(height, width, eval_size)
    return torch.from_numpy(out)


def self_consistency(maps: torch.Tensor, stated_masks: torch.Tensor, normalize: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair, the map's mass share inside its own stated boxes and its Pointing Game against them: ``maps [N, E, E]``
    (raw, on the eval grid), ``stated_masks [N, E, E]`` (``box_raster``); NaN where a pair's boxes cover no eval pixel."""
    if maps.shape[0] == 0:
        empty = torch.zeros(0, dtype=torch.float64)
        return empty, empty
    masks = stated_masks.to(maps.device)
    return energy_pointing(normalize_saliency(maps, normalize), masks).cpu(), pointing_game(maps, masks).cpu()


def pair_box_values(stated: torch.Tensor, truth: torch.Tensor, height: int, width: int, label: float,
                    failed: bool) -> list[float]:
    """One pair's ``BOX_PAIR_KEYS`` but the self-consistency pair (NaN there; ``self_consistency``): ``stated``
    (clipped, ``clip_boxes``) and ``truth`` ``[*, 4]`` in original pixels, its label and whether its answer failed to
    parse."""
    nan = float("nan")
    if truth.shape[0]:
        iou = best_iou(stated, truth)
        precision, recall = box_precision_recall(stated, truth, height, width)
        found = float(iou >= ACCURACY_IOU)
    else:
        iou = precision = recall = found = nan
    absent = float(stated.shape[0] > 0) if label == 0 and truth.shape[0] == 0 else nan
    return [found, iou, precision, recall, nan, nan, float(failed), absent]


def mean_average_precision(stated: list[dict], truth: list[dict]) -> dict[str, float]:
    """torchmetrics' COCO ``map_50`` and ``map`` of one finding over images: ``stated``/``truth`` per image, in one
    order, ``{"boxes": [n, 4], "scores": [n]}`` / ``{"boxes": [m, 4]}``. NaN where no image has a ground-truth box."""
    from torchmetrics.detection import MeanAveragePrecision

    if not any(t["boxes"].shape[0] for t in truth):
        return {"box_map50": float("nan"), "box_map": float("nan")}
    metric = MeanAveragePrecision(iou_type="bbox", box_format="xyxy")
    metric.update([{"boxes": s["boxes"].float(), "scores": s["scores"].float(), "labels": torch.zeros(len(s["scores"]), dtype=torch.long)}
                   for s in stated],
                  [{"boxes": t["boxes"].float(), "labels": torch.zeros(t["boxes"].shape[0], dtype=torch.long)} for t in truth])
    out = metric.compute()
    return {"box_map50": float(out["map_50"]), "box_map": float(out["map"])}


# -- state ----------------------------------------------------------------------------------------
class BoxPairs(Records):
    """Every (image, finding) pair's ``BOX_PAIR_KEYS`` values in fixed point with defined flags, with its image, unit and
    class; ``compute`` sorts them by (image key, class): the same order on 1 or N processes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_records()

    def shapes(self) -> dict:
        k = len(BOX_PAIR_KEYS)
        return {"image": ((0,), torch.long), "unit": ((0,), torch.long), "cls": ((0,), torch.long),
                "values": ((0, k), torch.long), "defined": ((0, k), torch.long)}

    def update(self, image: torch.Tensor, unit: torch.Tensor, cls: torch.Tensor, values: torch.Tensor) -> None:
        ok = ~torch.isnan(values)
        parts = {"image": image.long(), "unit": unit.long(), "cls": cls.long(),
                 "values": to_fixed(torch.nan_to_num(values.double(), nan=0.0)), "defined": ok.long()}
        for name, value in parts.items():
            getattr(self, name).append(value.to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        out = self._gathered()
        out["values"], out["defined"] = (out[k].reshape(-1, len(BOX_PAIR_KEYS)) for k in ("values", "defined"))
        order = torch.argsort(out["cls"], stable=True)
        order = order[torch.argsort(out["image"][order], stable=True)]
        return {name: value[order] for name, value in out.items()}


class BoxList(Records):
    """Boxes with their image key, class and score (``[N]``, ``[N]``, ``[N, 4]`` float64, ``[N]`` float64): the stated
    boxes or the ground truth, for the COCO mAP after the sync. ``compute`` sorts them by (image key, class), keeping
    each pair's own order (a model's order of statement)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._add_records()

    def shapes(self) -> dict:
        return {"image": ((0,), torch.long), "cls": ((0,), torch.long), "boxes": ((0, 4), torch.float64),
                "scores": ((0,), torch.float64)}

    def update(self, image: torch.Tensor, cls: torch.Tensor, boxes: torch.Tensor, scores: torch.Tensor) -> None:
        for name, value in (("image", image.long()), ("cls", cls.long()), ("boxes", boxes.double().reshape(-1, 4)),
                            ("scores", scores.double())):
            getattr(self, name).append(value.to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        out = self._gathered()
        out["boxes"] = out["boxes"].reshape(-1, 4)
        order = torch.argsort(out["cls"], stable=True)
        order = order[torch.argsort(out["image"][order], stable=True)]
        return {name: value[order] for name, value in out.items()}


class BoxMode(nn.Module):
    """The stated-box metrics of one dataset (``--model`` of a grounded generative family, ``score --boxes``): ``update``
    with each scored pair's values (``pair_box_values`` + ``self_consistency``) and every stated and ground-truth box;
    ``columns`` (per class), ``replicates`` (on the dataset's draws) from the synced records only."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes
        self.pairs, self.stated, self.truth = BoxPairs(), BoxList(), BoxList()

    def reset(self) -> None:
        for records in (self.pairs, self.stated, self.truth):
            records.reset()

    def update(self, image: torch.Tensor, unit: torch.Tensor, cls: torch.Tensor, values: torch.Tensor, stated: dict,
               truth: dict) -> None:
        """``values [P, len(BOX_PAIR_KEYS)]`` (NaN where undefined); ``stated``/``truth``: ``{"image", "cls", "boxes",
        "scores"}`` of every box of the batch's counted pairs (ground truth scored 1)."""
        if values.shape != (cls.numel(), len(BOX_PAIR_KEYS)):
            raise ValueError(f"BoxMode.update: values {tuple(values.shape)} for {cls.numel()} pairs and {len(BOX_PAIR_KEYS)} keys")
        self.pairs.update(image, unit, cls, values)
        self.stated.update(**stated)
        self.truth.update(**truth)

    def state(self) -> dict:
        """The synced records; one-element results reshaped back (torchmetrics' compute wrapper squeezes them to 0-d)."""
        pairs, stated, truth = self.pairs.compute(), self.stated.compute(), self.truth.compute()
        k = len(BOX_PAIR_KEYS)
        pairs = {name: value.reshape(-1, k) if name in ("values", "defined") else value.reshape(-1) for name, value in pairs.items()}
        stated, truth = ({name: value.reshape(-1, 4) if name == "boxes" else value.reshape(-1) for name, value in part.items()}
                         for part in (stated, truth))
        return {"pairs": pairs, "stated": stated, "truth": truth}

    def columns(self, state: dict) -> dict[str, torch.Tensor]:
        """``{key: [C]}`` float64 (NaN where undefined): the pair means and each finding's COCO mAP."""
        pairs = state["pairs"]
        means = class_means(pairs["cls"], pairs["values"], pairs["defined"], self.num_classes)
        out = {key: means[:, i] for i, key in enumerate(BOX_PAIR_KEYS)}
        maps = {key: torch.full((self.num_classes,), float("nan"), dtype=torch.float64) for key in BOX_MAP_KEYS}
        for c in range(self.num_classes):
            for key, value in self.finding_map(state, c).items():
                maps[key][c] = value
        return {**out, **maps}

    @staticmethod
    def finding_map(state: dict, cls: int) -> dict[str, float]:
        """``mean_average_precision`` of finding ``cls`` over the images with a stated or a ground-truth box of it, in
        image-key order."""
        stated, truth = state["stated"], state["truth"]
        mine_s, mine_t = stated["cls"] == cls, truth["cls"] == cls
        images = torch.unique(torch.cat([stated["image"][mine_s], truth["image"][mine_t]]), sorted=True)
        preds, targets = [], []
        for key in images.tolist():
            s, t = mine_s & (stated["image"] == key), mine_t & (truth["image"] == key)
            preds.append({"boxes": stated["boxes"][s], "scores": stated["scores"][s]})
            targets.append({"boxes": truth["boxes"][t]})
        return mean_average_precision(preds, targets)

    def replicates(self, state: dict, universe: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """The pair keys' class means per bootstrap replicate ``{key: [R, C]}`` on the dataset's draws."""
        pairs = state["pairs"]
        per = resampled_means(torch.searchsorted(universe, pairs["unit"]), pairs["cls"], pairs["values"], pairs["defined"],
                              self.num_classes, weights)
        return {key: per[:, :, i] for i, key in enumerate(BOX_PAIR_KEYS)}
