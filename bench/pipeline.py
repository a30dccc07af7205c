"""Parallel vs sequential asynchronous dispatch on a chain of computations (paper Figure 7).

A program is a chain of S small computations, each on a DIFFERENT device of a different host
where possible, each stage's output feeding the next stage's input, so that every hop of the
chain is a transfer between host processes. The same program runs with the two dispatch
modes of ``pw.connect(..., dispatch=...)`` (docs/design.md, mechanism 5):

- **parallel** (the default): when a run starts, every host enqueues every kernel of the run at
  once, with its inputs as object-store futures; the host-side work of stage k+1 is done before
  stage k finishes, so only the data hops are on the critical path;
- **sequential**: a kernel is enqueued only when progress tracking tells its host that its
  predecessors are done, so the host-side work of every stage is on the critical path.

Layout: ``HOSTS`` host processes of ``PER_HOST`` emulated devices (one island). Each client
asks the resource manager for ``HOSTS * PER_HOST`` one-device slices (``client.mesh((1,),
("d",))``) and orders them round-robin over the hosts: stage k runs on host k mod HOSTS, on
that host's device k div HOSTS. So no two stages share a device, consecutive stages are always
on different hosts, and with S = 16 every device of the cluster holds one stage. Each stage is
``x + (k + 1)`` on a replicated float64[4] with a modelled cost of ``COST`` (0.1 ms).

Throughput: each cell runs the program N times back to back, each run's output passed as the
next run's input (``x = chain(x)``; the client never waits in between), then waits for the
last. A run can therefore start only when the previous one's last stage is done: chain runs/s
is the inverse of the critical path of one run, and computations/s = S x runs/s. The first run
of every (mode, S) is checked against ``pw.reference``; every timed cell's final value is
checked exactly against the arithmetic (N x S(S+1)/2 added to the start value).

Each cell is sized from a warm-up to about ``budget`` seconds; the modes and chain lengths take
turns for ``reps`` rounds (the mode that goes first alternates) and each keeps its best. CPU
time of every cluster process and of this client (from /proc) is recorded per cell, to tell a
latency-bound chain from a CPU-bound one on this small machine.

Target: parallel >= 2x sequential throughput at 8 and 16 stages.

``--simulate`` runs the same cells on simulated clusters (``pw.local_cluster(simulate=True,
cpu="measured")``): coordinator, hosts and both clients are roles of one discrete-event
simulation in this process, each a virtual CPU charged the thread CPU time of its handlers, so
the figures are the modelled cluster's (one core per process), not this machine's. Cells are
sized and timed in virtual seconds (``cluster.clock()``); CPU is what the roles are charged,
and the busiest host role's CPU share replaces the machine's. ``--sizes``: hosts x devices
per host (default 4x4; e.g. 16x8), chains of 1, 2, 4, ... stages up to the device count; each
size reports the wall time its simulation took.

Run: ``python -m bench.pipeline [--quick] [--no-append] [--profile] [--simulate [--sizes
4x4,16x8] [--seed 0]]``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import numpy as np

import pathways as pw
from bench import profiling
from bench.results import SIM_CPU, bench_parser, parse_sizes, publish, wants_simulation
from pathways import P

TITLE = "Parallel vs sequential dispatch: a chain of S computations across hosts (paper Figure 7)"
SIM_TITLE = ("Parallel vs sequential dispatch, simulated: a chain of S computations across"
             " hosts in virtual time (paper Figure 7)")
HOSTS = 4
PER_HOST = 4
STAGES = (1, 2, 4, 8, 16)
COST = 1e-4  # modelled seconds per computation
WIDTH = 4  # elements of the float64 vector that flows down the chain
MODES = ("parallel", "sequential")
TARGET_RATIO = 2.0  # parallel >= 2x sequential ...
TARGET_FROM = 8  # ... for chains of this many stages and more
WARM_RUNS = 4
MIN_RUNS, MAX_RUNS = 8, 4000
SIM_SIZES = f"{HOSTS}x{PER_HOST}"  # hosts x devices per host, with --simulate
SIM_QUICK_SIZES = "2x4"


def stage_body(k: int):
    """Stage k adds k + 1. A closure, so cloudpickle ships it to the hosts by value."""
    inc = float(k + 1)

    def body(x):
        return x + inc

    body.__name__ = f"stage{k}"
    return body


def chain_total(stages: int) -> float:
    """What one run of a chain of ``stages`` adds to every element."""
    return stages * (stages + 1) / 2


# ---- time and CPU accounting ----------------------------------------------------------------

def _machine_ticks() -> tuple[int, int]:
    """(all, idle) CPU ticks of the whole machine so far; (0, 0) where unavailable."""
    try:
        with open("/proc/stat") as f:
            v = [int(n) for n in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    except (OSError, IndexError, ValueError):
        return 0, 0


class ProcMeter:
    """A real cluster: wall-clock seconds; CPU of ``pids`` (the cluster's processes and this
    one, from /proc); busy = the whole machine's busy share of its CPU ticks."""

    def __init__(self, pids: list[int]):
        self.pids, self.clock = pids, time.perf_counter

    def read(self):
        return sum(profiling.cpu_seconds(p) for p in self.pids), _machine_ticks()

    def figures(self, before, after, wall: float) -> tuple[dict[str, float], float]:
        """({"all": CPU seconds}, busy share) between two ``read``s."""
        (cpu0, (all0, idle0)), (cpu1, (all1, idle1)) = before, after
        busy = 1.0 - (idle1 - idle0) / (all1 - all0) if all1 > all0 else float("nan")
        return {"all": cpu1 - cpu0}, busy


