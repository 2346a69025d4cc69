"""Every backend returns the types it was given: the same keyed function run on the memory path (dict tables,
the very objects) and on RocksDB (values through runtime/state/codec.py) emits equal rows of equal types. Records
come off the network with their arrays as tuples, so a buffered record is a tuple; a list value stays a list."""

from __future__ import annotations

import os
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import KeyedContext, KeyedProcessFunction
from runtime.state.codec import decode_value, encode_value
from runtime.state.rocksdb import RocksDBBackend, available
from runtime.state.tables import BackendTables

MAX_PAR = 128
needs_rocksdb = pytest.mark.skipif(not available(), reason="the rocksdb extra is not installed")


class Buffer(KeyedProcessFunction):
    """Buffers records per key (list state), keeps the last one (value state) and one per kind (map state, a
    tuple key too); every third record emits everything it holds."""

    def open(self, ctx: Any) -> None:
        self.buffered = ctx.list_state("buffered")
        self.last = ctx.value_state("last")
        self.by_kind = ctx.map_state("by_kind")
        self.lists = ctx.value_state("lists", default=[])

    def process_element(self, record: Any, ctx: Any) -> None:
        self.buffered.add(record)
        self.last.update(record)
        self.by_kind.put(record[1], record)
        self.by_kind.put((record[1], "pair"), [record, list(record)])
        self.lists.update([*self.lists.value(), list(record)])  # a list value: it must stay a list
        if len(list(self.buffered.get())) == 3:
            ctx.emit(("buffered", list(self.buffered.get())))
            ctx.emit(("last", self.last.value()))
            ctx.emit(("by_kind", sorted(self.by_kind.items(), key=repr)))
            ctx.emit(("lists", self.lists.value()))
            self.buffered.clear()


def typed(value: Any) -> Any:
    """The value with every container's type spelled out, so that == compares types too."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(v) for v in value])
    if isinstance(value, dict):
        return ("dict", sorted(((typed(k), typed(v)) for k, v in value.items()), key=repr))
    return (type(value).__name__, value)


def run(state: Any) -> list[Any]:
    out: list[Any] = []
    ctx = KeyedContext(out.append, 0, 1, "buffer", state)
    function = Buffer()
    function.open(ctx)
    for n in range(9):
        wire = msgpack.packb([f"k{n % 2}", f"kind{n % 3}", n, [n, (n, "x")]], use_bin_type=True)
        record = msgpack.unpackb(wire, use_list=False, raw=False)  # as a task receives it: arrays are tuples
        ctx.current_key = record[0]
        function.process_element(record, ctx)
    return out


@needs_rocksdb
def test_the_same_function_on_memory_and_rocksdb_emits_the_same_types(tmp_path: Any) -> None:
    memory = run({})
    backend = RocksDBBackend(range(MAX_PAR), directory=os.path.join(str(tmp_path), "db"))
    try:
        rocksdb = run(BackendTables(backend, 7, MAX_PAR))
    finally:
        backend.close()
    assert len(memory) == 8 and memory[0][1][0] == ("k0", "kind0", 0, (0, (0, "x")))
    assert [typed(row) for row in rocksdb] == [typed(row) for row in memory]


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.tuples()
    | st.dictionaries(st.text(max_size=3) | st.tuples(st.integers(-9, 9), st.text(max_size=2)), inner, max_size=3),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_values_round_trip_with_their_types(value: Any) -> None:
    assert typed(decode_value(encode_value(value))) == typed(value)


def test_values_stored_before_read_back_as_they_did() -> None:
    old = msgpack.packb({"a": [1, [2, 3]], "b": (4, 5)}, use_bin_type=True)  # tuples were arrays then
    assert decode_value(old) == {"a": [1, [2, 3]], "b": [4, 5]}
