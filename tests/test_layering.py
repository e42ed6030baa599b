"""The import graph of the package against its layering (deep_delta/layering.py, the one table docs/architecture.md
shows): no module imports a layer above its own or one its layer does not name, and no chain of imports,
function-local ones included, runs in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from deep_delta.layering import LAYERS, layer_of, markdown, may_import

SRC = Path(__file__).resolve().parents[1] / "src"


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    for path in (SRC / "deep_delta").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of the package it imports anywhere in its file (at the top or inside a function);
    ``from a.b import c`` is an import of ``a.b.c`` where that is a module, else of ``a.b``."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    head = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(head + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in mods:
                        graph[name].add(full)
                    elif base in mods:
                        graph[name].add(base)
    return graph


def upward(graph: dict[str, set[str]], allowed=may_import) -> list[str]:
    """``importer -> imported (layer -> layer)`` for every import the layering does not allow."""
    return sorted(f"{a} -> {b} ({layer_of(a)} -> {layer_of(b)})" for a, targets in graph.items() for b in targets
                  if not allowed(a, b))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: every strongly connected group of two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    assert [m for m in modules() if not _has_layer(m)] == []


def _has_layer(module: str) -> bool:
    try:
        layer_of(module)
    except ValueError:
        return False
    return True


def test_no_import_runs_up_the_layers():
    assert upward(import_graph(modules())) == []


def test_no_import_circle():
    assert circles(import_graph(modules())) == []


def test_the_checks_can_fail():
    """An upward import and a circle, made up, are found."""
    graph = {"deep_delta.ops.delta": {"deep_delta.train.trainer"}, "deep_delta.train.trainer": set(),
             "deep_delta.eval.a": {"deep_delta.eval.b"}, "deep_delta.eval.b": {"deep_delta.eval.c"},
             "deep_delta.eval.c": {"deep_delta.eval.a"}}
    assert upward(graph) == ["deep_delta.ops.delta -> deep_delta.train.trainer (math -> training)"]
    assert circles(graph) == [["deep_delta.eval.a", "deep_delta.eval.b", "deep_delta.eval.c"]]


def test_the_layers_are_ordered_and_the_doc_shows_them():
    """A layer names only layers below it; docs/architecture.md holds the table the data renders."""
    seen: set[str] = set()
    for name, _, allowed in LAYERS:
        assert set(allowed) <= seen, (name, set(allowed) - seen)
        seen.add(name)
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    assert markdown() in doc, "docs/architecture.md's table of layers differs from deep_delta/layering.py"
