"""The package's import graph, read from the source: no import cycle (function-level imports
included), and the library never imports a command module (``xbench_pl.commands``)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "xbench_pl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in its body (``from P import m`` counts as
    importing the module ``P.m`` when there is one, else ``P``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_reader_sees_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_package_has_no_import_cycle():
    graph = import_graph()
    assert "xbench_pl.data.splits" in graph["xbench_pl.data.base"]  # the reader follows real imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_library_never_imports_a_command():
    graph = import_graph()
    offenders = {module: sorted(m for m in imported if m.startswith("xbench_pl.commands"))
                 for module, imported in graph.items() if not module.startswith("xbench_pl.commands")}
    assert {m: i for m, i in offenders.items() if i and m != "xbench_pl.__main__"} == {}


def test_every_command_is_a_module_of_commands():
    from xbench_pl.commands import COMMANDS

    for module in set(COMMANDS.values()):
        folder = PACKAGE / "commands"
        assert (folder / f"{module}.py").is_file() or (folder / module / "__init__.py").is_file(), module
    top_level = {p.stem for p in PACKAGE.glob("*.py")}
    assert not top_level & {"cli", "score", "score_maps", "compare", "report_html", "sweep", "describe", "arguments"}
