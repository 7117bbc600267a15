"""Where a run writes: every output folder is checked before any work, and results are never lost.

``check_writable`` probes each folder a command will write (``--out``, ``--predictions``, the W&B
directory, callback folders) by creating and removing a file in it, before any model or data is
loaded: a folder that cannot be written ends the command within seconds, not after the benchmark.
``write_results`` writes a command's result files; if that fails anyway (disk full), the main
record goes to a fallback file, which the error names.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path


class OutputError(ValueError):
    """An output folder that cannot be written; the message is one line naming the option and folder."""


def _write_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be written, or None. Missing folders are created for the probe and removed
    again, so a check leaves nothing behind."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return "it is a file, not a folder" if existing == folder else f"cannot create it: {existing} is a file, not a folder"
    missing = [folder, *folder.parents][: len(folder.parts) - len(existing.parts)]
    created = []
    try:
        for part in reversed(missing):
            part.mkdir()
            created.append(part)
        probe = folder / f".xbench-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        named = Path(error.filename) if error.filename else folder
        where = "" if folder in (named, named.parent) else f" ({named})"  # a parent that could not be created
        return f"cannot write there: {(error.strerror or str(error)).lower()}{where}"
    finally:
        for part in reversed(created):
            part.rmdir()
    return None


def check_writable(folders: Mapping[str, str | Path]) -> None:
    """Raise ``OutputError`` for the first folder (``{option: folder}``) that cannot be written."""
    for option, folder in folders.items():
        problem = _write_problem(Path(folder).absolute())
        if problem:
            raise OutputError(f"{option} {folder}: {problem}; choose another folder")


def fallback_path(name: str) -> Path:
    """Where ``write_results`` saves a record it could not write: the temporary folder, else the home folder."""
    stem, suffix = os.path.splitext(name)
    file = f"xbench-{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}{suffix}"
    for folder in (Path(tempfile.gettempdir()), Path.home()):
        if _write_problem(folder) is None:
            return folder / file
    raise OutputError(f"no folder to save {name} in (neither {tempfile.gettempdir()} nor {Path.home()} can be written)")


def write_results(out: str | Path, files: Mapping[str, str]) -> Path:
    """Write ``files`` (``{name: text}``, the main record first) into ``out``. When that fails (disk full,
    a folder gone read-only), the main record is written to ``fallback_path`` instead and ``OutputError``
    names it; should even that fail, the record is printed (the results are never lost)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
    except OSError as error:
        name, record = next(iter(files.items()))
        reason = f"cannot write {error.filename or out}: {(error.strerror or str(error)).lower()}"
        try:
            fallback = fallback_path(name)
            fallback.write_text(record)
        except (OSError, OutputError) as fallback_error:
            print(record)
            raise OutputError(f"{reason}; nor a fallback file ({fallback_error}): {name} is printed above") from error
        raise OutputError(f"{reason}; the results are saved in {fallback}") from error
    return out


def replicate_keys(fixed_threshold: float = 0.5) -> tuple[str, ...]:
    """The keys whose per-class replicates a table keeps in ``ci["replicates"]`` (``resampling.kept_replicates``): those
    the report shows as a share of a reader run's (Pointing Game, Dice/IoU at the fixed threshold, Dice best, the cxl
    keys). Here, without torch, for the report too."""
    t = f"{fixed_threshold:g}"
    return ("pointing_game", f"dice@{t}", f"iou@{t}", "dice_best", "cxl_hit_rate", "cxl_miou")


#: beside metrics.json: each table's bootstrap replicates (``ci.replicates``), by table path (``split_replicates``)
REPLICATES_FILE = "replicates.json"


def split_replicates(report: dict) -> tuple[dict, dict]:
    """``report`` without its tables' ``ci.replicates`` (thousands of numbers a table, for ratios between runs: the
    report's % of reader), and those replicates by the path of their table (``"datasets/NAME"``, ``.../by_group/G/V``)."""
    kept: dict[str, dict] = {}

    def without(node, path: str):
        if not isinstance(node, dict):
            return node
        ci = node.get("ci")
        if isinstance(ci, dict) and "replicates" in ci:
            kept[path] = ci["replicates"]
            node = {**node, "ci": {k: v for k, v in ci.items() if k != "replicates"}}
        return {k: without(v, f"{path}/{k}" if path else k) for k, v in node.items()}

    return without(report, ""), kept


def read_metrics(folder: str | Path) -> dict:
    """A run's ``metrics.json`` with its tables' replicates put back from ``REPLICATES_FILE`` where it was written."""
    folder = Path(folder)
    report = json.loads((folder / "metrics.json").read_text())
    sidecar = folder / REPLICATES_FILE
    if sidecar.is_file():
        for path, replicates in json.loads(sidecar.read_text()).items():
            node = report
            for key in path.split("/"):
                node = node.get(key, {}) if isinstance(node, dict) else {}
            if isinstance(node.get("ci"), dict):
                node["ci"]["replicates"] = replicates
    return report
