"""The repository itself: no merge-conflict markers anywhere in it (pre-commit's check-merge-conflict, as a test); a
README that is a front door (short, set-up commands and the model and dataset tables first); no broken relative link
in the README or docs/."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a conflict's opening or closing line, as git writes it (pre-commit's check-merge-conflict reads the same)
MARKER = re.compile(rb"^(<{7}|>{7})( |$)", re.MULTILINE)
SKIPPED = {".git", ".venv", "__pycache__", ".pytest_cache", "results", "node_modules"}
#: the README is read top down: everything a newcomer needs comes before this line, and the whole stays short
FRONT_DOOR_LINES, README_LINES = 60, 250
#: a markdown link or image, ``[text](target)``: the target up to a space or the closing parenthesis
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
#: fenced blocks and inline code, where brackets are code, not links (and ``#`` lines no headings)
FENCED, INLINE_CODE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE), re.compile(r"`[^`\n]*`")
#: an explicit anchor, ``<a id="the-suite"></a>``
ANCHOR = re.compile(r'<a id="([^"]+)"')


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


def ci_command(root: Path = ROOT) -> str:
    """The command ``.ci/run`` runs: its last line, which is the README's test command verbatim."""
    return (root / ".ci" / "run").read_text().strip().splitlines()[-1]


def test_the_readme_is_a_front_door():
    """Short, and its first screenfuls hold what a newcomer needs: both set-up commands (the test one exactly as CI
    runs it; the demo one with the same install), and the links to the model and dataset references."""
    lines = (ROOT / "README.md").read_text().splitlines()
    front = lines[:FRONT_DOOR_LINES]
    tests = ci_command()
    install = tests[:tests.index("&& .venv/bin/pip install -e")]
    assert len(lines) <= README_LINES
    assert tests in front
    assert any(line.startswith(install) and "-m xbench_pl test " in line and "--data demo" in line for line in front)
    targets = {target.partition("#")[0] for target in LINK.findall("\n".join(front))}
    assert {"docs/models.md", "docs/datasets.md"} <= targets


def without_code(text: str) -> str:
    """``text`` with code blanked out, character for character, so positions and line numbers stay."""
    def blank(code: re.Match) -> str:
        return re.sub(r"[^\n]", " ", code.group())
    return INLINE_CODE.sub(blank, FENCED.sub(blank, text))


def anchors(text: str) -> set[str]:
    """The anchors a markdown page has: its explicit ``<a id>``s and its headings' as GitHub makes them (lower case,
    punctuation but ``-`` and ``_`` dropped, each space a ``-``; a code span keeps its text)."""
    headings = [line.lstrip("#").strip().replace("`", "") for line in FENCED.sub("", text).splitlines()
                if line.startswith("#")]
    return set(ANCHOR.findall(text)) | {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def broken_links(files: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line: target`` of every relative link in ``files`` whose file is missing, or whose ``#anchor`` the
    markdown page it names does not have. Web addresses are not followed."""
    broken = []
    for path in files:
        text = path.read_text()
        for match in LINK.finditer(without_code(text)):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            found = linked.exists() and (not anchor or linked.suffix != ".md" or anchor in anchors(linked.read_text()))
            if not found:
                line = text.count("\n", 0, match.start()) + 1
                broken.append(f"{path.relative_to(root)}:{line}: {target}")
    return broken


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    assert broken_links([ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]) == []


def test_a_broken_link_is_named_at_its_line(tmp_path):
    """The check itself: a missing file, a missing anchor (on another page or the same one) are named; a link to an
    existing file, heading or ``<a id>``, a web address and brackets in code are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "speed.md").write_text(
        "# Speed\n\n## The suite (`pytest -q`)\n\n<a id=\"trust\"></a>**Trust.**\n\n```bash\n# not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "# Title\n[ok](docs/speed.md) [ok](docs/speed.md#the-suite-pytest--q) [ok](docs/speed.md#trust)\n"
        "[ok](#title) [web](https://example.org/x) `[code](nowhere.md)`\n```\n[code](nowhere.md)\n```\n"
        "[gone](docs/gone.md)\n[no anchor](docs/speed.md#not-a-heading) [no anchor](#nothing)\n")
    assert broken_links([tmp_path / "README.md", tmp_path / "docs" / "speed.md"], tmp_path) == [
        "README.md:7: docs/gone.md", "README.md:8: docs/speed.md#not-a-heading", "README.md:8: #nothing"]
