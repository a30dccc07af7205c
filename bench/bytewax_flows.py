"""The Bytewax side of ``bench.dataflow``: the same word count and keyed aggregation written
as Bytewax's documentation writes them (``flat_map`` + ``count_final``; ``key_on`` +
``reduce_final``), for ``python -m bytewax.run bench.bytewax_flows:word_count(...)``.

Each worker reads whole files (one partition per file, as ``DirSource`` does) and writes its
results to ``OUT/part-<worker>.jsonl``, which ``bench.dataflow`` checks against plain Python,
and when its flow started and ended to ``OUT/time-<worker>.json``: the run is timed from the
first start to the last end, without the interpreter's start, imports and connecting.
Imports only bytewax and numpy, so it runs in whichever environment has Bytewax installed.
"""

from __future__ import annotations

import json
import operator
import os
import time
from pathlib import Path

import bytewax.operators as op
import numpy as np
from bytewax.connectors.files import DirSource
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition


class _Lines(StatelessSinkPartition):
    """One worker's output file; it also notes when the flow started and ended on this
    worker (``time.monotonic``, one clock for every process of a machine)."""

    def __init__(self, path, times):
        self.times, self.start = times, time.monotonic()
        self.fh = open(path, "w")

    def write_batch(self, items):
        self.fh.write("".join(json.dumps(item) + "\n" for item in items))

    def close(self):
        self.fh.close()
        with open(self.times, "w") as fh:
            json.dump({"start": self.start, "end": time.monotonic()}, fh)


class JsonlPerWorker(DynamicSink):
    """Each worker writes what reaches it to ``directory/part-<worker>.jsonl``."""

    def __init__(self, directory):
        self.directory = directory

    def build(self, step_id, worker_index, worker_count):
        return _Lines(os.path.join(self.directory, f"part-{worker_index}.jsonl"),
                      os.path.join(self.directory, f"time-{worker_index}.json"))


class _Rows(StatefulSourcePartition):
    def __init__(self, path):
        rows = np.load(path)  # by column, as bench.dataflow's other engines read them
        self.rows = list(zip(rows[:, 0].tolist(), rows[:, 1].tolist()))
        self.done = False

    def next_batch(self):
        if self.done:
            raise StopIteration
        self.done = True
        return self.rows

    def snapshot(self):
        return None


class NpyRows(FixedPartitionedSource):
    """One partition per ``.npy`` file; each yields the file's rows (user, amount)."""

    def __init__(self, paths):
        self.paths = list(paths)

    def list_parts(self):
        return [os.path.basename(p) for p in self.paths]

    def build_part(self, step_id, for_part, resume_state):
        return _Rows(next(p for p in self.paths if os.path.basename(p) == for_part))


def word_count(directory: str, out: str) -> Dataflow:
    flow = Dataflow("word-count")
    lines = op.input("lines", flow, DirSource(Path(directory), glob_pat="corpus-*.txt"))
    words = op.flat_map("split", lines, str.split)
    counts = op.count_final("count", words, lambda word: word)
    op.output("out", counts, JsonlPerWorker(out))
    return flow


def keyed_sum(directory: str, out: str) -> Dataflow:
    flow = Dataflow("keyed-sum")
    paths = sorted(str(p) for p in Path(directory).glob("events-*.npy"))
    rows = op.input("events", flow, NpyRows(paths))
    keyed = op.key_on("user", rows, lambda row: str(row[0]))
    amounts = op.map_value("amount", keyed, lambda row: row[1])
    totals = op.reduce_final("sum", amounts, operator.add)
    op.output("out", totals, JsonlPerWorker(out))
    return flow
