"""The operator kinds of a chain: one class per kind, set up once, fed lists of elements per input.

An operator is built once for its task (like Flink's AbstractStreamOperator): its constructor makes the
context, state tables, side-output routes and timers, and binds its per-batch path, a closure over those
and the user's function. Plain records and event-time pairs take the same path: the chain's `Plain` or
`Timestamped` shape gives the operator, when it is built, the loop that applies the user's function to a
list of elements (shapes.py).

`inputs[i]` is the per-batch path of input i and `process_watermark(watermark, input_index)` takes that
input's watermark. Operators in a chain have one input: elements reach the next operator's input 0 and a
watermark is passed on once the operator has taken it. An operator with two inputs (connect, joins) has
two entries in `inputs` and holds the minimum of its inputs' watermarks before passing it on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.api import Context, KeyedContext, Node, OperatorContext, ProcessFunction
from runtime.api.runtime_hooks import RuntimeHooks
from runtime.connectors.sinks import Sink
from runtime.execution.async_io import AsyncIOOperator
from runtime.execution.async_operator import AsyncOperator, AsyncStateSettings
from runtime.execution.async_state import AsyncKeyedProcessFunction
from runtime.execution.operators.record_writer import EmitBatch
from runtime.execution.operators.shapes import Plain
from runtime.execution.timers import EVENT_TIME, PROCESSING_TIME, TIMER_TABLES, KeyedTimers, TimerQueue
from runtime.execution.ttl_cleanup import PER_RECORD, TtlCleanup
from runtime.state.backend import StateBackend

_MISSING = object()


@dataclass(frozen=True)
class OperatorSetup:
    """What the chain gives each of its operators when it builds them."""

    shape: Plain
    subtask_index: int
    parallelism: int  # the task's (a sink opens with it)
    attempt: int
    max_parallelism: int
    keyed_tables: Callable[[int], dict[str, Any]]  # node id -> its keyed-state tables
    list_state: dict[int, dict[str, list[Any]]]  # node id -> name -> [mode, items]
    side_outputs: Callable[[int], dict[str, list[EmitBatch]]]  # node id -> tag -> writers' emit_batch
    state_backend: StateBackend | None
    async_settings: AsyncStateSettings


class Operator:
    """One node of a chain. `inputs` holds the per-batch path of each input; `next` is where outputs go."""

    ctx: Context | None = None  # the context of a process function (its watermark follows the operator's)
    records_out = 0  # records it sends out of the chain itself (side outputs, a sink's writes)
    timers: TimerFiring | None = None  # a keyed operator's timers (the task fires them)

    def __init__(self, node: Node | None, nxt: Operator | None) -> None:
        self.node = node
        self.next = nxt
        self.inputs: tuple[EmitBatch, ...] = ()

    def process_watermark(self, watermark: int, input_index: int = 0) -> None:
        """The watermark of input `input_index` reached `watermark`: take it, then pass it on."""
        if self.ctx is not None:
            self.ctx.current_watermark = watermark
        if self.next is not None:
            self.next.process_watermark(watermark)

    def open(self) -> None:
        pass

    def before_snapshot(self) -> None:
        """A snapshot's synchronous part is about to copy the keyed-state tables (the memory path copies them
        shallowly): an operator that changes state values in place stops doing so for the values it holds."""

    def close(self) -> None:
        pass


class MapOperator(Operator):
    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        super().__init__(node, nxt)
        self.inputs = (setup.shape.map(node.payload, nxt.inputs[0]),)


class FilterOperator(Operator):
    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        super().__init__(node, nxt)
        self.inputs = (setup.shape.filter(node.payload, nxt.inputs[0]),)


class FlatMapOperator(Operator):
    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        super().__init__(node, nxt)
        self.inputs = (setup.shape.flat_map(node.payload, nxt.inputs[0]),)


class ReduceOperator(Operator):
    """A keyed running reduce: one accumulator per key in the "reduce" table, emitted after every record."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        super().__init__(node, nxt)
        table = setup.keyed_tables(node.id).setdefault("reduce", {})
        fn = node.payload
        key_fn = node.key_fn
        assert key_fn is not None
        get = table.get
        records_of, restamp = setup.shape.records, setup.shape.restamp
        emit = nxt.inputs[0]

        def run_reduce(elements: list[Any]) -> None:
            out: list[Any] = []
            add = out.append
            for record in records_of(elements):
                key = key_fn(record)
                acc = get(key, _MISSING)
                acc = record if acc is _MISSING else fn(acc, record)
                table[key] = acc
                add(acc)
            emit(restamp(elements, out))

        self.inputs = (run_reduce,)


