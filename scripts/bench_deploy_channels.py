#!/usr/bin/env python
"""A worker's channel walk at deployment (issue 32), in one process: every channel of every edge (as
runtime/worker/deployment.py walked them before) against only those its subtasks touch (channels_touching).

The plan is scripts/bench_scale.py's at --tasks (P = tasks / 2: source+map -> keyed count+sink, one all-to-all
edge of P x P channels), placed on tasks / --slots workers by the planner's own slot sharing; the walk is that
of the first worker: for each channel, its id and both ends' placements (what deploy() does before it builds
anything). CPU time per worker, the median of --repeat runs, both ways alternating; it checks that both find
the same channels in the same order.

    .venv/bin/python scripts/bench_deploy_channels.py --tasks 100 300 1000 10000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.graph.plan import (  # noqa: E402
    Edge,
    Vertex,
    channel_id,
    channels_of_edge,
    channels_touching,
    place_subtasks,
)

Walk = Callable[[Edge, int, int, set[int], set[int]], Iterable[tuple[int, int]]]


def every_channel(edge: Edge, up_p: int, down_p: int, producers: set[int], consumers: set[int]) -> list[
        tuple[int, int]]:
    return channels_of_edge(edge, up_p, down_p)


def walk(vertices: list[Vertex], edges: list[Edge], placement: dict[str, str], worker: str,
         pairs: Walk) -> list[int]:
    here: dict[int, set[int]] = {v.id: {i for i in range(v.parallelism) if placement[f"{v.id}:{i}"] == worker}
                                 for v in vertices}
    found = []
    for edge in edges:
        up, down = vertices[edge.up], vertices[edge.down]
        for i, j in pairs(edge, up.parallelism, down.parallelism, here[up.id], here[down.id]):
            cid = channel_id(0, edge, down.parallelism, i, j)
            if placement[f"{up.id}:{i}"] == worker or placement[f"{down.id}:{j}"] == worker:
                found.append(cid)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--slots", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'tasks':>6} {'workers':>7} {'channels':>10} {'touched':>8} {'every channel ms':>17} "
          f"{'touched only ms':>16} {'ratio':>7}")
    for tasks in args.tasks:
        p = max(1, tasks // 2)
        workers = max(1, -(-2 * p // args.slots))
        vertices = [Vertex(0, [0, 1], p, "source -> map"), Vertex(1, [2, 3], p, "count -> sink")]
        edges = [Edge(0, 0, 1, "hash", 0, 0)]
        placement = place_subtasks(vertices, [(f"worker-{w}", args.slots) for w in range(workers)])
        worker = placement["0:0"]
        times: dict[str, list[float]] = {"every": [], "touched": []}
        found: dict[str, list[int]] = {}
        for _ in range(args.repeat):
            for name, pairs in (("every", every_channel), ("touched", channels_touching)):
                t0 = time.process_time()
                found[name] = walk(vertices, edges, placement, worker, pairs)
                times[name].append(time.process_time() - t0)
        if found["every"] != found["touched"]:
            print(f"MISMATCH at {tasks} tasks", file=sys.stderr)
            return 1
        every, touched = statistics.median(times["every"]), statistics.median(times["touched"])
        print(f"{2 * p:>6} {workers:>7} {p * p:>10} {len(found['touched']):>8} {every * 1e3:>17.1f} "
              f"{touched * 1e3:>16.2f} {every / touched if touched else float('inf'):>6.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
