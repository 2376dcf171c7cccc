"""The packages' layers only look down (design.md, "Layers"): every import of a shardsmith module, at
module level, inside a function or under ``TYPE_CHECKING``, goes to the same layer or a lower one,
and the modules' import graph has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import shardsmith

ROOT = Path(shardsmith.__file__).parent

# Bottom first. A package (or top-level module) may import its own layer and those below it.
LAYERS: list[set[str]] = [
    {"errors", "core"},
    {"storage"},
    {"kit", "registry"},
    {"sources", "transforms", "formats", "plugin"},
    {"engine", "loader"},
    {"torch", "shardsmith"},
    {"report"},
    {"commands", "demo"},
    {"cli_options", "cli", "program", "__main__"},
    {"testing"},
]
# Within one layer these never import each other: the training-time loader runs without the engine,
# and plugins of one kind do not reach into plugins of another.
APART = [{"engine", "loader"}, {"sources", "transforms", "formats"}]
# What still crosses, each with its reason; the list only shrinks.
KNOWN: set[tuple[str, str]] = set()
# Cycles still there (none now: the list only shrinks).
KNOWN_CYCLES: list[list[str]] = []


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ["shardsmith", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The shardsmith modules ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names]
            hits = [t for t in targets if t in MODULES]
            out.update(hits if hits else [base] if base in MODULES else [])
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
    out.discard(name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _package(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "shardsmith"


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer():
    assert {_package(m) for m in MODULES} <= set().union(*LAYERS)


def test_imports_only_look_down():
    crossing = set()
    for name, targets in GRAPH.items():
        for target in targets:
            a, b = _package(name), _package(target)
            if a == b:
                continue
            if _layer(b) > _layer(a) or any({a, b} <= apart for apart in APART):
                crossing.add((name, target))
    assert crossing - KNOWN == set(), "imports that climb a layer:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in sorted(crossing - KNOWN))
    assert KNOWN - crossing == set(), "KNOWN lists crossings that are gone: remove them"


def test_no_import_cycle():
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(GRAPH):
        if start not in state:
            visit(start, [start])
    cycles = [c for c in cycles if c not in KNOWN_CYCLES]
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles)
