"""The operators of a SQL plan's last task (a window or group aggregation and what follows it, up to a print
table) as one real Chain in this process: rows with timestamps fed by hand, watermarks in band, timers fired as
the task fires them. For unit tests of what a plan computes, without processes."""

from __future__ import annotations

from typing import Any

from runtime.api import Job
from runtime.execution.operators import Chain
from runtime.graph.plan import chain_graph
from tests.support.chain_time import advance_watermark


class SqlTailChain:
    """`feed([(timestamp, row), ...])`, `watermark(wm)`; the print table's lines go to stdout (capsys)."""

    def __init__(self, script: str, *, subtask_index: int = 0, parallelism: int = 1) -> None:
        job = Job("sql-tail")
        job.sql(script)
        vertices, _ = chain_graph(job)
        tail = vertices[-1]
        assert job.nodes[tail.nodes[-1]].kind == "sink", "the script's last operator is a sink"
        # a query chained to its source entirely (no key_by): the operators after the source
        nodes = [n for n in tail.nodes if job.nodes[n].kind != "source"]
        self.job = job
        self.names = [job.nodes[n].name for n in nodes]
        self.chain = Chain(job, nodes, subtask_index=subtask_index, parallelism=parallelism, attempt=0, outputs=[])
        self.chain.open()

    def feed(self, rows: list[tuple[int | None, Any]], input_index: int = 0) -> None:
        """Rows to the head operator's input `input_index` (a join: 0 its left side, 1 its right)."""
        self.chain.input_batch(input_index)(list(rows))

    def watermark(self, wm: int) -> None:
        advance_watermark(self.chain, wm, 64)
