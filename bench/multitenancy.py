"""Multi-tenancy: several clients sharing one island (paper Figure 8, §5.2).

One island: a coordinator and one host process of 4 emulated TPUs (so the 2-core machine is
not oversubscribed by hosts). Every client is its own OS process (multiprocessing, spawn: no
shared GIL) that connects, takes a mesh of shape (4,) (all clients get the same 4 devices),
builds one computation -- ``shard_map(v + 1, mesh, P("d"), P("d"), cost=0.33 ms)``, called
outside ``@pw.program``, so each call is a 1-equation program (one gang on the 4 devices) --
puts its input, runs one warm-up call (installs the program) and waits on a start barrier.
Then all submit together: K calls back to back on the same input, *independent* (no call
waits for or consumes another's output, as in the paper's setup), then wait for all K results
(and check them). Each client reports its wall time and CPU time.

Sweep (policy "fifo"): 1, 2, 4 and 8 concurrent clients of K programs each. From the devices'
own timelines (``client.timeline()``, the host's perf_counter clock), kernels of the run's
clients started after the barrier: aggregate computations/s = programs / (last kernel end -
first kernel start); utilization per device = busy time within [its first kernel start, its
last kernel end] / that interval, averaged over the 4 devices. Baseline: one client
submitting the same total work (N x K programs), timed the same way; the N-client run and its
baseline take turns for ``reps`` rounds, each keeping its best. CPU seconds of the coordinator
and the host (from /proc) and of the clients (their own process time) per program show where
the time goes.

Shares (policy "share", window 8): 3 clients of weights 1, 2, 4 start together, each
backlogged with K programs; each client's device time while all three were still running
(from the latest first-kernel start to the earliest last-kernel end, as in
tests/e2e/test_multitenancy.py) over the total, against weight / sum of weights.

Targets (the issue): utilization >= 90% with 4 clients; aggregate throughput with N clients
>= one client with the same total work; shares within 10% (relative) of the weights.

``--simulate [--seed S]`` runs the same on a simulated cluster (``pw.local_cluster(simulate=True,
cpu="measured")``), in virtual time: coordinator, host and each client a role of one
discrete-event simulation with its own virtual CPU (one core per process, not this 2-core
machine), each client's calls concurrent work of its role (``cluster.run_as``).

``--fetch``: every client fetches the value of each of its K results, as users commonly do
(``[y.result() for y in ys]``), instead of only waiting for them to be ready (in the sweep and
the shares run alike).

Run: ``python -m bench.multitenancy [--quick] [--no-append] [--fetch] [--simulate [--seed
S]]``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback

import numpy as np

import pathways as pw
from bench.results import bench_parser, plot_sweep, publish
from pathways import P
from pathways.client.trace import device_time_by_client
from pathways.dashboard import Dashboard
from pathways.simulated import SimCluster

TITLE = "Multi-tenancy: clients sharing one island (paper Figure 8)"
SIM_TITLE = "Multi-tenancy, simulated: clients sharing one island in virtual time (paper Figure 8)"
COST = 0.00033  # modelled seconds of one computation (per device)
DEVICES = 4
UTIL_TARGET, UTIL_CLIENTS = 0.90, 4  # utilization >= 90% with 4 clients
SHARE_TOL = 0.10  # measured share within 10% (relative) of weight / sum of weights
WEIGHTS = (1.0, 2.0, 4.0)
WINDOW = 8
TIMEOUT = 300.0


# ---- one client (its own process) ------------------------------------------------------------

def _warm(client):
    """The client's mesh, computation and input; one call installs the program."""
    mesh = client.mesh((DEVICES,), ("d",))
    step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"), cost=COST, name="small")
    x = client.put(np.zeros(DEVICES), mesh, P("d"))
    step(x).result(TIMEOUT)  # installs the 1-equation program
    return mesh, step, x


def _finish(outs, fetch: bool) -> None:
    """Wait for every call's output as the user would: with ``fetch``, fetch its value
    (``[y.result() for y in ys]``); else only until it is ready, fetching nothing."""
    for o in outs:
        if fetch:
            o.result(TIMEOUT)
        else:
            o.block_until_ready(TIMEOUT)


