"""Boxes predicted elsewhere (detectors; grounded report generators such as MAIRA-2, whose boxes are
parsed from their text), read from a CSV or JSON-lines file and scored as saliency maps.

One row per box: ``image_id, finding, x_min, y_min, x_max, y_max`` in the original image's continuous
pixel coordinates (pixel ``i`` spans ``[i, i + 1)``, as ``regions.Box``; boxes given by inclusive
integer corners add 1 to ``x_max`` and ``y_max``), an optional ``confidence`` in [0, 1] and an optional
``score`` in [0, 1], the (image, finding) recognition score. A file with a ``confidence`` (``score``)
column needs it on every box (every row); a row with all four corners empty and a ``score`` scores
its pair without a box. The file is CSV (``.csv``, with a header) or JSON lines (``.jsonl``/``.json``,
one object per line, ``null`` for empty). Rows are numbered as the file's lines (a CSV header is row 1).

Map of a pair: the pixel-wise maximum of the confidences (1 without that column) of its boxes,
drawn straight onto the eval grid by the ground truth's own rule (``Box.rasterize``: an eval pixel
belongs to a box when its centre does), so a predicted box equal to a ground-truth box covers exactly
its pixels; ``eval_grid_affine`` tells the benchmark's warp that the map already is the eval grid.
A pair without a box has a constant zero map, which the tie-aware metrics score as the ``uniform``
baseline (chance): Pointing Game = the region's area fraction, Dice at the best threshold that of the
whole image.

Recognition of a pair: its ``score``; else the maximum confidence of its boxes; a pair without a row
scores 0 either way. Without both columns the run is grounding-only (recognition keys null).

The boxes themselves are judged too, as a grounded generative model's (``metrics.boxes``, the same code): box accuracy
at IoU 0.5, best-match IoU, RadFact's box precision/recall, COCO mAP (each box scored by its ``confidence``, 1
without), boxes drawn for absent findings, and the self-consistency of the box map with its own boxes.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from xbench_pl.console import QUIET_SECONDS, ProgressLines
from xbench_pl.data.base import Record, XBenchData, XBenchDataset
from xbench_pl.data.errors import DataError
from xbench_pl.data.regions import Box
from xbench_pl.external_maps import finding_name, replay_items
from xbench_pl.judging import StatedBoxes
from xbench_pl.predictions import Replayer, images_per_update

BOX_COLUMNS = ("image_id", "finding", "x_min", "y_min", "x_max", "y_max")
CORNERS = BOX_COLUMNS[2:]
#: what the file may hold, as its errors name it
LAYOUT = "image_id,finding,x_min,y_min,x_max,y_max[,confidence][,score]"
#: shifts the eval-pixel centres by this (eval pixels) before ``warp_to_eval_grid`` samples an eval-grid map:
#: its float64 centre ``i + 0.5`` may land an ulp past the cell centre, giving the next cell a ~1e-16 weight
#: (nonzero in float32); a centre just before it gives the previous cell a weight that rounds to exactly 0
GRID_NUDGE = 1e-9


@dataclass(frozen=True)
class BoxRow:
    """One row of a box file: ``box`` None for a score-only row; ``confidence``/``score`` None where the file has no such column."""

    row: int
    image_id: str
    finding: str
    box: Box | None
    confidence: float | None
    score: float | None


# -- reading -----------------------------------------------------------------------------------
def _csv_rows(path: Path) -> tuple[set[str], list[tuple[int, dict | str]]]:
    with open(path, newline="", encoding="utf-8-sig") as handle:  # (a spreadsheet's byte-order mark is no column name)
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        rows = [(reader.line_num, dict(zip(header, cells)) if len(cells) <= len(header) else
                 f"{len(cells)} cells for {len(header)} columns") for cells in reader if any(c.strip() for c in cells)]
    return set(header), rows


def _json_rows(path: Path) -> tuple[set[str], list[tuple[int, dict | str]]]:
    rows = []
    with open(path, encoding="utf-8-sig") as handle:
        for line, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                rows.append((line, f"not JSON ({error.msg}; a box file holds one JSON object per line)"))
                continue
            rows.append((line, value if isinstance(value, dict) else f"not a JSON object ({text.strip()[:40]})"))
    return {k for _, v in rows if isinstance(v, dict) for k, x in v.items() if x is not None}, rows


def read_rows(path: str | Path) -> tuple[set[str], list[tuple[int, dict | str]]]:
    """The file's columns and its non-blank rows ``(row, {column: value} or why it is no row)``; ``DataError``
    (whatever ``on_error``) for a file that cannot be read or lacks a box column."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl", ".json"):
        raise DataError(path, f"a box file is .csv or .jsonl/.json (JSON lines) with {LAYOUT}")
    try:
        columns, rows = _csv_rows(path) if suffix == ".csv" else _json_rows(path)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(path, f"cannot read the box file ({error})") from None
    missing = [c for c in BOX_COLUMNS if c not in columns]
    if missing:
        raise DataError(path, f"no column {', '.join(missing)} (a box file has {LAYOUT})", row=1 if suffix == ".csv" else None)
    return columns, rows


