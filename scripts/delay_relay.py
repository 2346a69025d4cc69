#!/usr/bin/env python
"""A TCP relay that delays every byte by a fixed time in each direction: a slow network link, in user space.

    python scripts/delay_relay.py --upstream 127.0.0.1:6379 --one-way-ms 0.5
    # prints "listening on 127.0.0.1:PORT" once ready; clients connect there instead of upstream

What scripts/bench_state.py uses to put the remote state server 1 ms of round trip away when the kernel has no
netem queueing discipline (`tc qdisc add ... netem delay` fails with "Specified qdisc kind is unknown" on
kernels built without sch_netem, as on this project's machines) and the server has no latency setting of its
own. Each direction is a reader thread, which stamps each chunk with its arrival time, and a writer thread,
which sends it once `--one-way-ms` has passed since that stamp: order is kept, and chunks in flight overlap as
packets on a slow link do (the delay is latency, not a bandwidth cap). Run as its own process, so its threads
never share an interpreter lock with the benchmark.
"""

from __future__ import annotations

import argparse
import collections
import socket
import sys
import threading
import time


def pump(source: socket.socket, sink: socket.socket, delay_s: float) -> None:
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    ready = threading.Condition()

    def read() -> None:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                data = b""
            with ready:
                queue.append((time.perf_counter() + delay_s, data))
                ready.notify()
            if not data:
                return

    threading.Thread(target=read, daemon=True).start()
    while True:
        with ready:
            while not queue:
                ready.wait()
            due, data = queue.popleft()
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        if not data:
            break
        try:
            sink.sendall(data)
        except OSError:
            break
    for s in (sink, source):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(listener: socket.socket, upstream: tuple[str, int], delay_s: float) -> None:
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection(upstream, timeout=5)
        except OSError:
            client.close()
            continue
        server.settimeout(None)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, server, delay_s), daemon=True).start()
        threading.Thread(target=pump, args=(server, client, delay_s), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="host:port of the real server")
    parser.add_argument("--one-way-ms", type=float, default=0.5)
    parser.add_argument("--listen", default="127.0.0.1")
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.listen, 0))
    listener.listen(64)
    print(f"listening on {args.listen}:{listener.getsockname()[1]}", flush=True)
    sys.stdout.close()
    serve(listener, (host, int(port)), args.one_way_ms / 1000)


if __name__ == "__main__":
    main()
