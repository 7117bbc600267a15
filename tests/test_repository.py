"""The repository itself: no merge-conflict markers anywhere in it (pre-commit's check-merge-conflict, as a test)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a conflict's opening or closing line, as git writes it (pre-commit's check-merge-conflict reads the same)
MARKER = re.compile(rb"^(<{7}|>{7})( |$)", re.MULTILINE)
SKIPPED = {".git", ".venv", "__pycache__", ".pytest_cache", "results", "node_modules"}


def repository_files(root: Path = ROOT) -> list[Path]:
    """The files git tracks or would track (ignored ones left out); every file below ``root`` outside a checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True)
    if listed.returncode == 0:
        return [root / name for name in listed.stdout.decode().split("\0") if name]
    return [p for p in root.rglob("*") if p.is_file() and not SKIPPED & set(p.relative_to(root).parts)]


def conflict_markers(files: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line`` of every conflict marker in ``files`` (binary files too: a marker is plain bytes)."""
    found = []
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:  # deleted in the work tree, still in the index
            continue
        for match in MARKER.finditer(data):
            line = data.count(b"\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(root)}:{line}")
    return found


def test_no_file_holds_a_merge_conflict_marker():
    assert conflict_markers(repository_files()) == []


def test_a_left_over_conflict_is_named_at_its_lines(tmp_path):
    """The check itself, outside a git checkout: a file with a conflict left in is named at its two marker lines; a
    line that only starts like one (a heading rule, a longer run) is not a marker."""
    (tmp_path / "notes.md").write_text("a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> other\n")
    (tmp_path / "clean.md").write_text("title\n=======\n<<<<<<<< eight\n")
    assert sorted(conflict_markers(repository_files(tmp_path), tmp_path)) == ["notes.md:2", "notes.md:6"]
