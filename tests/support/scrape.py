"""Scraping a process's Prometheus endpoint in tests."""

from __future__ import annotations

import urllib.request


def scrape(address: str) -> dict[str, float]:
    """Every `sluice_*` sample of the endpoint at `address`, by its name and labels."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sluice_"):
            name_labels, value = line.rsplit(" ", 1)
            totals[name_labels] = float(value)
    return totals
