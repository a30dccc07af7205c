"""Pathways in one screen: a local cluster of emulated TPUs, a mesh, a sharded step with a
collective, OpByOp futures, and a traced program of 128 steps checked against the reference.

    python examples/pathways_quickstart.py

With ``$PATHWAYS_ADDRESS`` set (``pathways slurm -- python examples/pathways_quickstart.py``
does) it uses that cluster, which needs 8 devices, instead of starting one.
"""

import contextlib
import os
import time

import numpy as np

import pathways as pw
from pathways import P


def main() -> None:
    with contextlib.ExitStack() as stack:
        address = os.environ.get("PATHWAYS_ADDRESS")
        if not address:
            cluster = pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=4)
            address = stack.enter_context(cluster).address
        print(f"cluster up at {address}")
        with pw.connect(address) as client:
            for d in client.devices():
                print(f"  device {d.id}: island {d.island}, host {d.host}, {d.kind}")
            mesh = client.mesh((2, 4), ("data", "model"))
            print(f"virtual slice: {mesh}")

            def body(x):  # runs on every device, on its shard
                return pw.psum(x, "data") + 1.0

            step = pw.shard_map(body, mesh, in_specs=P("data"), out_specs=P("data"))
            x0 = np.arange(16.0).reshape(4, 4)
            x = client.put(x0, mesh, P("data"))
            y = step(x)  # a future, at once
            print(f"step(x) returned {y} without waiting; its value:\n{y.result()}")

            @pw.program
            def chain(x):
                for _ in range(128):
                    x = step(x)
                return x

            print("the traced program (first lines):")
            print("\n".join(str(chain.trace([pw.compiled.Aval.of(x0)])).splitlines()[:4]))
            t0 = time.perf_counter()
            z = chain(x)  # one client call runs all 128 steps
            value = z.result()
            seconds = time.perf_counter() - t0
            assert np.allclose(value, pw.reference(chain)(x0))
            print(f"chain of 128 steps on 8 emulated TPUs: {seconds * 1e3:.1f} ms,"
                  " equal to the reference interpreter")


if __name__ == "__main__":
    main()
