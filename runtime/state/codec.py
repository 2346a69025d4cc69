"""How keys and values of keyed state become bytes, so that a key group is a contiguous range.

A stored key is `key group (2 bytes, big-endian) | state name length (1 byte) |
state name | msgpack(key)`. Big-endian key group first means the byte order of
stored keys sorts by key group, so "every entry of groups [a, b)" is one range
scan from `prefix(a)` to `prefix(b)`: what restore and rescale read.

A stored value is msgpack too, with tuples kept apart from lists (`encode_value`): a backend returns the types
it was given, as the heap path does.
"""

from __future__ import annotations

from typing import Any

import msgpack

from runtime.common.values import UnpicklableValue, packer_default, unpack_ext

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
        packed = msgpack.packb(key, use_bin_type=True, default=_KEY_DEFAULT)
    except UnpicklableValue:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise StateCodecError(f"state key {key!r:.80} cannot be stored: {e}") from e
    return group_prefix(group) + bytes((len(raw),)) + raw + packed


def decode_key(data: bytes) -> tuple[str, int, Any]:
    try:
        group = int.from_bytes(data[:2], "big")
        length = data[2]
        name = data[3:3 + length].decode("utf-8")
        key = msgpack.unpackb(data[3 + length:], raw=False, use_list=False, ext_hook=unpack_ext)
    except (IndexError, UnicodeDecodeError, ValueError, msgpack.UnpackException) as e:
        raise StateCodecError(f"stored state key {data[:40]!r} does not decode: {e}") from e
    return name, group, key


# Values keep tuples and lists apart. Plain msgpack packs both as an array, which reads back as a list (or, with
# use_list=False, everything as a tuple, the list state's own list included). But the heap path (memory) hands
# back the very objects it was given, and records come off the network with their arrays as tuples, so a buffered
# record is a tuple there. So a tuple is packed as an array whose first item is a marker (an empty msgpack
# extension of code TUPLE_EXT, 3 bytes) and read back as a tuple, at any depth (inside a list, as a map key); a
# list reads back as a list. Both hooks run in msgpack's C loop, one Python call per tuple (about 3x plain msgpack
# for a list of tuples, about the same for anything else). Values stored before read back as they did (lists).
TUPLE_EXT = 1
_TUPLE_MARK = msgpack.ExtType(TUPLE_EXT, b"")
_TUPLE = object()  # what the marker decodes to, before list_hook turns its array into a tuple
_NATIVE: tuple[type, ...] = (dict, list, str, bytes, int, float)
_KEY_DEFAULT = packer_default("a keyed state's key")
_VALUE_DEFAULT = packer_default("a keyed state's value")


def _pack_other(obj: Any) -> Any:
    """msgpack's `default` under strict_types: exact types pack natively, the rest comes here."""
    if isinstance(obj, tuple):  # a namedtuple too: it reads back as a plain tuple
        return [_TUPLE_MARK, *obj]
    for base in _NATIVE:  # subclasses (OrderedDict, IntEnum, ...) as their base
        if isinstance(obj, base):
            return base(obj)
    return _VALUE_DEFAULT(obj)  # anything else pickled (runtime/common/values.py)


def _unpack_ext(code: int, data: bytes) -> Any:
    return _TUPLE if code == TUPLE_EXT and not data else unpack_ext(code, data)


def _unpack_array(items: list[Any]) -> Any:
    return tuple(items[1:]) if items and items[0] is _TUPLE else items


def encode_value(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True, strict_types=True, default=_pack_other)
    except UnpicklableValue:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise StateCodecError(f"state value {value!r:.80} cannot be stored: {e}") from e


def decode_value(data: bytes) -> Any:
    # maps keyed by ints are values too
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_unpack_ext, list_hook=_unpack_array)


def hashable(key: Any) -> Any:
    """A key decoded from msgpack with its lists turned back into tuples (keys must be hashable)."""
    return tuple(hashable(k) for k in key) if isinstance(key, list) else key