def _submit(client, mesh, step, x, programs, clock, cpu_clock, fetch=False):
    """Submit ``programs`` independent calls, wait for (``fetch``: fetch) all; the client's
    report."""
    t0, cpu0 = clock(), cpu_clock()
    outs = [step(x) for _ in range(programs)]
    submitted = clock()
    _finish(outs, fetch)
    t1, cpu1 = clock(), cpu_clock()
    ok = bool(np.array_equal(outs[-1].result(TIMEOUT), np.ones(DEVICES)))
    return {"id": client.id, "devices": mesh.ids, "t0": t0, "t1": t1,
            "submit": submitted - t0, "cpu": cpu1 - cpu0, "ok": ok}


def _client(index, address, weight, programs, go, results, fetch=False):
    """Connect, warm up, wait for ``go``, submit ``programs`` independent calls, wait for
    (``fetch``: fetch) all."""
    try:
        with pw.connect(address, weight=weight) as client:
            mesh, step, x = _warm(client)
            results.put({"index": index, "ready": client.id})
            go.wait(TIMEOUT)
            report = _submit(client, mesh, step, x, programs, time.perf_counter,
                             time.process_time, fetch)
            results.put({"index": index, "weight": weight, **report})
    except BaseException:
        results.put({"index": index, "error": traceback.format_exc()})


def _collect(results, procs, timeout):
    """One message from each client process (in order of arrival); raises if one failed,
    died or stayed silent."""
    got: dict[int, dict] = {}
    deadline, dead_since = time.monotonic() + timeout, None
    while len(got) < len(procs):
        try:
            msg = results.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(procs) - len(got)} client(s) silent") from None
            dead = [i for i, p in enumerate(procs) if i not in got and p.exitcode is not None]
            dead_since = (dead_since or time.monotonic()) if dead else None
            if dead_since is not None and time.monotonic() - dead_since > 5.0:
                raise RuntimeError(f"client process(es) {dead} exited without a report"
                                   ) from None
            continue
        if "error" in msg:
            raise RuntimeError(f"client {msg['index']} failed:\n" + msg["error"])
        got[msg.pop("index")] = msg
    return list(got.values())


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _checked(reports):
    if not all(r["ok"] for r in reports):
        raise RuntimeError("a client got a wrong result")
    if len({r["devices"] for r in reports}) != 1:
        raise RuntimeError("the clients' meshes are not the same devices")
    return reports


def _this_run(observer, reports, start):
    """{device: kernel records of the run's clients that started from ``start``}."""
    ids = {r["id"] for r in reports}
    timeline = {d: [r for r in recs if r[2].get("client") in ids and r[3] >= start]
                for d, recs in observer.timeline().items()}
    return {d: recs for d, recs in timeline.items() if recs}


def run_clients(cluster, weights, programs, observer, fetch=False):
    """Clients of ``weights`` (one process each) submit ``programs`` each, started together;
    with ``fetch`` each fetches every result's value.

    Returns (client reports, {device: this run's kernel records}, [CPU seconds of the
    coordinator, of the host, wall seconds from the start to the last report])."""
    if isinstance(cluster, SimCluster):
        return run_clients_simulated(cluster, weights, programs, observer, fetch)
    ctx = mp.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client,
                         args=(i, cluster.address, w, programs, go, results, fetch),
                         daemon=True) for i, w in enumerate(weights)]
    pids = [p.pid for p in cluster.processes]
    try:
        for p in procs:
            p.start()
        _collect(results, procs, 120)  # all connected and warmed up
        cpu0 = [_cpu_seconds(pid) for pid in pids]
        start = time.perf_counter()
        go.set()
        reports = _collect(results, procs, TIMEOUT)
        cpu = [_cpu_seconds(pid) - c for pid, c in zip(pids, cpu0)]
        cpu.append(time.perf_counter() - start)  # the wall time those CPU seconds are of
        _checked(reports)
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return reports, _this_run(observer, reports, start), cpu


