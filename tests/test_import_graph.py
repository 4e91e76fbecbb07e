"""The import graph, read from the source with ast: the shared package imports no daemon,
neither daemon imports the other, and llmgwd's modules load without a circle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = {
    "llmgw": REPO / "src",
    "llmgwd": REPO / "llmgwd" / "src",
    "llmgw_agentd": REPO / "llmgw-agentd" / "src",
}


def modules(package: str) -> dict[str, Path]:
    """Every module of package, by dotted name (a package by its own name)."""
    root = ROOTS[package]
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _absolute(node: ast.ImportFrom, name: str, package: bool) -> str:
    """The module `from ... import` names, relative ones made absolute."""
    if not node.level:
        return node.module or ""
    base = name.split(".")
    base = base[: len(base) - node.level + (1 if package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported(node: ast.Import | ast.ImportFrom, name: str, package: bool) -> Iterator[str]:
    """The dotted names one import statement in module name may load: for `from A import B`,
    both A and A.B (B may be a module)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    source = _absolute(node, name, package)
    yield source
    yield from (f"{source}.{alias.name}" for alias in node.names)


def _type_checking(node: ast.stmt) -> bool:
    """`if TYPE_CHECKING:` (or typing.TYPE_CHECKING): never run."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def load_time(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module loads: its top level and class bodies, within
    if/try/with blocks, but neither function bodies nor `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _type_checking(node):
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from load_time([s for s in inner if isinstance(s, ast.stmt)])
                    for h in inner:
                        if isinstance(h, (ast.ExceptHandler, ast.match_case)):
                            yield from load_time(h.body)


def all_imports(path: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import in the file, wherever it is (in a function too)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _top(dotted: str) -> str:
    return dotted.split(".")[0]


def foreign(package: str, forbidden: set[str]) -> list[str]:
    """'module:line imports name' for each import in package of a forbidden package."""
    found = []
    for name, path in modules(package).items():
        for node in all_imports(path):
            for target in imported(node, name, _is_package(path)):
                if _top(target) in forbidden:
                    found.append(f"{name}:{node.lineno} imports {target}")
                    break
    return found


def load_graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it needs loaded to load: for `from A import B`, A.B
    when that is a module, else A (a package being loaded is in sys.modules while its
    __init__ runs, so a submodule reaching a sibling through it is no circle)."""
    known = modules(package)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in load_time(tree.body):
            targets = list(imported(node, name, _is_package(path)))
            modules_named = [t for t in targets[1:] if t in known]
            if isinstance(node, ast.Import):
                modules_named = [t for t in targets if t in known]
            elif len(modules_named) < len(targets) - 1 and targets[0] in known:
                modules_named.append(targets[0])  # a name defined in A itself
            graph[name].update(t for t in modules_named if t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle for each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_shared_package_imports_no_daemon() -> None:
    assert modules("llmgw")  # the tree was read
    assert foreign("llmgw", {"llmgwd", "llmgw_agentd"}) == []


@pytest.mark.parametrize(
    ("package", "other"), [("llmgwd", "llmgw_agentd"), ("llmgw_agentd", "llmgwd")]
)
def test_neither_daemon_imports_the_other(package: str, other: str) -> None:
    assert len(modules(package)) > 10
    assert foreign(package, {other}) == []


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_no_circle_when_modules_load(package: str) -> None:
    graph = load_graph(package)
    assert sum(len(targets) for targets in graph.values()) > len(graph)  # edges were found
    assert cycles(graph) == []


def test_the_checks_see_a_function_level_import_and_a_circle() -> None:
    """The readers themselves: an import in a function counts as an import, not as loading;
    a circle is found, and one through `if TYPE_CHECKING:` is not one."""
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\ndef f():\n    import c\n")
    assert [n.names[0].name for n in load_time(tree.body)] == ["a"]
    assert cycles({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [["x", "y"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_the_control_planes_root_keeps_only_its_wiring() -> None:
    """llmgwd's modules live in rooms by domain (planes, nodes, placement, router, ...): its
    root keeps the daemon's wiring, at most 8 modules, and every room says what it is for."""
    root = ROOTS["llmgwd"] / "llmgwd"
    top = sorted(p.name for p in root.glob("*.py"))
    assert "daemon.py" in top
    assert len(top) <= 8, top
    rooms = [p for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert len(rooms) >= 10
    for room in rooms:
        assert ast.get_docstring(ast.parse((room / "__init__.py").read_text())), room.name
