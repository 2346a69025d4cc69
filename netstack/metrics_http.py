"""The Prometheus /metrics listener every process serves, and the netstack's own metric.

It lives in netstack because it is a socket: the coordinator and the worker
both serve it, and neither should import the other's code to do so.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric

from netstack.transport import LINK_TIMEOUTS, PROTOCOL_FAILURES


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> int:
    """Serve /metrics in a background thread; returns the bound port (port 0 picks one)."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)


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
