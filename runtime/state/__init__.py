"""Keyed state storage: the backend interface, its implementations, and checkpoint files of state.

This layer sits between runtime.graph (key groups) and runtime.execution (the
tasks that will use it). Nothing here knows about tasks, channels or barriers.
"""
