"""Sluice runtime: the user API, job graph, tasks, operators, connectors and the worker process."""
