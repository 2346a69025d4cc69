"""A KeyedCoProcessFunction driven by hand with the runtime's real parts, no task and no network: a real
KeyedContext over keyed-state tables (plain dicts, or BackendTables on a state backend), the real timer queues
(runtime/execution/timers.py) and the real watermark combiner over the two inputs, with idle markers
(runtime/execution/watermarks.py). Records go in as (input, record, timestamp); outputs and side outputs come
out as (timestamp, value)."""

from __future__ import annotations

from typing import Any

from runtime.api import KeyedContext, KeyedCoProcessFunction
from runtime.api.time import MAX_WATERMARK
from runtime.execution.timers import EVENT_TIME, TIMER_TABLES, KeyedTimers, TimerQueue
from runtime.execution.watermarks import ACTIVE, IDLE, WatermarkCombiner
from runtime.state.backend import StateBackend
from runtime.state.tables import BackendTables

INPUTS = ("1", "2")


class KeyedCoHarness:
    def __init__(self, fn: KeyedCoProcessFunction, key_fns: tuple[Any, Any], *,
                 state_backend: StateBackend | None = None, node_id: int = 7, max_parallelism: int = 128) -> None:
        self.fn = fn
        self.key_fns = key_fns
        self.state: Any = {} if state_backend is None else BackendTables(state_backend, node_id, max_parallelism)
        self.out: list[tuple[int | None, Any]] = []
        self.side: dict[str, list[tuple[int | None, Any]]] = {}
        self.ctx = ctx = KeyedContext(lambda v: self.out.append((ctx.timestamp, v)), 0, 1, "harness", self.state)
        ctx._side = lambda tag, v: self.side.setdefault(tag, []).append((ctx.timestamp, v))
        self.event = TimerQueue(self.state.setdefault(TIMER_TABLES[EVENT_TIME], {}))
        processing = TimerQueue(self.state.setdefault(TIMER_TABLES["processing_time"], {}))
        ctx.timers = KeyedTimers(self.event, processing, lambda: ctx.current_key)
        self.combiner = WatermarkCombiner(list(INPUTS))
        fn.open(ctx)

    def record(self, input_index: int, record: Any, timestamp: int) -> None:
        ctx = self.ctx
        ctx.current_key = self.key_fns[input_index](record)
        ctx.timestamp = timestamp
        (self.fn.process1 if input_index == 0 else self.fn.process2)(record, ctx)

    def watermark(self, input_index: int, watermark: int) -> None:
        self._advance(self.combiner.on_watermark(INPUTS[input_index], watermark).watermark)

    def idle(self, input_index: int) -> None:
        self._advance(self.combiner.on_marker(INPUTS[input_index], IDLE).watermark)

    def active(self, input_index: int) -> None:
        self._advance(self.combiner.on_marker(INPUTS[input_index], ACTIVE).watermark)

    def end(self) -> None:
        """End of both inputs: each (active again if it was idle) sends the final watermark."""
        for i in range(len(INPUTS)):
            self.active(i)
            self.watermark(i, MAX_WATERMARK)

    @property
    def current_watermark(self) -> int:
        return self.ctx.current_watermark

    def _advance(self, watermark: int | None) -> None:
        """The operator's watermark moved: fire the due event-time timers (as the task does), then take it."""
        if watermark is None:
            return
        ctx = self.ctx
        ctx.current_watermark = watermark
        ctx.time_domain = EVENT_TIME
        while (due := self.event.pop_due(watermark)) is not None:
            ctx.timestamp, ctx.current_key = due
            self.fn.on_timer(ctx.timestamp, ctx)
        ctx.time_domain = None
