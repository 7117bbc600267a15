"""The page: a ``Section`` is a heading and its blocks (text, tables, figures), written once as ``report.md`` and
once as a self-contained ``report.html`` (every image inlined as a data URI, so it opens from a file, offline)."""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass, field
from pathlib import Path

from xbench_pl.commands.report.tables import COLUMNS_PER_TABLE, html_table, md_table, split_columns


@dataclass
class Section:
    """One section of the report: its ``title`` (a level-2 heading; level 1 for the page's own), its ``blocks`` in
    order, and ``data``: what ``report.json`` holds of it, by key."""
    title: str
    level: int = 2
    blocks: list[tuple] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def heading(self, text: str, level: int = 3) -> None:
        self.blocks.append(("heading", level, text))

    def text(self, text: str, warn: bool = False) -> None:
        self.blocks.append(("warn" if warn else "text", text))

    def table(self, header: list[str], rows: list[list[str]], group: int = 1) -> None:
        """A table, split at ``COLUMNS_PER_TABLE`` data columns (cut only between groups of ``group``)."""
        for h, r in split_columns(header, rows, COLUMNS_PER_TABLE, group):
            self.blocks.append(("table", h, r))

    def tables(self, parts: list[tuple[str, tuple[list, list]]]) -> None:
        """Each ``(subtitle, (header, rows))`` as a level-4 heading and its table."""
        for subtitle, (header, rows) in parts:
            self.heading(subtitle, 4)
            self.table(header, rows)

    def figure(self, path: Path, caption: str) -> None:
        """A figure with its caption; figures in a row stand side by side where the page is wide enough."""
        self.blocks.append(("figure", path, caption))

    def images(self, images: list[tuple[Path, str]], gallery: bool = False) -> None:
        """Saved images with their captions, side by side (``gallery``: as small thumbnails)."""
        self.blocks.append(("images", images, gallery))


def _link(path: Path, caption: str, out: Path) -> str:
    return f"![{caption}]({Path(os.path.relpath(path, out)).as_posix()})"


def markdown(sections: list[Section], out: Path) -> str:
    """``report.md``: images linked relative to ``out``, where it is written."""
    lines = []
    for section in sections:
        lines += ["", f"{'#' * section.level} {section.title}"]
        for kind, *rest in section.blocks:
            if kind == "heading":
                lines += ["", f"{'#' * rest[0]} {rest[1]}"]
            elif kind == "text":
                lines += ["", rest[0]]
            elif kind == "warn":
                lines += ["", f"> **{rest[0]}**"]
            elif kind == "table":
                lines += ["", md_table(*rest)]
            elif kind == "figure":
                lines += ["", _link(*rest, out), "", f"*{rest[1]}*"]
            else:
                lines += ["", *(_link(path, caption, out) for path, caption in rest[0])]
    return "\n".join(lines[1:]) + "\n"


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; } h3 { margin-top: 1.4rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.6rem 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; } th { background: #f1f3f5; }
td:first-child, th:first-child { text-align: left; }
th { max-width: 12rem; overflow-wrap: normal; word-break: normal; hyphens: manual; vertical-align: bottom; }
figure { display: inline-block; margin: 0.4rem; vertical-align: top; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.75rem; color: #555; max-width: 420px; }
.warn { background: #fff3cd; border: 1px solid #e0c060; padding: 0.5rem 0.8rem; }
.gallery figure img { width: 260px; }
"""

CHECK_IMAGES = """
window.addEventListener("load", function () {
  var images = Array.from(document.images);
  var ok = images.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images", ok + "/" + images.length);
  document.body.setAttribute("data-width", document.documentElement.scrollWidth);  // wider than the window: the page scrolls sideways
});
"""


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _figure(path: Path, caption: str) -> str:
    return (f'<figure><img src="{_data_uri(path)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _text(text: str) -> str:
    return html.escape(text.replace("`", ""))


def page(sections: list[Section]) -> str:
    """``report.html``."""
    parts = []
    for section in sections:
        parts.append(f"<h{section.level}>{_text(section.title)}</h{section.level}>")
        for kind, *rest in section.blocks:
            if kind == "heading":
                parts.append(f"<h{rest[0]}>{_text(rest[1])}</h{rest[0]}>")
            elif kind in ("text", "warn"):
                parts.append(f'<p class="warn">{_text(rest[0])}</p>' if kind == "warn" else f"<p>{_text(rest[0])}</p>")
            elif kind == "table":
                parts.append(html_table(*rest))
            elif kind == "figure":
                parts.append(_figure(*rest))
            else:
                images, gallery = rest
                figures = "".join(_figure(path, caption) for path, caption in images)
                parts.append(f'<div class="gallery">{figures}</div>' if gallery else f"<div>{figures}</div>")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>XBench report</title>'
            f"<style>{STYLE}</style><script>{CHECK_IMAGES}</script></head><body>{''.join(parts)}</body></html>\n")
