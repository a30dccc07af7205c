"""Plaque as a dataflow library: word count over files, keyed aggregation, stream latency.

What a user of Bytewax, Pathway or Dask bag writes first, written per tuple as the README
shows, at 1, 2 and 4 worker processes (best of ``--reps`` runs after a warm-up):

- word count over text files (``examples/word_count.py``'s graph: partitioned input read on
  the workers, ``emit(1, key=word)`` on a combining edge, a JSONL sink), words/s;
- keyed aggregation: events (user, amount) in ``.npy`` files, one part per source shard, each
  row emitted on its own as ``emit(amount, key=user)`` on a combining edge, summed per user,
  events/s;
- the same with a Dask bag (``frequencies`` and ``foldby``; the processes scheduler on a pool
  of as many processes, started once and warmed up as our cluster is) when dask is
  importable, and plain Python in this process (``Counter`` over the files, a dict fold over
  the events) for scale;
- the same flows on Bytewax (``bench/bytewax_flows.py``: ``count_final``, ``reduce_final``),
  one process per worker, when a Python with bytewax is given (``--bytewax-python``), and on
  Pathway (``bench/pathway_flows.py``: ``groupby().reduce``), as many threads, when one with
  pathway is (``--pathway-python``);
- the latency of a record through a 3-operator stream (input -> map -> map -> last operator),
  driver ``send`` to arrival, one record at a time, median and 90th percentile.

Every count and sum is checked against plain Python.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import json
import operator
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import plaque
from plaque import KEYED, ONE_TO_ONE, Graph, Operator

from .results import bench_parser, publish, security_for_all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import word_count  # noqa: E402  (the example's graph is the benchmark's)

EVENT_USERS = 100_000
BASELINES_EMPTY = {f"{name}{column}": "" for name in ("Dask bag", "Bytewax", "Pathway")
                   for column in (" words/s", " events/s")}
BASELINES_EMPTY.update({f"Plaque/{name}": "" for name in ("Dask", "Bytewax", "Pathway")})


# ---- keyed aggregation ------------------------------------------------------------------------
def write_events(directory: str, events: int, files: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    paths = []
    for f in range(files):
        n = events // files + (f < events % files)
        rows = np.empty((n, 2), dtype=np.int64)
        rows[:, 0] = rng.zipf(1.2, size=n) % EVENT_USERS
        rows[:, 1] = rng.integers(1, 1000, size=n)
        path = os.path.join(directory, f"events-{f}.npy")
        np.save(path, rows)
        paths.append(path)
    return paths


def load_events(path) -> list[tuple[int, int]]:
    """A file's events as (user, amount) tuples, read by column (as every Python engine here
    reads them; Pathway reads the same rows as CSV with its own reader)."""
    rows = np.load(path)
    return list(zip(rows[:, 0].tolist(), rows[:, 1].tolist()))


class Events(Operator):
    """A source: emits each event of its files on its own, amount under the user's key."""

    def on_start(self, ctx, t):
        emit = ctx.emit
        for path in ctx.part:
            for user, amount in load_events(path):
                emit(amount, key=user)


class Totals(Operator):
    def on_batch(self, ctx, t, port, pairs):
        totals = ctx.state.setdefault("totals", collections.Counter())
        for user, amount in pairs:
            totals[user] += amount

    def on_complete(self, ctx, t):
        ctx.output(dict(ctx.state.get("totals", {})))


def events_graph(workers: int) -> Graph:
    g = Graph("keyed-aggregation")
    src = g.node("events", Events, shards=workers)
    g.edge(src, g.node("totals", Totals, shards=workers), KEYED, combine=operator.add)
    return g


def events_oracle(paths) -> collections.Counter:
    want: collections.Counter = collections.Counter()
    for path in paths:
        for user, amount in load_events(path):
            want[user] += amount
    return want


# ---- the stream -------------------------------------------------------------------------------
class Stamp(Operator):
    def on_batch(self, ctx, t, port, values):
        ctx.emit_batch(values)


class Arrive(Operator):
    """The last operator: how long each record took from the driver's send to here."""

    def on_batch(self, ctx, t, port, values):
        now = time.monotonic()  # one clock for every process of this machine
        ctx.state.setdefault("lat", []).extend(now - sent for sent in values)

    def on_complete(self, ctx, t):
        ctx.output(ctx.state.get("lat", []))