def _text(values: dict, key: str) -> str:
    value = values.get(key)
    text = "" if value is None or isinstance(value, (dict, list, bool)) else str(value).strip()
    if not text:
        raise ValueError(f"{key} is missing")
    return text


def _number(values: dict, key: str) -> float | None:
    """The cell as a finite float, None where empty; ``ValueError`` naming the column otherwise."""
    value = values.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{key} is {value!r}, not a finite number")
    return number


def _unit(value: float | None, key: str, columns: set[str], why: str) -> float | None:
    if key in columns and value is None:
        raise ValueError(f"{key} is missing (the file has a {key} column: {why})")
    if value is not None and not 0 <= value <= 1:
        raise ValueError(f"{key} {value} is not in [0, 1]")
    return value


def parse_row(row: int, values: dict | str, columns: set[str]) -> BoxRow:
    """One row of a box file; ``ValueError`` saying what is malformed."""
    if isinstance(values, str):
        raise ValueError(values)
    image_id, finding = _text(values, "image_id"), _text(values, "finding")
    corners = [_number(values, key) for key in CORNERS]
    score = _unit(_number(values, "score"), "score", columns, "every row needs one")
    if all(c is None for c in corners) and score is not None:
        return BoxRow(row, image_id, finding, None, None, score)  # a score without a box
    if any(c is None for c in corners):
        raise ValueError(f"{', '.join(k for k, c in zip(CORNERS, corners) if c is None)} missing")
    x0, y0, x1, y1 = corners
    if x1 <= x0 or y1 <= y0:
        raise ValueError(f"box x_min,y_min,x_max,y_max = {x0:g},{y0:g},{x1:g},{y1:g} needs x_max > x_min and y_max > y_min")
    confidence = _unit(_number(values, "confidence"), "confidence", columns, "every box needs one")
    return BoxRow(row, image_id, finding, Box(x0, y0, x1, y1), confidence, score)


def read_boxes(path: str | Path, report: Callable[[DataError], None]) -> tuple[list[BoxRow], set[str]]:
    """The well-formed rows of a box file and its columns; each malformed row goes to ``report``
    (``XBenchData.report``: raise, or count it with ``on_error="skip"``)."""
    columns, rows = read_rows(path)
    out = []
    for row, values in rows:
        try:
            out.append(parse_row(row, values, columns))
        except ValueError as error:
            report(DataError(path, str(error), row=row))
    return out, columns


# -- checking against the dataset --------------------------------------------------------------
def outside(box: Box, height: int, width: int) -> bool:
    return box.x0 < 0 or box.y0 < 0 or box.x1 > width or box.y1 > height


def check_rows(rows: list[BoxRow], path: Path, datamodules: list[XBenchData],
               records: dict[str, tuple]) -> list[tuple[XBenchData, BoxRow]]:
    """Each usable row with its dataset and the dataset's finding name; a row of an image none of
    ``datamodules`` evaluates (``records``: image id -> (datamodule, Record, (H, W))), of an unknown
    finding, with a box outside its image or a score its pair's earlier rows contradict goes to the
    dataset's ``report`` (an image-less row to the first dataset's); a box covering no eval-pixel
    centre is kept and recorded (``empty_on_grid``)."""
    kept, first_score = [], {}
    for row in rows:
        try:
            if row.image_id not in records:
                raise DataError(path, f"image {row.image_id!r} is not an evaluated image of "
                                f"{', '.join(d.name for d in datamodules)}", row=row.row)
            owner, record, (height, width) = records[row.image_id]
            finding = finding_name(row.finding, owner.name, list(owner.classes))
            if finding is None:
                raise DataError(path, f"finding {row.finding!r} is none of {owner.name}'s {', '.join(owner.classes)}", row=row.row)
            if row.box is not None and outside(row.box, height, width):
                b = row.box
                raise DataError(path, f"box x_min,y_min,x_max,y_max = {b.x0:g},{b.y0:g},{b.x1:g},{b.y1:g} extends outside "
                                f"the {width}x{height} image {row.image_id}", row=row.row)
            pair = (row.image_id, finding)
            if row.score is not None:
                earlier = first_score.setdefault(pair, (row.row, row.score))
                if earlier[1] != row.score:
                    raise DataError(path, f"score {row.score:g} of {row.image_id} / {finding} differs from row {earlier[0]}'s "
                                    f"{earlier[1]:g}: one score per (image, finding)", row=row.row)
        except DataError as error:
            (records[row.image_id][0] if row.image_id in records else datamodules[0]).report(error)
            continue
        size = owner.eval_size
        if row.box is not None and not row.box.rasterize(height, width, size).any():
            owner.report(DataError(path, f"the {finding} box of {row.image_id} covers no pixel centre of the {size}x{size} "
                                   "eval grid: it adds nothing to the map (its confidence still counts)", row=row.row,
                                   action="empty_on_grid"))
        kept.append((owner, replace(row, finding=finding)))
    return kept


