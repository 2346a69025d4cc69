"""The remote state backend's server-side scripts (Lua, run atomically by the Valkey server).

Each script is a file here, its KEYS and ARGV layout documented at its top; `source(name)` reads one once.
They ship as package data (pyproject.toml [tool.setuptools.package-data]).
"""

from __future__ import annotations

import functools
from importlib import resources

SCRIPTS = ("write", "forget", "read", "claim", "settle", "collect")


@functools.cache
def source(name: str) -> str:
    if name not in SCRIPTS:
        raise ValueError(f"no Lua script {name!r}: one of {', '.join(SCRIPTS)}")
    return resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
