"""Value state schema evolution: records that gained a field restore with its default, through the checkpoint's
own msgpack encoding; incompatible changes are refused at open, naming the state and the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from runtime.api.functions import KeyedContext
from runtime.api.schema import StateSchemaError
from runtime.checkpointing.snapshots import decode_operator_state, encode_operator_state, keyed_tables


@dataclass
class StatsV1:
    count: int
    total: float


@dataclass
class StatsV2:  # gained two fields with defaults
    count: int
    total: float
    peak: float = 0.0
    tags: list[str] = field(default_factory=list)


@dataclass
class StatsNoDefault:
    count: int
    total: float
    peak: float


@dataclass
class StatsDropped:
    count: int


def context(table: dict[str, dict[Any, Any]]) -> KeyedContext:
    ctx = KeyedContext(lambda v: None, 0, 1, "op", table)
    ctx.current_key = "a"
    return ctx


def checkpointed(write: Any) -> dict[str, dict[Any, Any]]:
    """What `write(ctx)` left in a value state, through a checkpoint file's encoding and back."""
    tables: dict[str, dict[Any, Any]] = {}
    write(context(tables))
    data = encode_operator_state({1: tables}, max_parallelism=128, source=None, sinks=[])
    return keyed_tables(decode_operator_state(data, "x"))[1]


def test_a_dataclass_that_gained_fields_restores_with_their_defaults() -> None:
    tables = checkpointed(lambda ctx: ctx.value_state("stats", StatsV1(0, 0.0)).update(StatsV1(3, 7.5)))
    state = context(tables).value_state("stats", StatsV2(0, 0.0))
    assert state.value() == StatsV2(3, 7.5, 0.0, [])
    state.update(StatsV2(4, 9.0, 2.0, ["x"]))
    assert state.value() == StatsV2(4, 9.0, 2.0, ["x"]) and tables["stats"]["a"] == {
        "count": 4, "total": 9.0, "peak": 2.0, "tags": ["x"]}


def test_a_dict_that_gained_a_key_restores_with_the_defaults_value() -> None:
    tables = checkpointed(lambda ctx: ctx.value_state("stats", {"count": 0}).update({"count": 3, "extra": 1}))
    state = context(tables).value_state("stats", {"count": 0, "peak": -1})
    assert state.value() == {"count": 3, "extra": 1, "peak": -1}


@pytest.mark.parametrize(("kind", "message"), [
    (StatsNoDefault, "StatsNoDefault gained field 'peak' without a default"),
    (StatsDropped, r"have field\(s\) total that the class no longer has"),
])
def test_incompatible_dataclass_changes_are_refused_at_open(kind: type, message: str) -> None:
    tables = checkpointed(lambda ctx: ctx.value_state("stats", StatsV1(0, 0.0)).update(StatsV1(3, 7.5)))
    with pytest.raises(StateSchemaError, match=f"value state 'stats': .*{message}"):
        context(tables).value_state("stats", kind(**{f: 0 for f in kind.__dataclass_fields__}))


def test_a_value_that_was_not_a_record_is_refused() -> None:
    tables = checkpointed(lambda ctx: ctx.value_state("stats", 0).update(5))
    with pytest.raises(StateSchemaError, match="a stored value 5 is not a StatsV2"):
        context(tables).value_state("stats", StatsV2(0, 0.0))


def test_plain_values_keep_the_plain_value_state() -> None:
    state = context({}).value_state("count", 0)
    assert type(state).__name__ == "ValueState"
