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

Run: ``python -m bench.moe [--quick] [--no-append]``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import numpy as np

import pathways as pw
from bench.results import _table, bench_parser, publish
from pathways import P, moe
from pathways.program.mesh import Mesh

TITLE = "Mixture of Experts: sparse routing vs dense all-to-all dispatch (wire, tokens/s)"
E = 8  # experts
HOT = 5  # the expert every first choice goes to under the skewed routing
D = 4  # devices (= hosts) of measurements 1 and 2
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


DEFAULT = Sizes(tokens=2048, d=256, hidden=512, runs=10, reps=5, scale_tokens=512, scale_d=64)
QUICK = Sizes(tokens=256, d=64, hidden=64, runs=3, reps=1, scale_tokens=64, scale_d=16)


def problem(T, d, hidden, skew, seed=0):
    """(x[T, d], wr[d, E], w1[E, d, f], w2[E, f, d]) in float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, d)).astype(np.float32)
    wr, w1, w2 = moe.init_params(rng, d, hidden, E)
    if skew:
        x[:, 0] = 1.0
        wr[0, HOT] = 25.0
    return x, wr, w1, w2


def routed_slots(x, wr, k, cf, token_hosts, expert_hosts):
    """(kept slots, kept slots whose expert is on another host than their token), routing
    one group per token device as the router does; ``*_hosts``: host of each mesh device."""
    groups, per_device = len(token_hosts), E // len(expert_hosts)
    n = len(x) // groups
    kept = remote = 0
    for g in range(groups):
        route = moe.route_group(x[g * n:(g + 1) * n], wr, k, cf)[0]
        live = route[route >= 0]
        kept += live.size
        remote += int((np.asarray(expert_hosts)[live // per_device] != token_hosts[g]).sum())
    return kept, remote


def dense_layer(mesh, k, cf):
    """The GShard layer: capacity-padded [E, C, d] buffers, two all_to_alls over ICI."""
    ax, n_dev = mesh.axis_names[0], mesh.size

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


def sparse_layer(tm, em, k, cf):
    layer = moe.MoELayer(tm, em, E, top_k=k, capacity_factor=cf)

    @pw.program
    def forward(x, wr, w1, w2):
        return layer.forward(x, wr, w1, w2)[0]

    return forward


def counters(client, pids) -> dict:
    """Cumulative traffic to other hosts (Plaque, ICI) and CPU seconds, summed over hosts."""
    out = {"cpu": sum(_cpu_seconds(p) for p in pids)}
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


def timed(client, pids, fn, args, runs, want):
    """(seconds to every output ready, counters delta) of ``runs`` back-to-back forwards."""
    before = counters(client, pids)
    t0 = time.perf_counter()
    outs = [fn(*args) for _ in range(runs)]
    for o in outs:
        o.block_until_ready(TIMEOUT)
    seconds = time.perf_counter() - t0
    for o in outs:
        np.testing.assert_array_equal(o.result(TIMEOUT), want)
    time.sleep(0.05)  # let the last progress messages leave before the counters are read
    after = counters(client, pids)
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


def measure_layers(sizes: Sizes) -> list[Cell]:
    """Measurements 1 and 2 on 4 hosts x 1 device."""
    T, d, f = sizes.tokens, sizes.d, sizes.hidden
    cells = []
    with pw.local_cluster(islands=1, hosts_per_island=D, devices_per_host=1) as cluster, \
            pw.connect(cluster.address) as client:
        pids = [p.pid for p in cluster.processes[1:]]  # the hosts (0 is the coordinator)
        tm = client.mesh((D,), ("data",))
        em = Mesh((D,), ("expert",), tm.ids, tm.slice_id, tm.island, tm.version,
                  client=client)
        for skew in (False, True):
            routing = "skewed" if skew else "uniform"
            x, wr, w1, w2 = problem(T, d, f, skew)
            xs, wrs = client.put(x, tm, P("data")), client.put(wr, tm, P())
            sparse_args = (xs, wrs, client.put(w1, em, P("expert")),
                           client.put(w2, em, P("expert")))
            dense_args = (xs, wrs, client.put(w1, tm, P("data")), client.put(w2, tm, P("data")))
            for k, cf, with_dense in CONFIGS:
                kept, remote = routed_slots(x, wr, k, cf, range(D), range(D))
                routed = remote * d * x.itemsize * 2
                paths = [("sparse", sparse_layer(tm, em, k, cf), sparse_args)]
                if with_dense:
                    paths.append(("dense", dense_layer(tm, k, cf), dense_args))
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
                        s, traffic = timed(client, pids, fn, args, sizes.runs, w)
                        seconds[name].append(s)
                        for key, v in traffic.items():
                            totals[name][key] = totals[name].get(key, 0) + v
                n_runs = sizes.runs * sizes.reps
                for name, *_ in paths:
                    cell = Cell(routing, k, cf, name, (kept, remote), routed, T * sizes.runs,
                                seconds[name], {key: v / n_runs for key, v in totals[name].items()})
                    cells.append(cell)
                    print(f"  {routing} k={k} cf={cf} {name}: {cell.rate:,.0f} tokens/s,"
                          f" {cell.wire / 1e3:,.1f} KB/run", flush=True)
    return cells


def measure_scaling(sizes: Sizes) -> list[dict]:
    """Measurement 3 on 2 hosts x 4 devices: Plaque traffic per forward vs expert shards."""
    rows, base = [], None
    x, wr, w1, w2 = problem(sizes.scale_tokens, sizes.scale_d, sizes.scale_d, skew=False)
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=4) as cluster, \
            pw.connect(cluster.address) as client:
        pids = [p.pid for p in cluster.processes[1:]]
        full = client.mesh((8,), ("all",))  # the slice; token and expert meshes share it

        def mesh(devices, axis):
            return Mesh((len(devices),), (axis,), tuple(devices), full.slice_id, full.island,
                        full.version, client=client)

        host_of = {dev.id: dev.host for dev in client.devices()}
        by_host: dict = {}
        for dev in full.ids:
            by_host.setdefault(host_of[dev], []).append(dev)
        hosts = sorted(by_host)
        spread = [by_host[h][i] for i in range(4) for h in hosts]  # alternate the hosts
        tm = mesh([by_host[h][0] for h in hosts], "data")
        xs, wrs = client.put(x, tm, P("data")), client.put(wr, tm, P())
        for shards in (1, 2, 4, 8):
            em = mesh(spread[:shards], "expert")
            fn = sparse_layer(tm, em, 2, 1.25)
            args = (xs, wrs, client.put(w1, em, P("expert")), client.put(w2, em, P("expert")))
            want = fn(*args).result(TIMEOUT)
            _, traffic = timed(client, pids, fn, args, sizes.runs * sizes.reps, want)
            per_run = {key: v / (sizes.runs * sizes.reps) for key, v in traffic.items()}
            base = base or per_run["progress_sent"]
            _, remote = routed_slots(x, wr, 2, 1.25, [host_of[i] for i in tm.ids],
                                     [host_of[i] for i in em.ids])
            rows_kb = remote * x.shape[1] * x.itemsize * 2 / 1e3
            rows.append({
                "Expert shards": shards,
                "Expert devices": ",".join(map(str, em.ids)),
                "Progress msgs/run": f"{per_run['progress_sent']:.1f}",
                "vs 1 shard": f"{per_run['progress_sent'] / base:.2f}x",
                "shards²": shards * shards,
                "All Plaque msgs/run": f"{per_run['messages_sent']:.1f}",
                "Plaque KB/run": f"{per_run['bytes_sent'] / 1e3:.1f}",
                "Of which routed rows": f"{rows_kb:.1f}",
                "Rest KB/run": f"{per_run['bytes_sent'] / 1e3 - rows_kb:.1f}",
            })
            print(f"  {shards} expert shard(s): {rows[-1]['Progress msgs/run']} progress"
                  f" msgs/run", flush=True)
    return rows


def rows_of(cells: list[Cell]) -> list[dict]:
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
            "Tokens/s (best)": f"{c.rate:,.0f}",
            "Host CPU ms/run": f"{t['cpu'] * 1e3:.0f}",
            "Sparse / dense": f"{c.rate / twin.rate:.2f}" if twin else "",
        })
    return rows


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "tiny sizes, few runs")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULT
    started = time.perf_counter()
    print("measurements 1 and 2: 4 hosts x 1 device", flush=True)
    cells = measure_layers(sizes)
    print("measurement 3: 2 hosts x 4 devices", flush=True)
    scaling = measure_scaling(sizes)
    elapsed = time.perf_counter() - started

    sparse = [c for c in cells if c.path == "sparse" and c.routed]
    worst = max(sparse, key=lambda c: c.wire / c.routed)
    index = [c.slots[1] * 12 for c in sparse]  # slot indices: 8 B out, 4 B back per slot
    rest = [c.wire - c.routed - i for c, i in zip(sparse, index)]
    notes = "\n".join([
        f"Layer: T={sizes.tokens} tokens, d={sizes.d}, expert hidden {sizes.hidden}, E={E}"
        f" experts, float32; routing groups of {sizes.tokens // D} tokens (one per device);"
        f" capacity C = ceil(cf * {sizes.tokens // D} * k / {E}). Cluster: 1 island x {D}"
        f" hosts x 1 device; tokens on mesh ('data',) of the {D} devices, experts ({E // D}"
        " per device) on the same devices as mesh ('expert',). Skewed: x[:, 0] = 1,"
        f" wr[0, {HOT}] = 25 (every first choice to expert {HOT}, on device {HOT // (E // D)}).",
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
        "Tokens/s: this 2-core machine runs 4 host processes, so the step rate is bound by"
        " CPU; host CPU ms/run (summed over the 4 hosts, from /proc) shows what each path"
        " costs beyond the expert matmuls.",
        "",
        f"Progress traffic vs expert shards (measurement 3): 2 hosts x 4 devices, tokens on"
        f" one device per host, T={sizes.scale_tokens}, d={sizes.scale_d}, k=2, cf=1.25,"
        f" uniform routing, {sizes.runs * sizes.reps} runs per row; Plaque messages between"
        " hosts per forward, summed over hosts; routed rows: kept slots whose expert is on the"
        " other host, times d * 4 B, times 2; rest: progress, row indices, framing. Progress"
        " is batched into one message per peer host per event-loop turn, so with 2 hosts the"
        " message count is bounded by turns, not shards; growth in pointstamps shows in bytes:",
        "",
        *_table(scaling),
        "",
        f"Total bench time {elapsed:.0f} s.",
    ])
    publish(TITLE, rows_of(cells), notes, append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
