"""FrameDecoder: any split of a valid stream decodes to the same frames; a bad stream is refused early."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netstack.errors import CloseReason, RemoteProtocolError
from netstack.frames import (
    HEADER,
    HEADER_BYTES,
    MAGIC,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    FrameType,
    encode_frame,
    encode_header,
)

FRAMES = [
    Frame(FrameType.HELLO, 0, 0, 0, b"hello body"),
    Frame(FrameType.DATA, 0, 7, 1, b"\x00" * 300),
    Frame(FrameType.EVENT, 1, 7, 1, b"\x81\xa1k\x01"),
    Frame(FrameType.CREDIT, 0, 2**32 - 1, 0, b"\x00\x00\x00\x05"),
    Frame(FrameType.RPC_REQUEST, 0, 0, 2**64 - 1, b""),
    Frame(FrameType.GOODBYE, 0, 0, 0, b"bye"),
]


def encode(frame: Frame) -> bytes:
    return encode_frame(frame.type, frame.payload, flags=frame.flags, channel=frame.channel, seq=frame.seq)


def drain(decoder: FrameDecoder) -> list[Frame]:
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    return out


def decode_chunks(chunks: list[bytes], **kwargs: int) -> list[Frame]:
    decoder = FrameDecoder(**kwargs)
    out: list[Frame] = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        out.extend(drain(decoder))
    decoder.eof()
    assert decoder.buffered_bytes == 0
    return out


frame_strategy = st.builds(
    Frame,
    type=st.sampled_from(list(FrameType)),
    flags=st.integers(0, 255),
    channel=st.integers(0, 2**32 - 1),
    seq=st.integers(0, 2**64 - 1),
    payload=st.binary(max_size=200),
)


def test_header_layout_is_21_bytes_big_endian() -> None:
    raw = encode_frame(FrameType.DATA, b"xyz", flags=1, channel=0x01020304, seq=5)
    assert HEADER_BYTES == 21
    assert raw[:2] == MAGIC
    assert raw[2] == PROTOCOL_VERSION
    assert raw[3] == FrameType.DATA
    assert raw[4] == 1
    assert raw[5:9] == b"\x01\x02\x03\x04"
    assert raw[9:17] == (5).to_bytes(8, "big")
    assert raw[17:21] == (3).to_bytes(4, "big")
    assert raw[21:] == b"xyz"


def test_whole_stream_decodes_to_the_frames_sent() -> None:
    stream = b"".join(encode(f) for f in FRAMES)
    assert decode_chunks([stream]) == FRAMES


def test_byte_by_byte_decodes_identically() -> None:
    stream = b"".join(encode(f) for f in FRAMES)
    assert decode_chunks([stream[i : i + 1] for i in range(len(stream))]) == FRAMES


def test_no_frame_until_the_last_payload_byte() -> None:
    raw = encode(FRAMES[1])
    decoder = FrameDecoder()
    decoder.receive_data(raw[:-1])
    assert decoder.next_frame() is None
    assert decoder.buffered_bytes == len(raw) - 1 - HEADER_BYTES  # header consumed, payload waiting
    decoder.receive_data(raw[-1:])
    assert decoder.next_frame() == FRAMES[1]
    assert decoder.next_frame() is None


def test_empty_stream_and_clean_eof() -> None:
    decoder = FrameDecoder()
    assert decoder.next_frame() is None
    decoder.eof()  # nothing pending: no error


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(frame_strategy, max_size=12), data=st.data())
def test_random_splits_decode_identically(frames: list[Frame], data: st.DataObject) -> None:
    stream = b"".join(encode(f) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=30)))
    bounds = [0, *cuts, len(stream)]
    chunks = [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert b"".join(chunks) == stream
    assert decode_chunks(chunks) == frames
    assert decode_chunks([stream]) == frames


def _header(magic: bytes = MAGIC, version: int = PROTOCOL_VERSION, ftype: int = FrameType.DATA,
            length: int = 0) -> bytes:
    return HEADER.pack(magic, version, ftype, 0, 1, 1, length)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (_header(magic=b"XX"), CloseReason.BAD_MAGIC),
        (_header(version=PROTOCOL_VERSION + 1), CloseReason.BAD_VERSION),
        (_header(version=0), CloseReason.BAD_VERSION),
        (_header(ftype=0), CloseReason.UNKNOWN_TYPE),
        (_header(ftype=max(FrameType) + 1), CloseReason.UNKNOWN_TYPE),
        (_header(ftype=255), CloseReason.UNKNOWN_TYPE),
    ],
)
def test_bad_header_is_refused_with_its_reason(header: bytes, reason: CloseReason) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(header[:-1])
    assert decoder.next_frame() is None  # not judged before the header is complete
    decoder.receive_data(header[-1:])
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.reason is reason


def test_bad_frame_after_good_ones_is_refused_after_them() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(encode(FRAMES[0]) + encode(FRAMES[1]) + _header(magic=b"GE"))
    assert decoder.next_frame() == FRAMES[0]
    assert decoder.next_frame() == FRAMES[1]
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.reason is CloseReason.BAD_MAGIC


def test_oversized_frame_refused_as_soon_as_the_header_is_complete() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    decoder.receive_data(encode_header(FrameType.DATA, 0, 1, 1, 1025))  # no payload byte yet
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.reason is CloseReason.OVERSIZED
    assert "1025" in str(info.value)


def test_oversized_refused_even_for_a_huge_declared_length() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(encode_header(FrameType.RPC_REQUEST, 0, 0, 1, 2**32 - 1))
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.reason is CloseReason.OVERSIZED


def test_frame_of_exactly_the_maximum_is_accepted() -> None:
    payload = b"m" * 1024
    decoder = FrameDecoder(max_frame_bytes=1024)
    decoder.receive_data(encode_frame(FrameType.DATA, payload, channel=3, seq=9))
    assert decoder.next_frame() == Frame(FrameType.DATA, 0, 3, 9, payload)


@pytest.mark.parametrize("cut", [1, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 5])
def test_truncated_stream_at_eof(cut: int) -> None:
    raw = encode_frame(FrameType.EVENT, b"0123456789", channel=1, seq=1)
    decoder = FrameDecoder()
    decoder.receive_data(encode(FRAMES[0]) + raw[:cut])
    assert decoder.next_frame() == FRAMES[0]
    assert decoder.next_frame() is None
    with pytest.raises(RemoteProtocolError) as info:
        decoder.eof()
    assert info.value.reason is CloseReason.TRUNCATED


def test_decoder_compacts_its_buffer() -> None:
    decoder = FrameDecoder()
    raw = encode(FRAMES[1])
    for _ in range(200):
        decoder.receive_data(raw)
        assert decoder.next_frame() == FRAMES[1]
    # After many frames the consumed prefix is dropped rather than kept forever.
    assert len(decoder._buf) <= 2 * len(raw)
    assert decoder.buffered_bytes == 0
