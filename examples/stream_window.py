"""A windowed stream on Plaque: page views counted per tumbling window and in total.

clicks (input, 2 shards) -> pages (emit(1, key=page), combined) -KEYED-> window (2 shards)

The driver plays a click stream: events ``(time, user, page)`` with event times in
milliseconds. It sends them in batches into the stream's open epoch and advances the epoch
whenever event time crosses a window boundary, so each epoch is one tumbling window. A
``window`` shard counts the window's pages in ``ctx.state`` and, when the window's input is
complete (``on_complete``, in window order), adds them to the running totals it keeps across
the stream in ``ctx.keyed_state`` and outputs both. The driver checks every window's counts
and totals against plain Python over the same events and prints the throughput and how long
each window's result took after its epoch closed.

Run: ``python examples/stream_window.py [--workers 2] [--events 200000] [--window-ms 100]``.
"""

from __future__ import annotations

import argparse
import collections
import operator
import statistics
import sys
import time

import numpy as np

import plaque
from plaque import KEYED, ONE_TO_ONE, Graph, Operator


class Pages(Operator):
    def on_batch(self, ctx, t, port, clicks):
        for _, _, page in clicks:
            ctx.emit(1, key=page)


class Window(Operator):
    def on_batch(self, ctx, t, port, pairs):            # this window's (page, views) pairs
        window = ctx.state.setdefault("window", collections.Counter())
        for page, n in pairs:
            window[page] += n

    def on_complete(self, ctx, t):                      # the window is closed: in order
        window, totals = ctx.state.get("window", {}), ctx.keyed_state
        for page, n in window.items():
            totals[page] = totals.get(page, 0) + n
        ctx.output((dict(window), {page: totals[page] for page in window}))


def graph(workers: int) -> Graph:
    g = Graph("page-views")
    clicks = g.input("clicks", shards=workers)
    pages = g.node("pages", Pages, shards=workers)
    window = g.node("window", Window, shards=workers)
    g.edge(clicks, pages, ONE_TO_ONE)
    g.edge(pages, window, KEYED, combine=operator.add)
    return g


def click_stream(events: int, seed: int = 0) -> list[tuple[int, int, str]]:
    """``events`` clicks ``(time ms, user, page)`` in time order, about 1 per 0.1 ms."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.1, size=events)).astype(np.int64)
    users = rng.integers(0, 10_000, size=events)
    pages = np.minimum(rng.zipf(1.5, size=events), 500)
    return [(int(t), int(u), f"/page/{p}") for t, u, p in zip(times, users, pages)]


def windows(clicks, window_ms: int) -> list[list]:
    """The clicks of each tumbling window, in order (empty windows included)."""
    last = clicks[-1][0] // window_ms if clicks else -1
    out: list[list] = [[] for _ in range(last + 1)]
    for click in clicks:
        out[click[0] // window_ms].append(click)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--events", type=int, default=200_000, help="clicks in the stream")
    ap.add_argument("--window-ms", type=int, default=100, help="window length in event ms")
    ap.add_argument("--batch", type=int, default=1000, help="clicks per send")
    args = ap.parse_args(argv)
    clicks = click_stream(args.events)
    per_window = windows(clicks, args.window_ms)
    with plaque.local_cluster(workers=args.workers) as cluster:
        installed = cluster.install(graph(args.workers))
        with installed.stream() as warm:  # warm-up: imports, connections
            warm.send(clicks[:100])
        futures, closed_at, done_at = [], [], {}
        start = time.perf_counter()
        stream = installed.stream()
        for i, window in enumerate(per_window):
            for b in range(0, len(window), args.batch):
                stream.send(window[b:b + args.batch])
            closed_at.append(time.perf_counter())
            fut = stream.advance() if i < len(per_window) - 1 else stream.close()
            fut.add_done_callback(lambda _, i=i: done_at.setdefault(i, time.perf_counter()))
            futures.append(fut)
        results = [f.result(timeout=300) for f in futures]
        elapsed = time.perf_counter() - start
    running: collections.Counter = collections.Counter()
    for i, (window, result) in enumerate(zip(per_window, results)):
        want = collections.Counter(page for _, _, page in window)
        running.update(want)
        got_window, got_totals = {}, {}
        for counts, totals in result.values("window"):
            got_window.update(counts)
            got_totals.update(totals)
        if got_window != want or got_totals != {p: running[p] for p in want}:
            raise AssertionError(f"window {i}: counts differ from plain Python")
    lag = [done_at[i] - closed for i, closed in enumerate(closed_at)]
    print(f"{len(clicks):,} clicks in {len(per_window)} windows of {args.window_ms} ms on"
          f" {args.workers} workers: {elapsed:.2f} s = {len(clicks) / elapsed:,.0f} clicks/s;"
          f" a window's result came {statistics.median(lag) * 1e3:.1f} ms (median) after"
          " the driver closed it")
    print("every window's counts and running totals equal plain Python's (exact)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
