"""The user-facing API: build a job graph from sources, functions and sinks.

`from runtime.api import Job, KeyedProcessFunction, FileSink, ...` is the one
import a job module needs; the names below are the public interface.
"""

from runtime.api.async_functions import AsyncKeyedContext, AsyncKeyedProcessFunction, AsyncOpenContext
from runtime.api.async_io import RetryPolicy
from runtime.api.co_functions import (
    BroadcastContext,
    BroadcastProcessFunction,
    BroadcastState,
    BroadcastStateError,
    CoProcessFunction,
    KeyedBroadcastContext,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    MapStateDescriptor,
)
from runtime.api.functions import (
    Context,
    KeyedContext,
    KeyedProcessFunction,
    ListState,
    OperatorContext,
    OutputTag,
    ProcessFunction,
    TimerService,
    ValueState,
)
from runtime.api.interval_join import LATE_LEFT, LATE_RIGHT, IntervalJoinFunction
from runtime.api.state import (
    AggregateFunction,
    AggregatingState,
    KeyedListState,
    MapState,
    ReducingState,
    TtlValueState,
)
from runtime.api.stream import (
    DEFAULT_MAX_PARALLELISM,
    PARTITIONERS,
    BroadcastStream,
    ConnectedStreams,
    DataStream,
    Job,
    JobDefinitionError,
    KeyedStream,
    Node,
)
from runtime.api.time import MAX_WATERMARK, MIN_WATERMARK, BoundedOutOfOrderness
from runtime.api.windows import (
    LATE_DATA,
    EventTimeSessionWindows,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    Window,
    WindowedStream,
)
from runtime.connectors.delta import DeltaSink
from runtime.connectors.file_source import FileSource
from runtime.connectors.files import FileSink, JsonLinesSource, ParquetSource
from runtime.connectors.generator import GeneratorSource
from runtime.connectors.iceberg import IcebergSink
from runtime.connectors.kafka_core import KafkaRecord, MalformedKafkaRecord
from runtime.connectors.kafka_sink import KafkaSink
from runtime.connectors.kafka_source import MALFORMED_KAFKA_RECORDS, KafkaSource
from runtime.connectors.nats import NatsSink, NatsSource
from runtime.connectors.postgres_cdc import PostgresCdcSource
from runtime.connectors.postgres_sink import PostgresSink
from runtime.connectors.sinks import DiscardSink, PrintSink, Sink
from runtime.connectors.source import Source

__all__ = [
    "Job", "DataStream", "KeyedStream", "Node", "GeneratorSource", "FileSink", "JsonLinesSource", "ParquetSource",
    "PrintSink", "DiscardSink", "Sink", "Source", "KeyedProcessFunction", "ProcessFunction",
    "AsyncKeyedProcessFunction", "AsyncKeyedContext", "AsyncOpenContext", "Context",
    "KeyedContext", "ValueState", "JobDefinitionError", "DEFAULT_MAX_PARALLELISM", "PARTITIONERS", "NatsSource",
    "NatsSink", "DeltaSink", "IcebergSink", "FileSource", "PostgresCdcSource", "PostgresSink",
    "KafkaSource", "KafkaSink", "KafkaRecord", "MalformedKafkaRecord",
    "MALFORMED_KAFKA_RECORDS",
    "ListState", "OperatorContext",
    "BoundedOutOfOrderness", "MIN_WATERMARK", "MAX_WATERMARK", "TimerService",
    "OutputTag", "LATE_DATA", "Window", "WindowedStream", "TumblingEventTimeWindows",
    "SlidingEventTimeWindows", "EventTimeSessionWindows", "TumblingProcessingTimeWindows",
    "SlidingProcessingTimeWindows", "ProcessingTimeSessionWindows",
    "AggregateFunction", "AggregatingState", "KeyedListState", "MapState", "ReducingState", "TtlValueState",
    "CoProcessFunction", "KeyedCoProcessFunction", "BroadcastProcessFunction", "KeyedBroadcastProcessFunction",
    "MapStateDescriptor", "BroadcastState", "BroadcastStateError", "BroadcastContext", "KeyedBroadcastContext",
    "BroadcastStream", "ConnectedStreams",
    "LATE_LEFT", "LATE_RIGHT", "IntervalJoinFunction",
    "RetryPolicy",
]
