"""The Kafka connector's one place for aiokafka: the lazy import, an asyncio loop in a thread that owns the
clients, and broker errors turned into one line.

aiokafka is asyncio; the task calls sources and sinks synchronously. As the NATS connector does, each source
and sink subtask runs its clients on its own event loop in a daemon thread: the task hands work to it and
returns at once (prefetch into a buffer, committed batches produced in order); only open and close wait, with
deadlines.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from runtime.common import extras

log = logging.getLogger("sluice.kafka")


class KafkaError(RuntimeError):
    """The broker could not be reached, or refused what the connector asked for."""


def aiokafka() -> Any:
    try:
        import aiokafka as module
        import aiokafka.admin  # noqa: F401
    except ImportError as exc:
        raise extras.MissingExtra(["kafka"]) from exc
    return module


def describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def retriable(exc: BaseException) -> bool:
    """aiokafka's errors say whether a retry can help (a broker restarting, a leader moving); a lost connection
    surfaces as an OSError or a timeout."""
    return bool(getattr(exc, "retriable", False)) or isinstance(exc, (OSError, asyncio.TimeoutError))


class LoopThread:
    """An asyncio loop in a daemon thread; `call` waits with a deadline, `submit` does not."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float, what: str) -> Any:
        future = self.submit(coro)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise KafkaError(f"{what}: no answer from Kafka within {timeout_s:g}s") from None

    def stop(self, closing: Coroutine[Any, Any, Any] | None = None, timeout_s: float = 5.0) -> None:
        """Run `closing` (close the clients), then stop the loop and join the thread."""
        if self.thread.is_alive():
            if closing is not None:
                try:
                    self.call(closing, timeout_s, "closing")
                except Exception as exc:  # closing must not hide the task's own outcome
                    log.warning("kafka: error while closing: %s", describe(exc))
            else:
                closing = None
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout_s)
        elif closing is not None:
            closing.close()
        if not self.thread.is_alive():
            self.loop.close()


async def connect_checked(start: Coroutine[Any, Any, Any], bootstrap_servers: str, timeout_s: float) -> None:
    """Start a client, failing with one line that names the servers when they cannot be reached in time."""
    try:
        await asyncio.wait_for(start, timeout_s)
    except TimeoutError:
        raise KafkaError(f"cannot connect to Kafka at {bootstrap_servers}: no answer within {timeout_s:g}s") from None
    except Exception as exc:
        raise KafkaError(f"cannot connect to Kafka at {bootstrap_servers}: {describe(exc)}") from None


# -- checks at submit ------------------------------------------------------------------------------------------


async def _broker_facts(bootstrap_servers: str, timeout_s: float) -> tuple[set[str], int | None]:
    """The broker's topics and its transaction.max.timeout.ms (None when it does not report it)."""
    kafka = aiokafka()
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = kafka.admin.AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="sluice-submit",
                                            request_timeout_ms=int(timeout_s * 1000))
    try:
        await connect_checked(admin.start(), bootstrap_servers, timeout_s)
        topics = set(await asyncio.wait_for(admin.list_topics(), timeout_s))
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
        max_ms = None
        for broker in cluster.get("brokers", [])[:1]:
            resource = ConfigResource(ConfigResourceType.BROKER, str(broker["node_id"]),
                                      {"transaction.max.timeout.ms": None})
            for response in await asyncio.wait_for(admin.describe_configs([resource]), timeout_s):
                for entry in response.resources:
                    for name, value, *_ in entry[4]:
                        if name == "transaction.max.timeout.ms" and value:
                            max_ms = int(value)
        return topics, max_ms
    finally:
        await admin.close()


def broker_facts(bootstrap_servers: str, timeout_s: float) -> tuple[set[str], int | None]:
    """`_broker_facts` from synchronous code (the coordinator runs it in a thread at submit)."""
    try:
        return asyncio.run(asyncio.wait_for(_broker_facts(bootstrap_servers, timeout_s), timeout_s * 3))
    except KafkaError:
        raise
    except TimeoutError:
        raise KafkaError(f"cannot connect to Kafka at {bootstrap_servers}: no answer within {timeout_s:g}s") from None
    except Exception as exc:
        raise KafkaError(f"Kafka at {bootstrap_servers}: {describe(exc)}") from None
