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

CHAIN = 128  # calls per chained run
HOSTS, PER_HOST = 4, 4


def main() -> None:
    devices = HOSTS * PER_HOST
    with pw.local_cluster(hosts_per_island=HOSTS, devices_per_host=PER_HOST, simulate=True,
                          cpu="measured") as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((devices,), ("d",))
            step = pw.shard_map(trivial_body(1), mesh, P(), P())

            def chain(x):
                for _ in range(CHAIN):
                    x = step(x)
                return x

            prog = pw.program(chain)
            prog(client.put(np.zeros(()), mesh, P())).block_until_ready()  # installs it
            rates, wall = {}, time.perf_counter()
            for mode, fn, units, per in (("Chained", prog, 6, CHAIN), ("OpByOp", step, 600, 1)):
                x = client.put(np.zeros(()), mesh, P())
                x.block_until_ready()
                t0 = cluster.clock()
                for _ in range(units):
                    x = fn(x)
                x.block_until_ready()
                assert float(x.result()) == expected_value(devices, units * per)
                rates[mode] = units * per / (cluster.clock() - t0)
    print(" ".join(f"{m} {r:.0f}/s" for m, r in rates.items()),
          f"(virtual); wall {time.perf_counter() - wall:.1f} s", flush=True)


if __name__ == "__main__":
    main()
