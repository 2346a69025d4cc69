"""docs/ARCHITECTURE.md and the design notes name only what exists: every file path and code identifier they
put in backticks is in the tree, so a rename or a removal that leaves the map behind fails here.

A span counts as a path when it has a slash and ends in a file name with an extension or in a slash; it must
exist from the repository root or as the end of a path in the tree (`execution/task.py` in a table of
runtime/). A span counts as an identifier when it is a dotted name with an underscore, a dot or a capital (a
plain word may be prose); each of its parts must be a name in the sources. Spans with a placeholder (`<n>`),
a wildcard, a space or a leading dash (a flag) are neither.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "ARCHITECTURE.md", *sorted((ROOT / "docs" / "design").glob("*.md"))]
SOURCES = (".py", ".lua", ".sh", ".toml", ".yaml", ".yml", ".json", ".html", ".js", ".css")
PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*(/|/[\w-]+\.\w+|\.(py|md|toml|sh|lua|yaml|yml|json|html|js))$")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\(\))?$")
METRIC_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
MAX_LINES = 800  # a map a newcomer reads in ten minutes


def tree_paths() -> list[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    dirs = {str(parent) + "/" for f in files for parent in Path(f).parents if str(parent) != "."}
    return files + sorted(dirs)


def source_names() -> set[str]:
    names: set[str] = set()
    for top in ("runtime", "coordinator", "netstack", "scripts", "tests", "deploy"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in SOURCES and path != Path(__file__).resolve():
                names.update(re.findall(r"[A-Za-z_]\w*", path.read_text(encoding="utf-8", errors="ignore")))
    return names


def unknown_names(text: str, paths: list[str], names: set[str]) -> list[str]:
    """The backticked spans of `text` that name a path or an identifier the tree does not have."""
    unknown = []
    for span in re.findall(r"`([^`\n]+)`", text):
        if span.startswith("-") or "..." in span or any(c in span for c in "<>* "):
            continue
        if PATH.match(span) and "/" in span:
            path = span.rstrip(":")
            if not (ROOT / path).exists() and not any(p == path or p.endswith("/" + path) for p in paths):
                unknown.append(span)
        elif re.fullmatch(r"[\w-]+\.(py|md|toml|sh|lua)", span):
            if not any(Path(p).name == span for p in paths):
                unknown.append(span)
        elif IDENTIFIER.match(span) and ("_" in span or "." in span or span != span.lower()):
            parts = span.removesuffix("()").split(".")
            if parts[-1].startswith("sluice_"):
                parts[-1] = next((parts[-1].removesuffix(s) for s in METRIC_SUFFIXES if parts[-1].endswith(s)),
                                 parts[-1])
            if any(part not in names for part in parts):
                unknown.append(span)
    return unknown


@pytest.fixture(scope="module")
def tree() -> tuple[list[str], set[str]]:
    return tree_paths(), source_names()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_and_identifier_a_doc_names_exists(doc: Path, tree: tuple[list[str], set[str]]) -> None:
    paths, names = tree
    assert unknown_names(doc.read_text(encoding="utf-8"), paths, names) == []


def test_the_checker_finds_what_is_gone(tree: tuple[list[str], set[str]]) -> None:
    paths, names = tree
    text = ("`runtime/cli/main.py` `cli/main.py` `runtime/cli/nothing.py` `Job.state_backend` `Job._restart_now` "
            "`sluice_task_records_in_total` `sluice_never_defined` `main.py` `gone.py` `chk-<n>/` `--state-dir`")
    assert unknown_names(text, paths, names) == ["runtime/cli/nothing.py", "Job._restart_now",
                                                 "sluice_never_defined", "gone.py"]


def test_the_architecture_map_stays_short() -> None:
    lines = len((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"docs/ARCHITECTURE.md has {lines} lines: move detail into docs/design/"
