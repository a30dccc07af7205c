"""Word count on Plaque, with batch operators and keys.

lines (S shards) -> split -> KEYED by word -> count (C shards)

Each source shard makes its share of a deterministic corpus (Zipf-distributed words); the
splitter turns a batch of lines into one batch of words and sends every word to the shard of
its key with ``emit_batch(words, keys=words)``: one stable hash per word, the same in every
worker process whatever its ``PYTHONHASHSEED``. A counter keeps its run's counts in
``ctx.state`` (runs overlap) and outputs them when its input is complete. The driver starts
several runs at once, checks every count against ``collections.Counter`` over the same corpus,
and prints the throughput.

Run: ``python examples/word_count.py [--workers 2] [--lines 20000] [--runs 4]``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np

import plaque
from plaque import KEYED, ONE_TO_ONE, Graph, Operator

VOCABULARY = 5000
WORDS_PER_LINE = 12


def corpus(shard: int, num_shards: int, lines: int, run: int) -> list[str]:
    """This source shard's lines of run ``run``'s corpus (the same wherever it is made)."""
    rng = np.random.default_rng([run, shard])
    mine = lines // num_shards + (shard < lines % num_shards)
    ranks = np.minimum(rng.zipf(1.3, size=(mine, WORDS_PER_LINE)), VOCABULARY)
    return [" ".join(f"w{r}" for r in row) for row in ranks]


class Lines(Operator):
    """A source: ctx.arg = (lines in the corpus, run number)."""

    def on_complete(self, ctx, t):
        lines, run = ctx.arg
        ctx.emit_batch(corpus(ctx.shard, ctx.num_shards, lines, run))


class Split(Operator):
    def on_batch(self, ctx, t, port, lines):
        words = " ".join(lines).split()
        ctx.emit_batch(words, keys=words)


class Count(Operator):
    def on_batch(self, ctx, t, port, words):
        counts = ctx.state.setdefault("counts", collections.Counter())
        counts.update(words)

    def on_complete(self, ctx, t):
        ctx.output(dict(ctx.state.get("counts", {})))


def graph(sources: int = 2, counters: int = 4) -> Graph:
    g = Graph("word-count")
    lines = g.node("lines", Lines, shards=sources)
    split = g.node("split", Split, shards=sources)
    count = g.node("count", Count, shards=counters)
    g.edge(lines, split, ONE_TO_ONE)
    g.edge(split, count, KEYED)
    return g


def expected(lines: int, run: int, sources: int) -> collections.Counter:
    want: collections.Counter = collections.Counter()
    for s in range(sources):
        for line in corpus(s, sources, lines, run):
            want.update(line.split())
    return want


def check(result, lines: int, run: int, sources: int) -> int:
    """Raise unless every word was counted exactly once, on one shard; returns the words."""
    shards = result.outputs.get("count", {})
    got: collections.Counter = collections.Counter()
    for counts in (c for outs in shards.values() for c in outs):
        if set(counts) & set(got):
            raise AssertionError("a word was counted on two shards: keys split")
        got.update(counts)
    if got != expected(lines, run, sources):
        raise AssertionError(f"run {run}: counts differ from collections.Counter")
    return sum(got.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--lines", type=int, default=20_000, help="lines per run (default 20000)")
    ap.add_argument("--runs", type=int, default=4, help="runs started at once (default 4)")
    args = ap.parse_args(argv)
    with plaque.local_cluster(workers=args.workers) as cluster:
        installed = cluster.install(graph())
        installed.run((100, 0)).result(timeout=60)  # warm-up: imports, connections
        start = time.perf_counter()
        futures = [installed.run((args.lines, run)) for run in range(args.runs)]
        results = [f.result(timeout=300) for f in futures]
        elapsed = time.perf_counter() - start
    words = sum(check(r, args.lines, run, 2) for run, r in enumerate(results))
    print(f"{args.runs} overlapping runs of {args.lines} lines on {args.workers} workers:"
          f" {words:,} words counted in {elapsed:.2f} s = {words / elapsed:,.0f} words/s")
    print("every count equals collections.Counter over the same corpus (exact)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
