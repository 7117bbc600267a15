"""Each family's box convention: generated text -> boxes in model-input pixels ``(x0, y0, x1, y1, confidence)``.

A text without any box syntax states no box (an empty list); a text whose box syntax cannot be read raises
``ParseError`` (the pair is counted in ``parse_failure_rate`` and scored as no box). Corners are returned as stated
(``metrics.boxes.clip_boxes`` orders and clips them in the original image); no family states a confidence (1).

- ``maira2_phrases``/``maira2_boxes``: MAIRA-2's grounded sequence, read as its processor's
  ``convert_output_to_plaintext_or_grounded_sequence`` reads it (``processing_maira2.py``, microsoft/maira-2):
  ``<obj>phrase<box><xA><yB><xC><yD></box>...</obj>`` spans and nothing between them; a box's first run of
  ``<x><y><x><y>`` tokens, each bin < 100 and read at its centre ``(i + 0.5) / 100`` of the processed (cropped) image.
- ``qwen_boxes``: Qwen2.5-VL's JSON (Lingshu): a list of objects with ``"bbox_2d": [x1, y1, x2, y2]`` in absolute
  pixels of the resized input, optionally fenced in a markdown ``json`` block (Qwen's cookbook strips the fence).
- ``gemma_boxes``: Gemma 3's detection convention (MedGemma): ``"box_2d": [y0, x0, y1, x1]`` normalised to 0-1000 of
  the model input, in a JSON list (fenced or not).
- ``radvlm_boxes``: RadVLM's answers: every ``[x1, y1, x2, y2]`` of non-negative decimals in the text, in order,
  normalised to the image (their ``compute_metrics_tasks.extract_bounding_boxes`` regex); a bracketed list of numbers
  that does not fit it is a parse failure here, where their evaluation silently skips it (or crashes on ``0.1.2``).
"""

from __future__ import annotations

import json
import re

MAIRA2_BINS = 100
_MAIRA2_COORDINATES = re.compile(r"<x(\d+?)><y(\d+?)><x(\d+?)><y(\d+?)>")
_RADVLM_BOX = re.compile(r"\[([\d\.]+),\s*([\d\.]+),\s*([\d\.]+),\s*([\d\.]+)\]")
_BRACKETED_NUMBERS = re.compile(r"\[\s*-?[\d\.eE+\-]+(?:\s*,\s*-?[\d\.eE+\-]+)*\s*\]")
_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)


class ParseError(ValueError):
    """A generated text whose box syntax cannot be read."""


def maira2_phrases(text: str) -> str | list[tuple[str, list[tuple[float, float, float, float]] | None]]:
    """MAIRA-2's reading of a generated text: the plain text (stripped) where it has no ``<obj>``/``<box>`` syntax, else
    ``[(phrase, boxes or None)]`` with boxes as bin centres in [0, 1] of the processed image."""
    if not any(tag in text for tag in ("<obj>", "</obj>", "<box>", "</box>")):
        return text.strip()
    text = text.strip()
    out = []
    while text:
        if not text.startswith("<obj>") or "</obj>" not in text:
            raise ParseError(f"text outside <obj>...</obj>: {text[:40]!r}")
        body, text = text[len("<obj>"):].split("</obj>", 1)
        if "<obj>" in body:
            raise ParseError("nested <obj>")
        if "<box>" not in body:
            if "</box>" in body:
                raise ParseError("</box> without <box>")
            out.append((body.lstrip(), None))
            continue
        phrase, rest = body.split("<box>", 1)
        boxes, rest = [], "<box>" + rest
        while rest:
            if not rest.startswith("<box>") or "</box>" not in rest:
                raise ParseError(f"text after a box or an unclosed <box>: {rest[:40]!r}")
            inside, rest = rest[len("<box>"):].split("</box>", 1)
            found = _MAIRA2_COORDINATES.search(inside)
            if found is None:
                raise ParseError(f"box {inside!r} has no <x><y><x><y> coordinates")
            box = tuple((int(v) + 0.5) / MAIRA2_BINS for v in found.groups())
            if not all(0 <= v <= 1 for v in box):
                raise ParseError(f"box bins {found.groups()} beyond the {MAIRA2_BINS} bins")
            boxes.append(box)
        out.append((phrase.strip(), boxes))
    return out


def maira2_boxes(text: str, size: int) -> list[tuple[float, ...]]:
    """Every box of every phrase in ``text`` (``maira2_phrases``) in pixels of the ``size``-square processed image."""
    parsed = maira2_phrases(text)
    if isinstance(parsed, str):
        return []
    return [tuple(v * size for v in box) + (1.0,) for _, boxes in parsed for box in boxes or ()]


def _json_list(text: str):
    """The JSON of ``text`` (inside its first markdown fence where it has one); None where the text has no JSON
    syntax at all; ``ParseError`` where it has some that does not parse."""
    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced else text.strip()
    if not body or body[0] not in "[{":
        if "bbox_2d" in text or "box_2d" in text:
            raise ParseError(f"box keys outside a JSON list: {text[:60]!r}")
        return None
    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        raise ParseError(f"not JSON ({error.msg})") from None
    return value if isinstance(value, list) else [value]


def _numbers(item, key: str) -> list[float]:
    if not isinstance(item, dict) or key not in item:
        raise ParseError(f"an entry without {key!r}: {str(item)[:60]}")
    values = item[key]
    if not isinstance(values, list) or len(values) != 4 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                                     for v in values):
        raise ParseError(f"{key} {values!r} is not four numbers")
    return [float(v) for v in values]


def qwen_boxes(text: str) -> list[tuple[float, ...]]:
    """Qwen2.5-VL's ``bbox_2d`` boxes (absolute pixels of the model input)."""
    items = _json_list(text)
    return [tuple(_numbers(item, "bbox_2d")) + (1.0,) for item in items or ()]


def gemma_boxes(text: str, size: int) -> list[tuple[float, ...]]:
    """Gemma 3's ``box_2d`` boxes ``[y0, x0, y1, x1]`` on 0-1000, in pixels of the ``size``-square model input."""
    out = []
    for item in _json_list(text) or ():
        y0, x0, y1, x1 = _numbers(item, "box_2d")
        out.append((x0 / 1000 * size, y0 / 1000 * size, x1 / 1000 * size, y1 / 1000 * size, 1.0))
    return out


def radvlm_normalised(text: str) -> list[tuple[float, float, float, float]]:
    """RadVLM's boxes as their evaluation reads them (normalised ``[x1, y1, x2, y2]``, in order); ``ParseError`` for a
    bracketed list of numbers their regex skips or cannot convert."""
    boxes = []
    for found in _RADVLM_BOX.finditer(text):
        try:
            boxes.append(tuple(float(v) for v in found.groups()))
        except ValueError:
            raise ParseError(f"box {found.group(0)!r} is not four numbers") from None
    if len(_BRACKETED_NUMBERS.findall(text)) != len(boxes):
        raise ParseError(f"a bracketed list that is not [x1, y1, x2, y2] of non-negative decimals: {text[:60]!r}")
    return boxes


def radvlm_boxes(text: str, size: int) -> list[tuple[float, ...]]:
    """``radvlm_normalised`` in pixels of the ``size``-square model input (the image squashed: normalised to the
    original image is normalised to the input)."""
    return [tuple(v * size for v in box) + (1.0,) for box in radvlm_normalised(text)]
