"""Reading a GeneratorSource to its end, as one subtask of a parallelism, for the generator's tests."""

from __future__ import annotations

from runtime.connectors.generator import GeneratorSource


def read_all(source: GeneratorSource, subtask: int = 0, parallelism: int = 1) -> list[tuple[str, int, int]]:
    source.open(subtask, parallelism)
    out: list[tuple[str, int, int]] = []
    while (batch := source.read_batch(700)) is not None:
        out += batch
    return out
