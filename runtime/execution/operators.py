"""Operator chains: the nodes of one task composed into a single per-record function.

The chain is built back to front: each operator becomes a small closure
that calls the next one directly, so a record crosses a whole chain with
plain function calls and no per-operator queue. The tail of the chain is the
task's output (record writers) or a sink.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from runtime.api import Context, Job, KeyedContext, Node, ProcessFunction
from runtime.connectors.sinks import Sink
from runtime.execution.channels import Subpartition
from runtime.graph.partitioning import KeyRouter

Emit = Callable[[Any], None]
_MISSING = object()


class RecordWriter:
    """Serialises records once and routes them to the subpartitions of one output edge."""

    def __init__(self, subpartitions: list[Subpartition], partitioner: str, key_fn: Callable[[Any], Any] | None,
                 max_parallelism: int, subtask_index: int) -> None:
        self.subpartitions = subpartitions
        self.partitioner = partitioner
        self.key_fn = key_fn
        self.router = KeyRouter(max_parallelism, len(subpartitions))
        self._next = subtask_index % len(subpartitions)  # rebalance: start at our own index, spread the load
        self.emit = self._make_emit()

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

    def flush(self) -> None:
        for s in self.subpartitions:
            s.flush()


class Chain:
    """The operators of one task, and the function that pushes a record through them."""

    def __init__(self, job: Job, node_ids: list[int], *, subtask_index: int, parallelism: int, attempt: int,
                 outputs: list[RecordWriter]) -> None:
        self.nodes: list[Node] = [job.nodes[i] for i in node_ids]
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.attempt = attempt
        self.outputs = outputs
        self.records_out = 0
        self.sinks: list[Sink] = []
        self.functions: list[ProcessFunction] = []
        self.keyed_state: dict[int, dict[str, dict[Any, Any]]] = {}  # node id -> state name -> key -> value
        self._contexts: list[tuple[ProcessFunction, Context]] = []
        self._restored_sinks: list[Any] | None = None
        self.process = self._build()

    def _tail(self) -> Emit:
        emits = [w.emit for w in self.outputs]
        if not emits:
            def drop(record: Any) -> None:
                pass

            return drop
        if len(emits) == 1:
            only = emits[0]

            def emit_counted(record: Any) -> None:
                self.records_out += 1
                only(record)

            return emit_counted

        def emit_each(record: Any) -> None:
            self.records_out += 1
            for e in emits:
                e(record)

        return emit_each

    def _build(self) -> Emit:
        nxt = self._tail()
        start = 1 if self.nodes[0].kind == "source" else 0
        for node in reversed(self.nodes[start:]):
            nxt = self._wrap(node, nxt)
        return nxt

    def _wrap(self, node: Node, nxt: Emit) -> Emit:
        kind = node.kind
        fn = node.payload
        if kind == "map":
            def run_map(record: Any) -> None:
                nxt(fn(record))

            return run_map
        if kind == "filter":
            def run_filter(record: Any) -> None:
                if fn(record):
                    nxt(record)

            return run_filter
        if kind == "flat_map":
            def run_flat_map(record: Any) -> None:
                for out in fn(record):
                    nxt(out)

            return run_flat_map
        if kind == "process":
            ctx = Context(nxt, self.subtask_index, node.parallelism, node.name)
            self._contexts.append((fn, ctx))
            process = fn.process

            def run_process(record: Any) -> None:
                process(record, ctx)

            return run_process
        if kind == "keyed_process":
            state = self.keyed_state.setdefault(node.id, {})
            kctx = KeyedContext(nxt, self.subtask_index, node.parallelism, node.name, state)
            self._contexts.append((fn, kctx))
            kprocess = fn.process
            key_fn = node.key_fn
            assert key_fn is not None

            def run_keyed(record: Any) -> None:
                kctx.current_key = key_fn(record)
                kprocess(record, kctx)

            return run_keyed
        if kind == "reduce":
            table = self.keyed_state.setdefault(node.id, {}).setdefault("reduce", {})
            rkey = node.key_fn
            assert rkey is not None

            def run_reduce(record: Any) -> None:
                key = rkey(record)
                acc = table.get(key, _MISSING)
                acc = record if acc is _MISSING else fn(acc, record)
                table[key] = acc
                nxt(acc)

            return run_reduce
        if kind == "sink":
            sink: Sink = fn
            self.sinks.append(sink)
            write = sink.write
            if sink.delay_per_record_s > 0:
                throttle = sink.throttle

                def run_slow_sink(record: Any) -> None:
                    self.records_out += 1
                    write(record)
                    throttle()

                return run_slow_sink

            def run_sink(record: Any) -> None:
                self.records_out += 1
                write(record)

            return run_sink
        raise ValueError(f"operator kind {kind!r} cannot run inside a chain")

    # -- checkpoints ------------------------------------------------------------

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
        self._restored_sinks = list(sinks or [])

    def open(self) -> None:
        restored = self._restored_sinks
        for i, sink in enumerate(self.sinks):
            sink.open(self.subtask_index, self.parallelism, self.attempt)
            if restored is not None and i < len(restored):
                sink.restore_state(restored[i])
            elif self.attempt > 0:
                sink.restore_state(None)  # a restart without a checkpoint: drop earlier attempts' leftovers
        for fn, ctx in self._contexts:
            fn.open(ctx)

    def finish(self) -> None:
        """End of all input: sinks commit, writers flush."""
        for sink in self.sinks:
            sink.finish()
        for w in self.outputs:
            w.flush()

    def close(self) -> None:
        for fn, _ in self._contexts:
            fn.close()
        for sink in self.sinks:
            sink.close()
