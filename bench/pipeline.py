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

Run: ``python -m bench.pipeline [--quick] [--no-append] [--profile]``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import numpy as np

import pathways as pw
from bench import profiling
from bench.results import bench_parser, publish
from pathways import P

TITLE = "Parallel vs sequential dispatch: a chain of S computations across hosts (paper Figure 7)"
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


# ---- CPU accounting -------------------------------------------------------------------------



def _machine_ticks() -> tuple[int, int]:
    """(all, idle) CPU ticks of the whole machine so far; (0, 0) where unavailable."""
    try:
        with open("/proc/stat") as f:
            v = [int(n) for n in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    except (OSError, IndexError, ValueError):
        return 0, 0


@dataclass
class Cell:
    """``runs`` chained runs of a chain of ``stages`` in ``wall`` seconds."""

    mode: str
    stages: int
    runs: int
    wall: float
    cpu: float  # CPU seconds of the cluster processes and this client during the cell
    busy: float  # fraction of the machine's CPU time that was busy during the cell

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.wall

    @property
    def comps_per_s(self) -> float:
        return self.runs * self.stages / self.wall

    @property
    def ms_per_stage(self) -> float:
        return 1e3 * self.wall / (self.runs * self.stages)

    @property
    def cpu_ms_per_comp(self) -> float:
        return 1e3 * self.cpu / (self.runs * self.stages)


# ---- the rig --------------------------------------------------------------------------------

class ChainRig:
    """One client (one dispatch mode), its one-device stage meshes and its chain programs."""

    def __init__(self, client, pids: list[int]):
        self.client, self.pids = client, pids
        self.mode = client.dispatch
        meshes = [client.mesh((1,), ("d",)) for _ in range(HOSTS * PER_HOST)]
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
        cpu0 = sum(profiling.cpu_seconds(p) for p in self.pids)
        all0, idle0 = _machine_ticks()
        t0 = time.perf_counter()
        for _ in range(runs):
            x = chain(x)
        x.block_until_ready(timeout)
        wall = time.perf_counter() - t0
        all1, idle1 = _machine_ticks()
        cpu = sum(profiling.cpu_seconds(p) for p in self.pids) - cpu0
        got, want = x.result(timeout), start + runs * chain_total(stages)
        if not np.array_equal(got, want):
            raise AssertionError(f"{self.mode} chain of {stages} x {runs} runs: got {got},"
                                 f" expected {want}")
        busy = 1.0 - (idle1 - idle0) / (all1 - all0) if all1 > all0 else float("nan")
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


# ---- profiling ------------------------------------------------------------------------------

def profile(cluster, rigs: dict[str, ChainRig], stages: int, seconds: float) -> str:
    """py-spy (samples holding the GIL) of every cluster process while each mode runs the
    longest chain back to back."""
    report = []
    for mode, rig in rigs.items():
        report += profiling.record(profiling.cluster_processes(cluster),
                                   lambda r=rig: r.run(stages, 10, _timeout(stages, 10)), seconds,
                                   f"{mode}, S={stages}")
    return "\n".join(report)


# ---- reporting ------------------------------------------------------------------------------

def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def rows_of(best, stage_counts, layouts) -> list[dict]:
    rows = []
    for s in stage_counts:
        par, seq = best[("parallel", s)], best[("sequential", s)]
        ratio = par.runs_per_s / seq.runs_per_s
        target = ""
        if s >= TARGET_FROM:
            target = f">= {TARGET_RATIO:g}x: {'met' if ratio >= TARGET_RATIO else 'MISSED'}"
        rows.append({
            "Stages": s,
            "Stage placement (host, device)": layouts[s],
            "Parallel runs/s": _rate(par.runs_per_s),
            "Sequential runs/s": _rate(seq.runs_per_s),
            "Parallel comps/s": _rate(par.comps_per_s),
            "Sequential comps/s": _rate(seq.comps_per_s),
            "Parallel/Sequential": f"{ratio:.2f}",
            "ms per stage par, seq": f"{par.ms_per_stage:.2f}, {seq.ms_per_stage:.2f}",
            "CPU ms per comp par, seq": f"{par.cpu_ms_per_comp:.2f}, {seq.cpu_ms_per_comp:.2f}",
            "Machine busy par, seq": f"{par.busy:.0%}, {seq.busy:.0%}",
            "Target": target,
        })
    return rows


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "short cells, one round",
                      "py-spy the cluster while each mode runs the longest chain")
    ap.sized("--budget", float, 0.3, 1.2, "seconds per timed cell")
    ap.sized("--reps", int, 1, 4, "interleaved rounds (best kept)")
    args = ap.parse_args(argv)
    budget, reps = args.budget, args.reps
    stage_counts = STAGES
    started = time.perf_counter()
    profile_text = None

    with pw.local_cluster(islands=1, hosts_per_island=HOSTS,
                          devices_per_host=PER_HOST) as cluster:
        pids = [p.pid for p in cluster.processes] + [os.getpid()]
        clients = {mode: pw.connect(cluster.address, dispatch=mode) for mode in MODES}
        try:
            rigs = {mode: ChainRig(c, pids) for mode, c in clients.items()}
            layouts = {s: check_layout(rigs, s) for s in stage_counts}
            print(f"{HOSTS} hosts x {PER_HOST} devices; stage k on host k mod {HOSTS}:"
                  f" {layouts[max(stage_counts)]}", flush=True)
            best = measure(rigs, stage_counts, budget, reps)
            if args.profile:
                profile_text = profile(cluster, rigs, max(stage_counts), 6.0)
        finally:
            for c in clients.values():
                c.close()
    elapsed = time.perf_counter() - started

    rows = rows_of(best, stage_counts, layouts)
    judged = [s for s in stage_counts if s >= TARGET_FROM]
    ratios = {s: best[("parallel", s)].runs_per_s / best[("sequential", s)].runs_per_s
              for s in stage_counts}
    met = all(ratios[s] >= TARGET_RATIO for s in judged)
    notes = "\n".join([
        f"A chain of S computations (stage k: x + (k+1) on a replicated float64[{WIDTH}],"
        f" modelled cost {COST * 1e3:g} ms), each on its own one-device slice; {HOSTS} host"
        f" processes x {PER_HOST} emulated devices, one island, coordinator + hosts + this"
        f" client on one {os.cpu_count()}-core machine. Stage k runs on host k mod {HOSTS}"
        f" (device k div {HOSTS} there), so every hop of the chain is a transfer between"
        f" host processes (ZeroMQ tcp loopback, ICI link time), and the next run's input"
        f" comes back from the last stage's host.",
        "Parallel: every kernel of a run enqueued at once with its inputs as futures."
        " Sequential: a kernel enqueued only when progress tracking says its predecessors"
        " are done. Same devices, same program, one client per mode (pw.connect(...,"
        " dispatch=...)).",
        f"Each cell: N chained runs (x = chain(x), no waiting in between), then wait for the"
        f" last; N sized for ~{budget:g} s; best of {reps} interleaved rounds. Runs/s is the"
        f" inverse of one run's critical path; comps/s = S x runs/s; ms per stage = wall /"
        f" (N x S). First run of every cell checked against pw.reference, every cell's final"
        f" value checked exactly (start + N x S(S+1)/2). CPU ms per comp: CPU time of the"
        f" cluster processes and this client over computations; machine busy: whole-machine"
        f" CPU use during the cell.",
        f"Target: parallel >= {TARGET_RATIO:g}x sequential at {TARGET_FROM}+ stages: "
        + ", ".join(f"S={s} {ratios[s]:.2f}x" for s in judged)
        + f": {'met' if met else 'MISSED'}.",
        f"Total bench time {elapsed:.0f} s.",
    ])

    publish(TITLE, rows, notes, profile_text, append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
