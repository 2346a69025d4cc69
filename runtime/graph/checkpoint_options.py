"""How one checkpoint is taken, as one frozen value from its request to every barrier (Flink's CheckpointOptions).

The coordinator builds it once, when a checkpoint is requested or falls due (CheckpointSettings.options in
coordinator/checkpointing.py): the mode, whether it is a savepoint, and the switching settings that apply to
that mode. The trigger instruction carries it, the `trigger_checkpoint` message carries it to the workers
(runtime/graph/protocol.py), and each barrier carries it downstream (runtime/checkpointing/barriers.py
BarrierSpec), so no layer copies its fields one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.graph.enums import CheckpointMode


@dataclass(frozen=True, slots=True)
class CheckpointOptions:
    mode: CheckpointMode = CheckpointMode.ALIGNED
    savepoint: bool = False  # always aligned, never switching channels
    aligned_timeout_s: float | None = None  # mode aligned_timeout: switch the whole task to unaligned after this
    # per-channel switching of an aligned checkpoint (runtime/checkpointing/barriers.py); None = off
    channel_timeout_s: float | None = None
    channel_inflight_bytes: int | None = None
    max_inflight_bytes: int | None = None  # the cap on one task's persisted in-flight bytes
    # shares no file with an earlier checkpoint (Flink's full checkpoint): every channel-state segment and state
    # backend file is written anew. The coordinator asks for it once storage lost files a checkpoint named
    # (a wiped or expired bucket), so later checkpoints stop referencing them; later ones may share its files.
    full: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", CheckpointMode(self.mode))  # a plain string from a caller or the wire

    @property
    def switching(self) -> bool:
        """Whether channels of this (aligned) checkpoint switch to unaligned one by one."""
        return (self.mode == CheckpointMode.ALIGNED and not self.savepoint
                and (self.channel_timeout_s is not None or self.channel_inflight_bytes is not None))

    @property
    def plain_aligned(self) -> bool:
        """Aligned without any switch to unaligned (a savepoint is one): its barriers always travel in-band."""
        return self.mode == CheckpointMode.ALIGNED and not self.switching

    def to_wire(self) -> dict[str, Any]:
        """The fields that are set (a plain checkpoint's document is just its mode)."""
        doc: dict[str, Any] = {"mode": self.mode.value}
        for name in ("aligned_timeout_s", "channel_timeout_s", "channel_inflight_bytes", "max_inflight_bytes"):
            if getattr(self, name) is not None:
                doc[name] = getattr(self, name)
        for flag in ("savepoint", "full"):
            if getattr(self, flag):
                doc[flag] = True
        return doc

    @classmethod
    def from_wire(cls, doc: Any) -> CheckpointOptions:
        """Raises TypeError or ValueError (a protocol decode turns them into BadArguments)."""
        if not isinstance(doc, dict):
            raise TypeError(f"expected an object, got {doc!r}")

        def number(name: str, kind: type) -> Any:
            value = doc.get(name)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name}: expected a number, got {value!r}")
            return kind(value)

        return cls(mode=CheckpointMode(doc.get("mode", CheckpointMode.ALIGNED)),
                   savepoint=bool(doc.get("savepoint", False)),
                   full=bool(doc.get("full", False)),
                   aligned_timeout_s=number("aligned_timeout_s", float),
                   channel_timeout_s=number("channel_timeout_s", float),
                   channel_inflight_bytes=number("channel_inflight_bytes", int),
                   max_inflight_bytes=number("max_inflight_bytes", int))
