"""Operator chains: the nodes of one task as operators, each feeding the next a list of records.

The chain builds its operators back to front (kinds.py), so each one binds the per-batch path of the next
once: the per-record work is the user's function and little else (a map is one `map` call, a process
function emits with `list.append`). Every operator sees the same records in the same order as with one
record at a time; only the interleaving of operators inside one list differs, and the task serves
checkpoints and mail between lists, never inside one. The tail of the chain is the task's output (record
writers, which pack a list per subpartition in one call) or a sink. A watermark goes through the operators
in order, after the records before it, and out on every writer.
"""

from __future__ import annotations

from typing import Any

from runtime.api import Job, Node
from runtime.api.co_functions import copy_items
from runtime.connectors.sinks import Sink
from runtime.connectors.source import SideOutputBatch
from runtime.execution.async_io import AsyncIOOperator
from runtime.execution.async_operator import AsyncOperator, AsyncStateSettings
from runtime.execution.operators.kinds import (
    AsyncKeyedOperator,
    AsyncMapOperator,
    Operator,
    OperatorSetup,
    SinkOperator,
    TimerFiring,
    make_operator,
)
from runtime.execution.operators.record_writer import EmitBatch, RecordWriter
from runtime.execution.operators.shapes import shape_of
from runtime.execution.operators.two_input import TWO_INPUT_OPERATORS
from runtime.execution.ttl_cleanup import AT_CHECKPOINT, GROUPS_AT_CHECKPOINT
from runtime.state.backend import PendingSnapshot, StateBackend
from runtime.state.tables import BackendTables


class ChainOutput(Operator):
    """The end of a chain: the writers of the task's main output edges (side outputs are routed by the
    operator that emits them)."""

    def __init__(self, outputs: list[RecordWriter]) -> None:
        super().__init__(None, None)
        self.outputs = outputs
        emits = [w.emit_batch for w in outputs if w.side_output is None]
        if not emits:
            def drop(records: list[Any]) -> None:
                pass

            self.inputs = (drop,)
            return
        if len(emits) == 1:
            only = emits[0]

            def emit_counted(records: list[Any]) -> None:
                self.records_out += len(records)
                only(records)

            self.inputs = (emit_counted,)
            return

        def emit_each(records: list[Any]) -> None:
            self.records_out += len(records)
            for e in emits:
                e(records)

        self.inputs = (emit_each,)

    def process_watermark(self, watermark: int, input_index: int = 0) -> None:
        for w in self.outputs:
            w.emit_marker(watermark)