def stream_graph() -> Graph:
    g = Graph("latency")
    inp = g.input("in", shards=1, placement=(0,))
    a = g.node("map1", Stamp, shards=1, placement=(1,))
    b = g.node("map2", Stamp, shards=1, placement=(0,))
    c = g.node("last", Arrive, shards=1, placement=(1,))
    g.edge(inp, a, ONE_TO_ONE)
    g.edge(a, b, ONE_TO_ONE)
    g.edge(b, c, ONE_TO_ONE)
    return g


def stream_latency(cluster, records: int, gap: float) -> list[float]:
    stream = cluster.install(stream_graph()).stream()
    for _ in range(records):
        stream.send([time.monotonic()])
        time.sleep(gap)
    return [x for xs in stream.close().result(120).values("last") for x in xs]


# ---- baselines --------------------------------------------------------------------------------
def dask_word_count(paths, workers: int) -> collections.Counter:
    import dask.bag as db
    bag = db.read_text(paths, blocksize=max(1, sum(map(os.path.getsize, paths)) // workers))
    return collections.Counter(dict(bag.str.split().flatten().frequencies().compute()))


def dask_events(paths, workers: int) -> collections.Counter:
    import dask.bag as db
    bag = db.from_sequence(paths, npartitions=len(paths)).map(load_events).flatten()
    folded = bag.foldby(lambda r: r[0], lambda acc, r: acc + r[1], 0, operator.add, 0)
    return collections.Counter(dict(folded.compute()))


def python_with(module: str, given: str | None) -> str | None:
    """The interpreter to run a baseline with: ``given``, else this one if it has
    ``module``; None if neither does."""
    python = given or sys.executable
    ok = subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode
    return python if ok == 0 else None


def pathway_inputs(tmp: str, texts, events) -> tuple[str, str]:
    """Directories of the corpus and of the events as CSV, for Pathway's own readers."""
    text_dir, csv_dir = os.path.join(tmp, "pathway-text"), os.path.join(tmp, "pathway-csv")
    os.makedirs(text_dir)
    os.makedirs(csv_dir)
    for path in texts:
        os.symlink(path, os.path.join(text_dir, os.path.basename(path)))
    for i, path in enumerate(events):
        np.savetxt(os.path.join(csv_dir, f"events-{i}.csv"), np.load(path), fmt="%d",
                   delimiter=",", header="user,amount", comments="")
    return text_dir, csv_dir


def pathway_best(python, kind, source, workers, reps):
    """Best of ``reps`` Pathway runs on ``workers`` threads (its time inside ``pw.run``) and
    what it wrote, as {key: value}."""
    script = os.path.join(ROOT, "bench", "pathway_flows.py")
    env = dict(os.environ, PATHWAY_THREADS=str(workers))
    best, got = float("inf"), {}
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="pathway-out-") as out:
            path = os.path.join(out, "out.jsonl")
            done = subprocess.run([python, script, kind, source, path], env=env, check=True,
                                  capture_output=True, text=True, timeout=600)
            best = min(best, json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
            got = {}
            with open(path) as fh:
                for line in fh:
                    row = json.loads(line)
                    if kind == "word_count":
                        got[row["word"]] = row["count"]
                    else:
                        got[row["user"]] = row["total"]
    return best, got


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def bytewax_run(python: str, flow: str, directory: str, workers: int):
    """Run ``bench.bytewax_flows.<flow>`` on ``workers`` Bytewax processes (one worker each,
    as Bytewax scales across cores); (seconds from the first worker's start to the last one's
    end, as the flow noted them; {key: value} it wrote)."""
    with tempfile.TemporaryDirectory(prefix="bytewax-out-") as out:
        cmd = [python, "-m", "bytewax.run", f"bench.bytewax_flows:{flow}({directory!r}, {out!r})"]
        addresses = ";".join(f"127.0.0.1:{p}" for p in _free_ports(workers))
        procs = [subprocess.Popen(cmd + (["-i", str(i), "-a", addresses] if workers > 1 else []),
                                  cwd=ROOT) for i in range(workers)]
        codes = [p.wait(600) for p in procs]
        if any(codes):
            raise RuntimeError(f"Bytewax {flow} on {workers} processes exited with {codes}")
        got: dict = {}
        starts, ends = [], []
        for name in os.listdir(out):
            with open(os.path.join(out, name)) as fh:
                if name.startswith("time-"):
                    times = json.load(fh)
                    starts.append(times["start"])
                    ends.append(times["end"])
                    continue
                for line in fh:
                    key, value = json.loads(line)
                    got[key] = value
    return max(ends) - min(starts), got


def bytewax_best(python, flow, directory, workers, reps):
    """Best of ``reps`` Bytewax runs, and the results."""
    best, got = float("inf"), None
    for _ in range(reps):
        elapsed, got = bytewax_run(python, flow, directory, workers)
        best = min(best, elapsed)
    return best, got


def both(best, wc_args, ev_args, workers: int, reps: int):
    """A baseline's (seconds, results) of the word count, then of the keyed sum."""
    return (*best(*wc_args, workers, reps), *best(*ev_args, workers, reps))


def dask_both(texts, events, workers: int, reps: int):
    """Dask's best word count and keyed sum on a warmed pool of ``workers`` processes."""
    with dask_processes(workers):
        dask_word_count(texts, workers), dask_events(events, workers)  # warm-up
        return (*best_of(reps, dask_word_count, texts, workers),
                *best_of(reps, dask_events, events, workers))


@contextlib.contextmanager
def dask_processes(workers: int):
    """Dask's processes scheduler on a pool of ``workers`` processes started once, as our
    cluster is (Dask would otherwise start a pool per compute)."""
    import dask
    with cf.ProcessPoolExecutor(workers) as pool, \
            dask.config.set(scheduler="processes", pool=pool, num_workers=workers):
        yield


def best_of(reps: int, fn, *args):
    """The shortest of ``reps`` timed calls of ``fn(*args)``, and its result."""
    best, out = float("inf"), None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, out


def run_once(installed, parts):
    return installed.run(parts=parts).result(600)


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "small inputs, one rep")
    ap.sized("--words", int, 200_000, 2_000_000, "words in the corpus")
    ap.sized("--events", int, 500_000, 5_000_000, "events to aggregate")
    ap.sized("--reps", int, 1, 3, "timed runs per cell (best is kept)")
    ap.sized("--records", int, 200, 2000, "records sent one at a time through the stream")
    ap.add_argument("--workers", default="1,2,4", help="worker counts (default 1,2,4)")
    ap.add_argument("--bytewax-python", default=os.environ.get("BYTEWAX_PYTHON"),
                    help="a Python with bytewax (and numpy) installed, for the Bytewax columns"
                         " (default: $BYTEWAX_PYTHON, else this one if it has bytewax)")
    ap.add_argument("--pathway-python", default=os.environ.get("PATHWAY_PYTHON"),
                    help="a Python with pathway installed, for the Pathway columns (default:"
                         " $PATHWAY_PYTHON, else this one if it has pathway)")
    args = ap.parse_args(argv)
    bytewax = python_with("bytewax", args.bytewax_python)
    pathway = python_with("pathway", args.pathway_python)
    sweep = [int(w) for w in args.workers.split(",")]
    try:
        import dask.bag  # noqa: F401
        have_dask = True
    except ImportError:
        have_dask = False
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-dataflow-") as tmp, \
            security_for_all(args.insecure, args.curve) as security:
        texts = word_count.write_corpus(tmp, args.words)
        events = write_events(tmp, args.events, 4)
        want_words, want_events = word_count.expected(texts), events_oracle(events)
        if pathway is not None:
            pw_text, pw_csv = pathway_inputs(tmp, texts, events)
        words = sum(want_words.values())
        python_wc, _ = best_of(args.reps, lambda: word_count.expected(texts))
        python_ev, _ = best_of(args.reps, lambda: events_oracle(events))
        rows.append({"workers": "plain Python, 1 process",
                     "word count words/s": f"{words / python_wc:,.0f}",
                     "keyed events/s": f"{args.events / python_ev:,.0f}",
                     **BASELINES_EMPTY})
        latency: list[float] = []
        for workers in sweep:
            out = os.path.join(tmp, f"counts-w{workers}-{{t}}")
            with plaque.local_cluster(workers=workers, **security) as cluster:
                wc = cluster.install(word_count.graph(out, workers, workers))
                ev = cluster.install(events_graph(workers))
                wc_parts = {"split": plaque.text_parts(texts, workers)}
                ev_parts = {"events": [events[i::workers] for i in range(workers)]}
                wc.run(parts=wc_parts).result(600)  # warm-up: imports, connections
                ev.run(parts=ev_parts).result(600)
                t_wc, r_wc = best_of(args.reps, run_once, wc, wc_parts)
                t_ev, r_ev = best_of(args.reps, run_once, ev, ev_parts)
                if workers == 2:
                    stream_latency(cluster, 20, 0.002)  # warm-up
                    latency = stream_latency(cluster, args.records, 0.002)
            got = word_count.published(out.replace("{t}", str(r_wc.timestamp)))
            if got != want_words:
                raise AssertionError(f"word count on {workers} workers differs from Counter")
            totals: collections.Counter = collections.Counter()
            for d in r_ev.values("totals"):
                totals.update(d)
            if totals != want_events:
                raise AssertionError(f"keyed sums on {workers} workers differ from Python")
            row = {"workers": f"Plaque, {workers} worker processes",
                   "word count words/s": f"{words / t_wc:,.0f}",
                   "keyed events/s": f"{args.events / t_ev:,.0f}",
                   **BASELINES_EMPTY}
            runs = []  # (baseline, its best word count and keyed sum at this worker count)
            if have_dask:
                runs.append(("Dask bag", dask_both, (texts, events, workers, args.reps)))
            if bytewax is not None:
                runs.append(("Bytewax", both, (bytewax_best, (bytewax, "word_count", tmp),
                                               (bytewax, "keyed_sum", tmp), workers, args.reps)))
            if pathway is not None:
                runs.append(("Pathway", both, (pathway_best, (pathway, "word_count", pw_text),
                                               (pathway, "keyed_sum", pw_csv), workers,
                                               args.reps)))
            for name, run, run_args in runs:
                o_wc, got_wc, o_ev, got_ev = run(*run_args)
                if dict(got_wc) != dict(want_words) or \
                        {int(k): v for k, v in got_ev.items()} != dict(want_events):
                    raise AssertionError(f"{name}'s results differ from plain Python")
                row[f"{name} words/s"] = f"{words / o_wc:,.0f}"
                row[f"{name} events/s"] = f"{args.events / o_ev:,.0f}"
                row[f"Plaque/{name.split()[0]}"] = \
                    f"{o_wc / t_wc:.2f}x words, {o_ev / t_ev:.2f}x events"
            rows.append(row)
            print(" | ".join(f"{k}: {v}" for k, v in row.items()), flush=True)
    lat = sorted(latency)
    notes = (f"{words:,} words in 4 files ({len(want_words):,} distinct, Zipf 1.3); "
             f"{args.events:,} events over {len(want_events):,} users in 4 .npy files;"
             f" best of {args.reps}. Per tuple on Plaque: emit(1, key=word) and"
             " emit(amount, key=user) on combining KEYED edges; the word count writes its"
             " counts through a JSONL sink. Every result equals plain Python's."
             + ("" if have_dask else " Dask is not installed: no Dask columns.")
             + (" Bytewax: the same flows as its documentation writes them"
                " (bench/bytewax_flows.py), one process per worker, timed from the first"
                " worker's flow start to the last one's end (its processes' start, imports"
                " and connecting not counted)."
                if bytewax else " No Bytewax (give --bytewax-python): no Bytewax columns.")
             + (" Pathway: the same as its documentation writes them (bench/pathway_flows.py),"
                " static mode, PATHWAY_THREADS workers, its own text and CSV readers (the"
                " events as CSV), timed inside pw.run (its import and start not counted)."
                if pathway else " No Pathway (give --pathway-python): no Pathway columns.")
             + (f"\n\nStream latency, input -> map -> map -> last on 2 workers (each hop"
                f" crosses workers), {len(lat)} records sent one at a time 2 ms apart:"
                f" median {statistics.median(lat) * 1e3:.3f} ms, p90"
                f" {lat[int(0.9 * (len(lat) - 1))] * 1e3:.3f} ms (target <= 1 ms median)"
                if lat else ""))
    publish("Plaque dataflow: word count, keyed aggregation, stream latency", rows, notes,
            append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
