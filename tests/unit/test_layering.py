"""The packages depend on each other in one direction only (docs/ARCHITECTURE.md draws it).

Every import in the three packages is read from the source (module level,
inside functions and under TYPE_CHECKING alike) and checked against the
layer table below. A new import against the direction fails here with the
module and line that made it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# runtime's layers, lowest first: a module may import its own layer and the ones below it.
# api and connectors are one layer: connectors are the sources and sinks users pass to the api; SQL (runtime.sql)
# is planned onto them, and `job.sql(...)` reaches it.
RUNTIME_LAYERS: list[set[str]] = [
    {"runtime.api", "runtime.connectors", "runtime.examples", "runtime.sql"},
    {"runtime.graph"},
    {"runtime.state"},
    {"runtime.execution"},
    {"runtime.checkpointing"},
    {"runtime.worker", "runtime.data"},
    {"runtime.cli"},
]
# runtime.common sits below every layer: small shared helpers (atomic writes, task sets, handler tables).
COMMON = "runtime.common"
COORDINATOR_MAY_IMPORT = {"runtime.api", "runtime.connectors", "runtime.graph", COMMON}


def package_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "runtime" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def rank(package: str) -> int:
    for i, layer in enumerate(RUNTIME_LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"{package} is in no layer of RUNTIME_LAYERS: add it to the table")


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] in ("runtime", "netstack", "coordinator")]


def violation(importer: str, imported: str) -> str | None:
    src, dst = package_of(importer), package_of(imported)
    if src == dst:
        return None
    if src in ("netstack", COMMON):
        return f"{src} imports nothing of ours"
    if dst == COMMON:
        return None
    if dst == "coordinator":
        return None if src == "runtime.cli" else "only runtime.cli may import coordinator"
    if src == "coordinator":
        return None if dst in COORDINATOR_MAY_IMPORT or dst == "netstack" else \
            f"coordinator may import only netstack and {sorted(COORDINATOR_MAY_IMPORT)}"
    if dst == "netstack":
        return None
    src_rank, dst_rank = rank(src), rank(dst)
    if dst_rank < src_rank:
        return None
    if dst_rank == src_rank and src in RUNTIME_LAYERS[0]:
        return None
    return f"{src} (layer {src_rank}) must not import {dst} (layer {dst_rank})"


def all_modules() -> list[tuple[str, Path]]:
    out = []
    for top in ("runtime", "netstack", "coordinator"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.append((".".join(parts), path))
    return out


def test_every_import_follows_the_layers() -> None:
    problems = []
    for module, path in all_modules():
        for line, imported in imports_of(path):
            reason = violation(module, imported)
            if reason:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {imported}: {reason}")
    assert not problems, "imports against the layer direction:\n" + "\n".join(problems)


@pytest.mark.parametrize(("importer", "imported"), [
    ("netstack.transport", "runtime.api"),
    ("runtime.api.stream", "runtime.execution.task"),
    ("runtime.execution.task", "runtime.checkpointing.barriers"),
    ("runtime.worker.worker", "coordinator.server"),
    ("runtime.worker.worker", "runtime.cli.main"),
    ("coordinator.server", "runtime.worker.metrics"),
    ("runtime.worker.worker", "runtime.data.spark"),
    ("runtime.common.files", "runtime.api"),
    ("runtime.common.tasks", "netstack.frames"),
])
def test_the_checker_catches_imports_against_the_direction(importer: str, imported: str) -> None:
    assert violation(importer, imported) is not None


@pytest.mark.parametrize(("importer", "imported"), [
    ("runtime.cli.main", "coordinator.server"),
    ("coordinator.scheduler", "runtime.graph.plan"),
    ("runtime.checkpointing.checkpointer", "runtime.execution.channels"),
    ("runtime.connectors.files", "runtime.api.functions"),
    ("runtime.worker.network", "netstack.transport"),
    ("runtime.api.stream", "runtime.common.files"),
    ("coordinator.storage", "runtime.common.files"),
    ("runtime.cli.main", "runtime.common.tasks"),
])
def test_the_checker_allows_imports_along_the_direction(importer: str, imported: str) -> None:
    assert violation(importer, imported) is None


def runtime_imports(path: Path) -> set[str]:
    """The modules `path` imports when it runs: at module level and inside functions, not under TYPE_CHECKING
    (annotations only). `from a.b import c` counts as importing a.b and, if it is one, the module a.b.c."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.update({child.module, *(f"{child.module}.{alias.name}" for alias in child.names)})
            elif isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
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


def test_no_modules_import_each_other_in_a_circle() -> None:
    """A circle (even through a function-level import) means two modules are one: a name both need belongs in a
    small module of its own (runtime/api/errors.py, runtime/data/verify_input.py)."""
    modules = dict(all_modules())
    graph = {m: {i for i in runtime_imports(p) if i in modules and i != m} for m, p in modules.items()}
    assert circles(graph) == []


def test_the_circle_finder_finds_circles() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
