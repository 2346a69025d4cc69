"""Sluice coordinator: worker registry, scheduling, job lifecycle (and, later, checkpoints and failover)."""
