"""Operator chains (`chain`), the operator kinds they are built from (`kinds`), how records look inside a chain
with and without event time (`shapes`), and the record writers of a task's output edges (`record_writer`)."""

from runtime.execution.operators.chain import Chain, ChainOutput
from runtime.execution.operators.kinds import Operator, OperatorSetup, TimerFiring, make_operator
from runtime.execution.operators.record_writer import Emit, EmitBatch, RecordWriter

__all__ = ["Chain", "ChainOutput", "Emit", "EmitBatch", "Operator", "OperatorSetup", "RecordWriter", "TimerFiring",
           "make_operator"]
