"""Restoring a checkpoint at another parallelism: which old state each new subtask takes. Pure, no I/O.

Keyed state is stored by key group; a subtask owns a contiguous range of groups (graph/partitioning.py), so
new subtask i takes, from every old subtask whose range overlaps its own, the groups in its range.

Channel state of an edge whose producer or consumer side changed parallelism is moved to the consumers:
the old channel (j, k) holds, in order, the records old consumer k had received and not processed (its input
channel state) and then those still queued at old producer j (its output channel state), all whole records.
Old producer j's records are replayed to a new consumer as if they came on the new channel from producer
j mod q_up (Flink's "virtual channels"): on a hash edge each record goes to the new subtask that owns its
key group, on a rebalance edge record n of old producer j goes to new consumer (j + n) mod q_down, on a
forward edge everything of old pair (j, j) goes to new pair (j mod q, j mod q). A broadcast edge is not split
but replicated: each new consumer continues one old consumer, state and channel state together (below).
Non-keyed list state is split round robin, or given whole to every subtask (union lists); so are the records
an async_map had in flight (keyed: they go by key group, as keyed state). See
docs/ARCHITECTURE.md, "Rescaling", for why this keeps every record exactly once and the order per (upstream
subtask, key).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from runtime.api.co_functions import BROADCAST_MODE, copy_items
from runtime.api.time import MIN_WATERMARK
from runtime.common.values import unpack_ext
from runtime.connectors.source import position_lanes, rescale_lanes
from runtime.execution.async_io import FORMAT as ASYNC_IO_FORMAT
from runtime.execution.async_io import KIND as ASYNC_IO
from runtime.execution.channels import split_records
from runtime.graph.partitioning import key_group, subtask_for_key_group


class RescaleError(ValueError):
    """The checkpoint cannot be restored at the new parallelism (one line, for the user)."""


def overlapping_subtasks(max_parallelism: int, old_parallelism: int, groups: range) -> list[int]:
    """The old subtasks whose key-group ranges overlap `groups` (in subtask order)."""
    if not groups:
        return []
    first = subtask_for_key_group(groups.start, max_parallelism, old_parallelism)
    last = subtask_for_key_group(groups.stop - 1, max_parallelism, old_parallelism)
    return list(range(first, last + 1))


def merge_keyed(parts: list[dict[int, dict[str, dict[Any, Any]]]]) -> dict[int, dict[str, dict[Any, Any]]]:
    """Keyed tables of several old subtasks, already cut to one key-group range: disjoint keys, so a union."""
    out: dict[int, dict[str, dict[Any, Any]]] = {}
    for part in parts:
        for node, tables in part.items():
            for name, table in tables.items():
                out.setdefault(node, {}).setdefault(name, {}).update(table)
    return out


# -- channel state ---------------------------------------------------------------------------------------------


def redistribute_edge(partitioner: str, streams: dict[tuple[int, int], bytes], *, consumer: int,
                      new_up: int, new_down: int, max_parallelism: int,
                      key_fn: Any = None, timestamped: bool = False) -> dict[int, bytes]:
    """New consumer `consumer`'s share of one edge's old channel state, by new producer index.

    `streams` maps old channel (producer j, consumer k) to its records: input then output channel state.
    The result keeps, for each old producer, its records in their old order (j ascending, then k), so the
    order per (old producer, key) is the old one; what reaches one new channel is processed before anything
    new on it.

    `timestamped`: a job with event time, whose records are [timestamp, record] pairs among watermark markers.
    On a hash or rebalance edge the markers are dropped (they belong to no key; the restored task starts from
    the lowest old watermark, see rescale_time, and the live upstream sends newer ones).
    """
    if partitioner == "broadcast":
        raise RescaleError("a broadcast edge's channel state is replicated, not split: use redistribute_broadcast")
    out: dict[int, list[bytes]] = {}
    by_producer: dict[int, list[bytes]] = {}
    for (j, _k), stream in sorted(streams.items()):
        if stream:
            by_producer.setdefault(j, []).append(stream)
    for j, parts in sorted(by_producer.items()):
        mine: list[bytes] = []
        n = 0
        for stream in parts:
            for record in split_records(stream):
                if timestamped and partitioner != "forward":
                    pair = msgpack.unpackb(record, use_list=False, raw=False, strict_map_key=False, ext_hook=unpack_ext)
                    if pair.__class__ is not tuple:
                        continue  # a marker
                if partitioner == "hash":
                    value = msgpack.unpackb(record, use_list=False, raw=False, strict_map_key=False,
                                           ext_hook=unpack_ext)
                    group = key_group(key_fn(value[1] if timestamped else value), max_parallelism)
                    target = subtask_for_key_group(group, max_parallelism, new_down)
                elif partitioner == "rebalance":
                    target = (j + n) % new_down
                    n += 1
                else:  # forward: producer and consumer share their index, at both parallelisms
                    target = j % new_down
                if target == consumer:
                    mine.append(record)
        if mine:
            channel = consumer if partitioner == "forward" else j % new_up
            out.setdefault(channel, []).extend(mine)
    return {channel: b"".join(records) for channel, records in out.items()}


# -- broadcast edges and replicated consumers -------------------------------------------------------------------
#
# On a broadcast edge every consumer receives every record of every producer. Producer j puts its barrier at one
# point of its output, the same for all its channels, so before the barrier every channel (j, k) carries the
# same records P_j. But under an unaligned checkpoint old consumer k had *processed* a prefix of P_j of its own
# length a(j, k) when it took its snapshot, so the channel states (j, k) = P_j[a(j, k):] differ from consumer to
# consumer, and each one completes only the operator state of its own consumer. A new consumer therefore
# continues exactly one old consumer, its replica: new consumer c takes old consumer c mod p's operator state and,
# from every old producer j, old channel (j, c mod p) whole, replayed on new channel (j mod q_up, c). Its state
# plus what it replays is P_j for every j, so it has seen every record before the barrier exactly once, in
# order; what follows the barrier it receives from every new producer like any consumer. A scale-down drops the
# consumers c >= q (their state and channel state are copies of a stream the others see too); what they emitted
# before the checkpoint, in flight included, is kept (it is their output channel state, moved as always). A
# scale-up clones consumers 0..p-1 round robin, as Flink does with broadcast state.


def replica_of(consumer: int, old_parallelism: int) -> int:
    """The old subtask a new subtask of a replicated (broadcast-fed) vertex continues."""
    return consumer % old_parallelism


def redistribute_broadcast(streams: dict[tuple[int, int], bytes], *, consumer: int, old_down: int,
                           new_up: int) -> dict[int, bytes]:
    """New consumer `consumer`'s share of a broadcast edge's old channel state, by new producer index: every
    old producer j's channel to the replica, whole and in order (producers ascending), on new channel j mod
    new_up."""
    replica = replica_of(consumer, old_down)
    out: dict[int, list[bytes]] = {}
    for (j, k), stream in sorted(streams.items()):
        if k == replica and stream:
            out.setdefault(j % new_up, []).append(stream)
    return {channel: b"".join(parts) for channel, parts in out.items()}


# -- non-keyed operator state (list state) ---------------------------------------------------------------------
#
# A function's list state is, per node and name, [mode, items]. On a rescale, "split" lists (ctx.list_state) are
# concatenated in old subtask order and item n goes to new subtask n mod q (Flink's even-split redistribution):
# every item lands in exactly one new subtask. "union" lists (ctx.union_list_state) go whole to every new
# subtask, which picks what it needs. A vertex fed by a broadcast edge is replicated instead (see above): its
# lists are its replica's, whatever their mode, because they pair with the replica's channel state.
# Broadcast state (runtime/api/co_functions.py) is a list-state entry of mode BROADCAST_MODE whose items are a
# map; its vertex always has a broadcast input, so it is always its replica's.

Lists = dict[int, dict[str, list[Any]]]  # node id -> name -> [mode, items]


def only_broadcast_state(old: Sequence[Lists | None]) -> bool:
    """Whether the old subtasks' lists are all broadcast state (which replicates also beside another input)."""
    return all(mode == BROADCAST_MODE for lists in old for tables in (lists or {}).values()
               for mode, _ in tables.values())


