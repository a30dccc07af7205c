"""The Pathway side of ``bench.dataflow``: the same word count and keyed sum written as
Pathway's documentation writes them (``flatten`` + ``groupby().reduce(count())``; ``groupby``
+ ``reducers.sum``), static mode, run as ``python bench/pathway_flows.py KIND INPUT OUT``.

Word count reads the corpus' text files with ``pw.io.plaintext``; the keyed sum reads the
events as CSV (``events-*.csv``, written by ``bench.dataflow`` from the same rows), Pathway's
own reader. Results go to ``OUT`` as JSON lines. It prints ``{"seconds": ...}``: how long
``pw.run`` took, without the interpreter's start and Pathway's import. Workers:
``PATHWAY_THREADS``. Imports only pathway, so it runs wherever Pathway is installed.
"""

from __future__ import annotations

import json
import sys
import time

import pathway as pw


class Event(pw.Schema):
    user: int
    amount: int


def main(kind: str, source: str, out: str) -> None:
    if kind == "word_count":
        lines = pw.io.plaintext.read(source, mode="static")
        words = lines.select(word=pw.apply(str.split, pw.this.data)).flatten(pw.this.word)
        result = words.groupby(pw.this.word).reduce(pw.this.word, count=pw.reducers.count())
    elif kind == "keyed_sum":
        events = pw.io.csv.read(source, schema=Event, mode="static")
        result = events.groupby(pw.this.user).reduce(pw.this.user,
                                                    total=pw.reducers.sum(pw.this.amount))
    else:
        raise SystemExit(f"unknown flow {kind!r}")
    pw.io.jsonlines.write(result, out)
    start = time.perf_counter()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    print(json.dumps({"seconds": time.perf_counter() - start}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
