"""CPU tier: specgen's modules import one another without a circle, so that each step
(shape -> plan -> render -> compile -> verify -> bench/tune) can be read and changed
from the bottom up.  Imports inside functions count; imports under TYPE_CHECKING (types
only, never run) do not."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specgen"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_nodes(tree) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for s in node.body for n in ast.walk(s)}
    return skip


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
                # `from . import sub` reaches the submodule, not the package's own code
                named = subs if len(subs) == len(node.names) else subs + [target]
                graph[name] |= {t for t in named if t in modules and t != name}
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules and a.name != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, found


def test_the_circle_finder_finds_a_circle():
    """Negative control: a graph with a circle of three is reported, a chain is not."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_imports_inside_functions():
    """Negative control on specgen itself: the planner reaches the strategy table only
    through the registry, and a function-level import is an edge like any other."""
    graph = import_graph()
    assert "specgen.plan.common" in graph["specgen.plan"]
    assert "specgen.tunedb" in graph["specgen.strategies"]  # imported inside default_set