class SimMeter:
    """A simulated cluster: virtual seconds; CPU charged to its roles, grouped as client (the
    client roles and the user's thread), coordinator and hosts; busy = the busiest host
    role's CPU over the virtual time."""

    def __init__(self, cluster):
        self.cluster, self.clock = cluster, cluster.clock

    def read(self) -> dict[str, float]:
        return profiling.charged_cpu(self.cluster)

    def figures(self, before, after, wall: float) -> tuple[dict[str, float], float]:
        used = {name: after[name] - before.get(name, 0.0) for name in after}
        cpu = dict(zip(("client", "coordinator", "hosts"),
                       profiling.client_coordinator_hosts(used)))
        busiest = max(v for name, v in used.items() if name.startswith("host-"))
        return cpu, busiest / wall


@dataclass
class Cell:
    """``runs`` chained runs of a chain of ``stages`` in ``wall`` seconds."""

    mode: str
    stages: int
    runs: int
    wall: float
    cpu: dict[str, float]  # CPU seconds during the cell, by process or role group
    busy: float  # real: the machine's busy share; simulated: the busiest host role's

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.wall

    @property
    def comps_per_s(self) -> float:
        return self.runs * self.stages / self.wall

    @property
    def ms_per_stage(self) -> float:
        return 1e3 * self.wall / (self.runs * self.stages)

    def cpu_ms_per_comp(self, *groups: str) -> float:
        """CPU ms per computation of ``groups`` (all of them if none given)."""
        cpu = sum(v for k, v in self.cpu.items() if not groups or k in groups)
        return 1e3 * cpu / (self.runs * self.stages)


# ---- the rig --------------------------------------------------------------------------------