class Chain:
    """The operators of one task, and the function that pushes a list of records through them."""

    def __init__(self, job: Job, node_ids: list[int], *, subtask_index: int, parallelism: int, attempt: int,
                 outputs: list[RecordWriter], state_backend: StateBackend | None = None,
                 async_state: AsyncStateSettings | None = None) -> None:
        self.nodes: list[Node] = [job.nodes[i] for i in node_ids]
        self.max_parallelism = job.max_parallelism
        # None: keyed state in plain dicts (the memory backend's fast path); else tables on this backend
        self.state_backend = state_backend
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.attempt = attempt
        self.outputs = outputs
        self.keyed_state: dict[int, dict[str, dict[Any, Any]]] = {}  # node id -> state name -> key -> value
        self.list_state: dict[int, dict[str, list[Any]]] = {}  # node id -> name -> [mode, items] (OperatorContext)
        self._async_inflight: dict[int, Any] | None = None
        # event time: records are (timestamp, record) pairs inside the chain and on its output edges
        self.event_time = job.event_time
        self.watermarks = self.nodes[0].watermarks if self.nodes[0].kind == "source" else None
        if self.event_time:
            for w in outputs:
                w.carry_timestamps()
        setup = OperatorSetup(
            shape=shape_of(self.event_time), subtask_index=subtask_index, parallelism=parallelism, attempt=attempt,
            max_parallelism=job.max_parallelism, keyed_tables=self._keyed_tables, list_state=self.list_state,
            side_outputs=self._side_outputs, state_backend=state_backend,
            async_settings=async_state or AsyncStateSettings())
        self._shape = setup.shape
        self._source_side = self._side_outputs(self.nodes[0].id) if self.nodes[0].kind == "source" else {}
        self._source_side_records = 0
        self._tail = ChainOutput(outputs)
        nxt: Operator = self._tail
        operators: list[Operator] = []
        start = 1 if self.nodes[0].kind == "source" else 0
        for node in reversed(self.nodes[start:]):
            two_input = TWO_INPUT_OPERATORS.get(node.kind)
            nxt = two_input(node, nxt, setup) if two_input is not None else make_operator(node, nxt, setup)
            operators.append(nxt)
        self.operators = operators[::-1]  # in chain order
        self._head = nxt
        self.process_batch: EmitBatch = nxt.inputs[0]
        self.sinks: list[Sink] = [op.sink for op in self.operators if isinstance(op, SinkOperator)]
        # the timers of the keyed operator, if the chain has one (the task fires them)
        keyed = [op.timers for op in self.operators if op.timers is not None]
        self.timers: TimerFiring | None = keyed[0] if keyed else None
        asynchronous = [op.async_operator for op in self.operators
                        if isinstance(op, AsyncKeyedOperator | AsyncMapOperator)]
        if len(asynchronous) > 1:
            names = " and ".join(op.node.name for op in self.operators
                                 if isinstance(op, AsyncKeyedOperator | AsyncMapOperator) and op.node is not None)
            raise ValueError(f"a chain runs at most one asynchronous operator, this one has {names}: put "
                             "rebalance() between them")
        # the keyed operator when its function is an AsyncKeyedProcessFunction (runtime/execution/async_operator.py),
        # or an async_map (runtime/execution/async_io.py): the task waits on it the same way
        self.async_operator: AsyncOperator | AsyncIOOperator | None = asynchronous[0] if asynchronous else None

    def input_batch(self, input_index: int) -> EmitBatch:
        """The per-batch path of the records of the head's input edge `input_index` (Edge.input_index): a
        two-input head takes the edges of its first input on `inputs[0]`, of its second on `inputs[1]`
        (Input.side); any other head takes every edge (a union) on its one input."""
        head = self.nodes[0]
        if head.two_input:
            return self._head.inputs[head.inputs[input_index].side]
        return self.process_batch

    @property
    def records_out(self) -> int:
        """Records sent out of the chain: to the main output, to side outputs, into sinks."""
        return self._tail.records_out + sum(op.records_out for op in self.operators) + self._source_side_records

    def _keyed_tables(self, node_id: int) -> dict[str, Any]:
        """The keyed-state tables of one operator: dicts, or BackendTables on a state backend."""
        tables = self.keyed_state.get(node_id)
        if tables is None:
            tables = self.keyed_state[node_id] = {} if self.state_backend is None else \
                BackendTables(self.state_backend, node_id, self.max_parallelism)
        return tables

    def _side_outputs(self, node_id: int) -> dict[str, list[EmitBatch]]:
        """Tag -> the writers of the edges that consume that side output of `node_id`."""
        by_tag: dict[str, list[EmitBatch]] = {}
        for w in self.outputs:
            if w.side_output is not None and w.side_output[0] == node_id:
                by_tag.setdefault(w.side_output[1], []).append(w.emit_batch)
        return by_tag

    def emit_source_side_output(self, batch: SideOutputBatch) -> None:
        """A source's SideOutputBatch: straight to the writers of the edges consuming that side output of the
        source node (dropped when none does, or when its tag is None), at its timestamp with event time."""
        emits = self._source_side.get(batch.tag) if batch.tag is not None else None
        if not emits:
            return
        self._source_side_records += len(batch)
        element = self._shape.element
        elements = [element(batch.timestamp_ms, r) for r in batch]
        for emit in emits:
            emit(elements)

    def process(self, record: Any) -> None:
        """One record through the chain (restored state, tests); the task uses `process_batch`."""
        self.process_batch([record])

    # -- event time -----------------------------------------------------------------

    def forward_watermark(self, watermark: int) -> None:
        """The task's input reached `watermark` (timers of the keyed operator have fired): through the operators
        and out. An asynchronous operator takes it in line with its records and passes it on when its epoch
        ends."""
        self._head.process_watermark(watermark)

    def forward_status(self, marker: str) -> None:
        for w in self.outputs:
            w.emit_marker(marker)

    def restore_watermarks(self, operator: int, forwarded: int) -> None:
        """After a restore: the keyed operator is at `operator` (its timers may still be due), the operators
        after it at `forwarded`."""
        for op in self.operators:
            if op.ctx is not None:
                op.ctx.current_watermark = forwarded
        if self.timers is not None:
            self.timers.set_watermark(operator)

    # -- checkpoints ------------------------------------------------------------

    def begin_state_snapshot(self, checkpoint_id: int) -> PendingSnapshot | None:
        """The synchronous part of the state backend's snapshot (None on the memory path: the task copies its
        dict tables instead). An asynchronous operator takes the backend's snapshot itself, at its own point
        between state batches, and leaves its in-flight document for `take_async_inflight`."""
        self.clean_expired_state(AT_CHECKPOINT, GROUPS_AT_CHECKPOINT)
        for op in self.operators:
            op.before_snapshot()
        if self.async_operator is not None:
            pending, doc = self.async_operator.snapshot(checkpoint_id)
            self._async_inflight = {self.async_operator.node_id: doc}
            if pending is not None:
                return pending
        return None if self.state_backend is None else self.state_backend.begin_snapshot(checkpoint_id)

    def clean_expired_state(self, budget: int, groups: int) -> None:
        """A step of every keyed operator's TTL cleanup (runtime/execution/ttl_cleanup.py): at a checkpoint, so
        an operator without records is cleaned too and expired entries stay out of the snapshot."""
        for op in self.operators:
            cleanup = getattr(op, "ttl_cleanup", None)
            if cleanup is not None:
                cleanup.step(budget, groups)

    def take_async_inflight(self) -> dict[int, Any] | None:
        """The in-flight document the last `begin_state_snapshot` left, by node id (None: no asynchronous
        operator)."""
        doc, self._async_inflight = self._async_inflight, None
        return doc

    def restore_async(self, docs: dict[int, list[dict[str, Any]]] | None) -> None:
        """The asynchronous operator's in-flight documents of the restored checkpoint (one per old subtask)."""
        op = self.async_operator
        if op is not None and docs and docs.get(op.node_id):
            op.restore(docs[op.node_id])

    def snapshot_sinks(self, checkpoint_id: int) -> list[Any]:
        """Pre-commit every sink for `checkpoint_id`; returns their states, in chain order."""
        return [sink.snapshot_state(checkpoint_id) for sink in self.sinks]

    def commit_sinks(self, checkpoint_id: int) -> None:
        for sink in self.sinks:
            sink.commit(checkpoint_id)

    def restore_state(self, keyed: dict[int, dict[str, dict[Any, Any]]], sinks: list[Any] | None) -> None:
        """Load keyed state in place (operators hold the tables) and hand sinks their pre-committed files."""
        for node, tables in keyed.items():
            for name, restored in tables.items():
                table = self.keyed_state.setdefault(node, {}).setdefault(name, {})
                table.clear()
                table.update(restored)
        if self.timers is not None:
            self.timers.rebuild()  # their tables were just restored
        states = list(sinks or [])
        for i, op in enumerate(op for op in self.operators if isinstance(op, SinkOperator)):
            op.restored = (states[i],) if i < len(states) else None

    def snapshot_lists(self) -> dict[int, dict[str, list[Any]]]:
        """Copies of the list states (items are immutable by contract), for a snapshot."""
        return {node: {name: [mode, copy_items(items)] for name, (mode, items) in tables.items()}
                for node, tables in self.list_state.items() if tables}

    def restore_lists(self, lists: dict[int, dict[str, list[Any]]]) -> None:
        """Load list state in place (contexts hold the per-node tables), before `open`."""
        for node, tables in lists.items():
            table = self.list_state.setdefault(node, {})
            table.clear()
            table.update({name: [mode, copy_items(items)] for name, (mode, items) in tables.items()})

    # -- life cycle -------------------------------------------------------------

    def open(self) -> None:
        """Open the operators from the tail back: what an operator emits in `open` finds the ones after it open."""
        for op in reversed(self.operators):
            op.open()

    def restored_at_end(self, finished: bool) -> None:
        """After `open`: the task was restored at its end of input (or finished): the sinks learn it (their
        `finish` does not run again)."""
        for sink in self.sinks:
            sink.restored_at_end(finished=finished)

    async def open_async(self) -> None:
        """After `open`: the asynchronous operator's open (it may be `async def`); it admits input from then on."""
        if self.async_operator is not None:
            await self.async_operator.open()

    async def finish_async(self) -> None:
        """End of input, nothing queued: the asynchronous operator's records finish and its writes land."""
        if self.async_operator is not None:
            await self.async_operator.finish()

    def finish(self) -> None:
        """End of all input: sinks commit, writers flush."""
        for sink in self.sinks:
            sink.finish()
        for w in self.outputs:
            w.flush()

    async def aclose_async(self) -> None:
        """Cancel what the asynchronous operator still runs (after a failure) and wait for it."""
        if self.async_operator is not None:
            await self.async_operator.aclose()

    def close(self) -> None:
        for op in self.operators:
            op.close()
        if self.state_backend is not None:
            self.state_backend.close()
