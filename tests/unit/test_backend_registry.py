"""One table of state backends (runtime/state/registry.py): every list of names derives from it, and a backend
whose libraries are missing fails with the extra to install."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from runtime.api.stream import STATE_BACKENDS
from runtime.cli.main import build_parser
from runtime.state import registry
from runtime.state.backend import StateBackendError


def test_the_cli_choices_and_the_api_names_are_the_registry_s() -> None:
    parser = build_parser()
    for command in ("local", "submit"):
        sub = next(a for a in parser._subparsers._group_actions[0].choices[command]._actions  # type: ignore[union-attr]
                   if "--state-backend" in a.option_strings)
        assert tuple(sub.choices) == registry.KINDS
        assert all(spec.name in (sub.help or "") for spec in registry.BACKENDS)
    # runtime.api sits below the state layer and cannot import it: its tuple is held equal here
    assert STATE_BACKENDS == registry.KINDS
    with pytest.raises(SystemExit):
        parser.parse_args(["local", "m:f", "--state-backend", "disk"])


def test_every_backend_but_memory_names_its_extra_and_install_line() -> None:
    assert registry.spec("memory").install_line == ""
    for kind in ("rocksdb", "remote"):
        assert registry.spec(kind).install_line == f"pip install 'sluice-dataflow[{kind}]'"
    with pytest.raises(StateBackendError, match="unknown state backend 'disk': choose one of memory, rocksdb, remote"):
        registry.spec("disk")


def test_a_backend_whose_library_is_missing_fails_with_the_install_line(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Any) -> None:
    fake = types.ModuleType("runtime.state.rocksdb")
    fake.available = lambda: False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "runtime.state.rocksdb", fake)
    assert registry.missing_extra("rocksdb") == \
        "the rocksdb state backend needs the `rocksdb` extra: pip install 'sluice-dataflow[rocksdb]'"
    with pytest.raises(StateBackendError, match=r"pip install 'sluice-dataflow\[rocksdb\]'"):
        registry.make_backend("rocksdb", range(4), work_dir=str(tmp_path), options={})
    assert registry.missing_extra("memory") is None
