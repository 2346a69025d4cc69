"""The OTLP export (off unless `--otlp-endpoint` or OTEL_EXPORTER_OTLP_ENDPOINT names a collector): the traces of
checkpoints and recoveries (built by coordinator/trace_spans.py) and the coordinator's metrics, the same series
Prometheus scrapes, over OTLP/HTTP with the OpenTelemetry SDK (the `otel` extra).

Off, nothing of it exists: no import of the SDK, no task, and the checkpoint runner and the job manager build no
span (they hold None). On, the event loop only hands each trace's builder to the telemetry's own thread
(`submit`), which builds the span records and the SDK's spans (a 1,000-task checkpoint is 4,001 of them); the
SDK's batch processor sends them from its thread, and the metrics go through its periodic reader. The metrics
are read from the very Prometheus collectors the `/metrics` port serves (coordinator/metrics.py), on the event
loop every interval (`sample_metrics`), since the collectors read records the loop changes; the reader's thread
only takes the latest sample (`otlp_series`, pure). A Prometheus counter becomes an OTLP cumulative sum of the
family's name, a gauge a gauge; a histogram's `_count` and `_sum` become sums (its buckets are not exported). A
collector that is down costs what could not be sent and one line a minute (`ExportFailures`), never the
coordinator's work.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import Collector

from coordinator.trace_spans import SpanBuilder, SpanRecord
from runtime.common.extras import MissingExtra

log = logging.getLogger("sluice.telemetry")

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"  # the standard variable: the collector's base URL
SPAN_BACKLOG = 64  # traces waiting to be built on the telemetry's thread
SPAN_QUEUE = 1 << 15  # spans waiting to be sent; past it the SDK drops them (and logs that it did)
SHUTDOWN_S = 10.0  # how long a stopping coordinator waits for the last spans and metrics to be sent


@dataclass(frozen=True)
class OtlpSettings:
    """Where and how often the coordinator exports over OTLP/HTTP; built once from the command line."""

    endpoint: str  # the collector's base URL (http://host:4318): /v1/traces and /v1/metrics are added
    metrics_interval_s: float = 10.0  # metrics are sampled and sent this often
    spans_delay_s: float = 1.0  # an ended span waits at most this long to be sent in a batch with others
    service_name: str = "sluice-coordinator"

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"the OTLP endpoint must be an http:// or https:// URL, got {self.endpoint!r}")
        if self.metrics_interval_s <= 0 or self.spans_delay_s <= 0:
            raise ValueError("the OTLP intervals must be positive")

    def url(self, signal: str) -> str:
        return f"{self.endpoint.rstrip('/')}/v1/{signal}"

    @classmethod
    def from_flags(cls, endpoint: str | None, interval_s: float,
                   environ: Mapping[str, str] = os.environ) -> OtlpSettings | None:
        """From `--otlp-endpoint` / `--otlp-interval`, the endpoint defaulting to OTEL_EXPORTER_OTLP_ENDPOINT; None
        (off) when neither names one."""
        url = endpoint or environ.get(ENDPOINT_ENV, "")
        return cls(url, interval_s) if url else None


# -- metrics: a sample of the Prometheus collectors, as OTLP series (pure) -----------------------------------------

COUNTER, GAUGE = "counter", "gauge"
Point = tuple[float, Mapping[str, str]]  # value, labels


@dataclass(frozen=True, slots=True)
class Series:
    kind: str  # COUNTER (a cumulative sum) or GAUGE
    description: str
    points: tuple[Point, ...]


def otlp_series(families: Iterable[Any]) -> dict[str, Series]:
    """Prometheus metric families (prometheus_client's `Metric`) -> name -> the series OTLP exports."""
    out: dict[str, Series] = {}
    for family in families:
        if family.type == "counter":
            out[family.name] = Series(COUNTER, family.documentation, _points(family, family.name + "_total"))
        elif family.type == "gauge":
            out[family.name] = Series(GAUGE, family.documentation, _points(family, family.name))
        elif family.type == "histogram":
            for part in ("_count", "_sum"):
                out[family.name + part] = Series(COUNTER, f"{family.documentation} ({part[1:]})",
                                                 _points(family, family.name + part))
    return out


def _points(family: Any, sample_name: str) -> tuple[Point, ...]:
    return tuple((float(s.value), dict(s.labels)) for s in family.samples if s.name == sample_name)


# -- the exporter ---------------------------------------------------------------------------------------------------

EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                    "opentelemetry.exporter.otlp.proto.http.metric_exporter")
FAILURE_REPEAT_S = 60.0  # a collector that stays down is said again this often, not at every retry


class ExportFailures(logging.Filter):
    """The SDK's exporters log three lines per failed batch (two retries, then the give-up), every second while a
    collector is down. This keeps one line of ours instead, the first time and then once per FAILURE_REPEAT_S,
    with how many failures it stands for. `now` is a clock (a parameter, so the rule is tested without waiting)."""

    def __init__(self, endpoint: str, now: Callable[[], float]) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.now = now
        self.failures = 0  # since the last line said
        self.said_at: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        self.failures += 1
        at = self.now()
        if self.said_at is None or at - self.said_at >= FAILURE_REPEAT_S:
            reason = record.getMessage().split(" encountered while", 1)[0][:300]
            log.warning("OTLP export to %s failing (%d failed attempts since last said): %s; what it could not "
                        "send is dropped", self.endpoint, self.failures, reason)
            self.said_at, self.failures = at, 0
        return False


