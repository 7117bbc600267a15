"""Judging a model's answers: every dataset's benchmark metrics and what feeds them, in plain torch.

``Judge`` holds the metric settings and one ``BenchmarkMetrics`` per dataset and turns a batch's ``ZeroShotOutput``
into metric updates: the checks, the warp of each map to the eval grid, the region pairs, the negatives, the
CheXlocalize pairs. ``models.base.ZeroShotModel`` (a ``LightningModule``) judges its own forward with it in
``test_step``; ``predictions.Replayer`` judges stored predictions with it, without Lightning (``score``,
``compare``): the same code, so a replay reproduces a run's numbers exactly.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from jsonargparse.typing import ClosedUnitInterval, NonNegativeInt, OpenUnitInterval
from torch import nn

from xbench_pl.data.base import Batch
from xbench_pl.geometry import warp_to_eval_grid, warped_and_seen
from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.benchmark import checked_size_bounds, read_tuned_thresholds
from xbench_pl.metrics.chexlocalize import full_resolution_pairs
from xbench_pl.metrics.functional import NormalizeMode
from xbench_pl.metrics.grounding import promoted
from xbench_pl.metrics.resampling import image_key, unit_key
from xbench_pl.options import GridThreshold, GroupNames


def batch_units(batch: Batch) -> torch.Tensor:
    """Each sample's bootstrap unit ``[B]`` (``resampling.unit_key``): its patient where the dataset records one,
    else its image."""
    patients = batch.patient_ids or [None] * len(batch.image_ids)
    return torch.tensor([unit_key(i, p) for i, p in zip(batch.image_ids, patients)], dtype=torch.long)


@dataclass
class StatedBoxes:
    """What a model stated in text per (image, finding) (a grounded generative model: ``models.generative``).

    boxes: per image, per finding, ``[n, 5]`` float64: each stated box ``(x0, y0, x1, y1)`` in continuous model-input
    pixels (the square ``preprocess.size`` input the saliency spans; pixel ``i`` spans ``[i, i + 1)``) and its
    confidence (1 where the model gives none), in the order stated; ``[0, 5]``: no box.
    texts: per image, per finding, the raw generated text the boxes were parsed from.
    failed ``[B, C]`` bool: the text could not be parsed (its pair is scored as "no box", and counted).
    """

    boxes: list[list[torch.Tensor]]
    texts: list[list[str]]
    failed: torch.Tensor

    def __post_init__(self) -> None:
        b, c = self.failed.shape
        if len(self.boxes) != b or len(self.texts) != b or any(len(row) != c for row in self.boxes + self.texts):
            raise ValueError(f"StatedBoxes: boxes and texts must be [{b}][{c}] like failed")

    @staticmethod
    def joined(parts: list[StatedBoxes], order: torch.Tensor | None = None) -> StatedBoxes:
        """``parts`` one after the other, then (``order``) their rows in that order."""
        boxes, texts = [r for p in parts for r in p.boxes], [r for p in parts for r in p.texts]
        failed = torch.cat([p.failed.cpu() for p in parts])
        if order is None:
            return StatedBoxes(boxes, texts, failed)
        rows = order.tolist()
        return StatedBoxes([boxes[i] for i in rows], [texts[i] for i in rows], failed[order.cpu()])

    def rows(self, index: torch.Tensor) -> StatedBoxes:
        """The images ``index`` (``[n]`` positions) of these statements."""
        rows = index.tolist()
        return StatedBoxes([self.boxes[i] for i in rows], [self.texts[i] for i in rows], self.failed.cpu()[index.cpu()])

    def arrays(self) -> dict[str, torch.Tensor]:
        """As a prediction store keeps them: ``stated_boxes [M, 5]`` float64 (every box, image-major then finding, in the
        order stated), ``stated_counts [B, C]`` int64 (boxes per pair) and ``stated_failed [B, C]`` uint8."""
        flat = [pair.double().reshape(-1, 5).cpu() for row in self.boxes for pair in row]
        b, c = self.failed.shape
        return {"stated_boxes": torch.cat(flat) if flat else torch.zeros(0, 5, dtype=torch.float64),
                "stated_counts": torch.tensor([p.shape[0] for p in flat], dtype=torch.long).reshape(b, c),
                "stated_failed": self.failed.cpu().to(torch.uint8)}

    @staticmethod
    def from_arrays(boxes: torch.Tensor, counts: torch.Tensor, failed: torch.Tensor, texts: list[list[str]]) -> StatedBoxes:
        """The inverse of ``arrays`` (with the raw ``texts``)."""
        pairs = list(torch.split(boxes.double().reshape(-1, 5), counts.flatten().tolist()))
        c = counts.shape[1]
        return StatedBoxes([pairs[i * c:(i + 1) * c] for i in range(counts.shape[0])], [list(row) for row in texts], failed.bool())


@dataclass
class ZeroShotOutput:
    """scores ``[B, C]``: the model's probability in [0, 1] that finding c is present in image b.
    saliency ``[B, C, h, w]``: where the model locates finding c, on its native grid, which
    spans the whole model input (``preprocess.size`` square); larger = more salient.
    logits ``[B, C]`` (optional): the model's raw score as its authors compute it, before any
    mapping to ``scores`` (a model whose authors score in [0, 1] may leave it ``None``); the
    benchmark metrics read ``scores`` only.
    stated (optional): the boxes the model stated in text (``StatedBoxes``): the stated-box metrics
    (``metrics.boxes``) judge them; None for a model that states none."""

    scores: torch.Tensor
    saliency: torch.Tensor
    logits: torch.Tensor | None = None
    stated: StatedBoxes | None = None

    def promoted(self) -> ZeroShotOutput:
        """This output with its float16/bfloat16 tensors (a reduced-precision forward's) in float32; others as they are."""
        logits = None if self.logits is None else promoted(self.logits)
        return ZeroShotOutput(promoted(self.scores), promoted(self.saliency), logits, self.stated)


@dataclass
class TestStepOutput:
    """What ``Judge.update_metrics`` (so ``test_step``) returns, i.e. what callbacks get as ``outputs`` in
    ``on_test_batch_end``.

    ``output``: the model's ``ZeroShotOutput`` for the whole batch (stand-in samples included), in float32.
    ``maps [K, E, E]``: the counted (image, finding) pairs' saliency warped to the eval grid, raw
    (the maps the benchmark judges); ``masks [K, E, E]``: their regions; ``pairs [K, 2]``: each
    pair's (sample, class) index into the batch. Only references to tensors the step computed
    anyway: a callback that keeps some must copy them.
    """

    output: ZeroShotOutput
    maps: torch.Tensor
    masks: torch.Tensor
    pairs: torch.Tensor


class Judge(nn.Module):
    """The benchmark's metrics of every dataset (``benchmark``: name -> ``BenchmarkMetrics``) and their feeding.

    Args: ``ZeroShotModel``'s arguments of the same names, which document them (``normalize``, the thresholds, the
    bootstrap, ``size_strata``, ``tune_from``, ``cxl``, ``negatives``, ``groups``): how maps and scores are judged,
    never how they are made. A subclass sets ``device``, where the metrics live (a ``LightningModule``'s own).
    """

    device: torch.device
    #: whether the judged outputs carry stated boxes (``ZeroShotOutput.stated``): every dataset then has the box keys
    STATES_BOXES = False

    def __init__(self, normalize: NormalizeMode = "minmax", fixed_threshold: GridThreshold = 0.5,
                 score_threshold: ClosedUnitInterval = 0.5, bootstrap: NonNegativeInt = 1000, bootstrap_seed: int = 0,
                 size_strata: tuple[OpenUnitInterval, OpenUnitInterval] = (0.01, 0.1), tune_from: str | None = None,
                 cxl: bool = False, negatives: bool = False, groups: GroupNames | None = None):
        super().__init__()
        from xbench_pl.data.groups import parse_groups

        # a replay (judge_settings) passes back the parsed tuple
        self.groups = parse_groups(groups if isinstance(groups, str) else ",".join(groups)) if groups else ()
        self.normalize, self.fixed_threshold, self.score_threshold = normalize, fixed_threshold, score_threshold
        self.bootstrap, self.bootstrap_seed, self.size_strata = int(bootstrap), int(bootstrap_seed), checked_size_bounds(size_strata)
        self.tune_from = tune_from
        self.tuned_thresholds = read_tuned_thresholds(tune_from) if tune_from else {}
        self.cxl, self.negatives = bool(cxl), bool(negatives)
        # per dataset name, the XBenchDataset whose records give the full-resolution regions (cxl mode); found by
        # ``found_region_dataset`` when not set (a replay sets it)
        self.region_datasets: dict = {}
        self.benchmark = nn.ModuleDict()

    def add_dataset(self, name: str, classes: list[str], trust: dict | None = None) -> None:
        """A dataset's metrics (``trust``: the trust measures' settings, ``TrustRun.settings``; None: none)."""
        self.benchmark[name] = BenchmarkMetrics(classes, self.normalize, self.fixed_threshold, self.score_threshold,
                                                bootstrap=self.bootstrap, bootstrap_seed=self.bootstrap_seed, size_bounds=self.size_strata,
                                                tuned_thresholds=self.tuned_thresholds.get(name), tuning_source=self.tune_from, cxl=self.cxl,
                                                negatives=self.negatives, groups=self.groups, trust=trust,
                                                boxes=self.STATES_BOXES).to(self.device)

    def update_metrics(self, batch: Batch, output: ZeroShotOutput) -> TestStepOutput:
        """The judging of ``output`` for ``batch``: checks, the warp to the eval grid and the metric update. A
        16-mixed/bf16-mixed forward's scores and maps are promoted to float32 once, and everything here runs outside
        autocast (Lightning runs the step under it), in the dtypes the metrics ask for, never bf16/fp16."""
        output = output.promoted()
        device = output.scores.device.type
        with torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device) else nullcontext():
            return self.judged(batch, output)

    def judged(self, batch: Batch, output: ZeroShotOutput) -> TestStepOutput:
        b, c = batch.labels.shape
        if output.scores.shape != (b, c) or output.saliency.dim() != 4 or output.saliency.shape[:2] != (b, c):
            raise ValueError(f"{type(self).__name__} gave scores {tuple(output.scores.shape)} and saliency "
                             f"{tuple(output.saliency.shape)}; expected [{b}, {c}] and [{b}, {c}, h, w]")
        not_finite = ~torch.isfinite(output.saliency).flatten(2).all(2)
        if not_finite.any():
            b, c = not_finite.nonzero()[0].tolist()
            raise ValueError(f"{type(self).__name__} gave a saliency map with NaN or inf for image "
                             f"{batch.image_ids[b]!r} of {batch.dataset}, finding {batch.classes[c]!r}")
        if batch.dataset not in self.benchmark:
            self.add_dataset(batch.dataset, batch.classes)
        counted = batch.counted  # stand-in samples of an otherwise idle DDP rank are computed, never counted
        counted_pairs = counted[batch.region_index[:, 0]]
        sample, cls = batch.region_index[counted_pairs].unbind(1)
        # the native map spans the input the model was given: take its size from the batch itself
        maps, seen = warped_and_seen(output.saliency[sample, cls], batch.affine[sample], batch.images.shape[-1],
                                     batch.original_size[sample], batch.region_masks.shape[-1])
        masks = batch.region_masks[counted_pairs]
        image_keys, units = torch.tensor([image_key(i) for i in batch.image_ids], dtype=torch.long), batch_units(batch)
        rows = counted.nonzero().flatten().cpu()
        groups = pair_rows = None
        if self.groups:
            samples = batch.groups or [{}] * len(batch.image_ids)
            groups = {name: [samples[i].get(name, "unknown") for i in rows.tolist()] for name in self.groups}
            position = torch.full((len(batch.image_ids),), -1, dtype=torch.long)
            position[rows] = torch.arange(rows.numel())
            pair_rows = position[sample.cpu()]
        self.benchmark[batch.dataset].update(output.scores[counted], batch.labels[counted], maps, masks, cls,
                                             image_keys=image_keys[sample.cpu()], unit_keys=units[sample.cpu()],
                                             sample_keys=image_keys[rows], sample_units=units[rows], saliency=output.saliency[counted],
                                             negatives=self.negative_pairs(batch, output.saliency, rows) if self.negatives else None,
                                             groups=groups, pair_rows=pair_rows, seen=seen)
        if self.benchmark[batch.dataset].cxl is not None:
            self.update_cxl(batch, output.saliency, units)
        if self.benchmark[batch.dataset].boxes is not None:
            if output.stated is None:
                raise ValueError(f"{type(self).__name__} states boxes but gave none for a batch of {batch.dataset}")
            self.update_boxes(batch, output, rows, image_keys[rows], units[rows])
        return TestStepOutput(output, maps, masks, torch.stack((sample, cls), dim=1))

    def negative_pairs(self, batch: Batch, saliency: torch.Tensor, rows: torch.Tensor):
        """The (image, finding) pairs of the counted images ``rows`` where the finding is absent (label 0, no
        region): their maps warped to the eval grid, classes, and positions among ``rows``."""
        absent = batch.labels[rows.to(batch.labels.device)].cpu() == 0
        has_region = torch.zeros_like(absent)
        position = torch.full((batch.labels.shape[0],), -1, dtype=torch.long)
        position[rows] = torch.arange(rows.numel())
        region = batch.region_index.cpu()
        counted = position[region[:, 0]] >= 0
        has_region[position[region[counted, 0]], region[counted, 1]] = True
        row, cls = (absent & ~has_region).nonzero().unbind(1)
        sample = rows[row].to(saliency.device)
        maps = warp_to_eval_grid(saliency[sample, cls.to(saliency.device)], batch.affine[sample], batch.images.shape[-1],
                                 batch.original_size[sample], batch.region_masks.shape[-1])
        return maps, cls, row

    def update_cxl(self, batch: Batch, saliency: torch.Tensor, units: torch.Tensor) -> None:
        """The CheXlocalize-comparable metrics of every finding of the batch's counted images, at full
        resolution: regions from the dataset's records (original pixels), maps through the batch's affine;
        ``units`` ``[B]``: each sample's bootstrap unit (``batch_units``)."""
        dataset = self.region_dataset(batch)
        counted = batch.counted.nonzero().flatten().cpu()
        regions = [dataset.records[int(batch.index[i])].regions for i in counted.tolist()]
        pairs = full_resolution_pairs(saliency[counted.to(saliency.device)], batch.affine[counted.to(batch.affine.device)],
                                      batch.images.shape[-1], batch.original_size[counted.to(batch.original_size.device)].cpu(),
                                      regions, batch.classes)
        units = units[counted].repeat_interleave(len(batch.classes))  # the pairs' order: image, then finding
        self.benchmark[batch.dataset].update_cxl(pairs, units.tolist())

    def update_boxes(self, batch: Batch, output: ZeroShotOutput, rows: torch.Tensor, image_keys: torch.Tensor,
                     units: torch.Tensor) -> None:
        """The stated-box metrics of every (image, finding) pair of the counted images ``rows`` (``metrics.boxes``):
        each stated box mapped from the model input to the original image through the batch's affine and clipped to
        it (``boxes.clip_boxes``); the ground truth from the dataset's records at full resolution (each instance's
        ``regions.region_bounds``); self-consistency on the eval grid, the map warped as the benchmark warps it."""
        from xbench_pl.data.regions import region_bounds
        from xbench_pl.metrics.boxes import BOX_PAIR_KEYS, box_raster, clip_boxes, pair_box_values, self_consistency, stated_in_original

        dataset, stated, eval_size = self.region_dataset(batch), output.stated, batch.region_masks.shape[-1]
        values, pair_cls, stated_rows, truth_rows, consistency = [], [], [], [], []
        for position, b in enumerate(rows.tolist()):
            height, width = (int(v) for v in batch.original_size[b].tolist())
            record = dataset.records[int(batch.index[b])]
            for c, finding in enumerate(batch.classes):
                raw = stated.boxes[b][c].double().reshape(-1, 5).cpu()
                boxes, kept = stated_in_original(raw, batch.affine[b].tolist(), height, width)
                bounds = [r for r in (region_bounds(x, height, width) for x in record.regions.get(finding, [])) if r is not None]
                truth = clip_boxes(torch.tensor(bounds, dtype=torch.float64).reshape(-1, 4), height, width)[0]  # (polygons' points)
                values.append(pair_box_values(boxes, truth, height, width, float(batch.labels[b, c]), bool(stated.failed[b, c])))
                pair_cls.append(c)
                stated_rows.append((position, c, boxes, raw[kept, 4]))
                truth_rows.append((position, c, truth))
                if boxes.shape[0]:
                    consistency.append((len(values) - 1, b, c, box_raster(boxes, height, width, eval_size)))
        values = torch.tensor(values, dtype=torch.float64).reshape(-1, len(BOX_PAIR_KEYS))
        if consistency:
            index, samples, classes, masks = zip(*consistency)
            samples, classes = torch.tensor(samples), torch.tensor(classes)
            maps = warp_to_eval_grid(output.saliency[samples.to(output.saliency.device), classes.to(output.saliency.device)],
                                     batch.affine[samples.to(batch.affine.device)], batch.images.shape[-1],
                                     batch.original_size[samples.to(batch.original_size.device)], eval_size)
            mass, pointing = self_consistency(maps, torch.stack(masks), self.normalize)
            at = BOX_PAIR_KEYS.index("self_consistency_mass")
            values[list(index), at], values[list(index), at + 1] = mass, pointing

        def listed(entries, with_scores: bool) -> dict:
            counts = torch.tensor([e[2].shape[0] for e in entries], dtype=torch.long)
            position = torch.tensor([e[0] for e in entries], dtype=torch.long)
            boxes = torch.cat([e[2] for e in entries]) if entries else torch.zeros(0, 4, dtype=torch.float64)
            scores = torch.cat([e[3] for e in entries]) if with_scores and entries else torch.ones(boxes.shape[0], dtype=torch.float64)
            return {"image": image_keys[position].repeat_interleave(counts), "boxes": boxes, "scores": scores,
                    "cls": torch.tensor([e[1] for e in entries], dtype=torch.long).repeat_interleave(counts)}

        pairs = torch.arange(rows.numel()).repeat_interleave(len(batch.classes))
        self.benchmark[batch.dataset].update_boxes(image_keys[pairs], units[pairs], torch.tensor(pair_cls, dtype=torch.long),
                                                   values, listed(stated_rows, True), listed(truth_rows, False))

    def region_dataset(self, batch: Batch):
        """The ``XBenchDataset`` of ``batch``'s dataset, whose records hold the regions at full resolution (cxl mode):
        ``region_datasets``' (a replay sets it), else ``found_region_dataset``'s."""
        dataset = self.region_datasets.get(batch.dataset)
        if dataset is None:
            dataset = self.found_region_dataset(batch.dataset)
            if dataset is None:
                raise ValueError(f"cxl=True and stated boxes need the regions of {batch.dataset!r} at full resolution: run through an "
                                 "XBenchDataModule (the CLI's --data) or set model.region_datasets")
            self.region_datasets[batch.dataset] = dataset
        return dataset

    def found_region_dataset(self, name: str):
        """Dataset ``name``'s ``XBenchDataset`` where ``region_datasets`` lacks it (a Lightning model: its trainer's
        datamodule's); None: nowhere."""
        return None


#: the names of ``Judge``'s arguments: the metric settings a prediction store records and a replay judges with
JUDGE_ARGS = tuple(name for name in inspect.signature(Judge.__init__).parameters if name != "self")


def stored_judge_settings(manifest: dict) -> dict:
    """A prediction store's metric settings (its manifest's ``metrics``) that are ``Judge``'s: a store written before
    the judging had a class of its own also records fit's ``trainable``, ``lr`` and ``weight_decay`` there."""
    return {k: v for k, v in manifest.get("metrics", {}).items() if k in JUDGE_ARGS}


def judge_settings(judge: Judge) -> dict:
    """``judge``'s values of ``JUDGE_ARGS`` (a ``ZeroShotModel`` or a ``Replayer``), read from its attributes of the
    same names."""
    return {name: getattr(judge, name) for name in JUDGE_ARGS}
