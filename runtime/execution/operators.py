"""Operator chains: the nodes of one task composed into a single function over a list of records.

The chain is built back to front: each operator becomes a small closure that
runs over a list of records and hands the list of its outputs to the next one,
so the per-record work is the user's function and little else (a map is one
`map` call, a process function emits with `list.append`). Every operator sees
the same records in the same order as with one record at a time; only the
interleaving of operators inside one list differs, and the task serves
checkpoints and mail between lists, never inside one. The tail of the chain is
the task's output (record writers, which pack a list per subpartition in one
call) or a sink.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress
from typing import Any

import msgpack

from runtime.api import Context, Job, KeyedContext, KeyedProcessFunction, Node, OperatorContext, ProcessFunction
from runtime.connectors.sinks import Sink
from runtime.execution.channels import Subpartition
from runtime.execution.timers import EVENT_TIME, PROCESSING_TIME, TIMER_TABLES, KeyedTimers, TimerQueue
from runtime.graph.partitioning import KeyRouter
from runtime.state.backend import PendingSnapshot, StateBackend
from runtime.state.tables import BackendTables

Emit = Callable[[Any], None]
EmitBatch = Callable[[list[Any]], None]
_MISSING = object()


def _array_header_len(n: int) -> int:
    """Bytes of the msgpack array header for `n` items: packing a list of records is that header followed by
    each record packed on its own."""
    return 1 if n < 16 else 3 if n < 0x10000 else 5


class RecordWriter:
    """Serialises records once and routes them to the subpartitions of one output edge."""

    def __init__(self, subpartitions: list[Subpartition], partitioner: str, key_fn: Callable[[Any], Any] | None,
                 max_parallelism: int, subtask_index: int) -> None:
        self.subpartitions = subpartitions
        self.partitioner = partitioner
        self.key_fn = key_fn
        self.router = KeyRouter(max_parallelism, len(subpartitions))
        self._next = subtask_index % len(subpartitions)  # rebalance: start at our own index, spread the load
        self.side_output: tuple[int, str] | None = None  # (node id, tag) for the edge of a side output
        self.emit = self._make_emit()
        self.emit_batch = self._make_emit_batch()

    def _make_emit(self) -> Emit:
        pack = msgpack.Packer().pack
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
        pack = msgpack.Packer().pack
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
            route = self.router.route
            # key -> target, looked up from C (map over dict.__getitem__); the router fills it on a miss
            cache: dict[Any, int] = {}
            lookup = cache.__getitem__
            few = len(subs) <= 8
            pairs = [(sub, target.__eq__) for target, sub in enumerate(subs)]

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
                targets = targets_of(list(map(key_fn, records)))
                if few:  # one C pass over the targets per subpartition beats a Python loop over the records
                    for sub, is_target in pairs:
                        bucket = list(compress(records, map(is_target, targets)))
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
        key_fn = self.key_fn
        if key_fn is not None:
            self.key_fn = lambda pair: key_fn(pair[1])
        self.emit = self._make_emit()
        self.emit_batch = self._make_emit_batch()

    def emit_marker(self, marker: Any) -> None:
        """A watermark (an int) or a status marker, in-band after the records before it, on every channel."""
        data = msgpack.packb(marker)
        for s in self.subpartitions:
            s.append(data)


class TimerFiring:
    """The timers of a chain's keyed operator, and how to fire them into the rest of the chain."""

    def __init__(self, timers: KeyedTimers, ctx: KeyedContext,
                 fire: Callable[[TimerQueue, str, int, int], int]) -> None:
        self.timers = timers
        self.ctx = ctx
        self._fire = fire

    def set_watermark(self, watermark: int) -> None:
        self.ctx.current_watermark = watermark

    def event_due(self, watermark: int) -> bool:
        ts = self.timers.event.peek()
        return ts is not None and ts <= watermark

    def fire_event(self, watermark: int, limit: int) -> bool:
        """Fire up to `limit` event-time timers due at `watermark`; True when more are due."""
        self._fire(self.timers.event, EVENT_TIME, watermark, limit)
        return self.event_due(watermark)

    def processing_due(self, now_ms: int) -> bool:
        ts = self.timers.processing.peek()
        return ts is not None and ts <= now_ms

    def fire_processing(self, now_ms: int, limit: int) -> bool:
        self._fire(self.timers.processing, PROCESSING_TIME, now_ms, limit)
        return self.processing_due(now_ms)

    def rebuild(self) -> None:
        self.timers.event.rebuild()
        self.timers.processing.rebuild()