class _FunctionOperator(Operator):
    """What a process and a keyed process operator share: the function's context, the records it emitted
    (collected, then handed on as one list), side outputs, and the function's open and close."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup, ctx: Context) -> None:
        super().__init__(node, nxt)
        self.function: ProcessFunction = node.payload
        self.ctx = ctx
        pending: list[Any] = []
        ctx.emit = setup.shape.emitter(pending.append, ctx)
        self._route_side_outputs(setup, node.id, ctx)
        emit = nxt.inputs[0]

        def flush() -> None:
            # the next operator consumes the list before returning; keep the same list for the next batch
            if pending:
                try:
                    emit(pending)
                finally:
                    pending.clear()

        self.flush = flush

    def _route_side_outputs(self, setup: OperatorSetup, node_id: int, ctx: Context) -> None:
        """`ctx.output(tag, value)`: straight to the writers of the edges that consume that side output (a side
        output is never chained); a tag nobody consumes is dropped."""
        by_tag = setup.side_outputs(node_id)
        if not by_tag:
            return
        element = setup.shape.element

        def side(tag: str, value: Any) -> None:
            emits = by_tag.get(tag)
            if emits:
                self.records_out += 1
                batch = [element(ctx.timestamp, value)]
                for emit in emits:
                    emit(batch)

        ctx._side = side

    def open(self) -> None:
        assert self.ctx is not None
        self.function.open(self.ctx)
        self.flush()  # records emitted in open() go out now, as they did before batching

    def close(self) -> None:
        self.function.close()


class ProcessOperator(_FunctionOperator):
    """A non-keyed ProcessFunction, with operator list state (OperatorContext)."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        ctx = OperatorContext(_unset_emit, setup.subtask_index, node.parallelism, node.name,
                              setup.list_state.setdefault(node.id, {}))
        super().__init__(node, nxt, setup, ctx)
        self.inputs = (setup.shape.each(self.function.process, ctx, self.flush),)


