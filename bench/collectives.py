"""Hierarchical collectives: a psum across hosts by each host-level algorithm, and the default.

One client drives one island of H host processes x D emulated devices (``--sizes``, default
4x4 and 8x2) and, for each payload per device (a float64 scalar; 64 KiB and 1 MiB of float32),
runs one ``@pw.program`` of ``chain`` chained psums over every device (``psum(x) * (1 / N)``,
so the values stay bounded). Each algorithm of ``pathways.host.hierarchy`` is forced for a
whole cluster through the environment its hosts inherit:

- **flat**: ``PATHWAYS_FLAT_HOSTS=1024``: every host's partial to every other host, one round;
- **tree**: ``PATHWAYS_FLAT_HOSTS=0``, no scatter: recursive doubling, log2(H) rounds;
- **scatter**: ``PATHWAYS_FLAT_HOSTS=0 PATHWAYS_SCATTER_BYTES=0``: reduce-scatter then
  all-gather of one chunk per host (only where it applies: 3 hosts or more and at least one
  element per host; elsewhere the cell is "n/a");
- **default**: neither set: what a user gets (flat up to 4 hosts, tree beyond, scatter from
  256 KiB on 3 hosts or more).

Every host folds its own devices first in all of them. The first run of every cell is checked
bitwise against ``pw.reference`` (every algorithm adds along the same reduction tree), then
runs are timed back to back for about ``budget`` seconds. Reported: psums/s and the hosts'
summed CPU per psum (from /proc). Everything shares this machine's cores.

Run: ``python -m bench.collectives [--quick] [--no-append] [--sizes 4x4,8x2]``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

import pathways as pw
from bench import profiling
from bench.results import bench_parser, parse_sizes, publish, security_for_all
from pathways import P
from pathways.host import hierarchy

TITLE = "Hierarchical collectives: psum across hosts by algorithm"
SIZES = "4x4,8x2"
PAYLOADS = [("8 B", np.float64, 1), ("64 KiB", np.float32, 16 * 1024),
            ("1 MiB", np.float32, 256 * 1024)]  # per device: (name, dtype, elements)
ALGORITHMS = {
    "flat": {"PATHWAYS_FLAT_HOSTS": "1024", "PATHWAYS_SCATTER_BYTES": str(2**62)},
    "tree": {"PATHWAYS_FLAT_HOSTS": "0", "PATHWAYS_SCATTER_BYTES": str(2**62)},
    "scatter": {"PATHWAYS_FLAT_HOSTS": "0", "PATHWAYS_SCATTER_BYTES": "0"},
    "default": {},
}
KNOBS = ("PATHWAYS_FLAT_HOSTS", "PATHWAYS_SCATTER_BYTES")


@contextlib.contextmanager
def environment(settings: dict):
    """The hierarchy's thresholds set (or unset) for the clusters started inside."""
    saved = {k: os.environ.pop(k, None) for k in KNOBS}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k in KNOBS:
            os.environ.pop(k, None)
            if saved[k] is not None:
                os.environ[k] = saved[k]


def run_cluster(hosts: int, per_host: int, algorithm: str, chain: int, budget: float,
                security: dict) -> dict:
    """{payload name: (psums/s, hosts CPU ms per psum)} of one algorithm on one shape."""
    out = {}
    n = hosts * per_host
    with environment(ALGORITHMS[algorithm]), \
            pw.local_cluster(hosts_per_island=hosts, devices_per_host=per_host,
                             **security) as cluster, pw.connect(cluster.address) as client:
        mesh = client.mesh((n,), ("d",))
        pids = [pid for _, pid in profiling.cluster_processes(cluster)[1:]]
        for name, dtype, elements in PAYLOADS:
            nbytes = elements * np.dtype(dtype).itemsize
            if algorithm == "scatter" and not hierarchy.scatters("sum", nbytes, elements, hosts,
                                                                 threshold=0):
                out[name] = None
                continue
            scale = dtype(1.0 / n)
            step = pw.shard_map(lambda x, scale=scale: pw.psum(x, "d") * scale, mesh, P("d"),
                                P("d"))

            def program(x, step=step):
                for _ in range(chain):
                    x = step(x)
                return x

            prog = pw.program(program)
            x0 = np.random.default_rng(0).standard_normal(n * elements).astype(dtype)
            x = prog(client.put(x0, mesh, P("d")))
            got, want = x.result(timeout=120), pw.reference(prog)(x0)
            if got.tobytes() != want.tobytes():
                raise AssertionError(f"{algorithm} {hosts}x{per_host} {name}: not bitwise"
                                     " pw.reference's")
            runs, cpu0, t0 = 0, [profiling.cpu_seconds(p) for p in pids], time.perf_counter()
            while runs == 0 or time.perf_counter() - t0 < budget:
                x = prog(x)
                x.block_until_ready(timeout=120)
                runs += 1
            wall = time.perf_counter() - t0
            cpu = sum(profiling.cpu_seconds(p) - c for p, c in zip(pids, cpu0))
            out[name] = (runs * chain / wall, 1e3 * cpu / (runs * chain))
    return out


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "one shape (4x4), a short budget")
    ap.add_argument("--sizes", default=None, help=f"hosts x devices per host (default {SIZES})")
    ap.sized("--budget", float, 0.5, 2.0, "seconds each cell is timed")
    ap.sized("--chain", int, 4, 8, "chained psums per run")
    args = ap.parse_args(argv)
    shapes = parse_sizes(args.sizes or ("4x4" if args.quick else SIZES))
    started = time.perf_counter()
    rows = []
    with security_for_all(args.insecure, args.curve) as security:
        for hosts, per_host in shapes:
            cells = {a: run_cluster(hosts, per_host, a, args.chain, args.budget, security)
                     for a in ALGORITHMS}
            for name, _, _ in PAYLOADS:
                row = {"Hosts x devices": f"{hosts}x{per_host}", "Payload per device": name}
                for a in ALGORITHMS:
                    c = cells[a][name]
                    row[f"{a} psums/s"] = "n/a" if c is None else f"{c[0]:,.1f}"
                    row[f"{a} hosts CPU ms/psum"] = "n/a" if c is None else f"{c[1]:.2f}"
                rows.append(row)
    notes = (f"One @pw.program of {args.chain} chained psum(x) * (1/N) over every device,"
             f" run back to back for about {args.budget:g} s per cell, after one run checked"
             " bitwise against pw.reference (every algorithm adds along the same reduction"
             " tree). Algorithms forced per cluster through PATHWAYS_FLAT_HOSTS and"
             " PATHWAYS_SCATTER_BYTES (flat: every host's partial to every other host; tree:"
             " recursive doubling; scatter: reduce-scatter + all-gather, only on 3+ hosts;"
             " default: flat up to 4 hosts, tree beyond, scatter from 256 KiB on 3+ hosts)."
             " Hosts CPU = sum over host processes (/proc). All processes share one"
             f" {os.cpu_count()}-core machine. Total bench time"
             f" {time.perf_counter() - started:.0f} s.")
    publish(TITLE, rows, notes, append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
