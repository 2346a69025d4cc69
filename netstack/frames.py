"""Wire format: a fixed 21-byte header followed by a payload.

    magic  2s  b"SL"
    version B  PROTOCOL_VERSION
    type    B  FrameType
    flags   B  FLAG_* bits
    channel I  logical channel id (0 for connection-level frames)
    seq     Q  per-channel sequence number; for a priority event, the
               sequence number of the last in-band frame sent before it;
               for RPC frames, the correlation id; for PING/PONG, a nonce
    length  I  payload length in bytes

`FrameDecoder` is a sans-IO decoder: feed it bytes in any split, pull whole
frames. It validates the header as soon as the header is complete, so an
oversized or unknown frame is refused before its payload is buffered.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from netstack.errors import CloseReason, RemoteProtocolError

MAGIC = b"SL"
PROTOCOL_VERSION = 1
HEADER = struct.Struct(">2sBBBIQI")
HEADER_BYTES = HEADER.size
DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024

FLAG_PRIORITY = 0x01

# Data frame payload prefix: backlog (buffers queued behind this one) and the
# offset of the first record that starts in this buffer (NO_RECORD_START when
# the whole buffer continues a record begun in an earlier buffer).
DATA_PREFIX = struct.Struct(">II")
NO_RECORD_START = 0xFFFFFFFF
CREDIT_PAYLOAD = struct.Struct(">I")


class FrameType(enum.IntEnum):
    HELLO = 1
    HELLO_ACK = 2
    DATA = 3
    EVENT = 4
    CREDIT = 5
    RPC_REQUEST = 6
    RPC_RESPONSE = 7
    GOODBYE = 8
    PING = 9  # liveness probe; seq carries a nonce the PONG echoes
    PONG = 10


_KNOWN_TYPES = {int(t): t for t in FrameType}  # a lookup per frame, not an enum call (EnumType.__call__)


@dataclass(frozen=True, slots=True)
class Frame:
    type: FrameType
    flags: int
    channel: int
    seq: int
    payload: bytes


def encode_header(ftype: int, flags: int, channel: int, seq: int, length: int) -> bytes:
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, ftype, flags, channel, seq, length)


def encode_frame(ftype: int, payload: bytes = b"", *, flags: int = 0, channel: int = 0, seq: int = 0) -> bytes:
    return encode_header(ftype, flags, channel, seq, len(payload)) + payload


class FrameDecoder:
    """Turns a byte stream into frames; raises RemoteProtocolError on a bad stream."""

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0
        self._header: tuple[int, int, int, int, int] | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None when more bytes are needed."""
        if self._header is None:
            if len(self._buf) - self._pos < HEADER_BYTES:
                return None
            magic, version, ftype, flags, channel, seq, length = HEADER.unpack_from(self._buf, self._pos)
            if magic != MAGIC:
                raise RemoteProtocolError(f"bad magic {bytes(magic)!r}", CloseReason.BAD_MAGIC)
            if version != PROTOCOL_VERSION:
                raise RemoteProtocolError(
                    f"protocol version {version}, this process speaks {PROTOCOL_VERSION}", CloseReason.BAD_VERSION
                )
            if ftype not in _KNOWN_TYPES:
                raise RemoteProtocolError(f"unknown frame type {ftype}", CloseReason.UNKNOWN_TYPE)
            if length > self._max:
                raise RemoteProtocolError(
                    f"frame of {length} bytes exceeds the maximum of {self._max}", CloseReason.OVERSIZED
                )
            self._pos += HEADER_BYTES
            self._header = (ftype, flags, channel, seq, length)
        ftype, flags, channel, seq, length = self._header
        if len(self._buf) - self._pos < length:
            return None
        payload = bytes(self._buf[self._pos : self._pos + length])
        self._pos += length
        self._header = None
        return Frame(_KNOWN_TYPES[ftype], flags, channel, seq, payload)

    def eof(self) -> None:
        """The stream ended: fine between frames, a protocol error inside one."""
        if self._header is not None or self.buffered_bytes:
            raise RemoteProtocolError(
                f"stream ended with {self.buffered_bytes} bytes of an unfinished frame", CloseReason.TRUNCATED
            )
