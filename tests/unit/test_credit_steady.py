"""A backpressured channel keeps flowing: a sender out of credit never waits while the receiver has a free
buffer it could use (ChannelSender and CreditLedger stepped by hand in random orders, without I/O).

The failure this guards against (measured on a cluster: a source behind a slow sink ran at 0 and ~7,000
records/s in alternate seconds while the sink wrote a steady 4,600/s): the last buffer of a burst reports a
backlog of 0, because the sender had credit for its whole queue; the source refills its queue at once, but the
receiver, believing the backlog, put every floating buffer it consumed back in the pool without a credit, and
the sender could only tell it had refilled with the next data buffer, for which it had no credit. It sent
again once an exclusive buffer freed, and then in a burst: floating credit lent on a data buffer's backlog was
only announced with the next consumed buffer.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from netstack.credit import Buffer, ChannelSender, CreditLedger, SendData

STEPS = st.lists(st.sampled_from(["refill", "refill_one", "send", "consume"]), min_size=1, max_size=120)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(0, 8), st.integers(1, 5), STEPS)
def test_a_sender_out_of_credit_never_waits_while_the_receiver_has_a_free_buffer(
        exclusive: int, floating: int, limit: int, steps: list[str]) -> None:
    sender = ChannelSender(1)
    ledger = CreditLedger([1], exclusive=exclusive, floating=floating)
    held = 0

    def announce() -> None:  # what the input gate does with the ledger's announcements
        for _, credits in ledger.take_announcements().items():
            sender.add_credit(credits)

    announce()
    for step in steps:
        if step == "refill":  # the source task ran: unblocked, it fills its queue to the limit
            while sender.queued_buffers < limit:
                sender.add_buffer(Buffer(b"x"))
        elif step == "refill_one" and sender.queued_buffers < limit:
            sender.add_buffer(Buffer(b"x"))
        elif step == "send":  # the link sends all the credit allows; the gate takes each buffer in
            while (item := sender.pop_sendable()) is not None:
                assert isinstance(item, SendData)
                ledger.on_data(1, item.seq, item.backlog)
                held += 1
                announce()
        elif step == "consume" and held:
            held -= 1
            ledger.on_consumed(1)
            announce()
            ledger.check_invariant()
            receiver_full = held == exclusive + floating
            # data is queued or will be (the source refills): the sender must be able to send some of it
            assert sender.credit > 0 or receiver_full, (sender.credit, held, ledger.statistics())
