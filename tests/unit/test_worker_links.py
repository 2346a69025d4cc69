"""One data link per pair of workers, however many tasks ask for it at once (real sockets, one process)."""

from __future__ import annotations

import asyncio
import secrets

from netstack.errors import ConnectionLost
from runtime.worker.network import NetworkEnvironment


async def test_tasks_asking_for_a_link_at_once_share_one_dial() -> None:
    # Two jobs deploying on the same pair of workers asked for the link together; each dialed, the
    # second link replaced the first, and the peer's goodbye on it failed a job (a CI run restarted one).
    token = secrets.token_hex(8)
    lower = NetworkEnvironment("worker-1", token=token, host="127.0.0.1")
    upper = NetworkEnvironment("worker-2", token=token, host="127.0.0.1")
    lost: list[tuple[str, str]] = []
    lower.on_link_lost = upper.on_link_lost = lambda peer, why: lost.append((peer, why))
    await lower.start(0)
    port = await upper.start(0)
    try:
        links = await asyncio.wait_for(asyncio.gather(
            *(lower.link_to("worker-2", "127.0.0.1", port) for _ in range(5)),
            *(upper.link_to("worker-1", "127.0.0.1", lower.port) for _ in range(3))), 15)
        dialed, accepted = links[:5], links[5:]
        assert len({id(x) for x in dialed}) == 1 and len({id(x) for x in accepted}) == 1
        await asyncio.sleep(0.2)  # a second link's replacement would close the first by now
        assert [x for x in lower.all_links + upper.all_links if x.is_closing()] == []
        assert len(lower.all_links) == 1 and len(upper.all_links) == 1 and lost == []
        # once the link is gone, the next ask dials again
        dialed[0].close("test")
        await asyncio.sleep(0.1)
        again = await asyncio.wait_for(lower.link_to("worker-2", "127.0.0.1", port), 15)
        assert again is not dialed[0] and not again.is_closing()
    finally:
        await lower.close()
        await upper.close()


async def test_a_failed_dial_reaches_every_caller_and_the_next_ask_tries_again() -> None:
    lower = NetworkEnvironment("worker-1", token="t", host="127.0.0.1")
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    free_port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()  # nothing listens there now
    results = await asyncio.gather(*(lower.link_to("worker-2", "127.0.0.1", free_port, timeout_s=5)
                                      for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionLost) for r in results), results
    assert len({id(r) for r in results}) == 1  # one dial failed once, every caller told
    assert lower._dials == {}
    again = await asyncio.gather(lower.link_to("worker-2", "127.0.0.1", free_port, timeout_s=5),
                                 return_exceptions=True)
    assert isinstance(again[0], ConnectionLost) and again[0] is not results[0]