def rescale_lists(old: Sequence[Lists | None], new_parallelism: int, subtask: int, *,
                  replicated: bool = False) -> Lists:
    """New subtask `subtask`'s list state from the old subtasks' (None for one without any)."""
    if replicated:
        mine = old[replica_of(subtask, len(old))] if old else None
        return {node: {name: [mode, copy_items(items)] for name, (mode, items) in tables.items()}
                for node, tables in (mine or {}).items()}
    merged: dict[int, dict[str, list[Any]]] = {}
    for lists in old:
        for node, tables in (lists or {}).items():
            for name, (mode, items) in tables.items():
                entry = merged.setdefault(int(node), {}).setdefault(name, [mode, []])
                if entry[0] != mode:
                    raise RescaleError(f"list state {name!r} is a {entry[0]} list on one subtask and a {mode} "
                                       "list on another")
                entry[1].extend(items)
    out: Lists = {}
    for node, tables in merged.items():
        for name, (mode, items) in tables.items():
            share = items if mode == "union" else items[subtask::new_parallelism]
            out.setdefault(node, {})[name] = [mode, share]
    return out


# -- event time ------------------------------------------------------------------------------------------------


def rescale_time(states: list[Any]) -> dict[str, Any] | None:
    """Old subtasks' watermark states (Task.time_state) -> a new subtask's: per-channel watermarks cannot be
    split, so it starts from the lowest old watermark (it never runs ahead of an input it now reads); its
    channels start anew and count once their watermarks reach it."""
    present = [s for s in states if s]
    if not present:
        return None
    generators = [s["generator"] for s in present if "generator" in s]
    if generators:
        return {"generator": [min(g[0] for g in generators), min(g[1] for g in generators), False]}
    forwarded = min(int(s.get("forwarded", MIN_WATERMARK)) for s in present)
    currents = [int(s["combiner"]["current"]) for s in present if "combiner" in s]
    out: dict[str, Any] = {"forwarded": forwarded, "idle_forwarded": False}
    if currents:
        out["combiner"] = {"channels": {}, "current": max(min(currents), forwarded), "idle": False}
    return out