class Telemetry:
    """The SDK's providers for one coordinator; `emit` a span record, `sample_forever` on the loop, `shutdown`.
    MissingExtra when the `otel` extra is not installed."""

    def __init__(self, settings: OtlpSettings, *, collectors: Iterable[Collector], instance_id: str) -> None:
        self.settings = settings
        self.collectors = tuple(collectors)
        self.instance_id = instance_id
        self._latest: dict[str, Series] = {}
        self._instruments: set[str] = set()
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise MissingExtra(["otel"]) from None
        resource = Resource.create({"service.name": self.settings.service_name,
                                    "service.instance.id": self.instance_id})
        self._tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # `shutdown` does it
        self._tracer_provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=self.settings.url("traces"), timeout=5),
            # a checkpoint of a 1,000-task job is 4,001 spans at once: the SDK's default queue (2,048) would drop
            max_queue_size=SPAN_QUEUE, schedule_delay_millis=self.settings.spans_delay_s * 1000))
        self._tracer = self._tracer_provider.get_tracer("sluice.coordinator")
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=self.settings.url("metrics"), timeout=5),
                                               export_interval_millis=self.settings.metrics_interval_s * 1000)
        self._meter_provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
        self._meter = self._meter_provider.get_meter("sluice.coordinator")
        self._failures = ExportFailures(settings.endpoint, time.monotonic)
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self._failures)
        self._builders: queue.Queue[SpanBuilder | None] = queue.Queue(maxsize=SPAN_BACKLOG)
        self.dropped = 0  # traces dropped because the thread had SPAN_BACKLOG waiting
        self._thread = threading.Thread(target=self._build_forever, name="sluice-otlp-traces", daemon=True)
        self._thread.start()

    # -- traces -----------------------------------------------------------------------------------------------

    def submit(self, build: SpanBuilder) -> None:
        """Build a trace and export it on the telemetry's own thread: a 1,000-task checkpoint is 4,001 spans,
        about a third of a second of CPU in the SDK on a busy machine (docs/BENCHMARKS.md, Observability), which
        the event loop must not spend. A backlog past SPAN_BACKLOG (the thread cannot keep up) drops the newest,
        with a line."""
        try:
            self._builders.put_nowait(build)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("OTLP export: %d traces dropped so far, the telemetry thread cannot keep up",
                            self.dropped)

    def _build_forever(self) -> None:
        while True:
            build = self._builders.get()
            if build is None:
                return
            try:
                record = build()
                if record is not None:
                    self.emit(record)
            except Exception:  # noqa: BLE001 - one trace that fails to build must not end the others
                log.exception("building a trace for OTLP failed")

    def emit(self, record: SpanRecord) -> None:
        """Export a span and its children with their recorded times (a trace of its own)."""
        from opentelemetry import context, trace

        self._start(record, context.Context(), trace)

    def _start(self, record: SpanRecord, parent: Any, trace: Any) -> None:
        span = self._tracer.start_span(record.name, context=parent, attributes=dict(record.attributes),
                                       start_time=_ns(record.start_s))
        if record.error:
            span.set_status(trace.Status(trace.StatusCode.ERROR, record.error))
        below = trace.set_span_in_context(span, parent)
        for child in record.children:
            self._start(child, below, trace)
        span.end(end_time=_ns(record.end_s))

    # -- metrics ----------------------------------------------------------------------------------------------

    def sample_metrics(self) -> None:
        """Read the collectors (on the event loop) and keep the sample for the reader's thread; a family seen for
        the first time gets its instrument."""
        families = [family for collector in self.collectors for family in collector.collect()]
        latest = otlp_series(families)
        self._latest = latest  # one assignment: the reader's thread sees the old sample or the new, whole
        for name, series in latest.items():
            if name not in self._instruments:
                self._instruments.add(name)
                create = (self._meter.create_observable_counter if series.kind == COUNTER
                          else self._meter.create_observable_gauge)
                create(name, callbacks=[self._observe(name)], description=series.description)

    def _observe(self, name: str) -> Callable[[Any], Iterator[Any]]:
        from opentelemetry.metrics import Observation

        def observe(options: Any) -> Iterator[Any]:  # on the reader's thread
            series = self._latest.get(name)
            for value, labels in series.points if series is not None else ():
                yield Observation(value, dict(labels))
        return observe

    async def sample_forever(self) -> None:
        while True:
            try:
                self.sample_metrics()
            except Exception:  # noqa: BLE001 - a collector that fails must not end the export
                log.exception("sampling the metrics for OTLP failed")
            await asyncio.sleep(min(self.settings.metrics_interval_s / 2, 5.0))

    async def shutdown(self) -> None:
        """Send what is left (bounded by SHUTDOWN_S: a collector that is down does not hold the stop)."""
        def flush() -> None:
            self._builders.put(None)  # after the traces already submitted
            self._thread.join(SHUTDOWN_S)
            self._tracer_provider.shutdown()
            self._meter_provider.shutdown(timeout_millis=SHUTDOWN_S * 1000)

        try:
            await asyncio.wait_for(asyncio.to_thread(flush), SHUTDOWN_S)
        except TimeoutError:
            log.warning("the OTLP collector at %s took the last spans and metrics for longer than %.0f s; "
                        "left unsent", self.settings.endpoint, SHUTDOWN_S)
        finally:
            for name in EXPORTER_LOGGERS:
                logging.getLogger(name).removeFilter(self._failures)


def _ns(unix_s: float) -> int:
    """Unix seconds -> nanoseconds, the whole seconds apart (unix_s * 1e9 would round to 256 ns)."""
    whole = math.floor(unix_s)
    return whole * 1_000_000_000 + round((unix_s - whole) * 1e9)
