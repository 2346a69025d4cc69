"""The README's two-input jobs: orders joined with payments (KeyedCoProcessFunction) and rules broadcast to a
keyed stream (KeyedBroadcastProcessFunction). The tests run them too (tests/integration/test_two_input.py).

Orders and payments are two GeneratorSources of the same length: record seq of each is the order (payment) of
order id seq, so every id has one order and one payment and the join emits every id exactly once.
"""

from __future__ import annotations

import os

from runtime.api import (
    FileSink,
    GeneratorSource,
    Job,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    MapStateDescriptor,
)


class OrderPaymentJoin(KeyedCoProcessFunction):
    """Emits (order id, order, payment) once both have arrived, in either order; keeps the one that came first
    in keyed state meanwhile."""

    def open(self, ctx):
        self.order = ctx.value_state("order")
        self.payment = ctx.value_state("payment")

    def process1(self, order, ctx):  # an order: (order id, customer)
        payment = self.payment.value()
        if payment is None:
            self.order.update(order)
        else:
            self.payment.clear()
            ctx.emit((ctx.current_key, order[1], payment[1]))

    def process2(self, payment, ctx):  # a payment: (order id, method)
        order = self.order.value()
        if order is None:
            self.payment.update(payment)
        else:
            self.order.clear()
            ctx.emit((ctx.current_key, order[1], payment[1]))


RULES = MapStateDescriptor("rules")


class ApplyRules(KeyedBroadcastProcessFunction):
    """Rules (name, threshold) are broadcast to every subtask; each event (key, value) is emitted with the names
    of the rules it breaks. Every subtask also reports, when it opens, which rules it starts with."""

    def open(self, ctx):
        ctx.emit(("opened", ctx.subtask_index, ctx.parallelism, sorted(ctx.broadcast_state(RULES).keys())))

    def process_broadcast_element(self, rule, ctx):
        ctx.broadcast_state(RULES).put(rule[0], rule[1])

    def process_element(self, event, ctx):
        rules = ctx.broadcast_state(RULES)
        broken = sorted(name for name, threshold in rules.items() if event[1] > threshold)
        ctx.emit(("event", event[0], event[1], len(rules), ctx.parallelism, broken))


def _records(default: int) -> int:
    return int(os.environ.get("SLUICE_EXAMPLE_RECORDS", str(default)))


def orders_with_payments(job: Job) -> None:
    """`sluice local runtime.examples.connect:orders_with_payments`: out/joined/ gets every order id once."""
    n = _records(20_000)
    orders = job.source(GeneratorSource(count=n, keys=100, seed=1), name="orders", parallelism=2) \
        .map(lambda r: (r[1], r[0]))  # (order id, customer)
    payments = job.source(GeneratorSource(count=n, keys=3, seed=2), name="payments", parallelism=2) \
        .map(lambda r: (r[1], r[0]))  # (order id, payment method)
    (orders.key_by(lambda o: o[0], key_type="order id")
        .connect(payments.key_by(lambda p: p[0], key_type="order id"))
        .process(OrderPaymentJoin(), name="join", parallelism=2)
        .sink(FileSink(os.environ.get("SLUICE_EXAMPLE_OUT", "out/joined"))))


def rules_on_events(job: Job) -> None:
    """Five rules broadcast to a keyed stream of events."""
    rules = job.source(GeneratorSource(count=5, keys=5, seed=0), name="rules", parallelism=1) \
        .map(lambda r: (f"over-{r[1] * 200}", r[1] * 200))
    events = job.source(GeneratorSource(count=_records(20_000), keys=50, seed=4), name="events", parallelism=2) \
        .map(lambda r: (r[0], r[1] % 1000))
    (events.key_by(lambda e: e[0])
        .connect(rules.broadcast(RULES))
        .process(ApplyRules(), name="apply-rules", parallelism=2)
        .sink(FileSink(os.environ.get("SLUICE_EXAMPLE_OUT", "out/rules"))))
