"""Parsing of command-line values shared by every process: durations, sizes, addresses, the cluster token.

Each parser takes the text of a flag and returns its value or raises ValueError with a one-line reason; the
settings dataclasses name them in their fields' flags (runtime/graph/flags.py).
"""

from __future__ import annotations

import os
import re
import sys

DEV_TOKEN = "sluice-dev-token"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """'500ms', '2s', '1.5', '1m' -> seconds, more than zero unless `allow_zero`.

    Raises ValueError with the accepted forms. Negative values never parse.
    """
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 2s, 1m)")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value == 0 and not allow_zero:
        raise ValueError(f"must be more than zero, got {text!r} (use e.g. 500ms, 2s, 1m)")
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*(b|kb|kib|k|mb|mib|m|gb|gib|g)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {None: 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
               "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def parse_bytes(text: str) -> int:
    """'64KiB', '1MiB', '500000', '2mb' -> bytes, more than zero. Raises ValueError with the accepted forms."""
    match = _SIZE.match(str(text))
    value = int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower() or None] if match else 0
    if value <= 0:
        raise ValueError(f"not a size of more than zero bytes: {text!r} (use e.g. 64KiB, 1MiB, 500000)")
    return value


def parse_duration_or_zero(text: str) -> float:
    return parse_duration(text, allow_zero=True)


def parse_positive(text: str) -> int:
    """An integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not an integer: {text!r}") from None
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def parse_never_or_duration(text: str) -> float:
    """A duration, or 0 / 'never' (0.0): never (scale_down_after_s)."""
    return 0.0 if text.strip().lower() == "never" else parse_duration(text, allow_zero=True)


LIFE = "life"


def parse_duration_or_life(text: str) -> float | str:
    """A duration, or 'life' (LIFE): the job's whole life (a restart window)."""
    return LIFE if text.strip().lower() == LIFE else parse_duration(text)


def parse_parallelism(text: str) -> tuple[str, int]:
    """'N' (every operator: '*') or 'NAME=N', N >= 1."""
    name, sep, value = text.rpartition("=")
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1 or (sep and not name):
        raise ValueError(f"expected N or NAME=N with N a positive integer, got {text!r}")
    return (name if sep else "*"), n


DEFAULT_INFLIGHT_TARGET_S = 1.0


def parse_inflight_target(value: object) -> float:
    """A channel's in-flight target: a duration ('1s', '500ms', 0.5) of at least 0; 0 keeps fixed-size buffers."""
    seconds = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else \
        parse_duration(str(value), allow_zero=True)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"inflight target must be a duration of at least 0, got {value!r}")
    return seconds


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a HOST:PORT address: {text!r}")
    return host, int(port)


def parse_address_text(text: str) -> str:
    """A HOST:PORT address, checked and kept as text."""
    host, port = parse_address(text)
    return f"{host}:{port}"


def load_token(token_file: str | None) -> str:
    """The cluster token: from --token-file, else $SLUICE_TOKEN, else the development token (with a warning)."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ValueError(f"cannot read token file {token_file}: {exc.strerror}") from exc
        if not token:
            raise ValueError(f"token file {token_file} is empty")
        return token
    token = os.environ.get("SLUICE_TOKEN", "")
    if token:
        return token
    print("sluice: no --token-file or SLUICE_TOKEN; using the development token (not for shared networks)",
          file=sys.stderr)
    return DEV_TOKEN
