"""Where a run writes: every output folder is checked before any work, every file is written whole, and
results are never lost.

``check_writable`` probes each folder a command will write (``--out``, ``--predictions``, the W&B
directory, callback folders) by creating and removing a file in it, before any model or data is
loaded: a folder that cannot be written ends the command within seconds, not after the benchmark.
``atomic_write`` is how the project writes a file: to a temporary name in the same folder, then
renamed, so a reader never sees half a file. ``OutputFolder`` holds one command's files; if a write
fails anyway (disk full), all of them go to one fallback folder together, which the error names.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class OutputError(ValueError):
    """An output folder that cannot be written; the message is one line naming the option and folder."""


def _write_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be written, or None. A probe file is written and removed in it or, while it is
    missing, in the nearest folder above it that exists (where the run will create it). Nothing else is created:
    a check leaves nothing behind, and ranks started at once (torchrun, SLURM) checking one new folder cannot
    trip on each other's probes."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return "it is a file, not a folder" if existing == folder else f"cannot create it: {existing} is a file, not a folder"
    probe = existing / f".xbench-write-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        where = "" if existing == folder else f" ({existing})"  # a folder above it, where it would be created
        return f"cannot write there: {(error.strerror or str(error)).lower()}{where}"
    return None


def check_writable(folders: Mapping[str, str | Path]) -> None:
    """Raise ``OutputError`` for the first folder (``{option: folder}``) that cannot be written."""
    for option, folder in folders.items():
        problem = _write_problem(Path(folder).absolute())
        if problem:
            raise OutputError(f"{option} {folder}: {problem}; choose another folder")


#: the file that makes a folder an earlier run of a command, written when the run ends: ``test --out`` and ``fit
#: --out`` refuse such a folder without ``--overwrite``
RUN_RECORDS = {"test": "metrics.json", "fit": "fit.json"}


def earlier_run(out: str | Path, command: str = "test") -> bool:
    """Whether ``out`` holds an earlier ``command`` run (its ``RUN_RECORDS`` file). A folder without one (a sweep's run
    folder after a failed run: params.json, log.txt; an interrupted fit's checkpoints, which ``--ckpt_path`` resumes)
    does not: a run into it replaces nothing finished."""
    return (Path(out) / RUN_RECORDS[command]).is_file()


def check_not_earlier_run(out: str | Path, overwrite: bool, command: str = "test") -> bool:
    """``OutputError`` (one line: the folder and the fix) where ``out`` holds an earlier ``command`` run and
    ``overwrite`` is off; else whether this run replaces one."""
    if not earlier_run(out, command):
        return False
    if not overwrite:
        raise OutputError(f"--out {out}: holds an earlier run (its {RUN_RECORDS[command]}); choose another --out, or "
                          "add --overwrite to replace its files")
    return True


def atomic_write(path: str | Path, data: bytes | str, sync: bool = False) -> Path:
    """Write ``path`` whole or not at all: ``data`` (text as UTF-8) goes to a temporary name in the same folder,
    renamed over ``path`` (``os.replace``) once complete; on failure the temporary file is removed and ``path`` is
    as it was. ``sync``: fsync the file and its folder (a prediction store, which must survive a crash)."""
    path = Path(path)
    view = memoryview(data.encode() if isinstance(data, str) else data)
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        try:
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):  # name the file, not its temporary name
            raise OSError(error.errno, error.strerror or str(error), str(path)) from error
        raise
    if sync:
        fsync_dir(path.parent)
    return path


def file_bytes(write: Callable[[io.BytesIO], object]) -> bytes:
    """What ``write(file)`` writes into a file object (``np.save``, ``torch.save``, ``fig.savefig``), for
    ``atomic_write``."""
    buffer = io.BytesIO()
    write(buffer)
    return buffer.getvalue()


def figure_png(fig, **kwargs) -> bytes:
    """A matplotlib figure as PNG bytes (``savefig`` options in ``kwargs``), for ``atomic_write``."""
    return file_bytes(lambda f: fig.savefig(f, format="png", **kwargs))


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not possible on every platform; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fallback_folder(out: Path) -> Path:
    """Where an ``OutputFolder`` that cannot be written saves its files: a new folder in the temporary folder,
    else in the home folder."""
    prefix = f"xbench-{out.name or 'out'}-{time.strftime('%Y%m%d-%H%M%S')}-"
    for parent in (Path(tempfile.gettempdir()), Path.home()):
        if _write_problem(parent) is None:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    raise OutputError(f"neither {tempfile.gettempdir()} nor {Path.home()} can be written")


def write_failure(error: OSError, path: Path) -> str:
    return f"cannot write {error.filename or path}: {(error.strerror or str(error)).lower()}"


class OutputFolder:
    """One command's output folder (``--out``): each file written whole (``atomic_write``), by its name relative
    to the folder. Once a write fails (disk full, a folder gone read-only), the command's files go to one
    ``fallback_folder`` together: those written so far are copied there, and this and every later file are
    written there. ``close`` then raises ``OutputError`` naming it (or returns the folder when all went well)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.folder = self.root  # where files go now: root, or the fallback after a failure
        self.names: dict[str, None] = {}  # written so far, in order
        self.failure: str | None = None

    def write(self, name: str | Path, data: bytes | str) -> Path:
        """Write ``data`` as ``name`` (``"calibration/demo/metrics.csv"``); the path it went to."""
        path = self.folder / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        except OSError as error:
            reason = write_failure(error, path)
            if self.failure is not None:
                raise OutputError(f"{self.failure}; nor in the fallback folder {self.folder} ({reason})") from error
            self.failure = reason
            self.to_fallback(error)
            return self.write(name, data)
        self.names[str(name)] = None
        return path

    def to_fallback(self, error: OSError) -> None:
        try:
            self.folder = fallback_folder(self.root)
            for name in self.names:
                (self.folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.root / name, self.folder / name)
        except (OSError, OutputError) as fallback_error:
            raise OutputError(f"{self.failure}; nor in a fallback folder ({fallback_error})") from error

    def close(self) -> Path:
        """The folder that holds every file; ``OutputError`` (one line: what failed and where the files are) when
        that is the fallback."""
        if self.failure is not None:
            raise OutputError(f"{self.failure}; every output of this run is saved in {self.folder}")
        return self.folder


def write_results(out: str | Path | OutputFolder, files: Mapping[str, str]) -> Path:
    """Write ``files`` (``{name: text}``, the main record first) into ``out`` (a folder, or the command's
    ``OutputFolder`` with its files so far) and ``close`` it. Should even the fallback folder fail, the main
    record is printed (the results are never lost)."""
    folder = out if isinstance(out, OutputFolder) else OutputFolder(out)
    try:
        for name, text in files.items():
            folder.write(name, text)
    except OutputError as error:
        name, record = next(iter(files.items()))
        print(record)
        raise OutputError(f"{error}: {name} is printed above") from error
    return folder.close()


def write_whole(out: str | Path, write: Callable[[Path], T]) -> T:
    """``write(folder)``, which writes a command's every file into ``folder`` (each with ``atomic_write``), into
    ``out``; if that fails (disk full), all over again into one ``fallback_folder``, and ``OutputError`` names it.
    For commands that can write their files again (``report``, ``export``); a run's files: ``OutputFolder``."""
    out = Path(out)
    try:
        return write(out)
    except OSError as error:
        reason = write_failure(error, out)
        try:
            folder = fallback_folder(out)
            write(folder)
        except (OSError, OutputError) as fallback_error:
            raise OutputError(f"{reason}; nor in a fallback folder ({fallback_error})") from error
        raise OutputError(f"{reason}; every output of this run is saved in {folder}") from error


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


def read_json(path: Path, what: str) -> dict:
    """A run's JSON file (``what`` names it), or a ``ValueError`` naming the file, the line and what to do."""
    try:
        data = json.loads(path.read_text())
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a {what} (not text: {error.reason})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a complete {what} ({error.msg}: line {error.lineno}, column {error.colno}): its run "
                         "did not finish writing it, or it was edited; run it again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a {what} (a JSON {type(data).__name__}, not an object)")
    return data


def read_metrics(folder: str | Path) -> dict:
    """A run's ``metrics.json`` with its tables' replicates put back from ``REPLICATES_FILE`` where it was written."""
    folder = Path(folder)
    report = read_json(folder / "metrics.json", "metrics.json")
    sidecar = folder / REPLICATES_FILE
    if sidecar.is_file():
        for path, replicates in read_json(sidecar, REPLICATES_FILE).items():
            node = report
            for key in path.split("/"):
                node = node.get(key, {}) if isinstance(node, dict) else {}
            if isinstance(node.get("ci"), dict):
                node["ci"]["replicates"] = replicates
    return report
