"""Two-input operators: connect (CoProcessFunction, KeyedCoProcessFunction) and the broadcast state pattern.

A two-input operator heads its task (it is never chained to an upstream): `inputs[0]` takes the records of
the first input, `inputs[1]` those of the second; the task routes each input channel to one of them by the
edge it belongs to (Chain.input_batch). Both paths share one context, so keyed state and timers are shared
by the two sides. The watermark the operator gets is already the minimum over the channels of both inputs,
idle ones excluded (the task's WatermarkCombiner spans all its channels), so `process_watermark` is the
one-input rule.

Broadcast state lives in the task's list state as one [BROADCAST_MODE, dict] entry per descriptor: it is
snapshotted with the task's lists and, on a rescale, each new subtask takes its replica's copy
(checkpointing/rescaling.py, rescale_lists), together with the replica's broadcast channel state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.api import (
    BroadcastContext,
    BroadcastProcessFunction,
    CoProcessFunction,
    KeyedBroadcastContext,
    KeyedContext,
    Node,
    OperatorContext,
)
from runtime.api.runtime_hooks import RuntimeHooks
from runtime.execution.operators.kinds import Operator, OperatorSetup, _FunctionOperator, _install_timers, _unset_emit


def side_key_fns(node: Node) -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]:
    """The key function of each side: the one given to key_by() on the first edge of that side."""
    keys: list[Callable[[Any], Any] | None] = [None, None]
    for inp in reversed(node.inputs):
        keys[inp.side] = inp.key_fn
    return keys[0], keys[1]


class CoProcessOperator(_FunctionOperator):
    """A CoProcessFunction on two unkeyed (or keyed, without keyed state) inputs."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        ctx = OperatorContext(_unset_emit, setup.subtask_index, node.parallelism, node.name,
                              setup.list_state.setdefault(node.id, {}))
        super().__init__(node, nxt, setup, ctx)
        fn: CoProcessFunction = node.payload
        each = setup.shape.each
        self.inputs = (each(fn.process1, ctx, self.flush), each(fn.process2, ctx, self.flush))


class KeyedCoProcessOperator(_FunctionOperator):
    """A KeyedCoProcessFunction: keyed state and timers shared by both sides, each side keyed by its own
    key_by() function."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        state = setup.keyed_tables(node.id)
        ctx = KeyedContext(_unset_emit, setup.subtask_index, node.parallelism, node.name, state)
        super().__init__(node, nxt, setup, ctx)
        fn: CoProcessFunction = node.payload
        self.timers = _install_timers(fn, ctx, state, self.flush)
        self.hooks = fn if isinstance(fn, RuntimeHooks) else None
        # an interval join's clean-up timers follow from its buffers: one index per timestamp, no table
        derive = self.hooks.event_timers_from_state(ctx) if self.hooks is not None else None
        if derive is not None:
            self.timers.timers.index_event_timers(derive)
        key1, key2 = side_key_fns(node)
        assert key1 is not None and key2 is not None
        # an interval join's loops over whole batches of timed elements (runtime/api/interval_join.py)
        runners = self.hooks.timed_batch_runners((key1, key2), ctx, self.flush) \
            if self.hooks is not None and setup.shape.timed else None
        if runners is not None:
            self.inputs = tuple(runners)
            return
        each = setup.shape.each_keyed
        self.inputs = (each(key1, fn.process1, ctx, self.flush), each(key2, fn.process2, ctx, self.flush))

    def before_snapshot(self) -> None:
        if self.hooks is not None:  # the interval join's batch loops change its buffers in place between snapshots
            self.hooks.before_snapshot()


def _broadcast_side(fn: BroadcastProcessFunction, ctx: BroadcastContext | KeyedBroadcastContext,
                    keyed: bool) -> Callable[[Any, Any], None]:
    """`process_broadcast_element` with the broadcast state writable while it runs (and no current key)."""
    access = ctx._broadcast
    process = fn.process_broadcast_element

    def run(record: Any, c: Any) -> None:
        if keyed:
            c.current_key = None
        access.writable = True
        try:
            process(record, c)
        finally:
            access.writable = False

    return run


class BroadcastProcessOperator(_FunctionOperator):
    """A BroadcastProcessFunction: the main input (unkeyed) reads broadcast state, the broadcast input writes
    it."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        ctx = BroadcastContext(_unset_emit, setup.subtask_index, node.parallelism, node.name,
                               setup.list_state.setdefault(node.id, {}), node.broadcast_descriptors)
        super().__init__(node, nxt, setup, ctx)
        fn: BroadcastProcessFunction = node.payload
        each = setup.shape.each
        self.inputs = (each(fn.process_element, ctx, self.flush),
                       each(_broadcast_side(fn, ctx, False), ctx, self.flush))


class KeyedBroadcastProcessOperator(_FunctionOperator):
    """A KeyedBroadcastProcessFunction: the keyed main input has keyed state and timers and reads broadcast
    state; the broadcast input writes it."""

    def __init__(self, node: Node, nxt: Operator, setup: OperatorSetup) -> None:
        state = setup.keyed_tables(node.id)
        ctx = KeyedBroadcastContext(_unset_emit, setup.subtask_index, node.parallelism, node.name, state,
                                    setup.list_state.setdefault(node.id, {}), node.broadcast_descriptors)
        super().__init__(node, nxt, setup, ctx)
        fn: BroadcastProcessFunction = node.payload
        self.timers = _install_timers(fn, ctx, state, self.flush)
        key_fn, _ = side_key_fns(node)
        assert key_fn is not None
        self.inputs = (setup.shape.each_keyed(key_fn, fn.process_element, ctx, self.flush),
                       setup.shape.each(_broadcast_side(fn, ctx, True), ctx, self.flush))


TWO_INPUT_OPERATORS: dict[str, Callable[[Node, Operator, OperatorSetup], Operator]] = {
    "co_process": CoProcessOperator, "keyed_co_process": KeyedCoProcessOperator,
    "broadcast_process": BroadcastProcessOperator, "keyed_broadcast_process": KeyedBroadcastProcessOperator,
}
