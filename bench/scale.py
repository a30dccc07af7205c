"""Scale: one controller driving one island of 64 to 2,048 emulated devices.

One client (this process) connects to a local cluster of one island of H host processes x D
emulated devices each, for H x D from 4x16 (64 devices) up to 64x32 (2,048), and measures two
workloads on every size:

- **Fig. 5**: the paper's trivial computation (``bench.multicontroller.trivial_body(1)``: psum
  of a replicated float64 scalar over every device, then + 1), as one ``@pw.program`` of
  ``chain`` chained calls (each output is the next input), run back to back;
- **pipeline**: 4 stages on 4 disjoint sub-meshes of H/4 whole hosts each (the island's
  devices in (host, index) order, cut in quarters), stage k adding k + 1 to a float64 vector
  sharded one element per device (``P("d")``), each stage's output crossing to the next
  sub-mesh; one computation = one stage.

Each workload is warmed up with one run (installing the program; its result checked exactly)
and, if that took less than ``budget``, a second one to size the cells by; then it is timed
over enough back-to-back runs for about ``budget`` seconds (at least one), for ``reps``
cells, best kept. Results are checked exactly: the Fig. 5 value against ``expected_value``
(the same float additions as psum), the pipeline against start + runs x 10.

What it reports per size: computations/s; the controller's CPU per computation, i.e. CPU time
of this client process (``time.process_time``) plus the coordinator process
(``cluster.processes[0]``; its threads' run times from ``/proc/<pid>/task/*/schedstat``, to
the nanosecond); the same net of the controller's idle CPU (heartbeats, ticks and pings, a
cost per host and per second, measured for ``idle`` seconds before the workloads) over the
cell's wall time; the hosts' summed CPU per computation (where the devices' work is
emulated); and, against the smallest size, how the net controller CPU per computation grew
compared with the device count (the controller should scale with the programs and hosts it
drives, not with devices). A size that cannot start, loses a host or times out is reported
as such in the table and the next size still runs (sizes beyond one that did not start are
skipped). Every process shares this machine's cores, so the emulated devices' throughput
falls steeply with their number: at the largest sizes a Fig. 5 computation takes seconds,
the controller's idle cost dominates its CPU per computation, and the net figure is within
the idle baseline's error (shown as n/a when it is not positive); the pipeline, whose
computations stay fast, gives the cleaner reading.

``--simulate`` runs the same workloads on simulated clusters instead
(``pw.local_cluster(simulate=True, cpu="measured")``): the coordinator, every host and the
client are roles of one discrete-event simulation in this process, each a virtual CPU of its
own charged the thread CPU time of its handlers, so the figures are those of the modelled
cluster (one core per process), not of this machine, and sizes up to 64x64 (4,096 devices)
fit. Everything is then read from the simulation: cells are timed and sized in virtual
seconds (``cluster.clock()``); the controller's CPU is what is charged to the "coordinator"
role plus the client's (its role and the user's thread, ``cluster.user``), the hosts' the sum
of the host roles', the idle cost the same over ``idle`` virtual seconds with nothing running.
Each size also reports the wall time its simulation took.

Run: ``python -m bench.scale [--quick] [--no-append] [--sizes 4x16,8x16] [--simulate]``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

import pathways as pw
from bench import profiling
from bench.multicontroller import expected_value, trivial_body
from bench.pipeline import chain_total, stage_body
from bench.results import SIM_CPU, bench_parser, parse_sizes, publish, wants_simulation
from pathways import P

TITLE = "Scale: one controller, one island of 64 to 2,048 emulated devices"
SIZES = "4x16,8x16,16x16,16x32,32x32,64x32"  # hosts x devices per host
QUICK_SIZES = "4x16,8x16"
STAGES = 4
MAX_RUNS = 200
SIM_TITLE = ("Scale, simulated: one controller, one island of 64 to 4,096 devices in virtual"
             " time")
SIM_SIZES = "4x16,8x16,16x32,32x32,64x32,64x64"
SIM_QUICK_SIZES = "4x2,4x4"


def idle_cpu(pids: list[int], seconds: float) -> float:
    """CPU seconds per second that the client and the coordinator (``pids[0]``) spend while
    nothing runs: heartbeats, ticks and pings, a cost per host and per second, not per
    computation."""
    own0, coord0, t0 = time.process_time(), profiling.cpu_seconds(pids[0]), time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - t0
    return (time.process_time() - own0 + profiling.cpu_seconds(pids[0]) - coord0) / wall


@dataclass
class Cell:
    """``computations`` in ``wall`` seconds, and the CPU seconds spent meanwhile."""

    computations: int
    wall: float
    client_cpu: float
    coordinator_cpu: float
    hosts_cpu: float
    idle: float = 0.0  # the controller's CPU seconds per second when nothing runs

    @property
    def rate(self) -> float:
        return self.computations / self.wall

    @property
    def controller_ms(self) -> float:
        """Client + coordinator CPU milliseconds per computation."""
        return 1e3 * (self.client_cpu + self.coordinator_cpu) / self.computations

    @property
    def net_ms(self) -> float:
        """``controller_ms`` less what the controller spends per second when idle."""
        return self.controller_ms - 1e3 * self.idle * self.wall / self.computations

    @property
    def hosts_ms(self) -> float:
        return 1e3 * self.hosts_cpu / self.computations


# ---- the two workloads ----------------------------------------------------------------------

class Fig5:
    """``chain`` chained psum+1 calls over every device of ``mesh`` per run."""

    name = "Fig. 5"

    def __init__(self, client, mesh, chain: int):
        self.client, self.mesh, self.per_run = client, mesh, chain
        step = pw.shard_map(trivial_body(1), mesh, P(), P())

        def fig5_chain(x):
            for _ in range(chain):
                x = step(x)
            return x

        self.program = pw.program(fig5_chain)

    def start(self):
        return self.client.put(np.zeros(()), self.mesh, P())

    def check(self, x, runs: int, timeout: float) -> None:
        got = float(x.result(timeout))
        want = expected_value(self.mesh.size, self.per_run * runs)
        if got != want:
            raise AssertionError(f"Fig. 5 on {self.mesh.size} devices after {runs} runs:"
                                 f" got {got}, expected {want}")


class Pipeline:
    """Four stages on the four quarters of ``mesh`` (whole hosts each when H % 4 == 0)."""

    name = "pipeline"
    per_run = STAGES

    def __init__(self, client, mesh):
        q = mesh.size // STAGES
        self.client = client
        self.meshes = [pw.Mesh((q,), ("d",), mesh.ids[k * q:(k + 1) * q], client=client)
                       for k in range(STAGES)]
        stages = [pw.shard_map(stage_body(k), m, P("d"), P("d"))
                  for k, m in enumerate(self.meshes)]

        def pipeline(x):
            for f in stages:
                x = f(x)
            return x

        self.program = pw.program(pipeline)
        self._x0 = np.arange(float(q))

    def start(self):
        return self.client.put(self._x0, self.meshes[0], P("d"))

    def check(self, x, runs: int, timeout: float) -> None:
        got, want = x.result(timeout), self._x0 + runs * chain_total(STAGES)
        if not np.array_equal(got, want):
            raise AssertionError(f"pipeline after {runs} runs: got {got[:4]}..., expected"
                                 f" {want[:4]}...")


def timed(work, runs: int, pids: list[int], timeout: float) -> Cell:
    """``runs`` back-to-back runs of ``work`` (each output the next input), timed from the
    first call to the last result being ready, with the CPU of every process meanwhile."""
    x = work.start()
    x.block_until_ready(timeout)
    cpu0, own0 = [profiling.cpu_seconds(p) for p in pids], time.process_time()
    t0 = time.perf_counter()
    for _ in range(runs):
        x = work.program(x)
    x.block_until_ready(timeout)
    wall = time.perf_counter() - t0
    own = time.process_time() - own0
    cpu = [profiling.cpu_seconds(p) - c for p, c in zip(pids, cpu0)]
    work.check(x, runs, timeout)
    return Cell(runs * work.per_run, wall, own, cpu[0], sum(cpu[1:]))


def measure(work, pids, budget: float, reps: int, timeout: float, idle: float) -> Cell:
    """A checked warm-up run (installs the program) and, if it took less than ``budget``, a
    second one to size the cells by; then ``reps`` cells of about ``budget`` seconds each,
    fastest kept."""
    warm = timed(work, 1, pids, timeout)
    if warm.wall < budget:
        warm = timed(work, 1, pids, timeout)
    runs = max(1, min(MAX_RUNS, round(budget / warm.wall)))
    best = None
    for _ in range(reps):
        cell = timed(work, runs, pids, timeout)
        if best is None or cell.rate > best.rate:
            best = cell
    best.idle = idle
    return best


# ---- the same, simulated: every figure from the simulation's roles --------------------------

def sim_cpu(cluster) -> tuple[float, float, float]:
    """CPU seconds charged so far to the client, the coordinator and the hosts of the
    simulated ``cluster``."""
    return profiling.client_coordinator_hosts(profiling.charged_cpu(cluster))


def idle_cpu_simulated(cluster, seconds: float) -> float:
    """``idle_cpu`` of a simulated cluster: the controller's CPU seconds per virtual second
    over ``seconds`` virtual seconds with nothing running."""
    client0, coord0, _ = sim_cpu(cluster)
    t0 = cluster.clock()
    cluster.run_for(seconds)
    client1, coord1, _ = sim_cpu(cluster)
    return (client1 - client0 + coord1 - coord0) / (cluster.clock() - t0)


def timed_simulated(work, runs: int, cluster, timeout: float) -> Cell:
    """``timed`` on a simulated cluster: virtual seconds from the first call to the last
    result being ready, and the CPU charged to its roles meanwhile."""
    x = work.start()
    x.block_until_ready(timeout)
    before, t0 = sim_cpu(cluster), cluster.clock()
    for _ in range(runs):
        x = work.program(x)
    x.block_until_ready(timeout)
    wall = cluster.clock() - t0
    client, coordinator, hosts = (b - a for a, b in zip(before, sim_cpu(cluster)))
    work.check(x, runs, timeout)
    return Cell(runs * work.per_run, wall, client, coordinator, hosts)


def measure_simulated(work, cluster, budget: float, reps: int, timeout: float,
                      idle: float) -> Cell:
    """``measure`` in virtual time: a checked warm-up of two runs (installs the program for
    both of its inputs: a put's and a run's output, which a pipeline takes from its last
    stage's sub-mesh); then a cell of one run, and cells sized from the last one until one
    lasts at least half of ``budget`` virtual seconds or has ``MAX_RUNS`` runs (so a slow
    cell does not leave the next one short); it and ``reps`` - 1 more like it, fastest
    kept."""
    timed_simulated(work, 2, cluster, timeout)
    runs = 1
    cells = [timed_simulated(work, runs, cluster, timeout)]
    while cells[-1].wall < budget / 2 and runs < MAX_RUNS:
        runs = min(MAX_RUNS, round(budget * runs / cells[-1].wall))
        cells = [timed_simulated(work, runs, cluster, timeout)]
    while len(cells) < reps:
        cells.append(timed_simulated(work, runs, cluster, timeout))
    best = max(cells, key=lambda c: c.rate)
    best.idle = idle
    return best


# ---- one size ---------------------------------------------------------------------------------

@dataclass
class Size:
    hosts: int
    per_host: int
    status: str = "ok"
    started: float | None = None  # seconds to start the cluster (simulated: virtual)
    wall: float | None = None  # simulated: real seconds the whole size's simulation took
    idle: float | None = None  # the controller's CPU seconds per second while idle
    cells: dict | None = None  # workload name -> Cell

    @property
    def devices(self) -> int:
        return self.hosts * self.per_host

    @property
    def label(self) -> str:
        return f"{self.hosts}x{self.per_host}"


def _problem(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:160]}"


def run_size(size: Size, chain: int, budget: float, reps: int, idle: float,
             start_timeout: float, timeout: float) -> Size:
    """Start the cluster for ``size``, measure the controller idle for ``idle`` seconds and
    then both workloads, tear it down; failures are recorded in ``size.status``, not raised."""
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(pw.local_cluster(
                islands=1, hosts_per_island=size.hosts, devices_per_host=size.per_host,
                timeout=start_timeout))
        except Exception as exc:
            size.status = f"did not start within {start_timeout:g} s ({_problem(exc)})"
            return size
        size.started = time.perf_counter() - t0
        pids = [p.pid for p in cluster.processes]  # the coordinator first, then the hosts
        try:
            client = stack.enter_context(pw.connect(cluster.address, timeout=timeout))
            mesh = client.mesh((size.devices,), ("d",))
            size.idle = idle_cpu(pids, idle)
            measure_workloads(size, client, mesh, chain, lambda work: measure(
                work, pids, budget, reps, timeout, size.idle))
        except TimeoutError as exc:
            size.status = f"timed out after {timeout:g} s ({_problem(exc)})"
        except pw.HostLost as exc:
            size.status = f"host lost ({_problem(exc)})"
        except Exception as exc:
            size.status = f"failed ({_problem(exc)})"
    return size


def measure_workloads(size: Size, client, mesh, chain: int, measure_one) -> None:
    """Both workloads on ``mesh``, into ``size.cells``; ``measure_one(work)`` measures one
    (``measure``, ``measure_simulated``)."""
    size.cells = {}
    for work in (Fig5(client, mesh, chain), Pipeline(client, mesh)):
        c = size.cells[work.name] = measure_one(work)
        print(f"  {size.label} {work.name}: {c.rate:,.1f} comps/s, controller"
              f" {c.controller_ms:.3f} CPU ms/comp ({c.net_ms:.3f} net of idle"
              f" {1e3 * c.idle:.1f} ms/s; client {c.client_cpu:.3f} s, coordinator"
              f" {c.coordinator_cpu:.3f} s), hosts {c.hosts_ms:.1f} CPU ms/comp"
              f" ({c.computations} in {c.wall:.2f} s)", flush=True)


def run_size_simulated(size: Size, chain: int, budget: float, reps: int, idle: float,
                       start_timeout: float, timeout: float, seed: int) -> Size:
    """``run_size`` on a simulated cluster (times in virtual seconds); ``size.wall``: the
    real seconds it all took."""
    t0 = time.perf_counter()
    try:
        with pw.local_cluster(islands=1, hosts_per_island=size.hosts,
                              devices_per_host=size.per_host, timeout=start_timeout,
                              simulate=True, seed=seed, cpu="measured") as cluster:
            size.started = cluster.clock()
            with pw.connect(cluster.address, timeout=timeout) as client:
                mesh = client.mesh((size.devices,), ("d",))
                size.idle = idle_cpu_simulated(cluster, idle)
                measure_workloads(size, client, mesh, chain, lambda work: measure_simulated(
                    work, cluster, budget, reps, timeout, size.idle))
    except TimeoutError as exc:
        size.status = f"timed out after {timeout:g} virtual s ({_problem(exc)})"
    except pw.HostLost as exc:
        size.status = f"host lost ({_problem(exc)})"
    except Exception as exc:
        size.status = (f"failed ({_problem(exc)})" if size.started is not None else
                       f"did not start within {start_timeout:g} virtual s ({_problem(exc)})")
    size.wall = time.perf_counter() - t0
    return size


# ---- reporting --------------------------------------------------------------------------------

def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.2f}" if x < 10 else f"{x:,.1f}"


def growth(sizes: list[Size], work: str, net: bool) -> dict[str, float | None]:
    """Per size label: log(controller CPU/comp ratio) / log(device ratio) against the
    smallest measured size (1: grows like devices, 0: flat; None where a figure is <= 0)."""
    done = [s for s in sizes if s.cells and work in s.cells]
    out: dict[str, float | None] = {}
    for s in done[1:]:
        a, b = (c.net_ms if net else c.controller_ms
                for c in (done[0].cells[work], s.cells[work]))
        out[s.label] = (math.log(b / a) / math.log(s.devices / done[0].devices)
                        if a > 0 and b > 0 else None)
    return out


def _exponent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def rows_of(sizes: list[Size], simulated: bool = False) -> list[dict]:
    works = (Fig5.name, Pipeline.name)
    exps = {w: growth(sizes, w, net=True) for w in works}
    rows = []
    for s in sizes:
        row = {"Hosts x devices": s.label, "Devices": s.devices}
        if simulated:
            row["Start (virtual ms)"] = "-" if s.started is None else f"{1e3 * s.started:.1f}"
            row["Simulation wall (s)"] = "-" if s.wall is None else f"{s.wall:.1f}"
        else:
            row["Start (s)"] = "-" if s.started is None else f"{s.started:.1f}"
        row["Controller idle CPU ms/s"] = "-" if s.idle is None else f"{1e3 * s.idle:.1f}"
        for w in works:
            c = (s.cells or {}).get(w)
            row[f"{w} comps/s" + (" (virtual)" if simulated else "")] = (
                _rate(c.rate) if c else "-")
            row[f"{w} controller CPU ms/comp (net of idle)"] = (
                f"{c.controller_ms:.2f} ({c.net_ms:.2f})" if c else "-")
            row[f"{w} hosts CPU ms/comp"] = f"{c.hosts_ms:.1f}" if c else "-"
            if w == Fig5.name:  # a computation is one kernel on every device
                row["Fig. 5 hosts CPU us/device-kernel"] = (
                    f"{1e3 * c.hosts_ms / s.devices:.0f}" if c else "-")
        row["Net controller CPU growth exponent Fig5, pipe"] = ", ".join(
            _exponent(exps[w][s.label]) if s.label in exps[w] else "-" for w in works)
        row["Status"] = s.status
        rows.append(row)
    return rows


def verdict(sizes: list[Size]) -> str:
    """Does the controller's CPU per computation grow no faster than the device count?"""
    parts = []
    for w in (Fig5.name, Pipeline.name):
        net, raw = growth(sizes, w, net=True), growth(sizes, w, net=False)
        if not net:
            parts.append(f"{w}: not judged (fewer than two sizes measured)")
            continue
        known = [x for x in net.values() if x is not None]
        worst = max(known) if known else None
        ok = worst is not None and worst <= 1.0
        raw_worst = max((x for x in raw.values() if x is not None), default=None)
        unknown = [label for label, x in net.items() if x is None]
        parts.append(f"{w}: worst net exponent {_exponent(worst)} ->"
                     f" {'yes' if ok else 'NO' if known else 'not judged'}"
                     + (f" (n/a at {', '.join(unknown)}: net CPU within the idle baseline's"
                        " error)" if unknown else "")
                     + f"; with the idle cost included: {_exponent(raw_worst)}")
    return "; ".join(parts)


def _parser(simulate: bool):
    if not simulate:
        ap = bench_parser(__doc__, "the two smallest sizes only (4x16, 8x16), short cells")
        ap.add_argument("--sizes", default=None,
                        help=f"hosts x devices per host, comma-separated (default {SIZES};"
                             f" {QUICK_SIZES} with --quick)")
        ap.sized("--chain", int, 8, 8, "chained psum+1 calls per Fig. 5 run")
        ap.sized("--budget", float, 0.3, 3.0, "seconds per timed cell (at least one run)")
        ap.sized("--reps", int, 1, 2, "timed cells per workload and size (best kept)")
        ap.sized("--idle", float, 0.5, 2.0, "seconds the controller's idle CPU is measured")
        ap.sized("--start-timeout", float, 60.0, 240.0, "seconds for a cluster to start")
        ap.sized("--timeout", float, 60.0, 300.0, "seconds for any one wait on a result")
    else:  # the same options, in virtual seconds, with sizes and cells of a simulation's
        ap = bench_parser(__doc__, f"simulated, tiny sizes only ({SIM_QUICK_SIZES}), short"
                                   " cells")
        ap.add_argument("--sizes", default=None,
                        help=f"hosts x devices per host, comma-separated (default"
                             f" {SIM_SIZES}; {SIM_QUICK_SIZES} with --quick)")
        ap.add_argument("--seed", type=int, default=0, help="the simulations' seed")
        ap.sized("--chain", int, 8, 8, "chained psum+1 calls per Fig. 5 run")
        ap.sized("--budget", float, 0.02, 0.5,
                 "virtual seconds per timed cell (at least one run)")
        ap.sized("--reps", int, 1, 1, "timed cells per workload and size (best kept)")
        ap.sized("--idle", float, 0.5, 2.0,
                 "virtual seconds the controller's idle CPU is measured")
        ap.sized("--start-timeout", float, 60.0, 240.0,
                 "virtual seconds for a cluster to start")
        ap.sized("--timeout", float, 60.0, 300.0,
                 "virtual seconds for any one wait on a result")
    ap.add_argument("--simulate", action="store_true",
                    help="on simulated clusters, in virtual time (see the module's text)")
    return ap


def _notes(args, simulate: bool, sizes: list[Size], elapsed: float) -> str:
    if simulate:
        setup = ("One client drives one simulated island of H hosts x D emulated devices"
                 f" (pw.local_cluster(simulate=True, seed={args.seed}, cpu=\"measured\")): the"
                 " coordinator, every host and the client are roles of one discrete-event"
                 " simulation in this process, each a virtual CPU of its own charged the thread"
                 " CPU time of its handlers (one core per process, not this"
                 f" {os.cpu_count()}-core machine); control and client messages take DCN time.")
        cpu = (f" virtual s (>= 1 run); rates per virtual second; final values checked exactly."
               f" Controller CPU = CPU charged to the coordinator role + the client's (its role"
               f" and the user's thread) over computations; net of idle = less the same per"
               f" virtual second measured over {args.idle:g} virtual s with nothing running"
               f" (heartbeats, ticks, pings) times the cell's virtual time; hosts CPU = sum"
               f" over host roles. Simulation wall = real seconds the size took (start, idle"
               f" and both workloads). " + SIM_CPU)
    else:
        setup = ("One client drives one island of H host processes x D emulated devices; the"
                 f" coordinator, every host and the client share one {os.cpu_count()}-core"
                 " machine.")
        cpu = (f" s (>= 1 run); final values checked exactly. Controller CPU ="
               f" client process (time.process_time) + coordinator process (/proc task"
               f" schedstat) CPU time over computations; net of idle = less the controller's"
               f" CPU per second measured over {args.idle:g} s with nothing running"
               f" (heartbeats, ticks, pings: a cost per host and second, not per computation)"
               f" times the cell's wall time; hosts CPU = sum over host processes (Fig. 5"
               f" per device-kernel: over the devices, each running one kernel per computation).")
    return "\n".join([
        setup + f" Fig. 5: one @pw.program of {args.chain} chained calls of psum(x) + 1 over"
        f" every device (replicated float64 scalar), run back to back. Pipeline: {STAGES}"
        f" stages x + (k+1) on {STAGES} disjoint sub-meshes of H/{STAGES} whole hosts each, a"
        f" float64 vector sharded one element per device; one computation = one stage.",
        ("Each cell: a checked warm-up of two runs (the program installed for both of its"
         " inputs: a put's and a run's output), cells sized from the one before until one"
         " takes at least half the budget, then the best"
         if simulate else "Each cell: one checked warm-up run, then the best")
        + f" of {args.reps} cells of about {args.budget:g}" + cpu
        + " Growth exponent = log(net controller CPU/comp ratio) / log(device ratio) against"
        " the smallest size (1: grows like devices; <= 1: no faster than devices).",
        "Controller CPU per computation grows no faster than devices: " + verdict(sizes) + ".",
        f"Total bench time {elapsed:.0f} s.",
    ])


def main(argv=None) -> int:
    simulate = wants_simulation(argv)
    args = _parser(simulate).parse_args(argv)
    if simulate:
        wanted = parse_sizes(args.sizes or (SIM_QUICK_SIZES if args.quick else SIM_SIZES))
    else:
        wanted = parse_sizes(args.sizes or (QUICK_SIZES if args.quick else SIZES))
    started = time.perf_counter()

    sizes: list[Size] = []
    too_big = None  # devices of the smallest size that did not start
    for hosts, per_host in wanted:
        size = Size(hosts, per_host)
        sizes.append(size)
        if hosts % STAGES:
            size.status = f"skipped (hosts must be a multiple of {STAGES})"
            continue
        if too_big is not None and size.devices >= too_big:
            size.status = "skipped (a smaller size did not start)"
            continue
        print(f"{size.label} ({size.devices} devices):", flush=True)
        if simulate:
            run_size_simulated(size, args.chain, args.budget, args.reps, args.idle,
                               args.start_timeout, args.timeout, args.seed)
        else:
            run_size(size, args.chain, args.budget, args.reps, args.idle, args.start_timeout,
                     args.timeout)
        if size.started is None:
            too_big = size.devices
        if simulate:
            print(f"  {size.label}: {size.status}, simulated in {size.wall:.1f} s"
                  + (f", started in {1e3 * size.started:.1f} virtual ms" if size.started
                     else ""),
                  flush=True)
        else:
            print(f"  {size.label}: {size.status}"
                  + (f", started in {size.started:.1f} s" if size.started else ""), flush=True)
    elapsed = time.perf_counter() - started

    publish(SIM_TITLE if simulate else TITLE, rows_of(sizes, simulate),
            _notes(args, simulate, sizes, elapsed), append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
