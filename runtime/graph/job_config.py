"""A job's configuration as one typed value, built once where the job is submitted (or its record loaded).

The submission's `config` document (README, Job configuration) is parsed and checked here, once; a bad value
is refused with the key and what is accepted. After that the coordinator (scheduler, job store, autoscale)
and the workers (deploy) read attributes, never keys: the configuration crosses the wire as `to_wire()` and
comes back with `from_wire()`, and the job store keeps `to_document()`, the same flat document the records
always held, so records written before this module existed still load.

The checkpoint and restart settings of a submission are the coordinator's (coordinator/checkpointing.py,
coordinator/restarts.py) and not part of this value; `async_state` is carried as given and checked by
runtime/execution/async_operator.py's AsyncStateSettings (the CLI checks it before submitting, every worker
on deploy), since its choices belong to the asynchronous state controller.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from runtime.common import state_backends
from runtime.graph.config import (
    DEFAULT_INFLIGHT_TARGET_S,
    parse_address_text,
    parse_duration,
    parse_duration_or_zero,
    parse_inflight_target,
    parse_never_or_duration,
    parse_parallelism,
    parse_positive,
)
from runtime.graph.flags import flag

# the groups of a job's flags in `sluice submit --help` (runtime/cli/job_options.py titles them)
NETWORK, CHECKPOINTS, STATE, ASYNC_STATE, RESTARTS = "network", "checkpoints", "state", "async_state", "restarts"
AUTOSCALER = "autoscaler"

NEVER = 0.0  # scale_down_after_s that disables scaling down


class JobConfigError(ValueError):
    """A job configuration value that cannot be used; the message names the key and what is accepted."""


def parse_scale_down_after(value: object) -> float:
    """'never' or a number of seconds >= 0 (0 also means never); raises ValueError."""
    if isinstance(value, str) and value.strip().lower() == "never":
        return NEVER
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or value == math.inf:
        raise JobConfigError(f"scale_down_after_s must be 'never' or seconds >= 0, got {value!r}")
    return float(value)


# The largest a network buffer grows to. A buffer costs about the same CPU whatever its size (a frame each way, a
# wake-up of the consuming task, a run handed to its thread): 128 KiB made the keyed count's CPU per record 8-10 %
# lower, but a backpressured job's aligned checkpoints 1.5-2x longer, past the in-flight target. So the default
# stays 32 KiB, and a throughput job may raise it (docs/BENCHMARKS.md, The cluster's CPU beyond the stages).
DEFAULT_BUFFER_BYTES = 32 * 1024


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """The network settings of every channel of the job (README, Tuning)."""

    buffer_bytes: int = field(default=DEFAULT_BUFFER_BYTES, metadata=flag(
        "--buffer-bytes", f"network buffer size (default {DEFAULT_BUFFER_BYTES})", parse=parse_positive, group=NETWORK))
    buffers_per_channel: int = field(default=4, metadata=flag(  # producer queue limit per subpartition
        "--buffers-per-channel", "output buffers a channel may queue before its task is backpressured (default 4)",
        parse=parse_positive, group=NETWORK))
    exclusive_credits: int = field(default=2, metadata=flag(
        "--exclusive-credits", "receiver buffers per channel (default 2)", parse=parse_positive, group=NETWORK))
    floating_credits: int = field(default=8, metadata=flag(
        "--floating-credits", "receiver buffers per gate lent on backlog (8)", parse=int, group=NETWORK))
    flush_timeout_s: float = field(default=0.05, metadata=flag(
        "--flush-timeout", "latency bound of a partial buffer (50ms)", parse=parse_duration, group=NETWORK))
    # in-flight data per channel, in seconds of its throughput: buffers shrink to fit (0 = fixed buffer_bytes)
    inflight_target_s: float = field(default=DEFAULT_INFLIGHT_TARGET_S, metadata=flag(
        "--inflight-target", "in-flight data per channel in seconds of its throughput; buffers shrink to fit, "
        "which bounds how long an aligned barrier waits (1s; 0 = fixed --buffer-bytes)",
        parse=parse_duration_or_zero, group=NETWORK))
    # unaligned checkpoints reference the buffers an earlier one already wrote instead of writing them again
    incremental_channel_state: bool = field(default=True, metadata=flag(
        "--no-incremental-channel-state", "unaligned checkpoints write every captured buffer, also those an "
        "earlier checkpoint already persisted (default: reference those)", action="store_false",
        group=CHECKPOINTS))

    def __post_init__(self) -> None:
        for name, least in (("buffer_bytes", 1), ("buffers_per_channel", 1), ("exclusive_credits", 1),
                            ("floating_credits", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise JobConfigError(f"{name} must be an integer >= {least}, got {value!r}")
        if not _is_number(self.flush_timeout_s) or not 0 < self.flush_timeout_s < math.inf:
            raise JobConfigError(f"flush_timeout_s must be seconds > 0, got {self.flush_timeout_s!r}")
        if not isinstance(self.incremental_channel_state, bool):
            raise JobConfigError(f"incremental_channel_state must be true or false, "
                                 f"got {self.incremental_channel_state!r}")

    @property
    def buffers_in_path(self) -> int:
        """Buffers one channel can hold at most: the producer's queue and all the receiver may grant it."""
        return self.buffers_per_channel + self.exclusive_credits + self.floating_credits


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Where keyed state lives (README, State backends); None: the job module's choice, else memory."""

    backend: str | None = field(default=None, metadata=flag(
        "--state-backend", f"where keyed state lives: {state_backends.help_text()}; default: the job's "
        "Job.state_backend, else memory", choices=state_backends.NAMES, group=STATE))
    remote_address: str | None = field(default=None, metadata=flag(  # HOST:PORT of the remote backend's server
        "--state-remote-address", "the state server of --state-backend remote", parse=parse_address_text,
        metavar="HOST:PORT", group=STATE))
    work_dir: str | None = field(default=None, metadata=flag(  # local working files (RocksDB)
        "--state-work-dir", "where workers keep local state (RocksDB instances; default: the system temp "
        "directory)", metavar="DIR", to_field=os.path.abspath, group=STATE))
    # backend options passed through to the backend; `round_trip_ms` (tests, benchmarks) adds a fixed delay
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        for name in ("backend", "remote_address", "work_dir"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise JobConfigError(f"state.{name} must be a non-empty string, got {value!r}")
        if not isinstance(self.options, Mapping):
            raise JobConfigError(f"state.options must be an object, got {self.options!r}")
        if self.backend == "remote" and not self.remote_address:
            raise JobConfigError("state backend remote needs state.remote_address HOST:PORT")
        if not _is_number(self.round_trip_ms) or not 0 <= self.round_trip_ms < math.inf:
            raise JobConfigError(f"state.options.round_trip_ms must be >= 0, got {self.options['round_trip_ms']!r}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def round_trip_ms(self) -> float:
        value = self.options.get("round_trip_ms") or 0
        return float(value) if _is_number(value) else math.nan

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {k: v for k, v in (("backend", self.backend), ("remote_address", self.remote_address),
                                                  ("work_dir", self.work_dir)) if v is not None}
        if self.options:
            doc["options"] = dict(self.options)
        return doc


def _parse_fraction(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None


@dataclass(frozen=True, slots=True)
class AutoscalerConfig:
    """The load-based autoscaler's settings (README, Autoscaling; the policy is coordinator/load_policy.py).

    Off by default. Enabled, the coordinator samples every vertex's rates and busy time, and once a window of
    `window_s` has been collected after a `stabilization_s` pause that follows every (re)start and decision,
    rescales a vertex whose load is above `target_utilization + utilization_boundary` of its capacity, or was
    below `target_utilization - utilization_boundary` throughout the window, to the parallelism that brings it
    to `target_utilization`; `dry_run` only reports the decisions."""

    enabled: bool = field(default=False, metadata=flag(
        "--autoscale", "rescale vertices by their load (README: Autoscaling); off by default",
        action="store_true", group=AUTOSCALER))
    dry_run: bool = field(default=False, metadata=flag(
        "--autoscale-dry-run", "with --autoscale: report the decisions (REST, UI, metrics), rescale nothing",
        action="store_true", group=AUTOSCALER))
    target_utilization: float = field(default=0.7, metadata=flag(
        "--autoscale-target-utilization", "the fraction of a vertex's capacity its load should take (0.7)",
        parse=_parse_fraction, metavar="FRACTION", group=AUTOSCALER))
    utilization_boundary: float = field(default=0.2, metadata=flag(
        "--autoscale-utilization-boundary", "no decision while the load is within this of the target (0.2)",
        parse=_parse_fraction, metavar="FRACTION", group=AUTOSCALER))
    window_s: float = field(default=30.0, metadata=flag(
        "--autoscale-window", "rates are averaged over this window before a decision (30s)",
        parse=parse_duration, metavar="DURATION", group=AUTOSCALER))
    stabilization_s: float = field(default=30.0, metadata=flag(
        "--autoscale-stabilization", "after a (re)start, a rescale or a decision, rates are not collected for "
        "this long (30s)", parse=parse_duration_or_zero, metavar="DURATION", group=AUTOSCALER))
    min_parallelism: int = field(default=1, metadata=flag(
        "--autoscale-min-parallelism", "no vertex is scaled below this (1)", parse=parse_positive, metavar="N",
        group=AUTOSCALER))
    max_parallelism: int | None = field(default=None, metadata=flag(  # None: the slots the cluster has
        "--autoscale-max-parallelism", "no vertex is scaled above this (default: the cluster's slots)",
        parse=parse_positive, metavar="N", group=AUTOSCALER))

    def __post_init__(self) -> None:
        for name in ("enabled", "dry_run"):
            if not isinstance(getattr(self, name), bool):
                raise JobConfigError(f"autoscaler.{name} must be true or false, got {getattr(self, name)!r}")
        if not _is_number(self.target_utilization) or not 0 < self.target_utilization <= 1:
            raise JobConfigError(f"autoscaler.target_utilization must be in (0, 1], got {self.target_utilization!r}")
        if not _is_number(self.utilization_boundary) or \
                not 0 <= self.utilization_boundary < self.target_utilization:
            raise JobConfigError("autoscaler.utilization_boundary must be >= 0 and below target_utilization, got "
                                 f"{self.utilization_boundary!r}")
        if not _is_number(self.window_s) or not 0 < self.window_s < math.inf:
            raise JobConfigError(f"autoscaler.window_s must be seconds > 0, got {self.window_s!r}")
        if not _is_number(self.stabilization_s) or not 0 <= self.stabilization_s < math.inf:
            raise JobConfigError(f"autoscaler.stabilization_s must be seconds >= 0, got {self.stabilization_s!r}")
        for name in ("min_parallelism", "max_parallelism"):
            n = getattr(self, name)
            if (n is not None or name == "min_parallelism") and (isinstance(n, bool) or not isinstance(n, int)
                                                                 or n < 1):
                raise JobConfigError(f"autoscaler.{name} must be an integer >= 1, got {n!r}")
        if self.max_parallelism is not None and self.max_parallelism < self.min_parallelism:
            raise JobConfigError(f"autoscaler.max_parallelism ({self.max_parallelism}) is below min_parallelism "
                                 f"({self.min_parallelism})")

    @property
    def scale_up_above(self) -> float:
        """A vertex whose load is above this fraction of its capacity is a bottleneck."""
        return round(self.target_utilization + self.utilization_boundary, 9)  # 0.7 + 0.2 is 0.8999999999999999

    @property
    def scale_down_below(self) -> float:
        """A vertex whose load stayed below this fraction of its capacity over the window is idle."""
        return round(self.target_utilization - self.utilization_boundary, 9)

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], *, ignore_unknown: bool = False) -> AutoscalerConfig:
        unknown = set(doc) - set(_AUTOSCALER_KEYS)
        if unknown and not ignore_unknown:
            raise JobConfigError(f"unknown autoscaler settings {sorted(unknown)}: choose from "
                                 f"{list(_AUTOSCALER_KEYS)}")
        return cls(**{k: v for k, v in doc.items() if k in _AUTOSCALER_KEYS})

    def to_document(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _AUTOSCALER_KEYS}


_AUTOSCALER_KEYS = tuple(f.name for f in fields(AutoscalerConfig))
_CHANNEL_KEYS = tuple(f.name for f in fields(ChannelConfig))
_STATE_KEYS = ("backend", "remote_address", "work_dir", "options")
KNOWN_KEYS = frozenset({*_CHANNEL_KEYS, "parallelism", "state", "async_state", "scale_down_after_s",
                        "allow_non_restored_state", "autoscaler"})


@dataclass(frozen=True, slots=True)
class JobConfig:
    """Everything a job was configured with besides its checkpoint and restart settings."""

    channels: ChannelConfig = field(default_factory=ChannelConfig)
    # parallelism overrides: operator name (or "*" for every operator) -> parallelism; empty: the job's own
    parallelism: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}), metadata=flag(
        "--parallelism", "run every operator (N) or the one named NAME (NAME=N, repeatable) at this "
        "parallelism; with --restore the checkpoint is redistributed to it", parse=parse_parallelism,
        metavar="N|NAME=N", action="append", to_field=dict))
    state: StateConfig = field(default_factory=StateConfig)
    # AsyncStateSettings' fields as given (runtime/execution/async_operator.py checks them); empty: defaults
    async_state: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # None: the coordinator's default; NEVER (0): never scale down
    scale_down_after_s: float | None = field(default=None, metadata=flag(
        "--scale-down-after", "a restart that waited this long for the slots the job asks for restarts at the "
        "largest parallelism the free slots allow (default: the coordinator's, 10s; 0 or never: wait)",
        parse=parse_never_or_duration, metavar="DURATION|never", group=RESTARTS))
    # a restore may drop the state of operators the job no longer has (runtime/graph/evolution.py)
    allow_non_restored_state: bool = field(default=False, metadata=flag(
        "--allow-non-restored-state", "with --restore: drop the state of operators (by uid) the job no longer "
        "has, instead of refusing the checkpoint (README: Evolving a job)", action="store_true",
        group=CHECKPOINTS))
    autoscaler: AutoscalerConfig = field(default_factory=AutoscalerConfig)  # load-based scaling, off by default

    def __post_init__(self) -> None:
        for name, n in self.parallelism.items():
            if not isinstance(name, str) or not name or isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise JobConfigError(f"parallelism must map operator names (or '*') to integers >= 1, "
                                     f"got {name!r}: {n!r}")
        if not isinstance(self.async_state, Mapping):
            raise JobConfigError(f"async_state must be an object, got {self.async_state!r}")
        if not isinstance(self.allow_non_restored_state, bool):
            raise JobConfigError("allow_non_restored_state must be true or false, got "
                                 f"{self.allow_non_restored_state!r}")
        object.__setattr__(self, "parallelism", MappingProxyType(dict(self.parallelism)))
        object.__setattr__(self, "async_state", MappingProxyType(dict(self.async_state)))

    @classmethod
    def from_document(cls, doc: Mapping[str, Any] | None, *, ignore_unknown: bool = False) -> JobConfig:
        """The configuration from a submission's (or a job record's) document; raises JobConfigError.

        `ignore_unknown` drops keys this version does not know (a record written by another version) instead
        of refusing them, as a submission's are."""
        doc = dict(doc or {})
        unknown = set(doc) - KNOWN_KEYS
        if unknown and not ignore_unknown:
            raise JobConfigError(f"unknown job settings {sorted(unknown)}: choose from {sorted(KNOWN_KEYS)}")
        channels = {k: doc[k] for k in _CHANNEL_KEYS if doc.get(k) is not None}
        if "inflight_target_s" in channels:
            try:
                channels["inflight_target_s"] = parse_inflight_target(channels["inflight_target_s"])
            except ValueError as exc:
                raise JobConfigError(f"inflight_target_s: {exc}") from None
        state = _object(doc, "state")
        unknown_state = set(state) - set(_STATE_KEYS)
        if unknown_state and not ignore_unknown:
            raise JobConfigError(f"unknown state settings {sorted(unknown_state)}: choose from {list(_STATE_KEYS)}")
        after = doc.get("scale_down_after_s")
        autoscaler = _object(doc, "autoscaler")
        try:
            return cls(channels=ChannelConfig(**channels), parallelism=_object(doc, "parallelism"),
                       state=StateConfig(**{k: v for k, v in state.items() if k in _STATE_KEYS}),
                       async_state=_object(doc, "async_state"),
                       scale_down_after_s=parse_scale_down_after(after) if after is not None else None,
                       allow_non_restored_state=doc.get("allow_non_restored_state", False),
                       autoscaler=AutoscalerConfig.from_document(autoscaler, ignore_unknown=ignore_unknown))
        except TypeError as exc:  # a wrongly typed value a comparison in a check tripped over
            raise JobConfigError(f"bad job settings: {exc}") from None

    def to_document(self) -> dict[str, Any]:
        """The flat JSON document a submission sends and a job record keeps (from_document reads it back)."""
        doc: dict[str, Any] = {k: getattr(self.channels, k) for k in _CHANNEL_KEYS}
        if self.parallelism:
            doc["parallelism"] = dict(self.parallelism)
        if state := self.state.to_document():
            doc["state"] = state
        if self.async_state:
            doc["async_state"] = dict(self.async_state)
        if self.scale_down_after_s is not None:
            doc["scale_down_after_s"] = self.scale_down_after_s
        if self.allow_non_restored_state:
            doc["allow_non_restored_state"] = True
        if self.autoscaler != AutoscalerConfig():  # records of jobs that never set it stay as they were
            doc["autoscaler"] = self.autoscaler.to_document()
        return doc

    # the deploy RPC carries the same document, msgpack-encoded
    to_wire = to_document

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> JobConfig:
        return cls.from_document(doc)

    def with_parallelism(self, parallelism: Mapping[str, int]) -> JobConfig:
        return replace(self, parallelism=parallelism)


def _object(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise JobConfigError(f"{key} must be an object, got {value!r}")
    return dict(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
