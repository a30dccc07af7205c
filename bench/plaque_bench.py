"""Plaque engine vs raw pyzmq, on this machine, over tcp loopback, in one run.

Measures, with 2 worker processes and the coordinator in this (driver) process, each graph in
three forms (per tuple: on_input/emit; batches of lists: on_batch/emit_batch; batches of int64
numpy rows, sent out of band):

1. chain: small-int throughput through source -> f -> g -> sink (ONE_TO_ONE, 2 shards each),
   placed so that every one of the 3 hops crosses workers;
2. keyed: small-int throughput through an 8 -> 8 shard KEYED exchange over 2 workers, each tuple
   routed by ``key=`` its value (the stable hash of ``plaque.keys``);
3. latency of an empty run (arg=0) of the per-tuple chain: mean and median over sequential runs;
4. 1 MiB numpy arrays from a source on worker 0 to a sink on worker 1 (GB/s).

and the raw pyzmq baselines of ``bench/raw_zmq.py`` (each in its own pair of processes).
Every figure is the best of 3 repetitions (the machine is noisy), raw and engine interleaved.
Results are printed and appended to ``bench/RESULTS.md``; ``--quick`` runs tiny sizes as a
smoke check and appends nothing.

How tuples are counted (said again in the results):

* chain, "per hop": each tuple is counted once per worker-to-worker hop it makes (3 per tuple),
  which is how ``batched_push_pull_throughput`` counts (one hop per item) with the same two
  processes' worth of CPU.
* keyed: each tuple makes exactly one exchange hop (about half of them cross workers, the rest
  stay on their worker); counted once.

Run: ``python -m bench.plaque_bench [--quick] [--no-append]``.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import plaque
from bench import raw_zmq
from bench.results import bench_parser, publish, security_for_all

TITLE = "Plaque engine vs raw pyzmq"
REPS = 3
TARGET_BATCH = 0.25  # batch operators: small-tuple items/s >= 25% of raw batched push/pull
TARGET_TUPLE = 0.05  # per-tuple operators: >= 5%
TARGET_LATENCY = 5.0  # empty-run latency <= 5x raw dealer/router round trip
TARGET_ARRAYS = 0.80  # 1 MiB arrays >= 80% of raw zero-copy throughput
ARRAY_BYTES = 1 << 20
KEYED_SHARDS = 8


# ---- operators (module level: shipped to the workers by value) --------------------------------
# Three forms of the same work: per tuple (on_input / emit), batches of lists (on_batch /
# emit_batch) and batches of numpy rows (emit_batch of an int64 array, sent out of band).

class Src(plaque.Operator):
    """Emits ctx.arg small ints, one emit per tuple."""

    def on_complete(self, ctx, t):
        emit = ctx.emit
        for i in range(ctx.arg):
            emit(i)


class BatchSrc(plaque.Operator):
    """Emits ctx.arg small ints as one list."""

    def on_complete(self, ctx, t):
        ctx.emit_batch(list(range(ctx.arg)))


class RowsSrc(plaque.Operator):
    """Emits ctx.arg small ints as one int64 array."""

    def on_complete(self, ctx, t):
        ctx.emit_batch(np.arange(ctx.arg, dtype=np.int64))


class Fwd(plaque.Operator):
    def on_input(self, ctx, t, port, value):
        ctx.emit(value)


class BatchFwd(plaque.Operator):
    def on_batch(self, ctx, t, port, values):
        ctx.emit_batch(values)


class Count(plaque.Operator):
    """Counts tuples one by one (per run, in ctx.state); outputs the count at completion."""

    def on_input(self, ctx, t, port, value):
        state = ctx.state
        state["n"] = state.get("n", 0) + 1

    def on_complete(self, ctx, t):
        ctx.output(ctx.state.get("n", 0))


class BatchCount(plaque.Operator):
    """Counts tuples a batch at a time."""

    def on_batch(self, ctx, t, port, values):
        ctx.state["n"] = ctx.state.get("n", 0) + len(values)

    def on_complete(self, ctx, t):
        ctx.output(ctx.state.get("n", 0))


def _ints(ctx):
    base = ctx.shard * ctx.arg
    return range(base, base + ctx.arg)


class KeyedSrc(plaque.Operator):
    """Emits ctx.arg small ints, each to the shard of its key (the value)."""

    def on_complete(self, ctx, t):
        emit = ctx.emit
        for v in _ints(ctx):
            emit(v, key=v)


class KeyedBatchSrc(plaque.Operator):
    """The same ints as one list, keys= the list itself."""

    def on_complete(self, ctx, t):
        values = list(_ints(ctx))
        ctx.emit_batch(values, keys=values)


class KeyedRowsSrc(plaque.Operator):
    """The same ints as one int64 array, keys= the array (hashed and split without loops)."""

    def on_complete(self, ctx, t):
        r = _ints(ctx)
        values = np.arange(r.start, r.stop, dtype=np.int64)
        ctx.emit_batch(values, keys=values)


class ArraySrc(plaque.Operator):
    """Emits ctx.arg distinct views of one 1 MiB array (no copies; distinct objects, so pickle
    cannot memoize them into a single buffer)."""

    def __init__(self):
        self.arr = np.ones(ARRAY_BYTES, dtype=np.uint8)

    def on_complete(self, ctx, t):
        arr = self.arr
        for _ in range(ctx.arg):
            ctx.emit(arr.view())


class ByteCount(plaque.Operator):
    def on_input(self, ctx, t, port, value):
        value[-1]  # touch it, as the raw baseline's receiver does
        ctx.state["n"] = ctx.state.get("n", 0) + value.nbytes

    def on_complete(self, ctx, t):
        ctx.output(ctx.state.get("n", 0))


FORMS = {  # form -> (chain source, forwarder, sink), (keyed source, sink)
    "per tuple": ((Src, Fwd, Count), (KeyedSrc, Count)),
    "batch of lists": ((BatchSrc, BatchFwd, BatchCount), (KeyedBatchSrc, BatchCount)),
    "batch of numpy rows": ((RowsSrc, BatchFwd, BatchCount), (KeyedRowsSrc, BatchCount)),
}


# ---- graphs -----------------------------------------------------------------------------------

def chain_graph(src=Src, fwd=Fwd, sink=Count) -> plaque.Graph:
    g = plaque.Graph("chain")
    a = g.node("source", src, shards=2, placement=[0, 1])
    f = g.node("f", fwd, shards=2, placement=[1, 0])
    gg = g.node("g", fwd, shards=2, placement=[0, 1])
    z = g.node("sink", sink, shards=2, placement=[1, 0])
    g.edge(a, f, plaque.ONE_TO_ONE)
    g.edge(f, gg, plaque.ONE_TO_ONE)
    g.edge(gg, z, plaque.ONE_TO_ONE)
    return g


def keyed_graph(src=KeyedSrc, sink=Count) -> plaque.Graph:
    g = plaque.Graph("keyed")
    place = [s % 2 for s in range(KEYED_SHARDS)]
    a = g.node("source", src, shards=KEYED_SHARDS, placement=place)
    z = g.node("sink", sink, shards=KEYED_SHARDS, placement=place)
    g.edge(a, z, plaque.KEYED)
    return g


def array_graph() -> plaque.Graph:
    g = plaque.Graph("arrays")
    src = g.node("source", ArraySrc, shards=1, placement=[0])
    sink = g.node("sink", ByteCount, shards=1, placement=[1])
    g.edge(src, sink, plaque.ONE_TO_ONE)
    return g


# ---- measurements -----------------------------------------------------------------------------

def _wire(cluster) -> dict:
    """Worker-to-worker traffic so far (coordinator links excluded), summed over workers."""
    out = {"messages": 0, "bytes": 0, "tuples": 0, "progress": 0}
    for w, peers in cluster.counters().items():
        if w < 0:
            continue
        for p, c in peers.items():
            if p < 0:
                continue
            out["messages"] += c["messages_sent"]
            out["bytes"] += c["bytes_sent"]
            out["tuples"] += c["tuples_sent"]
            out["progress"] += c["progress_sent"]
    return out


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def timed_runs(cluster, ig, args, timeout=120.0):
    """Start runs with the given args all at once (they overlap); wait for all of them.
    Returns (seconds, results, worker-to-worker traffic during the runs)."""
    before = _wire(cluster)
    t0 = time.perf_counter()
    futs = [ig.run(a) for a in args]
    results = [f.result(timeout=timeout) for f in futs]
    elapsed = time.perf_counter() - t0
    return elapsed, results, _delta(_wire(cluster), before)


def measure_chain(cluster, ig, n_per_shard):
    elapsed, (res,), wire = timed_runs(cluster, ig, [n_per_shard])
    total = sum(res.values("sink"))
    if total != 2 * n_per_shard:
        raise AssertionError(f"chain delivered {total} tuples, expected {2 * n_per_shard}")
    if wire["tuples"] != 3 * total:
        raise AssertionError(f"chain: {wire['tuples']} tuples crossed workers, expected"
                             f" {3 * total} (every hop should cross)")
    return {"e2e": total / elapsed, "hop": wire["tuples"] / elapsed, "s": elapsed, "wire": wire,
            "tuples": total}


def measure_keyed(cluster, ig, n_per_shard):
    elapsed, (res,), wire = timed_runs(cluster, ig, [n_per_shard])
    total = sum(res.values("sink"))
    if total != KEYED_SHARDS * n_per_shard:
        raise AssertionError(f"keyed delivered {total}, expected {KEYED_SHARDS * n_per_shard}")
    return {"rate": total / elapsed, "s": elapsed, "wire": wire, "tuples": total,
            "crossed": wire["tuples"] / total}


def measure_arrays(cluster, ig, runs, per_run):
    elapsed, results, wire = timed_runs(cluster, ig, [per_run] * runs)
    nbytes = sum(sum(r.values("sink")) for r in results)
    if nbytes != runs * per_run * ARRAY_BYTES:
        raise AssertionError(f"arrays: sink counted {nbytes} bytes, expected"
                             f" {runs * per_run * ARRAY_BYTES}")
    return {"Bps": nbytes / elapsed, "s": elapsed, "wire": wire}


def measure_latency(ig, n, warmup):
    for _ in range(warmup):
        ig.run(0).result(timeout=30)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        ig.run(0).result(timeout=30)
        lat.append(time.perf_counter() - t0)
    return {"mean": statistics.fmean(lat), "median": statistics.median(lat),
            "p90": sorted(lat)[int(0.9 * len(lat))]}


# ---- main -------------------------------------------------------------------------------------

def _sizes(quick: bool) -> dict:
    """Tuples per source shard per run, by form (batches carry more to time the same)."""
    if quick:
        return dict(reps=1, chain=[2_000, 20_000, 50_000], keyed=[500, 5_000, 20_000],
                    array_runs=2, array_per_run=4, lat_n=20, lat_warmup=5, raw_items=20_000,
                    raw_arrays=20, raw_rtt=200)
    return dict(reps=REPS, chain=[150_000, 1_500_000, 4_000_000],
                keyed=[60_000, 400_000, 2_000_000], array_runs=16, array_per_run=64,
                lat_n=300, lat_warmup=50, raw_items=1_000_000, raw_arrays=500, raw_rtt=5000)


def _best(samples, key, lowest=False):
    pick = min if lowest else max
    return pick(samples, key=lambda s: s[key])


def _verdict(ratio, target, at_most=False):
    ok = ratio <= target if at_most else ratio >= target
    return f"{'<=' if at_most else '>='} {target:g}: {'met' if ok else 'MISSED'}"


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "tiny sizes")
    args = ap.parse_args(argv)
    sz = _sizes(args.quick)
    started = time.perf_counter()

    raw = {"batched": [], "rtt": [], "zc": []}
    eng = {"lat": [], "arrays": [], **{(k, f): [] for k in ("chain", "keyed") for f in FORMS}}
    with security_for_all(args.insecure, args.curve) as security, \
            plaque.local_cluster(workers=2, **security) as cluster:
        graphs = {}
        for i, (form, (chain_ops, keyed_ops)) in enumerate(FORMS.items()):
            graphs[("chain", form)] = (cluster.install(chain_graph(*chain_ops)), sz["chain"][i])
            graphs[("keyed", form)] = (cluster.install(keyed_graph(*keyed_ops)), sz["keyed"][i])
        arrays = cluster.install(array_graph())
        measure = {"chain": measure_chain, "keyed": measure_keyed}
        for (kind, _), (ig, n) in graphs.items():  # warm-up: connections, imports, operators
            measure[kind](cluster, ig, max(100, n // 20))
        measure_arrays(cluster, arrays, 1, 2)
        latency_graph = graphs[("chain", "per tuple")][0]
        for rep in range(sz["reps"]):
            raw["batched"].append(raw_zmq.batched_push_pull_throughput(
                n_items=sz["raw_items"], transport="tcp"))
            raw["rtt"].append(raw_zmq.dealer_router_rtt(n=sz["raw_rtt"], transport="tcp"))
            raw["zc"].append(raw_zmq.zero_copy_throughput(n=sz["raw_arrays"], transport="tcp"))
            line = [f"rep {rep + 1}: raw batched {raw['batched'][-1]:,.0f} items/s,"
                    f" rtt {raw['rtt'][-1] * 1e6:.1f} us, zero-copy {raw['zc'][-1] / 1e9:.2f} GB/s"]
            for (kind, form), (ig, n) in graphs.items():
                eng[(kind, form)].append(measure[kind](cluster, ig, n))
                m = eng[(kind, form)][-1]
                line.append(f"{kind} {form} {m['hop' if kind == 'chain' else 'rate']:,.0f}/s")
            eng["lat"].append(measure_latency(latency_graph, sz["lat_n"], sz["lat_warmup"]))
            eng["arrays"].append(measure_arrays(cluster, arrays, sz["array_runs"],
                                                sz["array_per_run"]))
            la, a = eng["lat"][-1], eng["arrays"][-1]
            line.append(f"empty run {la['mean'] * 1e6:.0f}/{la['median'] * 1e6:.0f} us"
                        f" mean/median, arrays {a['Bps'] / 1e9:.2f} GB/s")
            print(" | ".join(line), flush=True)

    raw_batched, raw_rtt, raw_zc = max(raw["batched"]), min(raw["rtt"]), max(raw["zc"])
    lat_best = _best(eng["lat"], "mean", lowest=True)
    lat_median = min(x["median"] for x in eng["lat"])
    arr_best = _best(eng["arrays"], "Bps")
    rows = [{"Test": "raw batched push/pull 256x16 B (1 hop)", "Engine": "",
             "Raw": f"{raw_batched:,.0f} items/s", "Engine/raw": "", "Target": ""}]
    wires = []
    for form in FORMS:
        target = TARGET_TUPLE if form == "per tuple" else TARGET_BATCH
        c = _best(eng[("chain", form)], "hop")
        k = _best(eng[("keyed", form)], "rate")
        rows.append({"Test": f"chain 4 nodes x 2 shards, 3 cross-worker hops, {form}: per hop",
                     "Engine": f"{c['hop']:,.0f} tuples/s", "Raw": f"{raw_batched:,.0f} items/s",
                     "Engine/raw": f"{c['hop'] / raw_batched:.3f}",
                     "Target": _verdict(c["hop"] / raw_batched, target)})
        rows.append({"Test": f"keyed exchange {KEYED_SHARDS}->{KEYED_SHARDS} shards by key="
                             f" ({k['crossed']:.0%} cross workers), {form}",
                     "Engine": f"{k['rate']:,.0f} tuples/s", "Raw": f"{raw_batched:,.0f} items/s",
                     "Engine/raw": f"{k['rate'] / raw_batched:.3f}",
                     "Target": _verdict(k["rate"] / raw_batched, target)})
        cw = c["wire"]
        wires.append(f"{form}: chain run {c['s']:.2f} s, {cw['messages']:,} worker-to-worker"
                     f" messages ({cw['progress']:,} progress),"
                     f" {cw['bytes'] / max(1, cw['tuples']):.1f} bytes per tuple-hop;"
                     f" keyed run {k['s']:.2f} s, {k['wire']['messages']:,} messages")
    rows += [
        {"Test": "empty run of the chain (arg=0), mean",
         "Engine": f"{lat_best['mean'] * 1e6:,.0f} us", "Raw": f"{raw_rtt * 1e6:,.1f} us RTT",
         "Engine/raw": f"{lat_best['mean'] / raw_rtt:.1f}x",
         "Target": _verdict(lat_best["mean"] / raw_rtt, TARGET_LATENCY, at_most=True)},
        {"Test": "empty run of the chain (arg=0), median",
         "Engine": f"{lat_median * 1e6:,.0f} us", "Raw": f"{raw_rtt * 1e6:,.1f} us RTT",
         "Engine/raw": f"{lat_median / raw_rtt:.1f}x", "Target": ""},
        {"Test": "1 MiB numpy arrays, worker 0 -> worker 1",
         "Engine": f"{arr_best['Bps'] / 1e9:.2f} GB/s", "Raw": f"{raw_zc / 1e9:.2f} GB/s",
         "Engine/raw": f"{arr_best['Bps'] / raw_zc:.3f}",
         "Target": _verdict(arr_best["Bps"] / raw_zc, TARGET_ARRAYS)},
    ]
    wire_lines = "\n".join(wires)
    notes = f"""Best of {sz['reps']} repetitions for every engine and raw figure (raw and engine
interleaved), tcp loopback, 2 worker processes + the coordinator thread in the driver, 2 cores.
Three forms of the same graphs: per tuple (on_input / emit), batches of lists (on_batch /
emit_batch) and batches of int64 numpy rows (emit_batch of an array: out-of-band frames).
Chain: {sz['chain']} small ints per source shard per run (per form); placement source [0,1],
f [1,0], g [0,1], sink [1,0], so each tuple crosses workers 3 times (checked with the traffic
counters). "Per hop" counts a tuple once per crossing, as the raw batched baseline counts an item
once per (single) hop; both use the same 2 processes.
Keyed: {sz['keyed']} ints per source shard (per form), each routed by key=its value
(stable hash), counted once per tuple (one exchange hop).
{wire_lines}
Empty-run latency: {sz['lat_n']} sequential runs of the per-tuple chain after {sz['lat_warmup']}
warm-up, driver call to result; raw: mean DEALER->ROUTER echo round trip over {sz['raw_rtt']}
messages.
Arrays: {sz['array_runs']} overlapping runs x {sz['array_per_run']} arrays of 1 MiB (distinct
views of one array; out-of-band frames, no copies); raw: zero_copy_throughput, {sz['raw_arrays']}
arrays, copy=False both ends.
Security: {"none (--insecure), plain tcp for engine and raw alike" if args.insecure else
"CURVE (--curve) with one throw-away key pair for the engine and the raw baseline alike"
if args.curve else "the engine on the default of local clusters (Unix sockets in a private"
" directory, no CURVE), the raw baseline on plain loopback tcp"}.
Total bench time {time.perf_counter() - started:.0f} s."""

    publish(TITLE, rows, notes, append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