# -- maps and scores ---------------------------------------------------------------------------
def max_confidence_map(boxes: list[tuple[Box, float]], height: int, width: int, eval_size: int) -> np.ndarray:
    """``[E, E]`` float32 on the eval grid of a ``height x width`` image: per eval pixel the largest
    confidence of the ``(box, confidence)`` covering its centre, 0 where none does."""
    out = np.zeros((eval_size, eval_size), dtype=np.float32)
    for box, confidence in boxes:
        inside = box.rasterize(height, width, eval_size)
        out[inside] = np.maximum(out[inside], np.float32(confidence))
    return out


def eval_grid_affine(height: int, width: int, eval_size: int) -> list[float]:
    """The affine ``(sx, sy, tx, ty)`` under which a ``[E, E]`` map on a ``E``-square input is the eval grid
    itself: ``warp_to_eval_grid`` then samples each eval pixel's own value, exactly (``GRID_NUDGE``)."""
    return [eval_size / width, eval_size / height, -GRID_NUDGE, -GRID_NUDGE]


def pair_scores(rows: list[BoxRow], recognition: str | None) -> dict[tuple[str, str], float]:
    """``(image_id, finding) -> score`` from the ``score`` column or the boxes' maximum ``confidence``
    (``recognition``); empty for None (grounding-only)."""
    scores: dict[tuple[str, str], float] = {}
    for row in rows:
        value = row.score if recognition == "score" else row.confidence if recognition == "confidence" else None
        if value is not None:
            key = (row.image_id, row.finding)
            scores[key] = max(scores.get(key, value), value)
    return scores


def stated_in_input(boxes: list[tuple[Box, float]], affine: list[float]) -> torch.Tensor:
    """A pair's boxes ``[n, 5]`` (corners in the input ``affine`` places the original in, and confidence): what the
    stated-box metrics (``metrics.boxes``) map back to the original through the same affine."""
    sx, sy, tx, ty = affine
    return torch.tensor([(b.x0 * sx + tx, b.y0 * sy + ty, b.x1 * sx + tx, b.y1 * sy + ty, c) for b, c in boxes],
                        dtype=torch.float64).reshape(-1, 5)


def score_boxes(child: XBenchData, records: list[Record], sizes: dict[str, tuple[int, int]], rows: list[BoxRow],
                recognition: str | None, replayer: Replayer, chunk: int) -> bool:
    """Feed one dataset's box maps into ``replayer``, every evaluated image (one without a box has zero maps);
    returns whether it had scores."""
    classes, size = list(child.classes), child.eval_size
    boxes: dict[tuple[str, str], list[tuple[Box, float]]] = {}
    for row in rows:
        if row.box is not None:
            boxes.setdefault((row.image_id, row.finding), []).append((row.box, 1.0 if row.confidence is None else row.confidence))
    scores = pair_scores(rows, recognition)
    missing = 0.0 if recognition else float("nan")  # a pair without a row: scored 0, or unscored
    dataset = XBenchDataset(child.name, records, classes, None, size)
    scored = True
    progress = ProgressLines(f"{child.name} boxes", len(records), "images", after=QUIET_SECONDS)
    step = images_per_update(chunk, len(classes), size, size)  # box maps are eval-grid sized
    for start in range(0, len(records), step):
        part = records[start:start + step]
        items = []
        for record in part:
            height, width = sizes[record.image_id]
            maps = [max_confidence_map(boxes.get((record.image_id, c), []), height, width, size) for c in classes]
            items.append((record.image_id, (height, width), torch.from_numpy(np.stack(maps)),
                          [scores.get((record.image_id, c), missing) for c in classes]))
        affine = [eval_grid_affine(*sizes[r.image_id], size) for r in part]
        stated = StatedBoxes([[stated_in_input(boxes.get((r.image_id, c), []), a) for c in classes] for r, a in zip(part, affine)],
                             [[""] * len(classes) for _ in part], torch.zeros(len(part), len(classes), dtype=torch.bool))
        scored &= replay_items(replayer, dataset, items, size, affine, chunk, stated)
        progress.step(len(part))
    return scored


def score_box_file(path: str | Path, datamodule: XBenchData, replayer: Replayer, chunk: int) -> dict[str, tuple[int, int, bool]]:
    """Score the box file ``path`` on every dataset of ``datamodule``: ``{dataset: (images, images with a box, scored)}``."""
    path = Path(path)
    children = datamodule.datamodules
    evaluated = {child.name: child.prepare_records() for child in children}  # (resets each dataset's problems)
    records = {}
    for child in children:
        for record in evaluated[child.name]:
            records[record.image_id] = (child, record, child.image_sizes[record.image_id])
    rows, columns = read_boxes(path, children[0].report)
    kept = check_rows(rows, path, children, records)
    recognition = "score" if "score" in columns else "confidence" if "confidence" in columns else None
    sizes = {image_id: size for image_id, (_, _, size) in records.items()}
    out = {}
    for child in children:
        mine = [row for owner, row in kept if owner is child]
        scored = score_boxes(child, evaluated[child.name], sizes, mine, recognition, replayer, chunk)
        out[child.name] = (len(evaluated[child.name]), len({r.image_id for r in mine if r.box is not None}), scored)
    return out
