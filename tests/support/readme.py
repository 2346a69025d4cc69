"""The README's own examples, for tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_example(module: str) -> str:
    """The README's ```python block that starts with `# <module>.py`."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    matching = [b for b in blocks if b.startswith(f"# {module}.py")]
    assert matching, f"README has no ```python block starting with '# {module}.py'"
    return matching[0]
