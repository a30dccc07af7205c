"""Pipeline vs SPMD: how close a GPipe pipeline on emulated TPUs comes to its bound.

The same model (S dense tanh layers) on the same S devices, two ways:
- pipelined: one layer per stage, each stage on its own device, M micro-batches, GPipe
  schedule (``pw.Pipeline``); every forward of a micro-batch costs ``c`` of modelled device
  time, every backward ``2c``;
- SPMD: every device runs all S layers on 1/S of the batch: 3·c·M of modelled time per step,
  one kernel per device per step, gradients summed with a psum.
Ideal step times: SPMD 3cM, GPipe 3c(M+S-1), so pipelined / SPMD throughput is at most the
GPipe bound M/(M+S-1). We report the measured pipeline throughput as a fraction of that bound
(target >= 90%) and of the measured SPMD throughput. ``c`` is large enough that the runtime's
CPU work (a few ms per step on 2 cores) is small next to the modelled time.

    python -m bench.gpipe [--quick]
"""

from __future__ import annotations

import sys
import time

import numpy as np

import pathways as pw
from bench.results import bench_parser, publish
from pathways import P

TITLE = "Pipeline vs SPMD: fraction of the GPipe bound M/(M+S-1)"
WIDTH, ROWS = 16, 8  # layer width; rows per micro-batch
TARGET = 0.90


def forward(params, x):
    (w,) = params
    y = np.tanh(x @ w)
    return y, (x, y)


def backward(params, residuals, dy):
    (w,) = params
    x, y = residuals
    dz = dy * (1 - y * y)
    return (x.T @ dz,), dz @ w.T


def mse(y, target):
    diff = y - target
    return np.mean(diff * diff), 2 * diff / diff.size


def pipelined_step_time(client, stages, micro, cost, steps):
    rng = np.random.default_rng(0)
    layers = [pw.Stage((rng.standard_normal((WIDTH, WIDTH)) / 4,), forward, backward, cost=cost)
              for _ in range(stages)]
    pipe = pw.Pipeline(client, layers, mse, microbatches=micro, lr=0.01)
    x = rng.standard_normal((ROWS * micro, WIDTH))
    t = rng.standard_normal((ROWS * micro, WIDTH))
    pipe.step(x, t).result(300)  # warm-up: install and first run
    t0 = time.perf_counter()
    losses = [pipe.step(x, t) for _ in range(steps)]
    losses[-1].result(600)
    return (time.perf_counter() - t0) / steps, losses[-1].result(1) < losses[0].result(1)


def spmd_step_time(client, stages, micro, cost, steps):
    mesh = client.mesh((stages,), ("data",))
    # every device: all layers on its rows, 3c per layer and micro-batch share, then a psum
    step = pw.shard_map(lambda w, x: w - 0.01 * pw.psum(x.T @ x, "data") / x.size,
                        mesh, (P(), P("data")), P(), cost=3 * cost * micro)
    w = client.put(np.zeros((WIDTH, WIDTH)), mesh, P())
    x = client.put(np.ones((ROWS * micro, WIDTH)), mesh, P("data"))
    step(w, x).result(300)
    t0 = time.perf_counter()
    for _ in range(steps):
        w = step(w, x)
    w.result(600)
    return (time.perf_counter() - t0) / steps


def main() -> int:
    ap = bench_parser(__doc__, "small sizes")
    args = ap.parse_args()
    cost = 0.005 if args.quick else 0.04
    configs = [(4, 4)] if args.quick else [(4, 8), (8, 16)]
    steps = 2 if args.quick else 3
    rows, checks, begin = [], [], time.perf_counter()
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=4) as cluster:
        for stages, micro in configs:
            with pw.connect(cluster.address) as client:
                pipe_t, learned = pipelined_step_time(client, stages, micro, cost, steps)
            with pw.connect(cluster.address) as client:
                spmd_t = spmd_step_time(client, stages, micro, cost, steps)
            bound = micro / (micro + stages - 1)
            of_bound = 3 * cost * (micro + stages - 1) / pipe_t
            checks.append(of_bound >= TARGET)
            rows.append({
                "S": stages, "M": micro, "c (ms)": f"{cost * 1e3:g}",
                "GPipe bound": f"{bound:.3f}",
                "pipeline step (ms)": f"{pipe_t * 1e3:.0f}",
                "ideal (ms)": f"{3 * cost * (micro + stages - 1) * 1e3:.0f}",
                "SPMD step (ms)": f"{spmd_t * 1e3:.0f}",
                "pipeline/SPMD": f"{spmd_t / pipe_t:.3f}",
                "fraction of bound": f"{of_bound:.3f}",
                "loss falls": "yes" if learned else "NO",
                "Target": f">= {TARGET:.0%}: {'met' if of_bound >= TARGET else 'MISSED'}",
            })
    notes = "\n".join([
        "Model: S dense tanh layers of width 16, one per stage, each stage on its own emulated"
        " device (1 island, 2 hosts x 4 devices); MSE loss; GPipe schedule; M micro-batches of"
        f" {ROWS} rows. Modelled cost per forward of one micro-batch c, backward 2c; SPMD: one"
        " kernel of 3cM per device per step plus a psum. Steps issued back to back (each"
        " depends on the previous parameters), timed after one warm-up step.",
        "Fraction of bound = ideal GPipe step 3c(M+S-1) / measured step; pipeline/SPMD ="
        " measured SPMD step / measured pipeline step (bounded by M/(M+S-1)).",
        f"Target: >= {TARGET:.0%} of the GPipe bound: "
        f"{'met' if all(checks) else 'MISSED'}. Total bench time"
        f" {time.perf_counter() - begin:.0f} s.",
    ])
    publish(TITLE, rows, notes, append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
