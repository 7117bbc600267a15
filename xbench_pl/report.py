"""The benchmark's output files: ``metrics.json`` (every number) and ``metrics.md`` (tables).

``metrics.json``: ``{"model": NAME, "datasets": {DATASET: {"classes": {CLASS: ROW}, "mean": ROW,
"problems": [...]}}, "config": {...}}``; ROW keys and their definitions are in
``xbench_pl.metrics.benchmark`` and the README's "Metrics" section. Fractions are in [0, 1];
null where undefined.
"""

from __future__ import annotations

import json
from pathlib import Path


def _cell(value) -> str:
    if value is None:
        return "–"
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def markdown_table(rows: dict[str, dict], first: str) -> str:
    keys = list(next(iter(rows.values())))
    lines = [f"| {first} | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(_cell(row[k]) for k in keys) + " |" for name, row in rows.items()]
    return "\n".join(lines)


def render_markdown(report: dict) -> str:
    datasets = report["datasets"]
    parts = [f"# {report['model']}", "", "## Per dataset (macro mean over findings; counts summed)", "",
             markdown_table({name: d["mean"] for name, d in datasets.items()}, "dataset")]
    for name, d in datasets.items():
        parts += ["", f"## {name}", "", markdown_table(d["classes"], "finding")]
        if d.get("problems"):
            parts += ["", f"{len(d['problems'])} input problem(s) skipped or corrected:", ""]
            parts += [f"- {p['file']}" + (f", row {p['row']}" if p["row"] else "") + f": {p['reason']}" for p in d["problems"]]
    return "\n".join(parts) + "\n"


def build_report(model: str, results: dict[str, dict], problems: dict[str, list], config: dict) -> dict:
    datasets = {name: {**table, "problems": [p.to_dict() for p in problems.get(name, [])]} for name, table in results.items()}
    return {"model": model, "datasets": datasets, "config": config}


def write_report(report: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "metrics.md").write_text(render_markdown(report))
    return out

