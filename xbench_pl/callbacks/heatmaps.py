"""Heatmap samples: a few images per (dataset, finding) with the judged saliency map overlaid.

For every (image, finding) pair with a region (the pairs grounding is judged on), the image's
key is a hash of (dataset, image id); each rank keeps, per (dataset, finding), the pairs with
the ``per_finding`` smallest keys in a bounded heap, copying only what it keeps. At the end of
testing the heaps go to rank zero, which keeps the ``per_finding`` smallest keys of their
union: the same samples whatever the number of processes, each exactly once, and a memory
footprint bounded by the sample count, not the dataset size.

Each sample is drawn in the original image frame (the eval grid stretched to the image's
aspect ratio): the image as the model saw it (its input, de-normalised and warped back; parts
a crop never showed are black), the map as the benchmark judges it (warped to the eval grid,
normalised as ``--model.normalize``), the ground-truth region outlined (lime), the Pointing
Game peak marked (a star), a grounded generative model's own stated boxes (dashed magenta, as the box metrics judge
them: in the original frame, clipped), and model, dataset, finding, image id, score, label, Pointing Game hit and the
number of stated boxes in the caption. Files: ``OUT/heatmaps/DATASET/FINDING/IMAGE_ID.png`` (dots in the id become ``_``) and
``OUT/heatmaps/samples.csv``; with a ``WandbLogger``, one ``wandb.Image`` list per
``heatmaps/DATASET/FINDING`` key.
"""

from __future__ import annotations

import csv
import hashlib
import heapq
import io
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import numpy as np
import torch

from xbench_pl.callbacks.common import (close_own, gather_to_rank_zero, model_name, new_figure, output_folder, safe_name,
                                       wandb_logger)
from xbench_pl.geometry import warp_to_eval_grid
from xbench_pl.metrics.boxes import stated_in_original
from xbench_pl.metrics.functional import RELATIVE_TOLERANCE, normalize_saliency, pointing_game
from xbench_pl.outputs import figure_png


def sample_key(dataset: str, image_id: str) -> int:
    """The deterministic rank of an image among samples: the first 8 bytes of SHA-1 of (dataset, id)."""
    return int.from_bytes(hashlib.sha1(f"{dataset}\0{image_id}".encode()).digest()[:8], "big")


@dataclass
class Sample:
    """One (image, finding) pair as drawn: eval-grid image (uint8), raw map (float32), region (bool)."""

    key: int
    dataset: str
    finding: str
    image_id: str
    score: float
    label: int
    pointing: float
    original_size: tuple[int, int]
    image: np.ndarray
    saliency: np.ndarray
    region: np.ndarray
    query: str | None = None  # the phrase grounded in place of the finding's name (phrase datasets: MS-CXR)
    stated: np.ndarray | None = None  # [n, 4] the boxes a generative model stated, in original pixels (clipped)


@dataclass
class SampleBook:
    """Per (dataset, finding), the ``k`` samples with the smallest keys seen so far (a max-heap of -key)."""

    k: int
    heaps: dict[tuple[str, str], list] = field(default_factory=dict)

    def wants(self, group: tuple[str, str], key: int) -> bool:
        heap = self.heaps.get(group, [])
        return self.k > 0 and (len(heap) < self.k or key < -heap[0][0])

    def add(self, sample: Sample) -> None:
        heap = self.heaps.setdefault((sample.dataset, sample.finding), [])
        entry = (-sample.key, sample.image_id, sample)
        if len(heap) < self.k:
            heapq.heappush(heap, entry)
        else:
            heapq.heappushpop(heap, entry)

    def samples(self) -> list[Sample]:
        return [entry[2] for heap in self.heaps.values() for entry in heap]

    @classmethod
    def merge(cls, k: int, books: list[list[Sample]]) -> dict[tuple[str, str], list[Sample]]:
        """The ``k`` smallest keys per (dataset, finding) over every rank's samples, sorted by key."""
        groups: dict[tuple[str, str], list[Sample]] = {}
        for samples in books:
            for s in samples:
                groups.setdefault((s.dataset, s.finding), []).append(s)
        return {g: sorted(v, key=lambda s: (s.key, s.image_id))[:k] for g, v in sorted(groups.items())}


