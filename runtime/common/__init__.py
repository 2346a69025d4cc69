"""The bottom layer: small helpers shared by the whole runtime and the coordinator.

Everything in runtime and the coordinator may import it; it imports nothing of ours.
"""
