"""Error types of the network stack, named by who broke what.

`LocalProtocolError` means this process misused the protocol (a bug here);
`RemoteProtocolError` means the peer did (bad frame, wrong token, data
without credit). `ConnectionLost` means the network or the peer went away.
Each carries a `CloseReason` so logs and metrics name the way a connection
ended without matching on message text.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar


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
    """A remote procedure call failed on the remote side.

    The answer carries a code on the wire (the RPC response's error type); `from_wire` turns it back into the
    class that owns it, so callers catch `JobNotFound` or `NotLeader` instead of matching message text. A code
    no class owns (an unexpected exception's type name, say) stays a plain RpcError with that code."""

    code = "Error"  # the code a raise of this class sends; `codes` are older or finer codes it stands for too
    codes: ClassVar[tuple[str, ...]] = ()
    _by_code: ClassVar[dict[str, type[RpcError]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for code in (cls.code, *cls.codes):
            RpcError._by_code[code] = cls

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code or type(self).code

    @property
    def remote_type(self) -> str:  # the name this attribute had before the hierarchy
        return self.code

    @staticmethod
    def from_wire(message: str, code: str) -> RpcError:
        return RpcError._by_code.get(code, RpcError)(message, code or None)


class JobNotFound(RpcError):
    """No job (or, on a worker, no deployed job) has the id asked for; or no worker, for a worker's page."""

    code = "UnknownJob"
    codes = ("UnknownWorker",)


class InvalidRequest(RpcError):
    """The request itself is wrong (bad settings, an unknown operator, a checkpoint that cannot be restored):
    asking again unchanged gets the same answer."""

    code = "BadRequest"
    codes = ("BadSettings", "BadArgs", "BadRescaleRequest", "BadCheckpointRequest", "BadMode", "JobLoadError",
             "JobDefinitionError", "IncompatibleCheckpoint", "CorruptCheckpoint",
             "MissingExtra",  # the job needs an extra of the install that is not installed
             "BadProfileRequest")


class Forbidden(RpcError):
    """The caller may not do this (a path outside the trusted roots, a client registering as a worker)."""

    code = "PathNotAllowed"
    codes = ("NotAWorker",)


class Conflict(RpcError):
    """The request does not fit the job's (or worker's) current state: not running, another attempt, a rescale
    under way; it may work later."""

    code = "JobNotRunning"
    codes = ("WrongAttempt", "RescaleFailed", "RescaleCheckpointFailed", "NotRegistered", "WorkerLogUnavailable",
             "JobRecordFailed", "ProfileInProgress", "ProfilerUnavailable", "WorkerProfileUnavailable")


class NotLeader(RpcError):
    """This coordinator is a standby: the call did not run here, so trying the leader is safe."""

    code = "NotLeader"
    retriable = True


class MethodNotFound(RpcError):
    """The peer serves no such method (a version mismatch)."""

    code = "UnknownMethod"
