"""Word count over text files on Plaque: partitioned input, a combining edge, a JSONL sink.

files -> split (S shards, each reading its own line-aligned part of the files)
      -> KEYED by word, combined -> count (C shards) -> out (a JSONL sink, C files per run)

``text_parts(files, S)`` cuts the files into S byte ranges that start and end at line
boundaries; each split shard reads its own where it runs (nothing of the input passes through
the driver) and emits ``1`` under each word's key. The edge to ``count`` combines with
``operator.add``: a split shard sends each distinct word once per turn with its count, hashed
once. A count shard adds the pairs it receives into its run's ``ctx.state`` and, when its input
is complete, hands its counts to the sink, which writes ``counts-<run>/part-<shard>.jsonl``
and publishes the run's directory when the run succeeds. The driver checks every count
against ``collections.Counter`` over the same files and prints the throughput.

Run: ``python examples/word_count.py [--workers 2] [--words 2000000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import operator
import os
import sys
import tempfile
import time

import numpy as np

import plaque

# --- the word count: what a user writes ------------------------------------------------------
from plaque import KEYED, ONE_TO_ONE, Graph, JsonlSink, Operator, read_lines


class Split(Operator):
    def on_start(self, ctx, t):                   # a source: reads its own part of the files
        for line in read_lines(ctx.part):
            for word in line.split():
                ctx.emit(1, key=word)             # folded per word before it leaves


class Count(Operator):
    def on_batch(self, ctx, t, port, pairs):      # (word, count) pairs from every splitter
        counts = ctx.state.setdefault("counts", collections.Counter())
        for word, n in pairs:
            counts[word] += n

    def on_complete(self, ctx, t):                # every pair of run t is in
        ctx.emit_batch(list(ctx.state.get("counts", {}).items()))


def graph(out: str, splitters: int = 2, counters: int = 2) -> Graph:
    g = Graph("word-count")
    split = g.node("split", Split, shards=splitters)
    count = g.node("count", Count, shards=counters)
    g.edge(split, count, KEYED, combine=operator.add)
    g.edge(count, g.node("out", JsonlSink(out), shards=counters), ONE_TO_ONE)
    return g
# --- end of the word count -------------------------------------------------------------------


VOCABULARY = 50_000
WORDS_PER_LINE = 12


def write_corpus(directory: str, words: int, files: int = 4, seed: int = 0) -> list[str]:
    """``files`` text files of Zipf-distributed words, ``words`` in all; their paths."""
    rng = np.random.default_rng(seed)
    paths = []
    lines = max(1, words // WORDS_PER_LINE)
    for f in range(files):
        mine = lines // files + (f < lines % files)
        ranks = np.minimum(rng.zipf(1.3, size=(mine, WORDS_PER_LINE)), VOCABULARY)
        path = os.path.join(directory, f"corpus-{f}.txt")
        with open(path, "w") as fh:
            fh.writelines(" ".join(f"w{r}" for r in row) + "\n" for row in ranks)
        paths.append(path)
    return paths


def expected(paths) -> collections.Counter:
    """The oracle: plain Python over the same files."""
    want: collections.Counter = collections.Counter()
    for path in paths:
        with open(path) as fh:
            for line in fh:
                want.update(line.split())
    return want


def published(directory: str) -> collections.Counter:
    """The counts a run's sink published, refusing a word counted in two files."""
    got: collections.Counter = collections.Counter()
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as fh:
            for line in fh:
                word, n = json.loads(line)
                if word in got:
                    raise AssertionError(f"{word!r} was counted on two shards: keys split")
                got[word] = n
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--words", type=int, default=2_000_000, help="words in the corpus")
    ap.add_argument("--runs", type=int, default=3, help="timed runs, one after another")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="plaque-wc-") as tmp:
        paths = write_corpus(tmp, args.words)
        out = os.path.join(tmp, "counts-{t}")
        with plaque.local_cluster(workers=args.workers) as cluster:
            installed = cluster.install(graph(out, args.workers, args.workers))
            parts = {"split": plaque.text_parts(paths, args.workers)}
            installed.run(parts=parts).result(timeout=300)  # warm-up: imports, connections
            times, results = [], []
            for _ in range(args.runs):
                start = time.perf_counter()
                results.append(installed.run(parts=parts).result(timeout=300))
                times.append(time.perf_counter() - start)
        want = expected(paths)
        for result in results:
            if published(os.path.join(tmp, f"counts-{result.timestamp}")) != want:
                raise AssertionError(f"run {result.timestamp}: counts differ from Counter")
    words = sum(want.values())
    print(f"word count over {len(paths)} files on {args.workers} workers: {words:,} words,"
          f" {len(want):,} distinct, best of {args.runs} runs {min(times):.2f} s ="
          f" {words / min(times):,.0f} words/s")
    print("every run's published counts equal collections.Counter over the files (exact)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
