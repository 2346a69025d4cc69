"""State schema evolution for value state: values that gain a field restore with its default. Pure.

Keyed state values are stored as msgpack (checkpoint files, RocksDB, the remote backend), which knows maps,
lists, strings, numbers and bytes, not Python classes. A value state whose default is a record gets a schema
(`schema_of`), decided by the default the job passes to `ctx.value_state(name, default)`:

- a dataclass instance: values are dataclass instances of that type, stored as a map of their fields. Read
  back (`load`), a stored map that lacks a field the type has now gets the field's default (or
  default_factory); a field without a default that stored values lack, a stored field the type no longer has
  (its data would be dropped silently), or a stored value that is not a map is refused with StateSchemaError,
  naming the state, the type and the field.
- a dict: values are dicts; a stored dict that lacks a key of the default gets the default's value for it
  (keys the default does not name are kept). A stored value that is not a dict is returned as it is, as before.

Renaming a field, or changing its type, is not detected: give such a value state a new name (it starts empty),
or rewrite the stored values with the state processor (`sluice data state transform`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any


class StateSchemaError(ValueError):
    """A stored value the state's declared type cannot read; the message names the state and what differs."""


class DataclassSchema:
    """Values of one dataclass type, stored as maps of their fields."""

    def __init__(self, name: str, kind: type) -> None:
        self.name = name
        self.kind = kind
        self.fields = {f.name: f for f in dataclasses.fields(kind)}

    def dump(self, value: Any) -> Any:
        if not isinstance(value, self.kind):
            raise StateSchemaError(f"value state {self.name!r} holds {self.kind.__name__} values, got {value!r:.80}")
        return {name: getattr(value, name) for name in self.fields}

    def load(self, stored: Any) -> Any:
        if not isinstance(stored, dict):
            raise StateSchemaError(f"value state {self.name!r}: a stored value {stored!r:.80} is not a "
                                   f"{self.kind.__name__} (a map of its fields); give the state a new name to start "
                                   "it empty, or rewrite it with `sluice data state transform`")
        dropped = set(stored) - set(self.fields)
        if dropped:
            raise StateSchemaError(f"value state {self.name!r}: stored {self.kind.__name__} values have field(s) "
                                   f"{', '.join(sorted(map(str, dropped)))} that the class no longer has: their data "
                                   "would be dropped; keep the field, or rewrite the state with `sluice data state "
                                   "transform`")
        values = dict(stored)
        for name, f in self.fields.items():
            if name in values:
                continue
            if f.default is not dataclasses.MISSING:
                values[name] = copy.copy(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                values[name] = f.default_factory()
            else:
                raise StateSchemaError(f"value state {self.name!r}: {self.kind.__name__} gained field {name!r} "
                                       "without a default, which the stored values lack: give it a default")
        return self.kind(**values)


class DictSchema:
    """Dict values: keys of the default that a stored dict lacks are filled from it."""

    def __init__(self, name: str, default: dict[Any, Any]) -> None:
        self.name = name
        self.default = default

    def dump(self, value: Any) -> Any:
        return value

    def load(self, stored: Any) -> Any:
        if isinstance(stored, dict) and not stored.keys() >= self.default.keys():
            return {**{k: copy.copy(v) for k, v in self.default.items() if k not in stored}, **stored}
        return stored


Schema = DataclassSchema | DictSchema


def schema_of(name: str, default: Any) -> Schema | None:
    """The schema a value state gets from its default (module docstring); None: values as they are."""
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return DataclassSchema(name, type(default))
    if isinstance(default, dict) and default:
        return DictSchema(name, default)
    return None
