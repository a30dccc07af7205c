"""Keyed aggregation on Plaque with numpy rows: count and sum per user, without a Python loop
per row.

events (S shards) -KEYED by user-> totals (C shards)

Each source shard makes a structured numpy array of events (user id, amount) and sends it with
``emit_batch(events, keys=events["user"])``: the user ids are hashed as one array (the stable
hash of ``plaque.keys``), the rows split by destination shard and sent as out-of-band frames,
never pickled row by row. A totals shard adds each batch into its run's ``ctx.state`` with
``np.unique`` and ``np.bincount`` and outputs (users, counts, sums) when its input is complete.
The driver checks the totals against numpy over the same events and prints rows/s.

Run: ``python examples/keyed_aggregation.py [--workers 2] [--rows 2000000] [--runs 4]``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import plaque
from plaque import KEYED, Graph, Operator

EVENT = np.dtype([("user", np.int64), ("amount", np.float64)])
USERS = 100_000


def events(shard: int, rows: int, run: int) -> np.ndarray:
    rng = np.random.default_rng([run, shard])
    out = np.empty(rows, dtype=EVENT)
    out["user"] = rng.integers(0, USERS, size=rows)
    out["amount"] = rng.integers(1, 1000, size=rows) / 100  # cents: sums are exact enough
    return out


class Events(Operator):
    """A source: ctx.arg = (rows per source shard, run number)."""

    def on_complete(self, ctx, t):
        rows, run = ctx.arg
        batch = events(ctx.shard, rows, run)
        ctx.emit_batch(batch, keys=batch["user"])


class Totals(Operator):
    def on_batch(self, ctx, t, port, rows):
        users, where = np.unique(rows["user"], return_inverse=True)
        parts = ctx.state.setdefault("parts", [])
        parts.append((users, np.bincount(where), np.bincount(where, weights=rows["amount"])))

    def on_complete(self, ctx, t):
        ctx.output(merge(ctx.state.get("parts", [])))


def merge(parts):
    """(users, counts, sums) of several partial totals, users sorted."""
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
    users, where = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    counts = np.bincount(where, weights=np.concatenate([p[1] for p in parts]))
    sums = np.bincount(where, weights=np.concatenate([p[2] for p in parts]))
    return users, counts.astype(np.int64), sums


def graph(sources: int = 2, totals: int = 4) -> Graph:
    g = Graph("keyed-aggregation")
    g.edge(g.node("events", Events, shards=sources), g.node("totals", Totals, shards=totals),
           KEYED)
    return g


def check(result, rows: int, run: int, sources: int) -> int:
    """Raise unless the totals equal numpy's over the same events; returns the rows."""
    shards = [outs[0] for outs in result.outputs["totals"].values()]
    seen = np.concatenate([s[0] for s in shards])
    if len(np.unique(seen)) != len(seen):
        raise AssertionError("a user has totals on two shards: keys split")
    users, counts, sums = merge(shards)
    every = np.concatenate([events(s, rows, run) for s in range(sources)])
    want_users, where = np.unique(every["user"], return_inverse=True)
    if not (np.array_equal(users, want_users)
            and np.array_equal(counts, np.bincount(where))
            and np.allclose(sums, np.bincount(where, weights=every["amount"]))):
        raise AssertionError(f"run {run}: totals differ from numpy's")
    return int(counts.sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--rows", type=int, default=2_000_000,
                    help="events per source shard per run (default 2000000)")
    ap.add_argument("--runs", type=int, default=4, help="runs started at once (default 4)")
    args = ap.parse_args(argv)
    with plaque.local_cluster(workers=args.workers) as cluster:
        installed = cluster.install(graph())
        installed.run((1000, 0)).result(timeout=60)  # warm-up: imports, connections
        start = time.perf_counter()
        futures = [installed.run((args.rows, run)) for run in range(args.runs)]
        results = [f.result(timeout=300) for f in futures]
        elapsed = time.perf_counter() - start
    rows = sum(check(r, args.rows, run, 2) for run, r in enumerate(results))
    print(f"{args.runs} overlapping runs on {args.workers} workers: {rows:,} events aggregated"
          f" by user in {elapsed:.2f} s = {rows / elapsed:,.0f} rows/s")
    print("every user's count and sum equal numpy's over the same events (exact)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
