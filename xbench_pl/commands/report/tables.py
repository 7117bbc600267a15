"""Tables as the report writes them: a cell's text, the metric names of headers, and a table as markdown and HTML
(split so that the page fits its width)."""

from __future__ import annotations

import html
import re

SHORT = {"pointing_game": "PG", "dice@0.5": "Dice", "iou@0.5": "IoU", "auroc": "AUROC", "dice_best": "Dice best",
         "cxl_hit_rate": "CXL hit rate", "cxl_miou": "CXL mIoU"}
LONG = {**SHORT, "pointing_game": "Pointing Game", "dice@0.5": "Dice at τ = 0.5", "dice_best": "Dice at tau_best"}
#: data columns per HTML/markdown table (after the row names): at the page's 1,200 px, each column keeps ~100 px
COLUMNS_PER_TABLE = 9


def cell(value) -> str:
    """A number as a table shows it: "–" where undefined, counts as they are, fractions to 3 decimals."""
    return "–" if value is None else (str(value) if isinstance(value, int) else f"{value:.3f}")


def mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def spread(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) - min(values) if len(values) > 1 else None


def split_columns(header: list[str], rows: list[list[str]], per_table: int, group: int = 1) -> list[tuple[list[str], list[list[str]]]]:
    """A table as several with at most ``per_table`` columns after the first (which each repeats), cut only between
    groups of ``group`` columns (Table 1's three keys of a dataset stay together): the page fits without
    horizontal scrolling however many runs or datasets it has."""
    size = max(group, per_table // group * group)
    return [([header[0], *header[1 + start:1 + start + size]], [[row[0], *row[1 + start:1 + start + size]] for row in rows])
            for start in range(0, len(header) - 1, size)]


def md_table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|---" * len(header) + "|", *("| " + " | ".join(r) + " |" for r in rows)])


#: where a header may break besides spaces: after ``_``, ``/``, ``=`` and a ``.`` before a letter (``model.sigma=0.05``):
#: a run's or a dataset's name is long without spaces; the page's CSS breaks no word
BREAKS = re.compile(r"(?<=[_/=])|(?<=\.)(?=[A-Za-z])")


def _header_html(text: str) -> str:
    return "<wbr>".join(html.escape(part) for part in BREAKS.split(text))


def html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_header_html(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
