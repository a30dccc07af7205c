"""Two clients share one island; the scheduler gives them device time by weight.

A local cluster (one island, 2 hosts x 2 emulated TPUs) runs the proportional-share policy.
Two clients connect with weights 1 and 3, each from its own thread, as two users would from two
processes. Each makes its input on the hosts (``client.generate``: the data never passes
through the client) and submits a stream of small programs on the same 4 devices. The devices'
own records then show who got how much device time while both were busy.

    python examples/two_clients.py [--programs 60] [--weights 1 3]
"""

from __future__ import annotations

import argparse
import threading

import numpy as np

import pathways as pw
from pathways import P
from pathways.client.trace import device_time_by_client

KERNEL = 0.002  # modelled seconds of one kernel


def ramp(index):
    """The input, made on each host for its own rows."""
    (rows,) = index
    return np.arange(rows.start, rows.stop, dtype=np.float64)


def user(address, weight, programs, results, name):
    with pw.connect(address, weight=weight) as client:
        mesh = client.mesh((4,), ("data",))
        x = client.generate(ramp, (1024,), np.float64, mesh, P("data"))
        step = pw.shard_map(lambda v: v * 0.5 + 1.0, mesh, P("data"), P("data"), cost=KERNEL)

        @pw.program
        def four_steps(v):
            for _ in range(4):
                v = step(v)
            return v

        outs = [four_steps(x) for _ in range(programs)]
        got = outs[-1].result(timeout=120)
        want = np.arange(1024.0)
        for _ in range(4):
            want = want * 0.5 + 1.0
        results[name] = (client.id, bool(np.allclose(got, want)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", type=int, default=60)
    ap.add_argument("--weights", type=float, nargs=2, default=(1.0, 3.0))
    args = ap.parse_args(argv)
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2,
                          policy="share", window=4) as cluster:
        results = {}
        names = ("alice", "bob")
        threads = [threading.Thread(target=user, args=(cluster.address, w, args.programs,
                                                       results, n))
                   for n, w in zip(names, args.weights)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        with pw.connect(cluster.address) as observer:
            timeline = observer.timeline()  # every device's own record of its kernels
    ids = {results[n][0]: n for n in names}
    busy, window = device_time_by_client(timeline, list(ids))
    total = sum(busy.values())
    print(f"{len(names)} clients, {args.programs} programs of 4 kernels each, on one island")
    for (cid, name), w in zip(ids.items(), args.weights):
        ok = results[name][1]
        print(f"  {name}: weight {w:g}, results {'correct' if ok else 'WRONG'},"
              f" device time while both ran {busy[cid]:.3f} s = {busy[cid] / total:.0%}"
              f" (weight share {w / sum(args.weights):.0%})")
    print(f"  (both were submitting for {window:.2f} s)")
    return busy, ids


if __name__ == "__main__":
    main()
