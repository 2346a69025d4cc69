"""The error a job graph that cannot run raises, in a module of its own: the stream classes and the operators
built on them (windows, joins, interval joins) all raise it, and none of them needs another to do so."""

from __future__ import annotations


class JobDefinitionError(ValueError):
    """The job graph the user built cannot run (bad parallelism, bad partitioning...)."""