# -- sources and sinks -----------------------------------------------------------------------------------------


def rescale_source(states: list[Any], new_parallelism: int,
                   lanes_of: Callable[[Any, int, int, int], list[list[int]]] = position_lanes) -> list[Any]:
    """Old subtasks' source states ([position, emitted] each, None for one that had finished) -> new ones
    ([{"lanes": ...}, 0]): every unit left is read by exactly one new subtask (connectors/source.py).
    `lanes_of` is the source's `lanes` (its positions' own format -> lanes)."""
    old_parallelism = len(states)
    lanes = [lanes_of(s[0], int(s[1]), j, old_parallelism) if s else [] for j, s in enumerate(states)]
    return [[{"lanes": mine}, 0] for mine in rescale_lanes(lanes, new_parallelism)]


def rescale_sinks(states: Sequence[Sequence[Any] | None], new_parallelism: int, subtask: int,
                  checkpoint_id: int) -> list[Any]:
    """New subtask `subtask`'s sink states, in chain order: all pending files of old subtasks j with
    j mod q == subtask (so each is committed by exactly one new subtask), and the old subtasks it cleans up
    after (their in-progress files and those committed by later checkpoints)."""
    mine = [j for j in range(len(states)) if j % new_parallelism == subtask]
    width = max((len(s) for s in states if s), default=0)
    out: list[Any] = []
    for index in range(width):
        parts = [s[index] for s in (states[j] for j in mine) if s and index < len(s)]
        every = [s[index] for s in states if s and index < len(s)]
        if all(p is None for p in every):
            out.append(None)
            continue
        if not all(isinstance(p, dict) and "pending" in p for p in every):
            raise RescaleError(f"sink {index} of the chain keeps state that cannot be redistributed")
        out.append({"pending": [entry for p in parts for entry in p["pending"]], "checkpoint": checkpoint_id,
                    "subtasks": mine})
    return out


def rescale_async_io(docs: Sequence[dict[str, Any] | None], new_parallelism: int,
                     subtask: int) -> dict[str, Any] | None:
    """A non-keyed async_map's in-flight records: those of every old subtask's document (in subtask order) dealt
    round robin; new `subtask`'s share as a document of its own, or None. Watermarks stay behind: another
    subtask's watermark says nothing about this one's records (runtime/execution/async_io.py)."""
    records = [item for doc in docs if doc is not None for item in doc["replay"] if item[0] == "r"]
    mine = records[subtask::new_parallelism]
    if not mine:
        return None
    return {"format": ASYNC_IO_FORMAT, "kind": ASYNC_IO, "keyed": False, "subtask": None, "parallelism": None,
            "replay": mine}