class Chain:
    """The operators of one task, and the function that pushes a record through them."""

    def __init__(self, job: Job, node_ids: list[int], *, subtask_index: int, parallelism: int, attempt: int,
                 outputs: list[RecordWriter], state_backend: StateBackend | None = None) -> None:
        self.nodes: list[Node] = [job.nodes[i] for i in node_ids]
        self.max_parallelism = job.max_parallelism
        # None: keyed state in plain dicts (the memory backend's fast path); else tables on this backend
        self.state_backend = state_backend
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.attempt = attempt
        self.outputs = outputs
        self.records_out = 0
        self.sinks: list[Sink] = []
        self.functions: list[ProcessFunction] = []
        self.keyed_state: dict[int, dict[str, dict[Any, Any]]] = {}  # node id -> state name -> key -> value
        self.list_state: dict[int, dict[str, list[Any]]] = {}  # node id -> name -> [mode, items] (OperatorContext)
        # (function, its context, a flush of what it emitted outside a batch: in open())
        self._contexts: list[tuple[ProcessFunction, Context, Callable[[], None]]] = []
        self._restored_sinks: list[Any] | None = None
        # event time: records are (timestamp, record) pairs inside the chain and on its output edges
        self.event_time = job.event_time
        self.watermarks = self.nodes[0].watermarks if self.nodes[0].kind == "source" else None
        self.timers: TimerFiring | None = None  # of the keyed operator, if the chain has one
        if self.event_time:
            for w in outputs:
                w.carry_timestamps()
        self.process_batch = self._build()

    def _keyed_tables(self, node_id: int) -> dict[str, Any]:
        """The keyed-state tables of one operator: dicts, or BackendTables on a state backend."""
        tables = self.keyed_state.get(node_id)
        if tables is None:
            tables = self.keyed_state[node_id] = {} if self.state_backend is None else \
                BackendTables(self.state_backend, node_id, self.max_parallelism)
        return tables

    def process(self, record: Any) -> None:
        """One record through the chain (restored state, tests); the task uses `process_batch`."""
        self.process_batch([record])

    def _tail(self) -> EmitBatch:
        emits = [w.emit_batch for w in self.outputs if w.side_output is None]
        if not emits:
            def drop(records: list[Any]) -> None:
                pass

            return drop
        if len(emits) == 1:
            only = emits[0]

            def emit_counted(records: list[Any]) -> None:
                self.records_out += len(records)
                only(records)

            return emit_counted

        def emit_each(records: list[Any]) -> None:
            self.records_out += len(records)
            for e in emits:
                e(records)

        return emit_each

    def _build(self) -> EmitBatch:
        nxt = self._tail()
        start = 1 if self.nodes[0].kind == "source" else 0
        wrap = self._wrap_timed if self.event_time else self._wrap
        for node in reversed(self.nodes[start:]):
            nxt = wrap(node, nxt)
        return nxt

    @staticmethod
    def _emit_pending(pending: list[Any], nxt: EmitBatch) -> None:
        # the next operator consumes the list before returning; keep the same list for the next batch
        if pending:
            try:
                nxt(pending)
            finally:
                pending.clear()

    def _wrap(self, node: Node, nxt: EmitBatch) -> EmitBatch:
        kind = node.kind
        fn = node.payload
        if kind == "map":
            def run_map(records: list[Any]) -> None:
                nxt(list(map(fn, records)))

            return run_map
        if kind == "filter":
            def run_filter(records: list[Any]) -> None:
                kept = list(filter(fn, records))
                if kept:
                    nxt(kept)

            return run_filter
        if kind == "flat_map":
            def run_flat_map(records: list[Any]) -> None:
                out: list[Any] = []
                extend = out.extend
                for record in records:
                    extend(fn(record))
                if out:
                    nxt(out)

            return run_flat_map
        emit_pending = self._emit_pending
        if kind == "process":
            pending: list[Any] = []
            ctx = OperatorContext(pending.append, self.subtask_index, node.parallelism, node.name,
                                  self.list_state.setdefault(node.id, {}))
            self._route_side_outputs(node, ctx)
            self._contexts.append((fn, ctx, lambda: emit_pending(pending, nxt)))
            process = fn.process

            def run_process(records: list[Any]) -> None:
                for record in records:
                    process(record, ctx)
                emit_pending(pending, nxt)

            return run_process
        if kind == "keyed_process":
            state = self._keyed_tables(node.id)
            keyed_pending: list[Any] = []
            kctx = KeyedContext(keyed_pending.append, self.subtask_index, node.parallelism, node.name, state)
            self._route_side_outputs(node, kctx)
            self._contexts.append((fn, kctx, lambda: emit_pending(keyed_pending, nxt)))
            self._install_timers(fn, kctx, node.id, lambda: emit_pending(keyed_pending, nxt))
            kprocess = fn.process
            key_fn = node.key_fn
            assert key_fn is not None

            def run_keyed(records: list[Any]) -> None:
                for record in records:
                    kctx.current_key = key_fn(record)
                    kprocess(record, kctx)
                emit_pending(keyed_pending, nxt)

            return run_keyed
        if kind == "reduce":
            table = self._keyed_tables(node.id).setdefault("reduce", {})
            rkey = node.key_fn
            assert rkey is not None
            get = table.get

            def run_reduce(records: list[Any]) -> None:
                out: list[Any] = []
                add = out.append
                for record in records:
                    key = rkey(record)
                    acc = get(key, _MISSING)
                    acc = record if acc is _MISSING else fn(acc, record)
                    table[key] = acc
                    add(acc)
                nxt(out)

            return run_reduce
        if kind == "sink":
            sink: Sink = fn
            self.sinks.append(sink)
            write = sink.write
            if sink.delay_per_record_s > 0:
                throttle = sink.throttle

                def run_slow_sink(records: list[Any]) -> None:
                    for record in records:
                        self.records_out += 1
                        write(record)
                        throttle()

                return run_slow_sink

            def run_sink(records: list[Any]) -> None:
                self.records_out += len(records)
                for record in records:
                    write(record)

            return run_sink
        raise ValueError(f"operator kind {kind!r} cannot run inside a chain")

    def _route_side_outputs(self, node: Node, ctx: Context) -> None:
        """`ctx.output(tag, value)` of `node`: straight to the writers of the edges that consume that side output
        (a side output is never chained); a tag nobody consumes is dropped."""
        by_tag: dict[str, list[EmitBatch]] = {}
        for w in self.outputs:
            if w.side_output is not None and w.side_output[0] == node.id:
                by_tag.setdefault(w.side_output[1], []).append(w.emit_batch)
        if not by_tag:
            return
        timed = self.event_time

        def side(tag: str, value: Any) -> None:
            emits = by_tag.get(tag)
            if emits:
                self.records_out += 1
                batch = [(ctx.timestamp, value)] if timed else [value]
                for emit in emits:
                    emit(batch)

        ctx._side = side

    # -- event time -----------------------------------------------------------------

    def _install_timers(self, fn: ProcessFunction, kctx: KeyedContext, node_id: int,
                        flush: Callable[[], None]) -> None:
        state = self.keyed_state[node_id]
        event = TimerQueue(state.setdefault(TIMER_TABLES[EVENT_TIME], {}))
        processing = TimerQueue(state.setdefault(TIMER_TABLES[PROCESSING_TIME], {}))
        timers = KeyedTimers(event, processing, lambda: kctx.current_key)
        kctx.timers = timers
        on_timer = fn.on_timer if isinstance(fn, KeyedProcessFunction) else None

        def fire(queue: TimerQueue, domain: str, upto: int, limit: int) -> int:
            n = 0
            kctx.time_domain = domain
            try:
                while n < limit:
                    due = queue.pop_due(upto)
                    if due is None:
                        break
                    ts, key = due
                    kctx.current_key = key
                    kctx.timestamp = ts
                    if on_timer is not None:
                        on_timer(ts, kctx)
                    n += 1
            finally:
                kctx.time_domain = None
            flush()
            return n

        self.timers = TimerFiring(timers, kctx, fire)

    def forward_watermark(self, watermark: int) -> None:
        """The chain's operators reached `watermark` (timers of the keyed one have fired): send it on."""
        for _, ctx, _ in self._contexts:
            ctx.current_watermark = watermark
        for w in self.outputs:
            w.emit_marker(watermark)

    def forward_status(self, marker: str) -> None:
        for w in self.outputs:
            w.emit_marker(marker)

    def restore_watermarks(self, operator: int, forwarded: int) -> None:
        """After a restore: the keyed operator is at `operator` (its timers may still be due), the operators
        after it at `forwarded`."""
        for _, ctx, _ in self._contexts:
            ctx.current_watermark = forwarded
        if self.timers is not None:
            self.timers.set_watermark(operator)

    def _wrap_timed(self, node: Node, nxt: EmitBatch) -> EmitBatch:
        """`_wrap` for (timestamp, record) pairs: an operator's outputs inherit the timestamp of its input."""
        kind = node.kind
        fn = node.payload
        if kind == "map":
            def run_map(items: list[Any]) -> None:
                nxt([(t, fn(r)) for t, r in items])

            return run_map
        if kind == "filter":
            def run_filter(items: list[Any]) -> None:
                kept = [p for p in items if fn(p[1])]
                if kept:
                    nxt(kept)

            return run_filter
        if kind == "flat_map":
            def run_flat_map(items: list[Any]) -> None:
                out = [(t, o) for t, r in items for o in fn(r)]
                if out:
                    nxt(out)

            return run_flat_map
        emit_pending = self._emit_pending
        if kind == "process":
            pending: list[Any] = []
            add = pending.append
            ctx = Context(add, self.subtask_index, node.parallelism, node.name)
            ctx.emit = lambda record: add((ctx.timestamp, record))
            self._route_side_outputs(node, ctx)
            self._contexts.append((fn, ctx, lambda: emit_pending(pending, nxt)))
            process = fn.process

            def run_process(items: list[Any]) -> None:
                for t, record in items:
                    ctx.timestamp = t
                    process(record, ctx)
                emit_pending(pending, nxt)

            return run_process
        if kind == "keyed_process":
            state = self._keyed_tables(node.id)
            keyed_pending: list[Any] = []
            kadd = keyed_pending.append
            kctx = KeyedContext(kadd, self.subtask_index, node.parallelism, node.name, state)
            kctx.emit = lambda record: kadd((kctx.timestamp, record))
            self._route_side_outputs(node, kctx)
            self._contexts.append((fn, kctx, lambda: emit_pending(keyed_pending, nxt)))
            self._install_timers(fn, kctx, node.id, lambda: emit_pending(keyed_pending, nxt))
            kprocess = fn.process
            key_fn = node.key_fn
            assert key_fn is not None

            def run_keyed(items: list[Any]) -> None:
                for t, record in items:
                    kctx.current_key = key_fn(record)
                    kctx.timestamp = t
                    kprocess(record, kctx)
                emit_pending(keyed_pending, nxt)

            return run_keyed
        if kind == "reduce":
            table = self._keyed_tables(node.id).setdefault("reduce", {})
            rkey = node.key_fn
            assert rkey is not None
            get = table.get

            def run_reduce(items: list[Any]) -> None:
                out: list[Any] = []
                add = out.append
                for t, record in items:
                    key = rkey(record)
                    acc = get(key, _MISSING)
                    acc = record if acc is _MISSING else fn(acc, record)
                    table[key] = acc
                    add((t, acc))
                nxt(out)

            return run_reduce
        if kind == "sink":
            write_pairs = self._wrap(node, nxt)

            def run_sink(items: list[Any]) -> None:
                write_pairs([r for _, r in items])

            return run_sink
        raise ValueError(f"operator kind {kind!r} cannot run inside a chain")

    # -- checkpoints ------------------------------------------------------------

    def begin_state_snapshot(self, checkpoint_id: int) -> PendingSnapshot | None:
        """The synchronous part of the state backend's snapshot (None on the memory path: the task copies its
        dict tables instead)."""
        return None if self.state_backend is None else self.state_backend.begin_snapshot(checkpoint_id)

    def snapshot_sinks(self, checkpoint_id: int) -> list[Any]:
        """Pre-commit every sink for `checkpoint_id`; returns their states, in chain order."""
        return [sink.snapshot_state(checkpoint_id) for sink in self.sinks]

    def commit_sinks(self, checkpoint_id: int) -> None:
        for sink in self.sinks:
            sink.commit(checkpoint_id)

    def restore_state(self, keyed: dict[int, dict[str, dict[Any, Any]]], sinks: list[Any] | None) -> None:
        """Load keyed state in place (closures hold the tables) and hand sinks their pre-committed files."""
        for node, tables in keyed.items():
            for name, restored in tables.items():
                table = self.keyed_state.setdefault(node, {}).setdefault(name, {})
                table.clear()
                table.update(restored)
        if self.timers is not None:
            self.timers.rebuild()  # their tables were just restored
        self._restored_sinks = list(sinks or [])

    def snapshot_lists(self) -> dict[int, dict[str, list[Any]]]:
        """Copies of the list states (items are immutable by contract), for a snapshot."""
        return {node: {name: [mode, list(items)] for name, (mode, items) in tables.items()}
                for node, tables in self.list_state.items() if tables}

    def restore_lists(self, lists: dict[int, dict[str, list[Any]]]) -> None:
        """Load list state in place (contexts hold the per-node tables), before `open`."""
        for node, tables in lists.items():
            table = self.list_state.setdefault(node, {})
            table.clear()
            table.update({name: [mode, list(items)] for name, (mode, items) in tables.items()})

    def open(self) -> None:
        restored = self._restored_sinks
        for i, sink in enumerate(self.sinks):
            sink.open(self.subtask_index, self.parallelism, self.attempt)
            if restored is not None and i < len(restored):
                sink.restore_state(restored[i])
            elif self.attempt > 0:
                sink.restore_state(None)  # a restart without a checkpoint: drop earlier attempts' leftovers
        for fn, ctx, flush in self._contexts:
            fn.open(ctx)
            flush()  # records emitted in open() go out now, as they did before batching

    def finish(self) -> None:
        """End of all input: sinks commit, writers flush."""
        for sink in self.sinks:
            sink.finish()
        for w in self.outputs:
            w.flush()

    def close(self) -> None:
        for fn, _, _ in self._contexts:
            fn.close()
        for sink in self.sinks:
            sink.close()
        if self.state_backend is not None:
            self.state_backend.close()