def run_clients_simulated(cluster, weights, programs, observer, fetch=False):
    """``run_clients`` on a simulated cluster: each client a role of its own, its calls
    concurrent work of that role (``cluster.run_as``), times virtual; CPU per role."""
    clients = [pw.connect(cluster.address, weight=w) for w in weights]
    try:
        rigs = [_warm(c) for c in clients]
        roles = [cluster.roles[c.session.loop.name] for c in clients]
        cluster_roles = [cluster.roles["coordinator"], cluster.roles["host-0"]]
        cpu0 = [r.cpu_used for r in cluster_roles + roles]
        start = cluster.clock()
        tasks = [cluster.run_as(c, _submit, c, *rig, programs, c.clock, lambda: 0.0, fetch)
                 for c, rig in zip(clients, rigs)]
        reports = _checked([t.result(TIMEOUT) for t in tasks])
        used = [r.cpu_used - c for r, c in zip(cluster_roles + roles, cpu0)]
        for report, cpu in zip(reports, used[2:]):
            report["cpu"] = cpu
        for report, w in zip(reports, weights):
            report["weight"] = w
        cpu = [*used[:2], cluster.clock() - start]
        return reports, _this_run(observer, reports, start), cpu
    finally:
        for c in clients:
            c.close()


# ---- measures from the devices' timelines ----------------------------------------------------

def utilization(timeline) -> float:
    """Per device, busy / [first start, last end]; averaged over devices."""
    fractions = []
    for recs in timeline.values():
        lo, hi = min(r[3] for r in recs), max(r[4] for r in recs)
        fractions.append(sum(r[4] - r[3] for r in recs) / (hi - lo))
    return sum(fractions) / len(fractions)


def rate(timeline) -> float:
    """Computations (gangs) per second: kernels of one device over the run's device span."""
    lo = min(r[3] for recs in timeline.values() for r in recs)
    hi = max(r[4] for recs in timeline.values() for r in recs)
    counts = {len(recs) for recs in timeline.values()}
    return max(counts) / (hi - lo)


class Cell:
    """One run: ``clients`` clients of ``programs`` programs each."""

    def __init__(self, clients, programs, reports, timeline, cpu):
        self.clients, self.total = clients, clients * programs
        if any(len(recs) != self.total for recs in timeline.values()):
            raise RuntimeError(f"expected {self.total} kernels per device, got"
                               f" {[len(r) for r in timeline.values()]}")
        self.rate, self.util = rate(timeline), utilization(timeline)
        self.wall = max(r["t1"] for r in reports) - min(r["t0"] for r in reports)
        self.submit = max(r["submit"] / programs for r in reports)  # s per call, slowest
        *cluster_cpu, self.elapsed = cpu
        self.cpu = [*cluster_cpu, sum(r["cpu"] for r in reports)]  # coord, host, clients

    def cpu_ms(self) -> str:
        return ", ".join(f"{c * 1e3 / self.total:.2f}" for c in self.cpu)


def island(simulation: dict | None, **options):
    """The island of the module's text: a real one, or simulated with ``simulation``'s
    options (``seed``...)."""
    extra = {} if simulation is None else {"simulate": True, **simulation}
    return pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=DEVICES,
                            **options, **extra)


def sweep(counts, programs, reps, simulation=None, fetch=False, dashboard=False):
    """{N: (N-client cells, 1-client cells of N x K programs)} over ``reps`` rounds, fifo
    (``fetch``: every client fetches every result; ``dashboard``: a live dashboard watches
    the island throughout, at its default rate)."""
    cells: dict[int, tuple[list, list]] = {n: ([], []) for n in counts}
    with island(simulation, policy="fifo") as cluster, \
            pw.connect(cluster.address) as observer, \
            (Dashboard(cluster.address) if dashboard else contextlib.nullcontext()):
        for rep in range(reps):
            for n in counts:
                kinds = [(0, n, programs), (1, 1, n * programs)][:1 if n == 1 else 2]
                for slot, clients, k in kinds[::-1] if rep % 2 else kinds:  # alternate
                    cell = Cell(clients, k,
                                *run_clients(cluster, [1.0] * clients, k, observer, fetch))
                    print(f"  round {rep + 1}: {clients} client(s) x {k}: {cell.rate:,.0f}"
                          f" comp/s, util {cell.util:.0%}, wall {cell.wall:.2f} s", flush=True)
                    cells[n][slot].append(cell)
    return {n: (a, b or a) for n, (a, b) in cells.items()}


def share_run(programs, simulation=None, fetch=False):
    """Weights 1:2:4 under "share": ({client: weight}, {client: device s}, interval s)."""
    with island(simulation, policy="share", window=WINDOW) as cluster, \
            pw.connect(cluster.address) as observer:
        reports, timeline, _ = run_clients(cluster, WEIGHTS, programs, observer, fetch)
    weight_of = {r["id"]: r["weight"] for r in sorted(reports, key=lambda r: r["weight"])}
    busy, interval = device_time_by_client(timeline, list(weight_of))
    return weight_of, busy, interval


