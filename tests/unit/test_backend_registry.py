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


def test_each_descriptor_names_a_factory_its_module_defines() -> None:
    import importlib

    for descriptor in registry.BACKENDS:
        if registry.missing_extra(descriptor.name) is not None:
            continue  # its libraries are not installed here: the module may not import
        module, _, function = descriptor.factory.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), descriptor.factory


def test_what_each_backend_restores() -> None:
    memory, rocksdb, remote = (registry.spec(k) for k in ("memory", "rocksdb", "remote"))
    assert [memory.restores(k) for k in registry.KINDS] == [True, True, False]
    assert [rocksdb.restores(k) for k in registry.KINDS] == [True, True, False]
    assert [remote.restores(k) for k in registry.KINDS] == [True, False, True]


def test_make_backend_builds_through_the_descriptor(tmp_path: Any) -> None:
    backend = registry.make_backend("memory", range(2, 5), work_dir=str(tmp_path), options={})
    assert backend.name == "memory" and backend.key_groups == range(2, 5)
    with pytest.raises(StateBackendError, match="the remote state backend needs the server's address"):
        registry.make_backend("remote", range(4), work_dir=str(tmp_path), options={})


def test_admission_asks_for_the_extra_the_descriptor_names() -> None:
    from runtime.api import Job
    from runtime.connectors.generator import GeneratorSource
    from runtime.connectors.sinks import DiscardSink
    from runtime.examples.wordcount import Count
    from runtime.graph.admission import needed_extras

    keyed, plain = Job("keyed"), Job("plain")
    keyed.source(GeneratorSource(count=1)).key_by(lambda r: r).process(Count()).sink(DiscardSink())
    plain.source(GeneratorSource(count=1)).sink(DiscardSink())
    assert [needed_extras(keyed, backend=k) for k in registry.KINDS] == [set(), {"rocksdb"}, {"remote"}]
    assert needed_extras(plain, backend="rocksdb") == set()  # no keyed state: no backend object
