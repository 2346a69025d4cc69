"""`sluice sql --explain`: each INSERT's plan as a tree (Flink's explain style), every node with its changelog
mode, and under it the operators it became: uid, parallelism, keys, state, watermarks."""

from __future__ import annotations

from runtime.sql.changelog import sink_accepts
from runtime.sql.logical import PlanNode, SinkNode, original
from runtime.sql.session import JOB_OPTIONS, SqlSession


def explain(session: SqlSession) -> str:
    lines = [f"== Job '{session.job.name}': {len(session.job.nodes)} operators, default parallelism "
             f"{session.job.default_parallelism} =="]
    options = session.catalog.options
    if options:
        lines.append("SET " + ", ".join(f"{k}={v}" + ("" if k in JOB_OPTIONS else " (not used)")
                                        for k, v in sorted(options.items())))
    shown: set[int] = set()
    for planned in session.planned:
        sink = planned.sink
        lines.append("")
        lines.append(f"-- INSERT INTO {sink.table.name} (line {planned.statement.line}); the sink takes "
                     f"{sink_accepts(sink.table.connector, sink.table.primary_key)}")
        _node(session, sink, 0, lines, shown)
    return "\n".join(lines) + "\n"


def _node(session: SqlSession, node: PlanNode, depth: int, lines: list[str], shown: set[int]) -> None:
    node = original(node)
    node = session.translator.twins.get(id(node), node)  # a reused sub-plan is shown as the one it reuses
    pad = "   " * depth
    branch = "" if depth == 0 else "+- "
    reused = id(node) in shown
    lines.append(f"{pad[:-3] if depth else ''}{branch}{node.digest()}  changelog={node.mode}"
                 + (f"  rowtime={node.fields[node.rowtime].name}" if node.rowtime is not None
                    and not isinstance(node, SinkNode) else "") + ("  (reused)" if reused else ""))
    if reused:
        return
    shown.add(id(node))
    for op in session.translator.operators.get(id(node), []):
        extra = "".join(f", {k} {v}" for k, v in (("keys", op.keys), ("state", op.state),
                                                  ("watermarks", op.watermarks)) if v)
        lines.append(f"{pad}   | operator '{op.name}' uid {op.uid}, parallelism {op.parallelism}{extra}")
    for child in node.inputs():
        _node(session, child, depth + 1, lines, shown)
