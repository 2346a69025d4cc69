"""How a configuration field is given on the command line, declared once on the field itself.

A settings dataclass (ChannelConfig, JobConfig, CheckpointSettings, RestartStrategy, AsyncStateSettings...)
marks the fields a user may set with `flag(...)` in the field's metadata: the flag's name, the function that
parses its text, its help. The CLI (runtime/cli/arguments.py) builds its arguments from these and turns the
flags given back into the settings document, so adding an option is one field with its flag, not a flag, a
dictionary key and a field kept equal by hand (click and typer build commands from signatures the same way).

A parse function takes the text and returns the value or raises ValueError with a one-line reason, which
the CLI prints with the flag. A flag not given is absent from the document, so the field's own default
(or the coordinator's) applies; `default` is only for a command line whose default differs from the field's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

METADATA_KEY = "flag"


@dataclass(frozen=True, slots=True)
class Flag:
    name: str  # "--buffer-bytes"
    help: str = ""
    parse: Callable[[str], Any] | None = None  # text -> value; raises ValueError (None: the text as it is)
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    action: str | None = None  # "store_true", "store_false" or "append" (each text parsed, the list to_field)
    default: Any = None  # the command line's default, when it differs from the field's
    to_field: Callable[[Any], Any] | None = None  # the parsed value -> the field's value (units, shapes)
    group: str = ""  # which group of the command's help lists it

    @property
    def dest(self) -> str:
        """The argparse attribute: the flag's name, as argparse derives it."""
        return self.name.lstrip("-").replace("-", "_")


def flag(name: str, help: str = "", **options: Any) -> Mapping[str, Flag]:
    """Field metadata declaring the field's command-line flag: `field(default=..., metadata=flag(...))`."""
    return {METADATA_KEY: Flag(name, help, **options)}


def flags_of(settings: type[Any]) -> list[tuple[str, Flag]]:
    """(field name, flag) of every field of the dataclass `settings` that declares one, in field order."""
    return [(f.name, f.metadata[METADATA_KEY]) for f in fields(settings) if METADATA_KEY in f.metadata]


def given(values: Mapping[str, Any], settings: type[Any]) -> dict[str, Any]:
    """The settings document of the flags given: field name -> value, from `values` keyed by flag dest
    (an argparse namespace's vars). Flags not given (None) are left out, so the field's default applies; a flag
    with a command-line `default` always has a value, so that value is sent."""
    out = {}
    for name, spec in flags_of(settings):
        value = values.get(spec.dest)
        if value is None:
            continue
        out[name] = spec.to_field(value) if spec.to_field is not None else value
    return out
