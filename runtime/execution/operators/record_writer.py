"""Record writers: the task's output edges, where a chain's records are packed once and routed to subpartitions.

A writer packs a whole list per subpartition in one msgpack call (`emit_batch`) and cuts buffers exactly where
packing record by record would (the consumer's channel state depends on it).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress, repeat
from operator import eq, itemgetter, not_
from typing import Any

import msgpack

from runtime.common.values import packer_default
from runtime.execution.channels import Subpartition
from runtime.graph.partitioning import KeyRouter

Emit = Callable[[Any], None]
EmitBatch = Callable[[list[Any]], None]
_record_of_pair = itemgetter(1)


def _array_header_len(n: int) -> int:
    """Bytes of the msgpack array header for `n` items: packing a list of records is that header followed by
    each record packed on its own."""
    return 1 if n < 16 else 3 if n < 0x10000 else 5


class RecordWriter:
    """Serialises records once and routes them to the subpartitions of one output edge."""

    def __init__(self, subpartitions: list[Subpartition], partitioner: str, key_fn: Callable[[Any], Any] | None,
                 max_parallelism: int, subtask_index: int, *, producer: str = "an operator") -> None:
        self.subpartitions = subpartitions
        self.partitioner = partitioner
        self.key_fn = key_fn  # of a record, also once records travel in pairs
        self.pairs = False  # records travel as (timestamp, record) pairs (carry_timestamps): keyed by the record
        self.router = KeyRouter(max_parallelism, len(subpartitions))
        # msgpack packs the types it knows in C; anything else is pickled (runtime/common/values.py), and a value
        # pickle refuses fails the job naming `producer` and the type
        self._default = packer_default(producer)
        self._next = subtask_index % len(subpartitions)  # rebalance: start at our own index, spread the load
        self.side_output: tuple[int, str] | None = None  # (node id, tag) for the edge of a side output
        self.emit = self._make_emit()
        self.emit_batch = self._make_emit_batch()

    def _make_emit(self) -> Emit:
        pack = msgpack.Packer(default=self._default).pack
        subs = self.subpartitions
        if self.partitioner == "forward" or len(subs) == 1:
            only = subs[0]
            append = only.append

            def emit_one(record: Any) -> None:
                append(pack(record))

            return emit_one
        if self.partitioner == "hash":
            key_fn = self.key_fn
            assert key_fn is not None
            route = self.router.route
            appends = [s.append for s in subs]
            if self.pairs:
                def emit_pair(pair: Any) -> None:
                    appends[route(key_fn(pair[1]))](pack(pair))

                return emit_pair

            def emit_hash(record: Any) -> None:
                appends[route(key_fn(record))](pack(record))

            return emit_hash
        if self.partitioner == "broadcast":
            def emit_all(record: Any) -> None:
                data = pack(record)
                for s in subs:
                    s.append(data)

            return emit_all
        n = len(subs)

        def emit_rebalance(record: Any) -> None:
            i = self._next
            self._next = i + 1 if i + 1 < n else 0
            subs[i].append(pack(record))

        return emit_rebalance

    def _make_emit_batch(self) -> EmitBatch:
        pack = msgpack.Packer(default=self._default).pack
        subs = self.subpartitions

        def append_records(sub: Subpartition, records: list[Any]) -> None:
            # one msgpack call for the whole list, minus its array header
            if sub.append_run(pack(records)[_array_header_len(len(records)):]):
                return
            append = sub.append  # the list crosses a cut: record by record until the cut, then the rest as a run
            for i, record in enumerate(records):
                cuts = sub.buffers_out
                append(pack(record))
                if sub.buffers_out != cuts:
                    rest = records[i + 1:]
                    if rest:
                        append_records(sub, rest)
                    return

        if self.partitioner == "forward" or len(subs) == 1:
            only = subs[0]

            def emit_one(records: list[Any]) -> None:
                append_records(only, records)

            return emit_one
        if self.partitioner == "hash":
            key_fn = self.key_fn
            assert key_fn is not None
            pairs = self.pairs

            def keys_of(records: list[Any]) -> list[Any]:
                if pairs:  # the user's key function over the records, from C: no wrapper call per pair
                    return list(map(key_fn, map(_record_of_pair, records)))
                return list(map(key_fn, records))
            route = self.router.route
            # key -> target, looked up from C (map over dict.__getitem__); the router fills it on a miss
            cache: dict[Any, int] = {}
            lookup = cache.__getitem__
            few = len(subs) <= 8
            two = len(subs) == 2
            first, second = subs[0], subs[-1]

            def targets_of(keys: list[Any]) -> list[int]:
                try:
                    return list(map(lookup, keys))
                except (KeyError, TypeError):  # a new key, or an unhashable one (routed without caching)
                    targets = list(map(route, keys))
                    if len(cache) > KeyRouter.CACHE_LIMIT:
                        cache.clear()
                    for key, target in zip(keys, targets, strict=True):
                        try:
                            cache[key] = target
                        except TypeError:
                            pass
                    return targets

            def emit_hash(records: list[Any]) -> None:
                targets = targets_of(keys_of(records))
                if two:  # the targets are 0 and 1: they select subpartition 1's records themselves
                    bucket = list(compress(records, map(not_, targets)))
                    if bucket:
                        append_records(first, bucket)
                    bucket = list(compress(records, targets))
                    if bucket:
                        append_records(second, bucket)
                    return
                if few:  # one C pass over the targets per subpartition beats a Python loop over the records
                    for target, sub in enumerate(subs):
                        bucket = list(compress(records, map(eq, targets, repeat(target))))
                        if bucket:
                            append_records(sub, bucket)
                    return
                buckets: list[list[Any]] = [[] for _ in subs]
                adds = [b.append for b in buckets]
                for record, target in zip(records, targets, strict=True):
                    adds[target](record)
                for sub, bucket in zip(subs, buckets, strict=True):
                    if bucket:
                        append_records(sub, bucket)

            return emit_hash
        if self.partitioner == "broadcast":
            def emit_all(records: list[Any]) -> None:
                for sub in subs:
                    append_records(sub, records)

            return emit_all
        n = len(subs)

        def emit_rebalance(records: list[Any]) -> None:
            start = self._next
            for j in range(min(n, len(records))):  # record j goes to subpartition (start + j) % n, as one by one
                append_records(subs[(start + j) % n], records[j::n])
            self._next = (start + len(records)) % n

        return emit_rebalance

    def flush(self) -> None:
        for s in self.subpartitions:
            s.flush()

    # -- event time ---------------------------------------------------------------

    def carry_timestamps(self) -> None:
        """Records become [timestamp, record] pairs on this edge (a job with event time); routing still
        keys on the record."""
        self.pairs = True
        self.emit = self._make_emit()
        self.emit_batch = self._make_emit_batch()

    def emit_marker(self, marker: Any) -> None:
        """A watermark (an int) or a status marker, in-band after the records before it, on every channel."""
        data = msgpack.packb(marker)
        for s in self.subpartitions:
            s.append(data)
