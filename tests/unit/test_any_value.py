"""Any picklable Python value travels in records and state (runtime/common/values.py): msgpack for the types it
knows, pickle marked with an extension type for the rest, loaded only through the restricted unpickler; a value
pickle refuses fails at once naming who emitted it and its type."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import os
import pickle
import subprocess
import sys
import threading
from subprocess import Popen  # noqa: F401 - a class a job module imports: still not a value class of it
from typing import Any

import msgpack
import pytest

from runtime.checkpointing.snapshots import decode_operator_state, encode_operator_state, keyed_tables
from runtime.common.values import PICKLE_EXT, RefusedPickle, UnpicklableValue, loads, packer_default, unpack_ext
from runtime.connectors.files import json_value
from runtime.connectors.kafka_core import MalformedKafkaRecord
from runtime.execution.channels import ChannelReader
from runtime.graph.partitioning import stable_hash
from runtime.state.codec import decode_key, decode_value, encode_key, encode_value


@dataclasses.dataclass(frozen=True)
class Order:
    sku: str
    placed: datetime.datetime
    amount: decimal.Decimal


UTC = datetime.UTC
VALUES: list[Any] = [
    datetime.datetime(2026, 11, 29, 1, 2, 3, 456, tzinfo=UTC), datetime.date(2026, 1, 1),
    datetime.timedelta(seconds=90), decimal.Decimal("366.10"), {1, 2, 3}, frozenset({"a", "b"}),
    Order("x-1", datetime.datetime(2026, 1, 1, tzinfo=UTC), decimal.Decimal("9.99")),
    ("key", [datetime.date(2020, 2, 29), {"nested": decimal.Decimal("-0")}]),
]


def test_records_carry_any_picklable_value_and_known_types_stay_plain_msgpack() -> None:
    pack = msgpack.Packer(default=packer_default("map")).pack
    reader = ChannelReader()
    for value in VALUES:
        reader.feed(pack(value))
    got = reader.take(len(VALUES))
    # records come off the wire with their arrays as tuples; a set's order is its own (compared as sets)
    expected = [*VALUES[:-1], ("key", (datetime.date(2020, 2, 29), {"nested": decimal.Decimal("-0")}))]
    assert got == expected and [type(v) for v in got] == [type(v) for v in expected]
    # the fast path: what msgpack knows is packed exactly as before, with no pickle in it
    assert pack(("k", 1, 2.5, None, b"x", {"a": [1]})) == msgpack.packb(("k", 1, 2.5, None, b"x", {"a": [1]}))
    marked = msgpack.unpackb(pack(decimal.Decimal(1)))
    assert isinstance(marked, msgpack.ExtType) and marked.code == PICKLE_EXT


def test_state_keys_values_and_snapshots_carry_them() -> None:
    for value in VALUES:
        assert decode_value(encode_value(value)) == value
        assert type(decode_value(encode_value(value))) is type(value)
    key = datetime.date(2026, 5, 1)
    assert decode_key(encode_key("count", 7, key)) == ("count", 7, key)
    data = encode_operator_state({3: {"last": {"k": VALUES[0], key: VALUES[6]}}}, max_parallelism=128,
                                 source=None, sinks=[])
    assert keyed_tables(decode_operator_state(data, "x")) == {3: {"last": {"k": VALUES[0], key: VALUES[6]}}}


def test_an_unpicklable_value_is_refused_naming_the_operator_and_the_type() -> None:
    pack = msgpack.Packer(default=packer_default("enrich (map)")).pack
    with pytest.raises(UnpicklableValue, match=r"^enrich \(map\): a value of type _thread\.lock cannot be sent"):
        pack(("k", threading.Lock()))
    assert UnpicklableValue.unrecoverable  # the job fails at once: a restart would meet it again
    assert pack([1]) == b"\x91\x01"  # the packer is whole after the refusal
    with pytest.raises(UnpicklableValue, match="a keyed state's value: a value of type builtins.generator cannot"):
        encode_value({"g": (i for i in range(2))})


def test_the_unpickler_loads_value_classes_only() -> None:
    assert loads(pickle.dumps(VALUES[6])) == VALUES[6]  # a class of the job's own code (this module)
    # the runtime's own record values (a KafkaSource's side output of malformed records), and nothing else of it
    malformed = MalformedKafkaRecord("t", 0, 7, 1, None, b"{", (), "JSONDecodeError: ...")
    assert loads(pickle.dumps(malformed)) == malformed
    refused = [os.system, subprocess.Popen.__new__(subprocess.Popen), print, ChannelReader]
    for obj in refused:
        with pytest.raises(RefusedPickle, match="refusing to load"):
            loads(pickle.dumps(obj))
    # a job module's name for an imported class does not make it a value class
    assert sys.modules[__name__].Popen is subprocess.Popen
    with pytest.raises(RefusedPickle, match=f"refusing to load {__name__}.Popen"):
        loads(f"c{__name__}\nPopen\n.".encode())
    with pytest.raises(RefusedPickle):
        unpack_ext(PICKLE_EXT, b"cos\nsystem\n(S'true'\ntR.")  # the textbook payload


def test_keys_hash_the_same_in_every_process() -> None:
    keys = [datetime.date(2026, 1, 1), frozenset({"a", "b", "c", "d"}), decimal.Decimal("1.5")]
    code = ("import datetime, decimal; from runtime.graph.partitioning import stable_hash; "
            "print([stable_hash(k) for k in (datetime.date(2026, 1, 1), frozenset({'a', 'b', 'c', 'd'}), "
            "decimal.Decimal('1.5'))])")
    mine = [stable_hash(k) for k in keys]
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert out.stdout.strip() == repr(mine)


def test_json_lines_write_the_common_value_types() -> None:
    assert [json_value(v) for v in VALUES[:7]] == [
        "2026-11-29T01:02:03.000456+00:00", "2026-01-01", 90.0, "366.10", [1, 2, 3], ["a", "b"],
        {"sku": "x-1", "placed": datetime.datetime(2026, 1, 1, tzinfo=UTC), "amount": decimal.Decimal("9.99")}]
    with pytest.raises(TypeError, match="cannot write a value of type _thread.lock"):
        json_value(threading.Lock())


def test_an_unpicklable_value_in_memory_state_names_the_state_at_the_checkpoint() -> None:
    keyed = {3: {"count": {"k": 1}, "cache": {"k": threading.Lock()}}}
    with pytest.raises(UnpicklableValue, match=r"^keyed state 'cache' of operator 3: .*type _thread\.lock"):
        encode_operator_state(keyed, max_parallelism=128, source=None, sinks=[])


def helper_function() -> str:
    return "a function of a job module"


def test_functions_load_only_from_modules_the_operator_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.common import values

    data = pickle.dumps(helper_function)
    with pytest.raises(RefusedPickle, match=f"refusing to load {__name__}.helper_function"):
        loads(data)
    monkeypatch.setenv(values.ALLOW_ENV, f"json, {__name__}")
    values._allowed_modules.cache_clear()
    try:
        assert loads(data)() == "a function of a job module"
    finally:
        monkeypatch.delenv(values.ALLOW_ENV)
        values._allowed_modules.cache_clear()
