"""Host CPU per kernel: a JAX body vs the same numpy body.

The same math written twice, as a numpy body (pw collectives) and as a JAX body (jax.numpy,
jax.lax collectives; traced, cut at collectives, segments compiled by XLA), runs as a
``@pw.program`` of ``steps`` chained calls on a mesh ("i",) of 4 devices
(``local_cluster(islands=1, hosts_per_island=2, devices_per_host=2)``). Host CPU is the two
host processes' CPU seconds (/proc schedstat, all threads: XLA's included) over the timed runs,
divided by the kernels they ran (steps x 4 devices x runs); wall is per step. Every output is
checked against pw.reference of the numpy body.

Bodies: "scale" (x * 2 + 1, no collective: one XLA call vs three numpy ops) and "mlp"
(psum(relu(x @ w1) @ w2): two segments around one collective), on shards of [rows, 64].

Run: ``python -m bench.jax_bodies [--quick] [--no-append]``.
"""

from __future__ import annotations

import time

import numpy as np

import pathways as pw
from bench.profiling import cpu_seconds
from bench.results import bench_parser, publish, security_for_all
from pathways import P

WIDTH = 64


def bodies():
    """{name: (numpy body, JAX body)} with the same meaning."""
    import jax
    import jax.numpy as jnp

    def scale_np(x, w1, w2):
        return x * 2.0 + 1.0

    def scale_jax(x, w1, w2):
        return jnp.multiply(x, 2.0) + 1.0

    def mlp_np(x, w1, w2):
        return pw.psum(np.maximum(x @ w1, 0.0) @ w2, "i") * 0.25

    def mlp_jax(x, w1, w2):
        return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "i") * 0.25

    return {"scale": (scale_np, scale_jax), "mlp": (mlp_np, mlp_jax)}


def chain(fn, steps: int):
    @pw.program
    def run(x, w1, w2):
        for _ in range(steps):
            x = fn(x, w1, w2)
        return x

    return run


def measure(client, hosts, body, args, steps: int, runs: int) -> tuple[float, float, object]:
    """(host CPU µs per kernel, wall ms per step, the last output) of ``runs`` runs."""
    mesh = client.mesh((4,), ("i",))
    specs = (P("i"), P(), P())
    fn = pw.shard_map(body, mesh, specs, P("i"))
    program = chain(fn, steps)
    put = [client.put(a, mesh, s) for a, s in zip(args, specs)]
    program(*put).result()  # trace, compile and install before timing
    cpu0, t0 = sum(cpu_seconds(p) for p in hosts), time.perf_counter()
    for _ in range(runs):
        out = program(*put)
    value = out.result()
    wall = time.perf_counter() - t0
    cpu = sum(cpu_seconds(p) for p in hosts) - cpu0
    kernels = steps * mesh.size * runs
    return cpu / kernels * 1e6, wall / (steps * runs) * 1e3, value


def xla_floor(x, calls: int = 2000) -> float:
    """CPU µs of one call of a jitted ``x * 2 + 1`` in this process, synchronous dispatch as
    on a host, with a 200 µs pause between calls (as between kernels), minus the pauses' own
    cost: the floor under any JAX segment."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_cpu_enable_async_dispatch", False)
    f = jax.jit(lambda x: jnp.multiply(x, 2.0) + 1.0)
    np.asarray(f(x))

    def cpu_per_call(work) -> float:
        t0 = time.process_time()
        for _ in range(calls):
            work()
            time.sleep(0.0002)
        return (time.process_time() - t0) / calls * 1e6

    return cpu_per_call(lambda: np.asarray(f(x))) - cpu_per_call(lambda: None)


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "few steps and runs")
    ap.sized("--steps", int, 8, 64, "chained calls per program")
    ap.sized("--runs", int, 2, 10, "program runs timed per cell")
    ap.sized("--rows", int, 16, 64, "rows of each device's shard")
    args = ap.parse_args(argv)
    try:
        pairs = bodies()
    except ImportError:
        raise SystemExit(pw.jax_body.INSTALL_HINT) from None
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((4 * args.rows, WIDTH)).astype(np.float32),
            (rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32),
            (rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32))
    rows = []
    with security_for_all(args.insecure, args.curve) as security, \
            pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2,
                             **security) as cluster, pw.connect(cluster.address) as client:
        hosts = [p.pid for p in cluster.processes[1:]]
        for name, (numpy_body, jax_body) in pairs.items():
            mesh = pw.Mesh.abstract((4,), ("i",))
            want = pw.reference(chain(pw.shard_map(numpy_body, mesh, (P("i"), P(), P()),
                                                   P("i")), args.steps))(*data)
            cells = {}
            for kind, body in (("numpy", numpy_body), ("jax", jax_body)):
                cpu, wall, value = measure(client, hosts, body, data, args.steps, args.runs)
                np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-4)
                cells[kind] = cpu
                rows.append({"body": name, "written in": kind,
                             "host CPU µs/kernel": f"{cpu:.0f}",
                             "wall ms/step": f"{wall:.2f}"})
                print(rows[-1], flush=True)
            rows[-1]["jax / numpy CPU"] = f"{cells['jax'] / cells['numpy']:.2f}x"
    floor = xla_floor(data[0][:args.rows])
    rows.append({"body": "scale", "written in": "jax.jit alone (one call, no pathways)",
                 "host CPU µs/kernel": f"{floor:.0f}", "wall ms/step": "-"})
    notes = (f"Mesh ('i',) of 4 devices on 2 host processes; shards [{args.rows}, {WIDTH}]"
             f" float32; a @pw.program of {args.steps} chained calls, {args.runs} runs per"
             " cell, after one untimed run (trace, XLA compile, install). Host CPU: both hosts'"
             " CPU seconds over the timed runs (all threads, XLA's included) per kernel."
             " Outputs equal pw.reference of the numpy body (rtol 1e-4). The last row is the"
             " floor under any segment: a jitted x * 2 + 1 on one shard called in this process"
             " with synchronous dispatch (as hosts use) and 200 µs pauses between calls (their"
             " own cost subtracted); a JAX body's extra host CPU over numpy is about one such"
             " call per segment.")
    publish("JAX bodies: host CPU per kernel vs numpy bodies", rows, notes,
            append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