class SaliencySamples(L.Callback):
    """Overlay the judged saliency map on ``per_finding`` deterministic images per (dataset, finding).

    Args:
        per_finding: images drawn per (dataset, finding), among the pairs with a region.
        dirpath: output folder (default: the trainer's ``default_root_dir``, i.e. ``--out``).
        display_size: long side, in pixels, of the drawn image (the eval grid is resampled to it).
        require_wandb: fail in ``setup`` when the trainer has no ``WandbLogger`` (default: files only then).
    """

    def __init__(self, per_finding: int = 4, dirpath: str | None = None, display_size: int = 384, require_wandb: bool = False):
        super().__init__()
        if per_finding < 0:
            raise ValueError(f"per_finding must be >= 0, got {per_finding}")
        self.per_finding, self.dirpath, self.display_size, self.require_wandb = per_finding, dirpath, display_size, require_wandb
        self.book = SampleBook(per_finding)
        self.written: list[Path] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        wandb_logger(trainer, required=self.require_wandb)

    def on_test_start(self, trainer, pl_module) -> None:
        self.book = SampleBook(self.per_finding)
        self.written = []

    @torch.no_grad()
    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if outputs is None or outputs.pairs.numel() == 0:
            return
        preprocess = pl_module.preprocess
        for k, (b, c) in enumerate(outputs.pairs.tolist()):
            dataset, image_id, finding = batch.datasets[b], batch.image_ids[b], batch.classes[c]
            key = sample_key(dataset, image_id)
            if not self.book.wants((dataset, finding), key):
                continue
            saliency, region = outputs.maps[k], outputs.masks[k]
            # the image as the model saw it, de-normalised, on the same eval grid as map and region
            mean = torch.tensor(preprocess.mean, dtype=torch.float32, device=batch.images.device).view(3, 1, 1)
            std = torch.tensor(preprocess.std, dtype=torch.float32, device=batch.images.device).view(3, 1, 1)
            pixels = (batch.images[b].float() * std + mean).mean(0, keepdim=True)
            image = warp_to_eval_grid(pixels, batch.affine[b : b + 1], batch.images.shape[-1],
                                      batch.original_size[b : b + 1], saliency.shape[-1])[0]
            self.book.add(Sample(
                key=key, dataset=dataset, finding=finding, image_id=image_id,
                score=float(outputs.output.scores[b, c]), label=int(batch.labels[b, c]),
                pointing=float(pointing_game(saliency[None], region[None])[0]),
                original_size=tuple(int(v) for v in batch.original_size[b].tolist()),
                image=(image.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy(),
                saliency=saliency.float().cpu().numpy().copy(),
                region=region.bool().cpu().numpy().copy(),
                query=batch.queries[b].get(finding) if batch.queries else None,
                stated=None if outputs.output.stated is None else stated_in_original(
                    outputs.output.stated.boxes[b][c], batch.affine[b].tolist(), *(int(v) for v in batch.original_size[b].tolist()))[0].numpy(),
            ))

    def on_test_end(self, trainer, pl_module) -> None:
        gathered = gather_to_rank_zero(trainer, self.book.samples())
        self.book = SampleBook(self.per_finding)  # free the maps
        if not trainer.is_global_zero:
            return
        chosen = SampleBook.merge(self.per_finding, gathered)
        outputs, root = output_folder(trainer, self.dirpath), Path("heatmaps")
        name, normalize = model_name(pl_module), getattr(pl_module, "normalize", "minmax")
        logger, rows = wandb_logger(trainer), []
        for (dataset, finding), samples in chosen.items():
            folder = root / safe_name(dataset) / safe_name(finding)
            paths, captions = [], []
            for s in samples:
                file = folder / f"{safe_name(s.image_id.replace('.', '_'))}.png"
                queried = f" \"{s.query}\"" if s.query else ""
                stated = "" if s.stated is None else f" | {len(s.stated)} stated box(es)"
                caption = (f"{name} | {dataset} | {finding}{queried} | {s.image_id} | score {s.score:.3f} | label {s.label} | "
                           f"pointing game {s.pointing:.2f}{stated}")
                paths.append(outputs.write(file, render_sample(s, caption, normalize, self.display_size)))
                captions.append(caption)
                rows.append({"dataset": dataset, "finding": finding, **({"query": s.query} if s.query else {}), "image_id": s.image_id, "score": s.score,
                             "label": s.label, "pointing_game": s.pointing, **({} if s.stated is None else {"stated_boxes": len(s.stated)}),
                             "file": str(file.relative_to(root))})
            self.written += paths
            if logger is not None:
                logger.log_image(key=f"heatmaps/{dataset}/{finding}", images=[str(p) for p in paths], caption=captions)
        if rows:
            text = io.StringIO()
            # a phrase dataset's rows add the phrase after the finding (``query``); others have no such column
            writer = csv.DictWriter(text, fieldnames=list(max(rows, key=len)), restval="")
            writer.writeheader()
            writer.writerows(rows)
            outputs.write(root / "samples.csv", text.getvalue())
        close_own(trainer, outputs)


TITLE_CHARACTER, TITLE_LINE = 0.06, 0.125  # inches: a 7-point character's width (at most, near enough) and line


def render_sample(sample: Sample, caption: str, normalize: str = "minmax", display_size: int = 384) -> bytes:
    """One sample (see the module docstring) drawn as a PNG."""
    height, width = sample.original_size
    saliency = torch.from_numpy(sample.saliency)
    shown = normalize_saliency(saliency[None], normalize if normalize != "none" else "minmax")[0].numpy()
    flat = sample.saliency.reshape(-1)
    hi, lo = flat.max(), flat.min()
    maximal = sample.saliency >= hi - RELATIVE_TOLERANCE * (hi - lo)
    peak_y, peak_x = np.unravel_index(int(np.argmax(sample.saliency)), sample.saliency.shape)
    e = sample.saliency.shape[0]
    extent = (0, width, height, 0)  # eval grid -> original pixel frame (anisotropic for non-square images)
    scale = display_size / max(height, width)
    shown_width, shown_height = max(2.5, width * scale / 100), max(2.5, height * scale / 100)  # inches
    ties = int(maximal.sum())
    title = textwrap.wrap(caption + (f" | {ties} tied peak px" if ties > 1 else ""), int((shown_width + 0.7) / TITLE_CHARACTER),
                          break_long_words=False)
    top = 0.08 + TITLE_LINE * len(title)
    fig = new_figure(shown_width + 0.7, shown_height + 0.05 + top, (0.05, 0.05, 0.65, top))  # right: the colour bar
    ax = fig.add_subplot()
    ax.imshow(sample.image, cmap="gray", vmin=0, vmax=255, extent=extent, interpolation="bilinear")
    overlay = ax.imshow(shown, cmap="jet", alpha=0.45, vmin=0, vmax=1, extent=extent, interpolation="bilinear")
    centres_x = (np.arange(e) + 0.5) * width / e
    centres_y = (np.arange(e) + 0.5) * height / e
    if sample.region.any():
        ax.contour(centres_x, centres_y, sample.region.astype(np.float32), levels=[0.5], colors=["lime"], linewidths=1.5)
    ax.plot(centres_x[peak_x], centres_y[peak_y], marker="*", markersize=16, markerfacecolor="white",
            markeredgecolor="black", linestyle="none")
    if sample.stated is not None:  # the model's own boxes (a grounded generative model), dashed magenta
        from matplotlib.patches import Rectangle

        for x0, y0, x1, y1 in sample.stated.tolist():
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="magenta", linestyle="--", linewidth=1.5))
    ax.set_axis_off()
    bar = fig.add_axes(((shown_width + 0.15) / fig.get_figwidth(), 0.05 / fig.get_figheight(), 0.12 / fig.get_figwidth(),
                        shown_height / fig.get_figheight()))
    fig.colorbar(overlay, cax=bar).ax.tick_params(labelsize=7)
    ax.set_title("\n".join(title), fontsize=7)
    return figure_png(fig, dpi=100)
