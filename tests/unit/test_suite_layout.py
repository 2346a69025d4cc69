"""The test suite's own layering: shared helpers live in tests/support, and no test module imports another.

A helper one test module needs from another moves to tests/support (a test module's helpers change with its
tests; two modules that share them break each other). Every import in tests/ is read from the source
(module level and inside functions alike); conftest modules count as test modules (their fixtures reach
tests by name, not by import).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def is_test_module(module: str) -> bool:
    """`tests.<tier>.test_x` or a conftest, by dotted name."""
    last = module.rsplit(".", 1)[-1]
    return module.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def imported_modules(tree: ast.AST, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every import; `from tests.a import b` also counts `tests.a.b` when that is a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            package = root.joinpath(*node.module.split("."))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                      if (package / f"{alias.name}.py").exists()]
    return found


def imports_of_test_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for line, module in imported_modules(tree) if is_test_module(module)]


def test_no_test_module_imports_another_test_module() -> None:
    offenders = [o for path in sorted(TESTS.rglob("*.py")) for o in imports_of_test_modules(path)]
    assert offenders == [], "move the shared helpers to tests/support:\n" + "\n".join(offenders)


def test_the_check_sees_imports_of_test_modules_anywhere(tmp_path: Path) -> None:
    (tmp_path / "tests" / "integration").mkdir(parents=True)
    (tmp_path / "tests" / "integration" / "test_nats.py").write_text("")
    bad = tmp_path / "test_bad.py"
    bad.write_text("from tests.integration.test_failover import install\n"
                   "def f():\n    import tests.unit.test_windows\n"
                   "from tests.integration import test_nats\n"
                   "from tests.integration.conftest import Cluster\n"
                   "from tests.support.cluster import Cluster, poll\n")
    tree = ast.parse(bad.read_text())
    hits = sorted({module for _, module in imported_modules(tree, tmp_path) if is_test_module(module)})
    assert hits == ["tests.integration.conftest", "tests.integration.test_failover",
                    "tests.integration.test_nats", "tests.unit.test_windows"]


def test_the_support_package_holds_no_tests() -> None:
    """tests/support is imported, never collected: a test_*.py file there would run in no tier."""
    assert sorted(p.name for p in (TESTS / "support").glob("test_*.py")) == []
