"""One round of the A/B dispatch gate (``bench.ab``): the Fig. 5 cells timed on whichever
``pathways`` the interpreter imports, printed as one JSON line.

It uses only the public API that every commit the gate compares has (``pw.local_cluster``,
``pw.connect``, ``pw.shard_map``, ``pw.program``), so ``bench.ab`` runs this same file against
the working tree and against an older commit (``PYTHONPATH`` and the working directory set to
that commit's tree, so the hosts it starts import it too). A cell is the paper's trivial
computation (psum of a replicated scalar over the mesh, plus 1; each output into the next
call) on hosts x devices per host over plain loopback TCP: OpByOp is ``x = step(x)`` from
Python, waiting for the result every ``WAIT_EVERY`` calls; Stream the same loop waiting only
every ``STREAM`` calls, a user's loop that never waits (a client's bound on runs in flight,
where it has one, is reached and paces the calls); Chained one ``@pw.program`` of ``CHAIN``
steps run repeatedly. Its figure is computations per second over ``budget`` seconds after a
warm-up.

Run: ``python bench/ab_cell.py CELLS BUDGET`` (CELLS: e.g. ``1x4,2x1``).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import pathways as pw
from pathways import P

CHAIN = 32  # steps per chained run
WAIT_EVERY = 64  # computations between two waits for the result (OpByOp, Chained)
STREAM = 4096  # computations between two waits in Stream (past a client's default bound)
MODES = ("OpByOp", "Chained", "Stream")


def _step(mesh):
    def body(x):
        with np.errstate(over="ignore", invalid="ignore"):
            return pw.psum(x, "d") + 1.0
    return pw.shard_map(body, mesh, P(), P())


def _chain(step):
    def chain(x):
        for _ in range(CHAIN):
            x = step(x)
        return x
    return pw.program(chain)


def _rate(fn, steps_per_call: int, client, mesh, budget: float,
          wait_every: int = WAIT_EVERY) -> float:
    """Computations per second of ``fn`` over about ``budget`` seconds (after a warm-up),
    waiting for the result every ``wait_every`` computations."""
    x = client.put(np.zeros(()), mesh, P())
    for _ in range(max(1, 8 // steps_per_call)):
        x = fn(x)
    x.block_until_ready(60)
    calls, t0 = 0, time.perf_counter()
    while True:
        for _ in range(max(1, wait_every // steps_per_call)):
            x = fn(x)
            calls += 1
        x.block_until_ready(120)
        wall = time.perf_counter() - t0
        if wall >= budget:
            return calls * steps_per_call / wall


def cell(hosts: int, per_host: int, budget: float) -> dict:
    with pw.local_cluster(islands=1, hosts_per_island=hosts, devices_per_host=per_host,
                          insecure=True) as cluster, pw.connect(cluster.address) as client:
        mesh = client.mesh((hosts * per_host,), ("d",))
        step = _step(mesh)
        fns = {"OpByOp": (step, 1, WAIT_EVERY), "Chained": (_chain(step), CHAIN, WAIT_EVERY),
               "Stream": (step, 1, STREAM)}
        return {mode: _rate(fn, k, client, mesh, budget, every)
                for mode, (fn, k, every) in fns.items()}


def main(argv: list[str]) -> int:
    cells, budget = argv[0].split(","), float(argv[1])
    out = {}
    for c in cells:
        hosts, per_host = (int(n) for n in c.split("x"))
        for mode, rate in cell(hosts, per_host, budget).items():
            out[f"{c} {mode}"] = rate
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
