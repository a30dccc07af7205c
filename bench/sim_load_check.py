"""Simulated Fig. 5 at 4x4 (Chained and OpByOp, cost 0) in virtual time; prints the rates.

The load-invariance check of the simulator (issue 29): run it on a quiet machine and under CPU
hogs (``python -c "while True: pass" &`` twice); the rates should not move beyond the noise
between quiet runs, while the wall time does. Run: ``python -m bench.sim_load_check``.
"""

import time

import numpy as np

import pathways as pw
from bench.multicontroller import expected_value, trivial_body
from pathways import P

CHAIN = 128
with pw.local_cluster(hosts_per_island=4, devices_per_host=4, simulate=True, cpu="measured") as c:
    with pw.connect(c.address) as client:
        mesh = client.mesh((16,), ("d",))
        step = pw.shard_map(trivial_body(1), mesh, P(), P())
        def chain(x):
            for _ in range(CHAIN):
                x = step(x)
            return x
        prog = pw.program(chain)
        x = prog(client.put(np.zeros(()), mesh, P())); x.block_until_ready()
        out = {}
        for mode, fn, units, per in (("Chained", prog, 6, CHAIN), ("OpByOp", step, 600, 1)):
            x = client.put(np.zeros(()), mesh, P()); x.block_until_ready()
            t0 = c.clock(); w0 = time.perf_counter()
            for _ in range(units):
                x = fn(x)
            x.block_until_ready()
            assert float(x.result()) == expected_value(16, units * per)
            out[mode] = units * per / (c.clock() - t0)
        print(" ".join(f"{m} {r:.0f}/s" for m, r in out.items()), f"wall {time.perf_counter()-w0:.1f}s", flush=True)
