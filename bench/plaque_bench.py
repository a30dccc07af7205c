"""Plaque engine vs raw pyzmq, on this machine, over tcp loopback, in one run.

Measures, with 2 worker processes and the coordinator in this (driver) process:

1. chain: small-int throughput through source -> f -> g -> sink (ONE_TO_ONE, 2 shards each),
   placed so that every one of the 3 hops crosses workers;
2. keyed: small-int throughput through an 8 -> 8 shard KEYED exchange over 2 workers, each tuple
   to a pseudo-random shard (multiplicative hash of its value);
3. latency of an empty run (arg=0) of the chain: mean and median over sequential runs;
4. 1 MiB numpy arrays from a source on worker 0 to a sink on worker 1 (GB/s).

and the raw pyzmq baselines of ``bench/raw_zmq.py`` (each in its own pair of processes).
Every figure is the best of 3 repetitions (the machine is noisy), raw and engine interleaved.
Results are printed and appended to ``bench/RESULTS.md``; ``--quick`` runs tiny sizes as a
smoke check and appends nothing.

How tuples are counted (said again in the results):

* chain, "per hop": each tuple is counted once per worker-to-worker hop it makes (3 per tuple),
  which is how ``batched_push_pull_throughput`` counts (one hop per item) with the same two
  processes' worth of CPU; "end to end" counts each tuple once.
* keyed: each tuple makes exactly one exchange hop (about half of them cross workers, the rest
  stay on their worker); counted once.

Run: ``python bench/plaque_bench.py [--quick] [--no-append]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script: make "bench" importable
    sys.path.insert(0, _ROOT)

import plaque  # noqa: E402
from bench import raw_zmq  # noqa: E402
from bench.results import bench_parser, publish, security_for_all  # noqa: E402

TITLE = "Plaque engine vs raw pyzmq"
REPS = 3
TARGET_TUPLES = 0.25  # engine small-tuple items/s >= 25% of raw batched push/pull
TARGET_LATENCY = 5.0  # empty-run latency <= 5x raw dealer/router round trip
TARGET_ARRAYS = 0.50  # 1 MiB arrays >= 50% of raw zero-copy throughput
ARRAY_BYTES = 1 << 20
KEYED_SHARDS = 8


# ---- operators (module level: shipped to the workers by value) --------------------------------

class Src(plaque.Operator):
    """Emits ctx.arg small ints."""

    def on_complete(self, ctx, t):
        emit = ctx.emit
        for i in range(ctx.arg):
            emit(i)


class Fwd(plaque.Operator):
    def on_input(self, ctx, t, port, value):
        ctx.emit(value)


class Count(plaque.Operator):
    """Counts tuples; outputs the count when the run is complete here."""

    def __init__(self):
        self.n = 0

    def on_input(self, ctx, t, port, value):
        self.n += 1

    def on_complete(self, ctx, t):
        ctx.output(self.n)
        self.n = 0


class KeyedSrc(plaque.Operator):
    """Emits ctx.arg small ints, each to a pseudo-random shard (Knuth multiplicative hash)."""

    def on_complete(self, ctx, t):
        emit = ctx.emit
        base = ctx.shard * ctx.arg
        for v in range(base, base + ctx.arg):
            emit(v, shard=((v * 2654435761) & 0xFFFFFFFF) >> 29)  # top 3 bits: 0..7


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
    def __init__(self):
        self.n = 0

    def on_input(self, ctx, t, port, value):
        value[-1]  # touch it, as the raw baseline's receiver does
        self.n += value.nbytes

    def on_complete(self, ctx, t):
        ctx.output(self.n)
        self.n = 0


# ---- graphs -----------------------------------------------------------------------------------

def chain_graph() -> plaque.Graph:
    g = plaque.Graph("chain")
    src = g.node("source", Src, shards=2, placement=[0, 1])
    f = g.node("f", Fwd, shards=2, placement=[1, 0])
    gg = g.node("g", Fwd, shards=2, placement=[0, 1])
    sink = g.node("sink", Count, shards=2, placement=[1, 0])
    g.edge(src, f, plaque.ONE_TO_ONE)
    g.edge(f, gg, plaque.ONE_TO_ONE)
    g.edge(gg, sink, plaque.ONE_TO_ONE)
    return g


def keyed_graph() -> plaque.Graph:
    g = plaque.Graph("keyed")
    place = [s % 2 for s in range(KEYED_SHARDS)]
    src = g.node("source", KeyedSrc, shards=KEYED_SHARDS, placement=place)
    sink = g.node("sink", Count, shards=KEYED_SHARDS, placement=place)
    g.edge(src, sink, plaque.KEYED)
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
    if quick:
        return dict(reps=1, chain=2_000, keyed=500, array_runs=2, array_per_run=4,
                    lat_n=20, lat_warmup=5, raw_items=20_000, raw_arrays=20, raw_rtt=200)
    return dict(reps=REPS, chain=120_000, keyed=50_000, array_runs=16, array_per_run=64,
                lat_n=300, lat_warmup=50, raw_items=1_000_000, raw_arrays=500, raw_rtt=5000)


def _best(samples, key, lowest=False):
    pick = min if lowest else max
    return pick(samples, key=lambda s: s[key])


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "tiny sizes")
    args = ap.parse_args(argv)
    sz = _sizes(args.quick)
    started = time.perf_counter()

    raw = {"batched": [], "rtt": [], "zc": []}
    eng = {"chain": [], "keyed": [], "lat": [], "arrays": []}
    with security_for_all(args.insecure) as security, \
            plaque.local_cluster(workers=2, transport="tcp", **security) as cluster:
        chain = cluster.install(chain_graph())
        keyed = cluster.install(keyed_graph())
        arrays = cluster.install(array_graph())
        # warm-up: connections, imports, operator construction on the workers
        measure_chain(cluster, chain, max(100, sz["chain"] // 20))
        measure_keyed(cluster, keyed, max(100, sz["keyed"] // 20))
        measure_arrays(cluster, arrays, 1, 2)
        for rep in range(sz["reps"]):
            raw["batched"].append(raw_zmq.batched_push_pull_throughput(
                n_items=sz["raw_items"], transport="tcp"))
            raw["rtt"].append(raw_zmq.dealer_router_rtt(n=sz["raw_rtt"], transport="tcp"))
            raw["zc"].append(raw_zmq.zero_copy_throughput(n=sz["raw_arrays"], transport="tcp"))
            eng["chain"].append(measure_chain(cluster, chain, sz["chain"]))
            eng["keyed"].append(measure_keyed(cluster, keyed, sz["keyed"]))
            eng["lat"].append(measure_latency(chain, sz["lat_n"], sz["lat_warmup"]))
            eng["arrays"].append(measure_arrays(cluster, arrays, sz["array_runs"],
                                                sz["array_per_run"]))
            c, k, la, a = (eng[x][-1] for x in ("chain", "keyed", "lat", "arrays"))
            print(f"rep {rep + 1}: raw batched {raw['batched'][-1]:,.0f} items/s,"
                  f" rtt {raw['rtt'][-1] * 1e6:.1f} us, zero-copy {raw['zc'][-1] / 1e9:.2f} GB/s"
                  f" | chain {c['hop']:,.0f} hop-tuples/s ({c['s']:.2f} s),"
                  f" keyed {k['rate']:,.0f} tuples/s ({k['s']:.2f} s),"
                  f" empty run {la['mean'] * 1e6:.0f}/{la['median'] * 1e6:.0f} us mean/median,"
                  f" arrays {a['Bps'] / 1e9:.2f} GB/s ({a['s']:.2f} s)", flush=True)

    raw_batched = max(raw["batched"])
    raw_rtt = min(raw["rtt"])
    raw_zc = max(raw["zc"])
    chain_best = _best(eng["chain"], "hop")
    keyed_best = _best(eng["keyed"], "rate")
    lat_best = _best(eng["lat"], "mean", lowest=True)
    lat_median = min(x["median"] for x in eng["lat"])
    arr_best = _best(eng["arrays"], "Bps")

    r_chain = chain_best["hop"] / raw_batched
    r_keyed = keyed_best["rate"] / raw_batched
    r_lat = lat_best["mean"] / raw_rtt
    r_lat_med = lat_median / raw_rtt
    r_arr = arr_best["Bps"] / raw_zc

    def verdict(ok):
        return "met" if ok else "MISSED"

    cw, kw = chain_best["wire"], keyed_best["wire"]
    rows = [
        {"Test": "raw batched push/pull 256x16 B (1 hop)", "Engine": "",
         "Raw": f"{raw_batched:,.0f} items/s", "Engine/raw": "", "Target": ""},
        {"Test": "chain 4 nodes x 2 shards, 3 cross-worker hops: per hop",
         "Engine": f"{chain_best['hop']:,.0f} tuples/s", "Raw": f"{raw_batched:,.0f} items/s",
         "Engine/raw": f"{r_chain:.3f}",
         "Target": f">= {TARGET_TUPLES:.2f}: {verdict(r_chain >= TARGET_TUPLES)}"},
        {"Test": "chain, end to end (each tuple once)",
         "Engine": f"{chain_best['e2e']:,.0f} tuples/s", "Raw": "", "Engine/raw": "",
         "Target": ""},
        {"Test": f"keyed exchange {KEYED_SHARDS}->{KEYED_SHARDS} shards"
                 f" ({keyed_best['crossed']:.0%} cross workers)",
         "Engine": f"{keyed_best['rate']:,.0f} tuples/s", "Raw": f"{raw_batched:,.0f} items/s",
         "Engine/raw": f"{r_keyed:.3f}",
         "Target": f">= {TARGET_TUPLES:.2f}: {verdict(r_keyed >= TARGET_TUPLES)}"},
        {"Test": "empty run of the chain (arg=0), mean",
         "Engine": f"{lat_best['mean'] * 1e6:,.0f} us", "Raw": f"{raw_rtt * 1e6:,.1f} us RTT",
         "Engine/raw": f"{r_lat:.1f}x",
         "Target": f"<= {TARGET_LATENCY:.0f}x: {verdict(r_lat <= TARGET_LATENCY)}"},
        {"Test": "empty run of the chain (arg=0), median",
         "Engine": f"{lat_median * 1e6:,.0f} us", "Raw": f"{raw_rtt * 1e6:,.1f} us RTT",
         "Engine/raw": f"{r_lat_med:.1f}x", "Target": ""},
        {"Test": "1 MiB numpy arrays, worker 0 -> worker 1",
         "Engine": f"{arr_best['Bps'] / 1e9:.2f} GB/s", "Raw": f"{raw_zc / 1e9:.2f} GB/s",
         "Engine/raw": f"{r_arr:.3f}",
         "Target": f">= {TARGET_ARRAYS:.2f}: {verdict(r_arr >= TARGET_ARRAYS)}"},
    ]
    notes = f"""Best of {sz['reps']} repetitions for every engine and raw figure (raw and engine
interleaved), tcp loopback, 2 worker processes + the coordinator thread in the driver, 2 cores.
Chain: {sz['chain']:,} small ints per source shard per run (one run = {chain_best['s']:.2f} s);
placement source [0,1], f [1,0], g [0,1], sink [1,0], so each tuple crosses workers 3 times
(checked with the traffic counters). "Per hop" counts a tuple once per crossing, as the raw
batched baseline counts an item once per (single) hop; both use the same 2 processes.
Wire per chain run: {cw['messages']:,} worker-to-worker messages ({cw['progress']:,} progress), i.e.
{cw['tuples'] / max(1, cw['messages'] - cw['progress']):,.0f} tuples per data message,
{cw['bytes'] / max(1, cw['tuples']):.1f} bytes per tuple-hop.
Keyed: {sz['keyed']:,} ints per source shard, shard = top 3 bits of (v * 2654435761 mod 2^32);
counted once per tuple (one exchange hop; {keyed_best['crossed']:.0%} crossed workers,
{kw['messages']:,} messages).
Empty-run latency: {sz['lat_n']} sequential runs after {sz['lat_warmup']} warm-up, driver call
to result; raw: mean DEALER->ROUTER echo round trip over {sz['raw_rtt']} messages.
Arrays: {sz['array_runs']} overlapping runs x {sz['array_per_run']} arrays of 1 MiB (distinct
views of one array; out-of-band frames, no copies); raw: zero_copy_throughput, {sz['raw_arrays']}
arrays, copy=False both ends.
Targets: small-tuple throughput >= {TARGET_TUPLES:.0%} of raw batched pyzmq
(chain {verdict(r_chain >= TARGET_TUPLES)}, keyed {verdict(r_keyed >= TARGET_TUPLES)});
empty-run latency <= {TARGET_LATENCY:.0f}x raw round trip ({verdict(r_lat <= TARGET_LATENCY)});
1 MiB arrays >= {TARGET_ARRAYS:.0%} of raw zero-copy throughput ({verdict(r_arr >= TARGET_ARRAYS)}).
Security: {"none (--insecure), plain tcp for engine and raw alike" if args.insecure else
"CURVE with one throw-away key pair for the engine and the raw baseline alike"}.
Total bench time {time.perf_counter() - started:.0f} s."""

    publish(TITLE, rows, notes, append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