class ChainRig:
    """One client (one dispatch mode), its one-device stage meshes and its chain programs;
    ``meter``: a ``ProcMeter`` or ``SimMeter``."""

    def __init__(self, client, meter, devices: int):
        self.client, self.meter = client, meter
        self.mode = client.dispatch
        meshes = [client.mesh((1,), ("d",)) for _ in range(devices)]
        self.meshes = round_robin(meshes, self.host_of)
        self._programs: dict[int, object] = {}
        self._checked: set[int] = set()

    def host_of(self, mesh) -> int:
        return self.client.cluster.host_of(mesh.ids[0])

    def layout(self, stages: int) -> list[tuple[int, int]]:
        """(host, device) of each stage."""
        return [(self.host_of(m), m.ids[0]) for m in self.meshes[:stages]]

    def program(self, stages: int):
        if stages not in self._programs:
            fns = [pw.shard_map(stage_body(k), self.meshes[k], P(), P(), cost=COST)
                   for k in range(stages)]

            def chain(x):
                for f in fns:
                    x = f(x)
                return x

            chain.__name__ = f"chain{stages}"
            self._programs[stages] = pw.program(chain)
        return self._programs[stages]

    def check_reference(self, stages: int, timeout: float) -> None:
        """One run from a non-trivial input, against the reference interpreter (once)."""
        if stages in self._checked:
            return
        chain = self.program(stages)
        x0 = np.arange(float(WIDTH)) * 0.5
        got = chain(self.client.put(x0, self.meshes[0], P())).result(timeout)
        want = pw.reference(chain)(x0)
        if not np.array_equal(got, want):
            raise AssertionError(f"{self.mode} chain of {stages}: got {got}, reference {want}")
        self._checked.add(stages)

    def run(self, stages: int, runs: int, timeout: float) -> Cell:
        """``runs`` chained runs (each output is the next input), timed from the first call
        to the last result being ready; the final value is checked exactly."""
        chain = self.program(stages)
        start = np.arange(float(WIDTH))
        x = self.client.put(start, self.meshes[0], P())
        before = self.meter.read()
        t0 = self.meter.clock()
        for _ in range(runs):
            x = chain(x)
        x.block_until_ready(timeout)
        wall = self.meter.clock() - t0
        cpu, busy = self.meter.figures(before, self.meter.read(), wall)
        got, want = x.result(timeout), start + runs * chain_total(stages)
        if not np.array_equal(got, want):
            raise AssertionError(f"{self.mode} chain of {stages} x {runs} runs: got {got},"
                                 f" expected {want}")
        return Cell(self.mode, stages, runs, wall, cpu, busy)


