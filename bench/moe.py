"""Mixture of Experts: sparse routing (``expert_map``) vs dense all-to-all dispatch.

One MoE feed-forward layer forward (router, experts, combine; ``pathways.lib.moe.MoELayer``), E=8
experts, float32, on ``local_cluster(islands=1, hosts_per_island=4, devices_per_host=1)``:
every device is its own host process, so every byte between devices crosses a socket. Tokens
are sharded over the 4 devices (mesh axis "data", one routing group per device); the experts
(2 per device) over the SAME 4 devices (axis "expert", a mesh built by hand on the token
mesh's devices). Two paths compute the same layer:

- **sparse**: ``MoELayer.forward`` in a ``@pw.program``: only the routed rows travel, as
  Plaque messages to the expert's device and back;
- **dense** (GShard): one ``shard_map`` whose body routes its tokens (``moe.route_group``),
  fills a capacity-padded dispatch buffer ``[E, C, d]`` (zeros where empty), ``all_to_all``s
  it over "data", runs ``moe.ffn`` on each local expert's ``[D*C, d]`` batch, sends the
  outputs back with a second ``all_to_all`` and combines; both collectives go over ICI.

Both get the same capacity factor (the dense path cannot be dropless) and must produce the same
``y`` (rtol 1e-5); the sparse path is also measured dropless. Routings: **uniform** (random
router weights) and **skewed** (``x[:, 0] = 1`` and ``wr[0, 5] = 25``: every first choice goes
to expert 5, on device 2).

1. Wire per layer forward: bytes and messages every host sent to OTHER hosts
   (``Client.host_status()[h]["wire"]``: Plaque data + progress, and ICI), deltas over all
   timed runs divided by the runs. "Routed tokens" is what a perfect sparse dispatch must move:
   slots kept by the router whose expert lives on another device than their token, times
   ``d * 4`` bytes, times 2 (there and back); wire / routed is the overhead (target <= 1.2 for
   the sparse path). Progress messages are part of the Plaque figures; messages to the
   coordinator are not counted (they are not between devices).
2. Step rate: ``runs`` forwards submitted back to back (futures), timed to every output
   ready, best of ``reps`` rounds in which sparse and dense take turns; every output checked.
3. Progress traffic vs expert shards: on 2 hosts x 4 devices, tokens on 2 devices (one per
   host), experts on 1, 2, 4 and 8 devices alternating between the hosts; Plaque messages
   (all, and progress only) per sparse forward, summed over hosts.

``--simulate`` runs all three on simulated clusters instead (``pw.local_cluster(simulate=True,
cpu="measured")``): coordinator, hosts and client are roles of one discrete-event simulation in
this process, each host a virtual CPU of its own charged the thread CPU time of its handlers
(kernel bodies included), so the step rate is the modelled cluster's, not that of hosts
sharing this machine's cores, and the layouts grow: measurements 1 and 2 on ``--hosts``
one-device hosts (default 16), 2 experts and 512 tokens per host; measurement 3 on 8 hosts x 4
devices, tokens on one device per host, experts on 1 to 32 devices. Cells are timed in virtual
seconds (``cluster.clock()``), CPU is what the host roles are charged, and each simulation
reports the wall time it took.

Run: ``python -m bench.moe [--quick] [--no-append] [--simulate [--hosts 16] [--seed 0]]``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import pathways as pw
from bench.results import bench_parser, publish, table, wants_simulation
from pathways import P, moe
from pathways.program.mesh import Mesh

TITLE = "Mixture of Experts: sparse routing vs dense all-to-all dispatch (wire, tokens/s)"
SIM_TITLE = ("Mixture of Experts, simulated: sparse routing vs dense all-to-all dispatch in"
             " virtual time (wire, tokens/s)")
E = 8  # experts of measurements 1 and 2 (simulated: 2 per host)
HOT = 5  # the expert every first choice goes to under the skewed routing
D = 4  # devices (= hosts) of measurements 1 and 2 (simulated: --hosts)
TARGET = 1.2  # sparse wire bytes <= 1.2 x routed-token bytes
# (top_k, capacity factor, also run the dense path)
CONFIGS = [(1, 1.25, True), (2, 2.0, True), (1, None, False), (2, None, False)]
TIMEOUT = 120.0


@dataclass
class Sizes:
    tokens: int  # measurements 1, 2: T, d, expert hidden; runs per round, rounds
    d: int
    hidden: int
    runs: int
    reps: int
    scale_tokens: int  # measurement 3: T and d (= expert hidden)
    scale_d: int
    hosts: int = D  # measurements 1, 2: hosts of one device, experts over them
    experts: int = E
    scale_hosts: int = 2  # measurement 3: hosts x devices; as many experts as devices
    scale_per_host: int = 4


DEFAULT = Sizes(tokens=2048, d=256, hidden=512, runs=10, reps=5, scale_tokens=512, scale_d=64)
QUICK = Sizes(tokens=256, d=64, hidden=64, runs=3, reps=1, scale_tokens=64, scale_d=16)
# simulated: per host as DEFAULT and QUICK (512 or 64 tokens, 2 experts), on more hosts
SIM_DEFAULT = Sizes(tokens=512 * 16, d=256, hidden=512, runs=5, reps=2, scale_tokens=256 * 8,
                    scale_d=64, hosts=16, experts=32, scale_hosts=8, scale_per_host=4)
SIM_QUICK = Sizes(tokens=64 * 8, d=64, hidden=64, runs=3, reps=1, scale_tokens=32 * 4,
                  scale_d=16, hosts=8, experts=16, scale_hosts=4, scale_per_host=2)


def problem(T, d, hidden, skew, experts=E, seed=0):
    """(x[T, d], wr[d, E], w1[E, d, f], w2[E, f, d]) in float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, d)).astype(np.float32)
    wr, w1, w2 = moe.init_params(rng, d, hidden, experts)
    if skew:
        x[:, 0] = 1.0
        wr[0, HOT] = 25.0
    return x, wr, w1, w2


