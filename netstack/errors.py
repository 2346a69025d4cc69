"""Error types of the network stack, named by who broke what.

`LocalProtocolError` means this process misused the protocol (a bug here);
`RemoteProtocolError` means the peer did (bad frame, wrong token, data
without credit). `ConnectionLost` means the network or the peer went away.
Each carries a `CloseReason` so logs and metrics name the way a connection
ended without matching on message text.
"""

from __future__ import annotations

import enum


class CloseReason(enum.Enum):
    NORMAL = "normal"
    BAD_MAGIC = "bad magic"
    BAD_VERSION = "unsupported protocol version"
    UNKNOWN_TYPE = "unknown frame type"
    OVERSIZED = "frame larger than the configured maximum"
    TRUNCATED = "connection closed in the middle of a frame"
    BAD_TOKEN = "wrong cluster token"
    BAD_HANDSHAKE = "malformed handshake"
    UNKNOWN_CHANNEL = "frame for an unknown channel"
    NO_CREDIT = "data buffer sent without credit"
    BAD_SEQUENCE = "out-of-order sequence number"
    BAD_PAYLOAD = "payload does not decode"
    UNEXPECTED = "frame not allowed in this state"
    PEER_CLOSED = "peer closed the connection"
    IO_ERROR = "socket error"
    TIMEOUT = "timed out"
    LINK_TIMEOUT = "nothing heard from the peer within the link timeout"


class NetstackError(Exception):
    """Base of every error raised by netstack."""

    retriable = False

    def __init__(self, message: str, reason: CloseReason = CloseReason.UNEXPECTED) -> None:
        super().__init__(message)
        self.reason = reason


class LocalProtocolError(NetstackError):
    """This side tried to do something the protocol forbids."""


class RemoteProtocolError(NetstackError):
    """The peer sent something the protocol forbids; the connection must close."""


class ConnectionLost(NetstackError):
    """The peer or the network ended the connection (cause attached)."""

    retriable = True


class RpcError(NetstackError):
    """A remote procedure call failed on the remote side; `.remote_type` names its error."""

    def __init__(self, message: str, remote_type: str = "Error") -> None:
        super().__init__(message)
        self.remote_type = remote_type