def round_robin(meshes, host_of) -> list:
    """Meshes reordered so that position k is on host k mod H (H hosts, equally many each)."""
    by_host: dict[int, list] = {}
    for m in meshes:
        by_host.setdefault(host_of(m), []).append(m)
    hosts = sorted(by_host)
    per = min(len(v) for v in by_host.values())
    return [by_host[hosts[k % len(hosts)]][k // len(hosts)] for k in range(per * len(hosts))]


def check_layout(rigs: dict[str, ChainRig], stages: int) -> str:
    """Both modes use the same devices; no device twice; consecutive stages on other hosts."""
    layouts = {mode: rig.layout(stages) for mode, rig in rigs.items()}
    first = layouts[MODES[0]]
    if any(lay != first for lay in layouts.values()):
        raise AssertionError(f"the modes got different devices: {layouts}")
    devices = [d for _, d in first]
    if len(set(devices)) != len(devices):
        raise AssertionError(f"a device holds two stages: {first}")
    hosts = [h for h, _ in first]
    if any(a == b for a, b in zip(hosts, hosts[1:])):
        raise AssertionError(f"two consecutive stages on one host: {first}")
    return " ".join(f"h{h}d{d}" for h, d in first)


def _timeout(stages: int, runs: int) -> float:
    return 60.0 + 0.05 * stages * runs


# ---- measuring ------------------------------------------------------------------------------

def measure(rigs: dict[str, ChainRig], stage_counts, budget: float, reps: int
            ) -> dict[tuple[str, int], Cell]:
    """Warm up and size every (mode, S) cell, then ``reps`` interleaved rounds; best kept."""
    runs: dict[tuple[str, int], int] = {}
    for stages in stage_counts:
        for mode, rig in rigs.items():
            rig.check_reference(stages, _timeout(stages, 1))  # installs the program too
            warm = rig.run(stages, WARM_RUNS, _timeout(stages, WARM_RUNS))
            per_run = warm.wall / WARM_RUNS
            runs[(mode, stages)] = max(MIN_RUNS, min(MAX_RUNS, round(budget / per_run)))
    best: dict[tuple[str, int], Cell] = {}
    for rep in range(reps):
        order = MODES if rep % 2 == 0 else tuple(reversed(MODES))
        for stages in stage_counts:
            for mode in order:
                n = runs[(mode, stages)]
                cell = rigs[mode].run(stages, n, _timeout(stages, n))
                key = (mode, stages)
                if key not in best or cell.runs_per_s > best[key].runs_per_s:
                    best[key] = cell
        print(f"  round {rep + 1}/{reps}: " + "; ".join(
            f"S={s} par {best[('parallel', s)].runs_per_s:,.1f}"
            f" seq {best[('sequential', s)].runs_per_s:,.1f} runs/s" for s in stage_counts),
            flush=True)
    return best


def profile(cluster, rigs: dict[str, ChainRig], stages: int, seconds: float) -> str:
    """py-spy (samples holding the GIL) of every cluster process while each mode runs the
    longest chain back to back."""
    report = []
    for mode, rig in rigs.items():
        report += profiling.record(profiling.cluster_processes(cluster),
                                   lambda r=rig: r.run(stages, 10, _timeout(stages, 10)), seconds,
                                   f"{mode}, S={stages}")
    return "\n".join(report)


# ---- one cluster size ------------------------------------------------------------------------

@dataclass
class Size:
    """A cluster of ``hosts`` x ``per_host`` devices and what was measured on it."""

    hosts: int
    per_host: int
    stage_counts: tuple[int, ...]
    best: dict | None = None  # (mode, stages) -> Cell
    layouts: dict | None = None  # stages -> placement, "h<host>d<device> ..."
    wall: float | None = None  # simulated: real seconds its simulation took

    @property
    def label(self) -> str:
        return f"{self.hosts}x{self.per_host}"

    def ratio(self, stages: int) -> float:
        par, seq = (self.best[(mode, stages)] for mode in MODES)
        return par.runs_per_s / seq.runs_per_s


def run_size(size: Size, budget: float, reps: int, seed: int | None,
             profile_seconds: float = 0.0) -> str | None:
    """Measure both modes on a cluster of ``size``, into ``size``: a simulated one if
    ``seed`` is given, else host processes. Returns the profile text, if one was asked."""
    simulate = seed is not None
    options = dict(simulate=True, seed=seed, cpu="measured") if simulate else {}
    text = None
    with pw.local_cluster(islands=1, hosts_per_island=size.hosts,
                          devices_per_host=size.per_host, **options) as cluster:
        meter = (SimMeter(cluster) if simulate else
                 ProcMeter([p.pid for p in cluster.processes] + [os.getpid()]))
        clients = {mode: pw.connect(cluster.address, dispatch=mode) for mode in MODES}
        try:
            rigs = {mode: ChainRig(c, meter, size.hosts * size.per_host)
                    for mode, c in clients.items()}
            size.layouts = {s: check_layout(rigs, s) for s in size.stage_counts}
            print(f"{size.hosts} hosts x {size.per_host} devices; stage k on host k mod"
                  f" {size.hosts}: {_placement(size.layouts[max(size.stage_counts)])}",
                  flush=True)
            size.best = measure(rigs, size.stage_counts, budget, reps)
            if profile_seconds:
                text = profile(cluster, rigs, max(size.stage_counts), profile_seconds)
        finally:
            for c in clients.values():
                c.close()
        if simulate:
            size.wall = cluster.wall()
            print(f"  {size.label}: simulated {cluster.clock():.2f} virtual s in"
                  f" {size.wall:.1f} s", flush=True)
    return text


# ---- reporting ------------------------------------------------------------------------------

def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _placement(text: str, shown: int = 16) -> str:
    """The first ``shown`` stages' placement of a long chain."""
    parts = text.split()
    return text if len(parts) <= shown else " ".join(parts[:shown]) + f" ... ({len(parts)})"


# figures of each mode's cell, shown as "parallel, sequential"
PAIRS = {"ms per stage": lambda c: f"{c.ms_per_stage:.2f}",
         "CPU ms per comp": lambda c: f"{c.cpu_ms_per_comp():.2f}"}
REAL_PAIRS = {"Machine busy": lambda c: f"{c.busy:.0%}"}
SIM_PAIRS = {"Hosts CPU ms per comp": lambda c: f"{c.cpu_ms_per_comp('hosts'):.2f}",
             "Client+coordinator CPU ms per comp":
                 lambda c: f"{c.cpu_ms_per_comp('client', 'coordinator'):.2f}",
             "Busiest host CPU busy": lambda c: f"{c.busy:.0%}"}


def rows_of(sizes: list[Size], simulated: bool = False) -> list[dict]:
    rows = []
    for size in sizes:
        for s in size.stage_counts:
            par, seq = size.best[("parallel", s)], size.best[("sequential", s)]
            ratio = size.ratio(s)
            met = "met" if ratio >= TARGET_RATIO else "MISSED"
            row = {"Hosts x devices": size.label} if simulated else {}
            row.update({
                "Stages": s,
                "Stage placement (host, device)": _placement(size.layouts[s]),
                "Parallel runs/s": _rate(par.runs_per_s),
                "Sequential runs/s": _rate(seq.runs_per_s),
                "Parallel comps/s": _rate(par.comps_per_s),
                "Sequential comps/s": _rate(seq.comps_per_s),
                "Parallel/Sequential": f"{ratio:.2f}",
            })
            for name, figure in {**PAIRS, **(SIM_PAIRS if simulated else REAL_PAIRS)}.items():
                row[f"{name} par, seq"] = f"{figure(par)}, {figure(seq)}"
            row["Target"] = f">= {TARGET_RATIO:g}x: {met}" if s >= TARGET_FROM else ""
            rows.append(row)
    return rows


def _setup(args, simulated: bool, sizes: list[Size]) -> str:
    if not simulated:
        where = (f"{HOSTS} host processes x {PER_HOST} emulated devices, one island, coordinator"
                 f" + hosts + this client on one {os.cpu_count()}-core machine. Stage k runs on"
                 f" host k mod {HOSTS} (device k div {HOSTS} there), so every hop of the chain"
                 f" is a transfer between host processes (ZeroMQ tcp loopback, ICI link time)")
    else:
        where = (
            "simulated, in virtual time: one island of H hosts x D emulated devices ("
            + ", ".join(s.label for s in sizes) + f"; pw.local_cluster(simulate=True,"
            f" seed={args.seed}, cpu=\"measured\")): the coordinator, every host and both"
            f" clients are roles of one discrete-event simulation in this process, each a"
            f" virtual CPU of its own charged the thread CPU time of its handlers (one core per"
            f" process, not this {os.cpu_count()}-core machine); messages between roles take"
            f" DCN time, a value's kernel the modelled ICI link time. S = 1, 2, 4, ... up to"
            f" the device count; stage k runs on host k mod H (device k div H there), so every"
            f" hop of the chain is a transfer between hosts")
    return (f"A chain of S computations (stage k: x + (k+1) on a replicated float64[{WIDTH}],"
            f" modelled cost {COST * 1e3:g} ms), each on its own one-device slice; {where},"
            f" and the next run's input comes back from the last stage's host.")


def _notes(args, simulated: bool, sizes: list[Size], elapsed: float) -> str:
    judged = [(size, s) for size in sizes for s in size.stage_counts if s >= TARGET_FROM]
    met = ("not judged (no chain that long)" if not judged else
           "met" if all(size.ratio(s) >= TARGET_RATIO for size, s in judged) else "MISSED")
    lines = [
        _setup(args, simulated, sizes),
        "Parallel: every kernel of a run enqueued at once with its inputs as futures."
        " Sequential: a kernel enqueued only when progress tracking says its predecessors"
        " are done. Same devices, same program, one client per mode (pw.connect(...,"
        " dispatch=...)).",
        f"Each cell: N chained runs (x = chain(x), no waiting in between), then wait for the"
        f" last; N sized for ~{args.budget:g} {'virtual s' if simulated else 's'}; best of"
        f" {args.reps} interleaved rounds. Runs/s{' (per virtual second)' if simulated else ''}"
        f" is the inverse of one run's critical path; comps/s = S x runs/s; ms per stage ="
        f" wall / (N x S). First run of every cell checked against pw.reference, every cell's"
        f" final value checked exactly (start + N x S(S+1)/2). CPU ms per comp: "
        + ("CPU charged to every role (both clients' roles and the user's thread, the"
           " coordinator, the hosts) over computations, then the hosts' and the client's +"
           " coordinator's alone; busiest host CPU busy: the most charged host role's CPU over"
           " the cell's virtual time (near 100%: that host's CPU bounds the chain). " + SIM_CPU
           if simulated else "CPU time of the cluster processes and this client over"
           " computations; machine busy: whole-machine CPU use during the cell."),
        f"Target: parallel >= {TARGET_RATIO:g}x sequential at {TARGET_FROM}+ stages: "
        + ", ".join(f"{size.label + ' ' if simulated else ''}S={s} {size.ratio(s):.2f}x"
                    for size, s in judged) + f": {met}.",
    ]
    if simulated:
        lines.append("Wall time of each size's simulation: "
                     + ", ".join(f"{s.label} {s.wall:.1f} s" for s in sizes) + ".")
    lines.append(f"Total bench time {elapsed:.0f} s.")
    return "\n".join(lines)


def _parser(simulate: bool):
    ap = bench_parser(__doc__, f"simulated, {SIM_QUICK_SIZES} only, short cells, one round"
                      if simulate else "short cells, one round", None if simulate else
                      "py-spy the cluster while each mode runs the longest chain")
    ap.add_argument("--simulate", action="store_true",
                    help="on simulated clusters, in virtual time (see the module's text)")
    if simulate:
        ap.add_argument("--sizes", default=None,
                        help=f"hosts x devices per host, comma-separated (default {SIM_SIZES};"
                             f" {SIM_QUICK_SIZES} with --quick); chains of 1, 2, 4, ... stages"
                             " up to the device count")
        ap.add_argument("--seed", type=int, default=0, help="the simulations' seed")
    ap.sized("--budget", float, *((0.02, 0.2) if simulate else (0.3, 1.2)),
             "virtual seconds per timed cell" if simulate else "seconds per timed cell")
    ap.sized("--reps", int, 1, 2 if simulate else 4, "interleaved rounds (best kept)")
    return ap


def main(argv=None) -> int:
    simulate = wants_simulation(argv)
    args = _parser(simulate).parse_args(argv)
    if simulate:
        wanted = parse_sizes(args.sizes or (SIM_QUICK_SIZES if args.quick else SIM_SIZES))
        if any(h < 2 for h, _ in wanted):
            raise SystemExit("--sizes: at least 2 hosts (consecutive stages on other hosts)")
        # chains of 1, 2, 4, ... stages, up to one per device
        sizes = [Size(h, d, tuple(2**i for i in range((h * d).bit_length()))) for h, d in wanted]
    else:
        sizes = [Size(HOSTS, PER_HOST, STAGES)]
    started = time.perf_counter()
    seed, profile_seconds = (args.seed, 0.0) if simulate else (None, 6.0 if args.profile else 0)
    profiles = [run_size(size, args.budget, args.reps, seed, profile_seconds) for size in sizes]
    elapsed = time.perf_counter() - started

    publish(SIM_TITLE if simulate else TITLE, rows_of(sizes, simulate),
            _notes(args, simulate, sizes, elapsed), profiles[-1],
            append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