def routed_slots(x, wr, k, cf, token_hosts, expert_hosts):
    """(kept slots, kept slots whose expert is on another host than their token), routing
    one group per token device as the router does; ``*_hosts``: host of each mesh device."""
    groups, per_device = len(token_hosts), wr.shape[1] // len(expert_hosts)
    n = len(x) // groups
    kept = remote = 0
    for g in range(groups):
        route = moe.route_group(x[g * n:(g + 1) * n], wr, k, cf)[0]
        live = route[route >= 0]
        kept += live.size
        remote += int((np.asarray(expert_hosts)[live // per_device] != token_hosts[g]).sum())
    return kept, remote


def dense_layer(mesh, k, cf, experts=E):
    """The GShard layer: capacity-padded [E, C, d] buffers, two all_to_alls over ICI."""
    ax, n_dev, E = mesh.axis_names[0], mesh.size, experts

    def body(x, wr, w1, w2):
        n, d = x.shape
        route, gates, _, _ = moe.route_group(x, wr, k, cf)
        C = moe.capacity(n, E, k, cf)
        pos = np.full(route.shape, -1, np.int64)  # place of each kept slot in its expert
        used = np.zeros(E, np.int64)
        for j in range(k):  # as route_group: first choices first, then token order
            t = np.flatnonzero(route[:, j] >= 0)
            e = route[t, j]
            onehot = np.eye(E, dtype=np.int64)[e]
            pos[t, j] = np.cumsum(onehot, axis=0)[np.arange(len(t)), e] - 1 + used[e]
            used += onehot.sum(axis=0)
        t, j = np.nonzero(route >= 0)
        buf = np.zeros((E, C, d), x.dtype)
        buf[route[t, j], pos[t, j]] = x[t]
        got = pw.all_to_all(buf.reshape(n_dev, E // n_dev, C, d), ax, 0, 0)  # [src, e, C, d]
        out = np.stack([moe.ffn(got[:, e].reshape(-1, d), w1[e], w2[e]).reshape(n_dev, C, d)
                        for e in range(E // n_dev)], axis=1)
        back = pw.all_to_all(out, ax, 0, 0).reshape(E, C, d)
        rows = np.zeros((n, k, d), x.dtype)
        rows[t, j] = back[route[t, j], pos[t, j]]
        return x + (gates[..., None] * rows).sum(axis=1).astype(x.dtype)

    fn = pw.shard_map(body, mesh, (P(ax), P(), P(ax), P(ax)), P(ax), name="gshard_dense")

    @pw.program
    def forward(x, wr, w1, w2):
        return fn(x, wr, w1, w2)

    return forward


def sparse_layer(tm, em, k, cf, experts=E):
    layer = moe.MoELayer(tm, em, experts, top_k=k, capacity_factor=cf)

    @pw.program
    def forward(x, wr, w1, w2):
        return layer.forward(x, wr, w1, w2)[0]

    return forward


@dataclass
class Probe:
    """What the measurements read off a cluster: ``clock()`` (seconds: real, or virtual),
    ``host_cpu()`` (CPU seconds of the hosts so far: their processes', or what their roles
    were charged) and ``pause(seconds)`` (let that much time pass)."""

    clock: Callable[[], float]
    host_cpu: Callable[[], float]
    pause: Callable[[float], None]
    wall: Callable[[], float] | None = None  # simulated: real seconds since it started


def open_cluster(hosts: int, per_host: int, seed: int | None):
    """A local cluster of one island: simulated (virtual time) if ``seed`` is given."""
    options = {} if seed is None else dict(simulate=True, seed=seed, cpu="measured")
    return pw.local_cluster(islands=1, hosts_per_island=hosts, devices_per_host=per_host,
                            **options)


def probe_of(cluster, simulated: bool) -> Probe:
    if simulated:
        hosts = [r for name, r in cluster.roles.items() if name.startswith("host-")]
        return Probe(cluster.clock, lambda: sum(r.cpu_used for r in hosts), cluster.run_for,
                     cluster.wall)
    pids = [p.pid for p in cluster.processes[1:]]  # the hosts (0 is the coordinator)
    return Probe(time.perf_counter, lambda: sum(_cpu_seconds(p) for p in pids), time.sleep)


def counters(client, probe: Probe) -> dict:
    """Cumulative traffic to other hosts (Plaque, ICI) and CPU seconds, summed over hosts."""
    out = {"cpu": probe.host_cpu()}
    for status in client.host_status().values():
        for key in ("bytes_sent", "messages_sent", "progress_sent"):
            out[key] = out.get(key, 0) + status["wire"]["plaque"][key]
        for key in ("bytes", "messages"):
            out[f"ici_{key}"] = out.get(f"ici_{key}", 0) + status["wire"]["ici"][key]
    return out


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(client, probe: Probe, fn, args, runs, want):
    """(seconds to every output ready, counters delta) of ``runs`` back-to-back forwards."""
    before = counters(client, probe)
    t0 = probe.clock()
    outs = [fn(*args) for _ in range(runs)]
    for o in outs:
        o.block_until_ready(TIMEOUT)
    seconds = probe.clock() - t0
    for o in outs:
        np.testing.assert_array_equal(o.result(TIMEOUT), want)
    probe.pause(0.05)  # let the last progress messages leave before the counters are read
    after = counters(client, probe)
    return seconds, {key: after[key] - before[key] for key in after}


@dataclass
class Cell:
    routing: str
    k: int
    cf: float | None
    path: str
    slots: tuple[int, int]  # kept, remote
    routed: int  # bytes of the remote kept slots, there and back
    tokens: int  # tokens per timed round
    seconds: list
    traffic: dict  # per run

    @property
    def rate(self) -> float:
        return self.tokens / min(self.seconds)

    @property
    def wire(self) -> float:
        return self.traffic["bytes_sent"] + self.traffic["ici_bytes"]


def measure_layers(sizes: Sizes, seed: int | None = None) -> tuple[list[Cell], float | None]:
    """Measurements 1 and 2 on ``sizes.hosts`` hosts x 1 device, simulated if ``seed`` is
    given: the cells, and the real seconds the simulation took (None if not simulated)."""
    D, E = sizes.hosts, sizes.experts
    cells = []
    with open_cluster(D, 1, seed) as cluster, pw.connect(cluster.address) as client:
        probe = probe_of(cluster, seed is not None)
        tm = client.mesh((D,), ("data",))
        em = Mesh((D,), ("expert",), tm.ids, tm.slice_id, tm.island, tm.version,
                  client=client)
        for skew in (False, True):
            data = problem(sizes.tokens, sizes.d, sizes.hidden, skew, E)
            x, wr, w1, w2 = data
            xs, wrs = client.put(x, tm, P("data")), client.put(wr, tm, P())
            sparse_args = (xs, wrs, client.put(w1, em, P("expert")),
                           client.put(w2, em, P("expert")))
            dense_args = (xs, wrs, client.put(w1, tm, P("data")), client.put(w2, tm, P("data")))
            for k, cf, with_dense in CONFIGS:
                paths = [("sparse", sparse_layer(tm, em, k, cf, E), sparse_args)]
                if with_dense:
                    paths.append(("dense", dense_layer(tm, k, cf, E), dense_args))
                cells += measure_config(client, probe, sizes, "skewed" if skew else "uniform",
                                        data, k, cf, paths)
        wall = probe.wall() if probe.wall else None
    return cells, wall


def measure_config(client, probe: Probe, sizes: Sizes, routing: str, data, k, cf,
                   paths) -> list[Cell]:
    """One routing, top-k and capacity factor: each of ``paths`` ((name, forward, args))
    checked, then timed for ``sizes.reps`` rounds in which they take turns."""
    x, wr, w1, w2 = data
    D, d = sizes.hosts, sizes.d
    kept, remote = routed_slots(x, wr, k, cf, range(D), range(D))
    routed = remote * d * x.itemsize * 2
    wants = [fn(*a).result(TIMEOUT) for _, fn, a in paths]  # warm-up: installs
    np.testing.assert_allclose(wants[0], moe.dense_moe(x, wr, w1, w2, D, k, cf)[0],
                               rtol=1e-4, atol=1e-4)
    for got in wants[1:]:
        # dense == sparse: two float32 algorithms (matmuls over differently shaped
        # batches) agree to an ulp, which near zero needs an absolute bound
        np.testing.assert_allclose(got, wants[0], rtol=1e-5, atol=1e-6)
    seconds = {p[0]: [] for p in paths}
    totals: dict = {p[0]: {} for p in paths}
    turns = list(zip(paths, wants))
    for rep in range(sizes.reps):
        for (name, fn, args), w in (turns if rep % 2 == 0 else turns[::-1]):
            s, traffic = timed(client, probe, fn, args, sizes.runs, w)
            seconds[name].append(s)
            for key, v in traffic.items():
                totals[name][key] = totals[name].get(key, 0) + v
    n_runs = sizes.runs * sizes.reps
    cells = []
    for name, *_ in paths:
        cell = Cell(routing, k, cf, name, (kept, remote), routed, len(x) * sizes.runs,
                    seconds[name], {key: v / n_runs for key, v in totals[name].items()})
        cells.append(cell)
        print(f"  {routing} k={k} cf={cf} {name}: {cell.rate:,.0f} tokens/s,"
              f" {cell.wire / 1e3:,.1f} KB/run", flush=True)
    return cells


def measure_scaling(sizes: Sizes, seed: int | None = None) -> tuple[list[dict], float | None]:
    """Measurement 3 on ``sizes.scale_hosts`` x ``scale_per_host`` devices (2 x 4), simulated
    if ``seed`` is given: Plaque traffic per forward vs expert shards. The rows, and the real
    seconds the simulation took (None if not simulated)."""
    hosts, per_host = sizes.scale_hosts, sizes.scale_per_host
    experts = hosts * per_host
    rows, base = [], None
    x, wr, w1, w2 = problem(sizes.scale_tokens, sizes.scale_d, sizes.scale_d, False, experts)
    with open_cluster(hosts, per_host, seed) as cluster, pw.connect(cluster.address) as client:
        probe = probe_of(cluster, seed is not None)
        full = client.mesh((experts,), ("all",))  # the slice; token and expert meshes share it

        def mesh(devices, axis):
            return Mesh((len(devices),), (axis,), tuple(devices), full.slice_id, full.island,
                        full.version, client=client)

        host_of = {dev.id: dev.host for dev in client.devices()}
        by_host: dict = {}
        for dev in full.ids:
            by_host.setdefault(host_of[dev], []).append(dev)
        spread = [by_host[h][i] for i in range(per_host) for h in sorted(by_host)]  # alternate
        tm = mesh([by_host[h][0] for h in sorted(by_host)], "data")
        xs, wrs = client.put(x, tm, P("data")), client.put(wr, tm, P())
        for shards in (2**i for i in range(experts.bit_length())):
            em = mesh(spread[:shards], "expert")
            fn = sparse_layer(tm, em, 2, 1.25, experts)
            args = (xs, wrs, client.put(w1, em, P("expert")), client.put(w2, em, P("expert")))
            want = fn(*args).result(TIMEOUT)
            _, traffic = timed(client, probe, fn, args, sizes.runs * sizes.reps, want)
            per_run = {key: v / (sizes.runs * sizes.reps) for key, v in traffic.items()}
            base = base or per_run["progress_sent"]
            _, remote = routed_slots(x, wr, 2, 1.25, [host_of[i] for i in tm.ids],
                                     [host_of[i] for i in em.ids])
            rows.append(scaling_row(em, per_run, base, remote * x.shape[1] * x.itemsize * 2))
            print(f"  {shards} expert shard(s): {rows[-1]['Progress msgs/run']} progress"
                  f" msgs/run", flush=True)
        wall = probe.wall() if probe.wall else None
    return rows, wall


def scaling_row(em, per_run: dict, base: float, routed_bytes: int) -> dict:
    shards, rows_kb = em.size, routed_bytes / 1e3
    return {
        "Expert shards": shards,
        "Expert devices": ",".join(map(str, em.ids)),
        "Progress msgs/run": f"{per_run['progress_sent']:.1f}",
        "vs 1 shard": f"{per_run['progress_sent'] / base:.2f}x",
        "shards²": shards * shards,
        "All Plaque msgs/run": f"{per_run['messages_sent']:.1f}",
        "Plaque KB/run": f"{per_run['bytes_sent'] / 1e3:.1f}",
        "Of which routed rows": f"{rows_kb:.1f}",
        "Rest KB/run": f"{per_run['bytes_sent'] / 1e3 - rows_kb:.1f}",
    }


def rows_of(cells: list[Cell], simulated: bool = False) -> list[dict]:
    rows = []
    dense = {(c.routing, c.k, c.cf): c for c in cells if c.path == "dense"}
    for c in cells:
        t = c.traffic
        twin = dense.get((c.routing, c.k, c.cf)) if c.path == "sparse" else None
        rows.append({
            "Routing": c.routing,
            "k, cf": f"{c.k}, {'dropless' if c.cf is None else c.cf}",
            "Path": c.path,
            "Slots kept / remote": f"{c.slots[0]} / {c.slots[1]}",
            "Routed-token KB": f"{c.routed / 1e3:,.1f}",
            "Wire KB/run": f"{c.wire / 1e3:,.1f}",
            "Wire / routed": f"{c.wire / c.routed:.2f}" if c.routed else "-",
            "Plaque msgs (progress) / ICI msgs": f"{t['messages_sent']:.1f}"
                                                  f" ({t['progress_sent']:.1f}) /"
                                                  f" {t['ici_messages']:.1f}",
            "Tokens/s (best" + (", virtual)" if simulated else ")"): f"{c.rate:,.0f}",
            "Host CPU ms/run": f"{t['cpu'] * 1e3:.0f}",
            "Sparse / dense": f"{c.rate / twin.rate:.2f}" if twin else "",
        })
    return rows


def _layer_notes(sizes: Sizes, cells: list[Cell], simulated: bool) -> list[str]:
    D, E = sizes.hosts, sizes.experts
    sparse = [c for c in cells if c.path == "sparse" and c.routed]
    worst = max(sparse, key=lambda c: c.wire / c.routed)
    index = [c.slots[1] * 12 for c in sparse]  # slot indices: 8 B out, 4 B back per slot
    rest = [c.wire - c.routed - i for c, i in zip(sparse, index)]
    return [
        f"Layer: T={sizes.tokens} tokens, d={sizes.d}, expert hidden {sizes.hidden}, E={E}"
        f" experts, float32; routing groups of {sizes.tokens // D} tokens (one per device);"
        f" capacity C = ceil(cf * {sizes.tokens // D} * k / {E}). Cluster: 1 island x {D}"
        f" {'simulated ' if simulated else ''}hosts x 1 device; tokens on mesh ('data',) of"
        f" the {D} devices, experts ({E // D} per device) on the same devices as mesh"
        f" ('expert',). Skewed: x[:, 0] = 1, wr[0, {HOT}] = 25 (every first choice to expert"
        f" {HOT}, on device {HOT // (E // D)}).",
        f"Each cell: {sizes.runs} forwards back to back, timed to every output ready, best of"
        f" {sizes.reps} rounds (sparse and dense take turns); wire counters summed over hosts,"
        f" over all {sizes.runs * sizes.reps} timed runs, per run. Wire = Plaque bytes (routed"
        " rows, progress) + ICI bytes (all_to_all); messages to the coordinator not counted."
        " Every dense y equals the sparse y (rtol 1e-5); sparse y equals moe.dense_moe.",
        f"Sparse wire / routed-token bytes: worst {worst.wire / worst.routed:.2f}"
        f" ({worst.routing}, k={worst.k}, cf={worst.cf}); target <= {TARGET}:"
        f" {'met' if worst.wire / worst.routed <= TARGET else 'MISSED'}. Sparse bytes"
        " beyond the routed tokens: slot indices (int32 slot and expert out, slot back: 12 B"
        f" per remote slot) {min(index) / 1e3:,.1f} to {max(index) / 1e3:,.1f} KB/run, the"
        f" rest (progress, framing, pickled headers) {min(rest) / 1e3:,.1f} to"
        f" {max(rest) / 1e3:,.1f} KB/run.",
        (f"Simulated, in virtual time (pw.local_cluster(simulate=True, cpu=\"measured\")):"
         " coordinator, hosts and this client are roles of one discrete-event simulation in"
         " this process, each host a virtual CPU of its own charged the thread CPU time of its"
         " handlers, kernel bodies included (one core per host process, not this"
         f" {os.cpu_count()}-core machine); control, client and Plaque messages take DCN time,"
         " all_to_all values the modelled ICI time in their kernels. Tokens/s per virtual"
         " second; host CPU ms/run = CPU charged to the host roles, summed. numpy's BLAS"
         " runs on one thread while the simulation runs (pathways.sim.cputime.one_thread:"
         " a pool's CPU would escape the role's thread meter)."
         if simulated else
         f"Tokens/s: this {os.cpu_count()}-core machine runs {D} host processes, so the step"
         f" rate is bound by CPU; host CPU ms/run (summed over the {D} hosts, from /proc)"
         " shows what each path costs beyond the expert matmuls."),
    ]


def _scaling_notes(sizes: Sizes, scaling: list[dict]) -> list[str]:
    hosts = sizes.scale_hosts
    return [
        f"Progress traffic vs expert shards (measurement 3): {hosts} hosts x"
        f" {sizes.scale_per_host} devices, tokens on one device per host,"
        f" T={sizes.scale_tokens}, d={sizes.scale_d}, E={hosts * sizes.scale_per_host}, k=2,"
        f" cf=1.25, uniform routing, {sizes.runs * sizes.reps} runs per row; Plaque messages"
        " between hosts per forward, summed over hosts; routed rows: kept slots whose expert is"
        " on another host than their token, times d * 4 B, times 2; rest: progress, row"
        " indices, framing. Progress is batched into one message per peer host per event-loop"
        f" turn, so with {hosts} hosts the message count is bounded by turns, not shards;"
        " growth in pointstamps shows in bytes:",
        "",
        *table(scaling),
    ]


def _parser(simulate: bool):
    ap = bench_parser(__doc__, f"simulated, tiny sizes ({SIM_QUICK.hosts} hosts;"
                      f" {SIM_QUICK.scale_hosts}x{SIM_QUICK.scale_per_host}), few runs"
                      if simulate else "tiny sizes, few runs")
    ap.add_argument("--simulate", action="store_true",
                    help="on simulated clusters, in virtual time (see the module's text)")
    if simulate:
        ap.add_argument("--hosts", type=int, default=None,
                        help=f"one-device hosts of measurements 1 and 2, 2 experts each"
                             f" (default {SIM_DEFAULT.hosts}; {SIM_QUICK.hosts} with --quick)")
        ap.add_argument("--seed", type=int, default=0, help="the simulations' seed")
    return ap


def sizes_of(args, simulate: bool) -> Sizes:
    if not simulate:
        return QUICK if args.quick else DEFAULT
    sizes = SIM_QUICK if args.quick else SIM_DEFAULT
    if args.hosts is not None:
        if args.hosts * 2 <= HOT:
            raise SystemExit(f"--hosts: at least {HOT // 2 + 1} (expert {HOT} is the hot one)")
        sizes = dataclasses.replace(sizes, hosts=args.hosts, experts=2 * args.hosts,
                                    tokens=sizes.tokens // sizes.hosts * args.hosts)
    return sizes


def main(argv=None) -> int:
    simulate = wants_simulation(argv)
    args = _parser(simulate).parse_args(argv)
    sizes, seed = sizes_of(args, simulate), (args.seed if simulate else None)
    started = time.perf_counter()
    print(f"measurements 1 and 2: {sizes.hosts} hosts x 1 device", flush=True)
    cells, layers_wall = measure_layers(sizes, seed)
    if simulate:
        print(f"  simulated in {layers_wall:.1f} s", flush=True)
    print(f"measurement 3: {sizes.scale_hosts} hosts x {sizes.scale_per_host} devices",
          flush=True)
    scaling, scaling_wall = measure_scaling(sizes, seed)
    if simulate:
        print(f"  simulated in {scaling_wall:.1f} s", flush=True)
    elapsed = time.perf_counter() - started

    walls = ([f"Wall time of the simulations: measurements 1 and 2 {layers_wall:.1f} s,"
              f" measurement 3 {scaling_wall:.1f} s (seed {args.seed})."] if simulate else [])
    notes = "\n".join([*_layer_notes(sizes, cells, simulate), "",
                       *_scaling_notes(sizes, scaling), "", *walls,
                       f"Total bench time {elapsed:.0f} s."])
    publish(SIM_TITLE if simulate else TITLE, rows_of(cells, simulate), notes,
            append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
