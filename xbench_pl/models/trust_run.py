"""``--model.trust``: is the map the model's? The measures of issue 29 run inside the shared ``test_step``.

For every counted (image, finding) pair with a region (every finding of every counted image with
``trust_pairs="all"``), in a seeded sample of the images (``trust_fraction``), ``TrustRun.measure`` gives:

* ``randomization``: per stage of the model's cascade (``models.randomization.cascade_stages``; ``trust_stages="last"``:
  the full cascade only), the map of the model randomized down to that stage (through the same explainer:
  ``map_output``) against the trained model's, both on the eval grid: SSIM of the maps normalised as the benchmark
  normalises them (``normalize``), Spearman's rank correlation of the raw maps with and without absolute values
  (Adebayo et al.; a per-map min-max normalisation would not change the ranks, the absolute values would). One
  working copy of the model, made at the first batch, walks the cascade at every batch (``randomization.Cascade``:
  set back to the trained weights, then randomized stage after stage, stage k's weights ``randomized_copy(model, k,
  seed)``'s): two copies of the weights in memory however many stages, and one map pass per measured stage and batch.
  After the first batch a line says what randomization will cost the run;
* ``deletion`` / ``insertion``: the area under the curve of the finding's target (the model's logit where it gives
  one, else its score: ``explainer_forward``) as the most relevant pixels of its map (upsampled to the model input)
  are replaced by the baseline in ``trust_steps`` steps, or inserted into it (``metrics.trust.perturbation_curve``:
  each pair's K + 1 perturbed inputs in one batch, never mixed with other pairs', so a curve does not depend on the
  batch; the text embeddings the model's cached ones);
* ``random_target``: SSIM of the finding's normalised map with that of another finding of the same image, chosen by
  a seeded hash of (seed, image id, finding).

The forwards run as the native one does (under the trainer's precision); the measures' arithmetic in float32/64.
Every choice depends on image ids and the seed only, never on the batch or the process, so 1 and N processes
measure the same pairs.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from xbench_pl.console import note
from xbench_pl.geometry import warp_to_eval_grid
from xbench_pl.metrics.functional import normalize_saliency
from xbench_pl.metrics.trust_mode import value_columns
from xbench_pl.options import parse_trust


def sampled(image_id: str, seed: int, fraction: float) -> bool:
    """Whether ``image_id`` is in the seeded sample of ``fraction`` of the images: BLAKE2b of ``seed:image_id`` as a
    number in [0, 1) below ``fraction`` (the rule metrics.json records; every process draws the same images)."""
    if fraction >= 1:
        return True
    digest = hashlib.blake2b(f"{seed}:{image_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def other_finding(image_id: str, finding: int, num_classes: int, seed: int) -> int:
    """The finding whose map ``random_target`` compares with ``finding``'s on this image: one of the others, by a
    seeded hash (-1 with a single finding)."""
    if num_classes < 2:
        return -1
    digest = hashlib.blake2b(f"{seed}:{image_id}:{finding}".encode(), digest_size=8).digest()
    pick = int.from_bytes(digest, "little") % (num_classes - 1)
    return pick + (pick >= finding)


def no_autocast(device: torch.device):
    """The measures' arithmetic outside the trainer's autocast (never in bf16/fp16)."""
    kind = device.type
    return torch.autocast(kind, enabled=False) if torch.amp.is_autocast_available(kind) else nullcontext()


class TrustRun:
    """The trust measures a model runs in ``test_step`` (``ZeroShotModel``'s ``trust*`` arguments, checked here)."""

    def __init__(self, measures: str, seed: int = 0, steps: int = 10, baseline: str = "blur", blur_sigma: float = 10.0,
                 stages: str = "all", pairs: str = "regions", fraction: float = 1.0):
        self.measures = parse_trust(measures)
        if steps < 1:
            raise ValueError(f"trust_steps must be >= 1, got {steps}")
        if baseline not in ("blur", "mean"):
            raise ValueError(f"trust_baseline must be blur or mean, got {baseline!r}")
        if stages not in ("all", "last"):
            raise ValueError(f"trust_stages must be all or last, got {stages!r}")
        if pairs not in ("regions", "all"):
            raise ValueError(f"trust_pairs must be regions or all, got {pairs!r}")
        if not 0 < fraction <= 1:
            raise ValueError(f"trust_fraction must be in (0, 1], got {fraction}")
        self.seed, self.steps, self.baseline, self.blur_sigma = int(seed), int(steps), baseline, float(blur_sigma)
        self.stages, self.pairs, self.fraction = stages, pairs, float(fraction)
        self.cascade: list[tuple[str, int]] | None = None  # (stage name, its index in the model's cascade)
        self.walk = None  # the randomization.Cascade of the run's working copy, made at the first batch (release)

    # -- what runs --------------------------------------------------------------------------
    def stage_names(self, model) -> list[str]:
        """The names of the cascade stages measured (none without randomization)."""
        return [name for name, _ in self.measured_stages(model)]

    def measured_stages(self, model) -> list[tuple[str, int]]:
        if self.cascade is None:
            self.cascade = []
            if "randomization" in self.measures:
                from xbench_pl.models.randomization import cascade_stages

                stages = [(name, i) for i, (name, _) in enumerate(cascade_stages(model))]
                self.cascade = stages[-1:] if self.stages == "last" else stages
        return self.cascade

    def settings(self, model) -> dict:
        """What metrics.json's ``trust`` block records of the run (``settings``)."""
        return {"measures": list(self.measures), "seed": self.seed, "steps": self.steps, "baseline": self.baseline,
                "blur_sigma": self.blur_sigma if self.baseline == "blur" else None, "stages": self.stage_names(model),
                "pairs": self.pairs,
                "sample": {"fraction": self.fraction, "rule": "blake2b(f'{seed}:{image_id}') / 2**64 < fraction"}}

    def randomized(self, model) -> Iterator:
        """The working copy at each measured stage in turn, one walk down the cascade (``randomization.Cascade``, made
        at the first batch outside inference mode: the explainers take gradients through it). Its weights at stage k
        are ``randomized_copy(model, k, seed)``'s; it is the next stage's at the next step."""
        measured = {index for _, index in self.measured_stages(model)}
        if not measured:
            return
        if self.walk is None:
            from xbench_pl.models.randomization import Cascade

            self.walk = Cascade(model, self.seed, last=max(measured))
        for index, _, randomized in self.walk:
            if index in measured:
                yield randomized

    def release(self) -> None:
        """Drop the working copy at the end of a run (the next run makes its own and says its cost again)."""
        self.walk = None

    def announce(self, model, seconds: float) -> None:
        """One line (rank zero) after the first batch that walked the cascade: its time, and that times the run's
        batches (where the trainer knows them)."""
        stages = len(self.measured_stages(model))
        trainer = getattr(model, "_trainer", None)
        batches = sum(getattr(trainer, "num_test_batches", None) or [])
        total = f", ~{seconds * batches / 60:.1f} min in all ({batches} batches)" if 0 < batches < math.inf else ""
        note(f"trust randomization: {stages} stage{'s' * (stages != 1)}, ~{seconds:.1f} s per batch{total}")

    # -- one batch --------------------------------------------------------------------------
    def chosen_pairs(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sample [P], class [P])`` (CPU) of the pairs measured in ``batch``: counted, with a region unless
        ``pairs="all"``, of sampled images; in (sample, class) order."""
        counted = batch.counted.cpu()
        if self.pairs == "all":
            c = batch.labels.shape[1]
            rows = counted.nonzero().flatten()
            sample, cls = rows.repeat_interleave(c), torch.arange(c).repeat(rows.numel())
        else:
            region = batch.region_index.cpu()
            region = region[counted[region[:, 0]]]
            sample, cls = region.unbind(1)
        keep = torch.tensor([sampled(batch.image_ids[i], self.seed, self.fraction) for i in sample.tolist()], dtype=torch.bool)
        sample, cls = sample[keep], cls[keep]
        order = torch.argsort(sample * batch.labels.shape[1] + cls)
        return sample[order], cls[order]

    def eval_maps(self, saliency: torch.Tensor, batch, sample: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
        """The pairs' maps of ``saliency [B, C, h, w]`` on the eval grid, raw ``[P, E, E]``."""
        d = saliency.device
        return warp_to_eval_grid(saliency[sample.to(d), cls.to(d)], batch.affine[sample.to(batch.affine.device)],
                                 batch.images.shape[-1], batch.original_size[sample.to(batch.original_size.device)],
                                 batch.region_masks.shape[-1])

    def texts(self, batch) -> list[list[str]]:
        """Each sample's texts (its phrases, else the class names): what its forward is given."""
        texts = [list(batch.classes)] * len(batch.image_ids)
        for group, samples in batch.query_texts():
            for i in samples.tolist():
                texts[i] = list(group)
        return texts

    def measure(self, model, batch, output, normalize: str) -> dict | None:
        """The measured pairs of ``batch``: ``sample``, ``cls`` ``[P]``, ``values [P, K]`` float64 in
        ``trust_mode.value_columns`` order (NaN where not measured or undefined) and ``maps [P, E, E]`` (the trained
        maps, normalised); None without a pair."""
        from xbench_pl.metrics import trust

        sample, cls = self.chosen_pairs(batch)
        if sample.numel() == 0:
            return None
        stages = self.measured_stages(model)
        columns = {name: i for i, name in enumerate(value_columns(len(stages)))}
        values = torch.full((sample.numel(), len(columns)), float("nan"), dtype=torch.float64)
        device = output.saliency.device
        with no_autocast(device):
            raw = self.eval_maps(output.saliency, batch, sample, cls).float()
            maps = normalize_saliency(raw, normalize)
        if stages:
            first = self.walk is None
            started = time.perf_counter()
            with no_autocast(device):  # the trained maps ranked once for every stage (spearman's two sides)
                trained_ranks = trust.ranks(raw.flatten(1)), trust.ranks(raw.flatten(1).abs())
            for i, randomized_model in enumerate(self.randomized(model)):
                randomized = randomized_model.map_output(batch).promoted()  # (no boxes generated: only the maps are compared)
                with no_autocast(device):
                    other = self.eval_maps(randomized.saliency, batch, sample, cls).float()
                    values[:, columns[f"stage{i}_ssim"]] = trust.ssim(maps, normalize_saliency(other, normalize)).double().cpu()
                    ranked = trust.ranks(other.flatten(1)), trust.ranks(other.flatten(1).abs())
                    values[:, columns[f"stage{i}_spearman"]] = trust.rank_correlation(trained_ranks[0], ranked[0]).double().cpu()
                    values[:, columns[f"stage{i}_spearman_abs"]] = trust.rank_correlation(trained_ranks[1], ranked[1]).double().cpu()
            if first:  # the values are on the CPU: the device's work is done
                self.announce(model, time.perf_counter() - started)
        for measure in ("deletion", "insertion"):
            if measure in self.measures:
                values[:, columns[f"{measure}_auc"]] = self.perturbation_aucs(model, batch, output, sample, cls,
                                                                             insertion=measure == "insertion")
        if "random_target" in self.measures:
            c = batch.labels.shape[1]
            others = torch.tensor([other_finding(batch.image_ids[s], k, c, self.seed)
                                   for s, k in zip(sample.tolist(), cls.tolist())], dtype=torch.long)
            has = others >= 0
            if bool(has.any()):
                with no_autocast(device):
                    theirs = normalize_saliency(self.eval_maps(output.saliency, batch, sample[has], others[has]).float(), normalize)
                    values[has, columns["random_target_ssim"]] = trust.ssim(maps[has.to(maps.device)], theirs).double().cpu()
        return {"sample": sample, "cls": cls, "values": values,
                "maps": maps if "randomization" in self.measures else None}

    def perturbation_aucs(self, model, batch, output, sample: torch.Tensor, cls: torch.Tensor, insertion: bool) -> torch.Tensor:
        """``[P]`` float64: each pair's deletion (insertion) AUC of its finding's target (``trust.perturbation_curve``),
        the pairs of one text list and finding in one call."""
        from xbench_pl.metrics import trust

        texts, size = self.texts(batch), batch.images.shape[-1]
        aucs = torch.full((sample.numel(),), float("nan"), dtype=torch.float64)
        groups: dict[tuple, list[int]] = {}
        for p, (s, k) in enumerate(zip(sample.tolist(), cls.tolist())):
            groups.setdefault((tuple(texts[s]), k), []).append(p)
        for (group_texts, k), rows in groups.items():
            rows_t = torch.tensor(rows, dtype=torch.long)
            picked = sample[rows_t]
            images = batch.images[picked.to(batch.images.device)]
            d = output.saliency.device
            with no_autocast(d):
                maps = F.interpolate(output.saliency[picked.to(d), cls[rows_t].to(d)][:, None].float(), size=(size, size),
                                     mode="bilinear", align_corners=False)[:, 0]
                baseline = (trust.blurred_baseline(images, self.blur_sigma) if self.baseline == "blur"
                            else trust.mean_baseline(images, torch.zeros(images.shape[1], device=images.device)))

            def target(x: torch.Tensor, texts=list(group_texts), finding=k) -> torch.Tensor:
                return model.explainer_forward(x, texts, grad=False)[1][:, finding].double()

            curves = trust.perturbation_curve(target, images, maps, self.steps, baseline, insertion=insertion)
            aucs[rows_t] = trust.curve_auc(curves).double().cpu()
        return aucs
