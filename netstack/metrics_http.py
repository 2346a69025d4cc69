"""The Prometheus /metrics listener every process serves, and the netstack's own metrics.

It lives in netstack because it is a socket: the coordinator and the worker
both serve it, and neither should import the other's code to do so. The
HTTP side (admission, idle timeouts, keep-alive) is netstack/http.py's,
shared with the coordinator's REST API; this module only answers GET with
the registry. Collecting runs in a worker thread, one scrape at a time, so a
slow collector or a scrape storm never stalls the loop the RPC and data
links run on. Every process also serves the standard `process_*` metrics
(memory, CPU, open files) of prometheus_client's process collector.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from netstack.http import HttpLimits, HttpRequest, HttpResponse, HttpServer
from netstack.limits import SHED
from netstack.transport import LINK_TIMEOUTS, PROTOCOL_FAILURES

log = logging.getLogger("sluice.metrics")

# The metrics port's own limits: scrapers are few and send no bodies.
MetricsLimits = HttpLimits


class MetricsHandler:
    """GET (any path but /favicon.ico, as prometheus_client did) -> the registry in text format."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._collect_lock = asyncio.Lock()

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return HttpResponse(405, b"method not allowed\n")
        if request.path == "/favicon.ico":
            return HttpResponse(404)
        async with self._collect_lock:
            body = await asyncio.to_thread(generate_latest, self.registry)
        return HttpResponse(200, body, CONTENT_TYPE_LATEST)


class _NetstackCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("sluice_connections_shed", "Connections a listener closed to stay within its "
                                     "limits: 'evicted' (waiting for a handshake or request, made room for a newer "
                                     "one) or 'refused' (the listener was full of active connections)",
                                     labels=["reason"])
        for reason in ("evicted", "refused"):
            family.add_metric([reason], SHED[reason])
        yield family


async def serve_metrics(registry: CollectorRegistry, host: str, port: int, limits: HttpLimits | None = None, *,
                        ssl_context: ssl.SSLContext | None = None) -> HttpServer:
    """Serve /metrics on the running loop (HTTPS with `ssl_context`); the server's `port` is the bound one (port 0
    picks one)."""
    registry.register(_NetstackCollector())
    ProcessCollector(registry=registry)  # process_*: resident memory, CPU seconds, open and max fds
    server = HttpServer(MetricsHandler(registry), limits or HttpLimits(), name="metrics")
    await server.start(host, port, ssl_context=ssl_context)
    return server


def protocol_failures() -> Metric:
    family = CounterMetricFamily("sluice_connections_refused", "Connections closed because the peer broke the "
                                 "protocol (bad frame, wrong token, data without credit...)", labels=["reason"])
    for reason, n in sorted(PROTOCOL_FAILURES.items()):
        family.add_metric([reason], n)
    return family


def link_timeouts() -> Metric:
    family = CounterMetricFamily("sluice_link_timeouts", "Links closed because the peer stayed silent for the "
                                 "link timeout (a cut network path), by the peer's role", labels=["peer_role"])
    for role, n in sorted(LINK_TIMEOUTS.items()):
        family.add_metric([role], n)
    return family