def best(cells):
    return max(cells, key=lambda c: c.rate)


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "1 and 2 clients, few programs, one round")
    ap.sized("--programs", int, 40, 500, "programs per client (K)")
    ap.sized("--reps", int, 1, 3, "rounds per cell (best kept)")
    ap.add_argument("--simulate", action="store_true",
                    help="on the simulator, in virtual time (see the module's text)")
    ap.add_argument("--seed", type=int, default=0, help="the simulation's seed (--simulate)")
    ap.add_argument("--dashboard", action="store_true",
                    help="a live dashboard (pathways dashboard) watches the sweep's island, to"
                         " measure what watching costs")
    ap.add_argument("--fetch", action="store_true",
                    help="every client fetches the value of each result (y.result()), not only"
                         " waits for it to be ready")
    args = ap.parse_args(argv)
    counts = (1, 2) if args.quick else (1, 2, 4, 8)
    programs, reps = args.programs, args.reps
    simulation = {"seed": args.seed, "cpu": "measured"} if args.simulate else None
    started = time.perf_counter()
    if args.dashboard and args.simulate:
        ap.error("--dashboard watches a real cluster; not with --simulate")
    cells = sweep(counts, programs, reps, simulation, args.fetch, args.dashboard)
    share_k = programs if args.quick else 2 * programs
    weight_of, busy, interval = share_run(share_k, simulation, args.fetch)
    elapsed = time.perf_counter() - started

    rows, ratios = [], {}
    for n, (multi, single) in cells.items():
        m, s = best(multi), best(single)
        ratios[n] = m.rate / s.rate
        rows.append({
            "Clients": n, "Programs": f"{n} x {programs}",
            "Comp/s (best)": f"{m.rate:,.0f}",
            "All rounds": ", ".join(f"{c.rate:,.0f}" for c in multi),
            "Utilization": f"{m.util:.1%}",
            "1 client, same work: comp/s": f"{s.rate:,.0f}" if n > 1 else "(itself)",
            "All rounds (1 client)": ", ".join(f"{c.rate:,.0f}" for c in single)
            if n > 1 else "",
            "N / 1 client": f"{ratios[n]:.2f}",
            "Clients' wall (s)": f"{m.wall:.2f}",
            "CPU ms/program: coord, host, clients": m.cpu_ms(),
            "Same, 1 client": s.cpu_ms() if n > 1 else "",
            "Host CPU / wall": f"{m.cpu[1] / m.elapsed:.0%}",
        })

    everything = [c for pair in cells.values() for cs in pair for c in cs]
    host_ms = sum(c.cpu[1] for c in everything) / sum(c.total for c in everything) * 1e3
    coord_ms = sum(c.cpu[0] for c in everything) / sum(c.total for c in everything) * 1e3
    submit_us = max(c.submit for c in everything) * 1e6
    util_n = UTIL_CLIENTS if UTIL_CLIENTS in cells else max(cells)
    util = best(cells[util_n][0]).util
    util_verdict = ("not measured" if util_n != UTIL_CLIENTS
                    else "met" if util >= UTIL_TARGET else "MISSED")
    worst = min((r, n) for n, r in ratios.items() if n > 1)
    total_busy = sum(busy.values())
    if total_busy > 0:
        share_err = {c: busy[c] / total_busy / (w / sum(WEIGHTS)) - 1
                     for c, w in weight_of.items()}
        share_met = all(abs(e) <= SHARE_TOL for e in share_err.values())
        share_text = "; ".join(
            f"weight {w:g}: {busy[c] / total_busy:.1%} of device time (weight share"
            f" {w / sum(WEIGHTS):.1%}, {share_err[c]:+.1%})" for c, w in weight_of.items())
        share_verdict = (f"worst {max(abs(e) for e in share_err.values()):.1%}:"
                         f" {'met' if share_met else 'MISSED'}")
    else:  # (--quick: so few programs that the clients may never run at the same time)
        share_text = "the clients never ran at the same time: no shares to measure"
        share_verdict = "not measured"
    notes = "\n".join([
        f"Each program: one computation, a gang on all {DEVICES} devices of the island, "
        f"modelled {COST * 1e3:g} ms per device (shard_map v + 1 of a float64[{DEVICES}],"
        " called outside @pw.program); each client submits its K calls back to back on the"
        " same input (independent, not chained), then "
        + ("fetches every result's value (--fetch: y.result() on each of its K outputs, as"
           " [y.result() for y in ys], in the sweep and the shares run; every result fetched)"
           if args.fetch else "waits for all")
        + "; results checked."
        + (" A live dashboard (pathways dashboard, 4 Hz) watched the sweep's island"
           " (--dashboard)." if args.dashboard else "")
        + " Policy"
        f" \"fifo\". One island: coordinator + 1 host of {DEVICES} devices; "
        + (f"simulated, in virtual time (pw.local_cluster(simulate=True, seed={args.seed},"
           " cpu=\"measured\")): coordinator, host and every client each a role of one"
           " discrete-event simulation with a virtual CPU of its own charged its handlers'"
           " thread CPU; each client's calls are concurrent work of its role"
           " (cluster.run_as). Seconds below are virtual." if args.simulate else
           f"every client its own process (spawn); all on one {os.cpu_count()}-core"
           " machine."),
        "Comp/s and utilization from the devices' timelines (kernels of the run's clients"
        " after the start barrier): comp/s = programs / (last kernel end - first kernel"
        " start); utilization = per device, busy / [its first start, its last end], averaged."
        f" Best of {reps} rounds (N clients and the 1-client baseline alternate). CPU"
        " ms/program: coordinator and host "
        + ("their roles' charged CPU, clients their roles' (summed)," if args.simulate else
           "from /proc, clients their own process time (summed),")
        + " over the run (\"Same, 1 client\": in the best 1-client baseline); Host CPU / wall:"
        " the host's CPU seconds over the run's wall.",
        f"Where the time goes: the host process spends {host_ms:.2f} ms of CPU per program"
        f" (4 kernels: dequeue, execute, record, publish, plus the run's messages), the"
        f" coordinator {coord_ms:.2f} ms (it alone could sequence ~{_per_s(coord_ms)}"
        " programs/s). One host process holds one GIL, so it sequences at"
        f" most ~{_per_s(host_ms)} programs/s, i.e. device utilization <="
        f" {COST * 1e3 / max(host_ms, 1e-9):.0%} with {COST * 1e3:g} ms computations, whatever"
        " the number of clients: the island is host-CPU-bound, not device-bound. Submitting is"
        f" not the limit: a client issues a call in <= {submit_us:.0f} us (slowest client, any"
        " run).",
        f"Shares (policy \"share\", window {WINDOW}, {len(WEIGHTS)} clients x {share_k}"
        f" programs, started together; device time while all were running, {interval:.2f} s):"
        f" {share_text}.",
        f"Targets: utilization >= {UTIL_TARGET:.0%} with {UTIL_CLIENTS} clients of"
        f" {COST * 1e3:g} ms computations: {util:.1%} with {util_n} clients:"
        f" {util_verdict}; aggregate throughput with N clients >= one client"
        f" with the same total work: worst {worst[0]:.2f}x (N={worst[1]}):"
        f" {'met' if round(worst[0], 2) >= 1.0 else 'MISSED'}; shares within {SHARE_TOL:.0%} of the"
        f" weights: {share_verdict}.",
        f"Total bench time {elapsed:.0f} s"
        + (" (real seconds the simulations took)." if args.simulate else "."),
    ])
    publish(SIM_TITLE if args.simulate else TITLE, rows, notes,
            append=not (args.quick or args.no_append))
    if args.plot:
        plot_sweep(args.plot, TITLE, "concurrent clients", "device utilization",
                   {"N clients": [(n, best(multi).util) for n, (multi, _) in cells.items()],
                    "1 client, same work": [(n, best(single).util)
                                            for n, (_, single) in cells.items()]},
                   target=UTIL_TARGET)
    return 0


def _per_s(ms: float) -> str:
    """Programs per second at ``ms`` of CPU each; a run too short for the CPU clock's ticks
    (10 ms) may have measured none."""
    return f"{1e3 / ms:,.0f}" if ms > 0 else "(unmeasured: too little CPU for its clock)"


if __name__ == "__main__":
    sys.exit(main())
