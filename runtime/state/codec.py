"""How keys and values of keyed state become bytes, so that a key group is a contiguous range.

A stored key is `key group (2 bytes, big-endian) | state name length (1 byte) |
state name | msgpack(key)`. Big-endian key group first means the byte order of
stored keys sorts by key group, so "every entry of groups [a, b)" is one range
scan from `prefix(a)` to `prefix(b)`: what restore and rescale read.
"""

from __future__ import annotations

from typing import Any

import msgpack

MAX_KEY_GROUPS = 1 << 16  # the prefix is two bytes
MAX_NAME_BYTES = 255


class StateCodecError(ValueError):
    """A state name, key group or stored entry that cannot be encoded or decoded."""


def group_prefix(group: int) -> bytes:
    if not 0 <= group < MAX_KEY_GROUPS:
        raise StateCodecError(f"key group {group} is outside 0..{MAX_KEY_GROUPS - 1}")
    return group.to_bytes(2, "big")


def range_bounds(groups: range) -> tuple[bytes, bytes]:
    """The [start, end) byte bounds that hold exactly the entries of `groups` (a step-1 range)."""
    if groups.step != 1:
        raise StateCodecError(f"key group range {groups} must have step 1")
    end = groups.stop.to_bytes(2, "big") if groups.stop < MAX_KEY_GROUPS else b"\xff\xff\xff"
    return group_prefix(groups.start) if groups.start < MAX_KEY_GROUPS else end, end


def encode_key(name: str, group: int, key: Any) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > MAX_NAME_BYTES:
        raise StateCodecError(f"state name {name!r} is longer than {MAX_NAME_BYTES} bytes")
    try:
        packed = msgpack.packb(key, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise StateCodecError(f"state key {key!r:.80} cannot be stored: {e}") from e
    return group_prefix(group) + bytes((len(raw),)) + raw + packed


def decode_key(data: bytes) -> tuple[str, int, Any]:
    try:
        group = int.from_bytes(data[:2], "big")
        length = data[2]
        name = data[3:3 + length].decode("utf-8")
        key = msgpack.unpackb(data[3 + length:], raw=False, use_list=False)
    except (IndexError, UnicodeDecodeError, ValueError, msgpack.UnpackException) as e:
        raise StateCodecError(f"stored state key {data[:40]!r} does not decode: {e}") from e
    return name, group, key


def encode_value(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise StateCodecError(f"state value {value!r:.80} cannot be stored: {e}") from e


def decode_value(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)  # maps keyed by ints are values too


def hashable(key: Any) -> Any:
    """A key decoded from msgpack with its lists turned back into tuples (keys must be hashable)."""
    return tuple(hashable(k) for k in key) if isinstance(key, list) else key
