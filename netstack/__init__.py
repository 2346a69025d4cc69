"""Sluice network stack: wire format, sans-IO protocol state, one asyncio transport.

Imports nothing from runtime/ or coordinator/.
"""
