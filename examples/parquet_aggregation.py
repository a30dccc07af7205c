"""Keyed aggregation over Parquet files on Plaque: spend per user, Parquet in and out.

events (S shards, each reading its own row groups) -KEYED by user, combined-> totals (C)
       -> out (a Parquet sink: one file per totals shard)

``parquet_parts(files, S)`` deals the files' row groups out to the S source shards (the driver
reads only the files' footers); each shard reads its own with ``read_parquet`` where it runs
and emits every event's amount under its user's key, one emit per row, on an edge that sums
per user before anything leaves. A totals shard adds up what reaches it and hands rows
``{"user", "events", "spend"}`` to the sink, which publishes ``totals-<run>/`` when the run
succeeds. The driver checks the published totals against plain Python over the same files and
prints the throughput. Needs pyarrow: ``pip install 'pathways-open[parquet]'``.

Run: ``python examples/parquet_aggregation.py [--workers 2] [--events 1000000]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import plaque
from plaque import KEYED, ONE_TO_ONE, Combiner, Graph, Operator, ParquetSink

# (events, spend) per user, from amounts: a pair per row, pairs added member by member
SPEND = Combiner(add=lambda acc, amount: (acc[0] + 1, acc[1] + amount),
                 create=lambda amount: (1, amount),
                 merge=lambda a, b: (a[0] + b[0], a[1] + b[1]))


class Events(Operator):
    def on_start(self, ctx, t):
        for table in plaque.read_parquet(ctx.part, columns=["user", "amount"]):
            for user, amount in zip(table.column("user").to_pylist(),
                                    table.column("amount").to_pylist()):
                ctx.emit(amount, key=user)


class Totals(Operator):
    def on_batch(self, ctx, t, port, pairs):
        totals = ctx.state.setdefault("totals", {})
        for user, acc in pairs:
            totals[user] = SPEND.merge(totals[user], acc) if user in totals else acc

    def on_complete(self, ctx, t):
        ctx.emit_batch([{"user": u, "events": n, "spend": s}
                        for u, (n, s) in sorted(ctx.state.get("totals", {}).items())])


def graph(out: str, sources: int, totals: int) -> Graph:
    g = Graph("spend-per-user")
    events = g.node("events", Events, shards=sources)
    per_user = g.node("totals", Totals, shards=totals)
    g.edge(events, per_user, KEYED, combine=SPEND)
    g.edge(per_user, g.node("out", ParquetSink(out), shards=totals), ONE_TO_ONE)
    return g


def write_events(directory: str, events: int, files: int = 4) -> list[str]:
    """Parquet files of events (user, amount in cents, item), row groups of 50,000 rows."""
    rng = np.random.default_rng(0)
    paths = []
    for f in range(files):
        n = events // files + (f < events % files)
        table = pa.table({"user": rng.zipf(1.2, size=n) % 50_000,
                          "amount": rng.integers(1, 10_000, size=n),
                          "item": rng.integers(0, 1_000, size=n)})
        path = os.path.join(directory, f"events-{f}.parquet")
        pq.write_table(table, path, row_group_size=50_000)
        paths.append(path)
    return paths


def expected(paths) -> dict:
    want: dict = collections.defaultdict(lambda: [0, 0])
    for path in paths:
        table = pq.read_table(path, columns=["user", "amount"])
        for user, amount in zip(table.column("user").to_pylist(),
                                table.column("amount").to_pylist()):
            want[user][0] += 1
            want[user][1] += amount
    return {u: tuple(v) for u, v in want.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--events", type=int, default=1_000_000, help="events in the files")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="plaque-parquet-") as tmp:
        paths = write_events(tmp, args.events)
        with plaque.local_cluster(workers=args.workers) as cluster:
            installed = cluster.install(graph(os.path.join(tmp, "totals-{t}"), args.workers,
                                              args.workers))
            parts = {"events": plaque.parquet_parts(paths, args.workers)}
            installed.run(parts=parts).result(timeout=300)  # warm-up: imports, connections
            start = time.perf_counter()
            result = installed.run(parts=parts).result(timeout=300)
            elapsed = time.perf_counter() - start
        published = pq.read_table(os.path.join(tmp, f"totals-{result.timestamp}")).to_pylist()
        got = {r["user"]: (r["events"], r["spend"]) for r in published}
        if len(got) != len(published) or got != expected(paths):
            raise AssertionError("published totals differ from plain Python")
    print(f"{args.events:,} events from {len(paths)} Parquet files on {args.workers} workers,"
          f" {len(got):,} users: {elapsed:.2f} s = {args.events / elapsed:,.0f} events/s")
    print("the published per-user totals equal plain Python's over the files (exact)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
