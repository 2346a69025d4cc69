"""Checking a msgpack document field by field against a frozen dataclass: the one decoder of the RPC requests
(runtime/graph/protocol.py) and their replies (runtime/graph/replies.py).

A field's declared type, as written (the modules use postponed annotations), names its check and conversion;
`T | None` accepts None too. A wrong value raises TypeError or ValueError, which the caller words with the
message's name and the field's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field
from typing import Any

from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.checkpoint_options import CheckpointOptions


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)  # a string as the REST API's JSON may carry it: "30" (and "soon" raises ValueError)


def _document(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {value!r}")
    return dict(value)


def _items(value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected a list, got {value!r}")
    return list(value)


def _flag(value: Any) -> bool:
    return bool(value)


# a field's declared type -> its check and conversion
_DECODE: dict[str, Callable[[Any], Any]] = {
    "str": _text, "int": _integer, "float": _number, "bool": _flag, "Mapping[str, Any]": _document,
    "list[Any]": _items, "TaskCheckpointFigures": TaskCheckpointFigures.from_wire,
    "CheckpointOptions": CheckpointOptions.from_wire,
}


def decode_value(declared: Any, value: Any) -> Any:
    """`value` checked and converted to the field type `declared` (its annotation string)."""
    return _DECODE[str(declared).removesuffix(" | None")](value)


def encode_value(value: Any) -> Any:
    """A field's value in its wire form: a typed value's own `to_wire()`, anything else as it is."""
    return value.to_wire() if hasattr(value, "to_wire") else value


def decode_fields(declared: Iterable[Field[Any]], doc: Mapping[str, Any],
                  refuse: Callable[[str], Exception]) -> dict[str, Any]:
    """The values of the `declared` fields in `doc`, checked; a field absent (or None) keeps its default, and
    one without a default, or of the wrong type, raises `refuse(problem)`."""
    values: dict[str, Any] = {}
    for f in declared:
        value = doc.get(f.name)
        if value is None:
            if f.default is MISSING and f.default_factory is MISSING:
                raise refuse(f"{f.name!r} is required")
            continue
        try:
            values[f.name] = decode_value(f.type, value)
        except (TypeError, ValueError) as exc:
            raise refuse(f"{f.name!r}: {exc}") from None
    return values