class KeyedProcessOperator(_FunctionOperator):
    """A KeyedProcessFunction: keyed state scoped to the current key, and timers (`timers`, fired by the task)."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        state = setup.keyed_tables(node.id)
        ctx = KeyedContext(_unset_emit, setup.subtask_index, node.parallelism, node.name, state)
        super().__init__(node, nxt, setup, ctx)
        self.timers = _install_timers(self.function, ctx, state, self.flush)
        hooks = self.function if isinstance(self.function, RuntimeHooks) else None
        self.hooks = hooks
        # a window operator's event-time timers follow from its windows: one index per timestamp, no table
        derive = hooks.event_timers_from_state(ctx) if hooks is not None else None
        if derive is not None:
            self.timers.timers.index_event_timers(derive)
        assert node.key_fn is not None
        run = setup.shape.each_keyed(node.key_fn, self.function.process, ctx, self.flush)
        # a window operator's loop over a whole batch of timed elements (runtime/api/windows.py), where it has one
        if hooks is not None and setup.shape.timed:
            run = hooks.timed_batch_runner(node.key_fn, ctx, self.flush) or run
        # expired TTL state nobody reads again is cleaned a few entries per record (runtime/execution/ttl_cleanup.py);
        # the states are declared in open(), so the check is per batch: one attribute test without TTL
        self.ttl_cleanup = TtlCleanup(ctx.ttl_states, ctx.state_table, lambda: ctx.ttl_clock())
        ttl_states, cleanup = ctx.ttl_states, self.ttl_cleanup.step

        def run_and_clean(elements: list[Any]) -> None:
            run(elements)
            if ttl_states:
                cleanup(PER_RECORD * len(elements))

        self.inputs = (run_and_clean,)

    def before_snapshot(self) -> None:
        if self.hooks is not None:  # the window operator's batch loop changes its accumulators in place
            self.hooks.before_snapshot()


def _unset_emit(record: Any) -> None:
    raise AssertionError("the operator sets ctx.emit when it builds the context")


class SinkOperator(Operator):
    """A sink: writes records (without their timestamps) and counts them as sent. Nothing it takes goes on; a
    watermark does (to the chain's side outputs)."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        super().__init__(node, nxt)
        sink: Sink = node.payload
        self.sink = sink
        self._setup = setup
        self.restored: tuple[Any] | None = None  # (state,) after a restore, for `open`
        records = setup.shape.records
        write = sink.write
        if sink.delay_per_record_s > 0:
            throttle = sink.throttle

            def run_slow_sink(elements: list[Any]) -> None:
                for record in records(elements):
                    self.records_out += 1
                    write(record)
                    throttle()

            self.inputs = (run_slow_sink,)
            return

        write_all = batch_writer(sink)
        if write_all is not None:
            timed = setup.shape.timed

            def run_batch_sink(elements: list[Any]) -> None:
                self.records_out += len(elements)
                write_all(list(records(elements)) if timed else elements)

            self.inputs = (run_batch_sink,)
            return

        def run_sink(elements: list[Any]) -> None:
            self.records_out += len(elements)
            for record in records(elements):
                write(record)

        self.inputs = (run_sink,)

    def open(self) -> None:
        setup = self._setup
        self.sink.open(setup.subtask_index, setup.parallelism, setup.attempt)
        if self.restored is not None:
            self.sink.restore_state(self.restored[0])
        elif setup.attempt > 0:
            self.sink.restore_state(None)  # a restart without a checkpoint: drop earlier attempts' leftovers

    def close(self) -> None:
        self.sink.close()


class AsyncKeyedOperator(Operator):
    """A keyed operator with an AsyncKeyedProcessFunction: elements go to its AsyncOperator, which hands a
    record's outputs to the next operator when the record finishes, and a watermark once the records before it
    have (runtime/execution/async_operator.py)."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        super().__init__(node, nxt)
        if setup.state_backend is None:
            raise ValueError(f"{node.name}: an AsyncKeyedProcessFunction needs a state backend object "
                             f"(the worker gives its task one on every backend)")
        assert node.key_fn is not None
        self.async_operator = AsyncOperator(
            node.payload, setup.state_backend, setup.async_settings, node_id=node.id, name=node.name,
            key_fn=node.key_fn, subtask_index=setup.subtask_index, parallelism=node.parallelism,
            max_parallelism=setup.max_parallelism, timed=setup.shape.timed, emit=nxt.inputs[0],
            forward_watermark=nxt.process_watermark)
        self.inputs = (self.async_operator.feed,)

    def process_watermark(self, watermark: int, input_index: int = 0) -> None:
        self.async_operator.feed_watermark(watermark)  # in line with the records; passed on when its epoch ends

    def close(self) -> None:
        self.async_operator.function.close()


class AsyncMapOperator(Operator):
    """`async_map`: elements go to its AsyncIOOperator, which hands results to the next operator as the calls
    finish (in order, or as they come within a watermark's segment), and a watermark once the records before it
    have left (runtime/execution/async_io.py)."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        super().__init__(node, nxt)
        self.async_operator = AsyncIOOperator(
            node.payload, node_id=node.id, name=node.name, key_fn=node.key_fn, subtask_index=setup.subtask_index,
            parallelism=node.parallelism, max_parallelism=setup.max_parallelism, timed=setup.shape.timed,
            emit=nxt.inputs[0], forward_watermark=nxt.process_watermark)
        self.inputs = (self.async_operator.feed,)

    def process_watermark(self, watermark: int, input_index: int = 0) -> None:
        self.async_operator.feed_watermark(watermark)  # in line with the records; passed on in the queue's order


def batch_writer(sink: Sink) -> Callable[[list[Any]], None] | None:
    """`sink.write_all` where it stands for the sink's `write`: defined by the class that defines that `write` or
    by one below it. A subclass that overrides `write` alone (of a DiscardSink, say) must see every record."""
    mro = type(sink).__mro__
    write_owner = next(c for c in mro if "write" in c.__dict__)
    all_owner = next(c for c in mro if "write_all" in c.__dict__)
    if all_owner is Sink or not issubclass(all_owner, write_owner):
        return None
    return sink.write_all


def make_operator(node: Node, nxt: Operator, setup: OperatorSetup) -> Operator:
    kind = node.kind
    if kind == "keyed_process" and isinstance(node.payload, AsyncKeyedProcessFunction):
        return AsyncKeyedOperator(node, nxt, setup)
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(f"operator kind {kind!r} cannot run inside a chain")
    return cls(node, nxt, setup)


_KINDS: dict[str, Callable[[Node, Operator, OperatorSetup], Operator]] = {
    "map": MapOperator, "filter": FilterOperator, "flat_map": FlatMapOperator, "process": ProcessOperator,
    "keyed_process": KeyedProcessOperator, "reduce": ReduceOperator, "sink": SinkOperator,
    "async_map": AsyncMapOperator,
}


# -- timers -------------------------------------------------------------------------------------------


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
        if not self.event_due(watermark):  # most watermarks: nothing due, no firing set up
            return False
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


def _install_timers(fn: Any, kctx: KeyedContext, state: dict[str, Any],
                    flush: Callable[[], None]) -> TimerFiring:
    event = TimerQueue(state.setdefault(TIMER_TABLES[EVENT_TIME], {}))
    processing = TimerQueue(state.setdefault(TIMER_TABLES[PROCESSING_TIME], {}))
    timers = KeyedTimers(event, processing, lambda: kctx.current_key)
    kctx.timers = timers
    # a KeyedProcessFunction's, a KeyedCoProcessFunction's...; a plain ProcessFunction on a keyed stream has none
    on_timer = getattr(fn, "on_timer", None)

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

    return TimerFiring(timers, kctx, fire)
