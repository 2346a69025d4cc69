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

A state's kind (value, list, map, reducing, aggregating; operator list or union list state) must not change
under its name: a map read where a value was stored means nothing. `declared_state_kinds` reads the kinds a
function declares from its class's source, without running it (a call such as `ctx.map_state("seen")` with the
name written out); the checkpoint records them per operator (runtime/graph/operator_ids.py) and a restore into a
version that declares another kind under the same name is refused (runtime/graph/evolution.py). A name built at
run time is not seen, and not checked.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import textwrap
import weakref
from typing import Any


class StateSchemaError(ValueError):
    """A stored value the state's declared type cannot read; the message names the state and what differs. No
    restart changes what is stored, so the job fails at once with it (not after its restarts)."""

    unrecoverable = True


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


# the context methods that declare state, and the kind each declares (runtime/api/functions.py, async_functions.py)
STATE_KINDS = {"value_state": "value", "list_state": "list", "map_state": "map", "reducing_state": "reducing",
               "aggregating_state": "aggregating", "operator_list_state": "list", "union_list_state": "union list"}


def declared_state_kinds(function: Any) -> dict[str, str]:
    """State name -> kind for every state `function` (a user function object) declares with its name written
    out, in its class or a base class of the job's own code; {} when its source cannot be read (a lambda, a class
    built at run time). Pure: the function is not run."""
    if inspect.isroutine(function) or not hasattr(function, "__class__"):
        return {}
    cls = type(function)
    kinds = _KINDS_OF.get(cls)
    if kinds is None:
        kinds = _KINDS_OF[cls] = _class_state_kinds(cls)
    return dict(kinds)


_KINDS_OF: weakref.WeakKeyDictionary[type, dict[str, str]] = weakref.WeakKeyDictionary()  # parsed once per class


def _class_state_kinds(cls: type) -> dict[str, str]:
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's declaration wins over its base's
        if klass.__module__ == "builtins" or klass.__module__.startswith("runtime.api."):
            continue  # the API's own bases declare nothing of the user's
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr in STATE_KINDS):
                continue
            named = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "name"), None)
            if isinstance(named, ast.Constant) and isinstance(named.value, str):
                found[named.value] = STATE_KINDS[call.func.attr]
    return found
