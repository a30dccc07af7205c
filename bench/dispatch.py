"""Dispatch overhead: Pathways vs a JAX-style multi-controller (the paper's Figures 5 and 6).

The trivial computation -- psum of a replicated scalar over every device of the mesh, then
add 1, each output fed to the next call -- measures what dispatch costs when devices have
almost nothing to do. Pathways runs it three ways (all with parallel asynchronous dispatch):

- **OpByOp**: ``x = step(x)`` called N times from Python, then wait for the last;
- **Chained**: one ``@pw.program`` of 128 calls of ``step``, run repeatedly (128 computations
  per run);
- **Fused**: one ``shard_map`` whose body loops 128 times over psum+1, with modelled cost 128x
  the per-step cost (128 computations per call);

and the baseline is ``bench/multicontroller.py``: one process per host running the user loop
on the same emulated devices, collectives and transport, with no coordinator.

Figure 5: computations/s of each, with a negligible modelled cost (``FIG5_COST``), on 1, 2
and 4 hosts of 4 devices. Figure 6: on the largest configuration, the modelled cost per
computation swept from 0.05 ms to 20 ms; for each Pathways mode, the smallest cost from which
on it keeps >= 95% of multi-controller throughput (the paper: 2.3 ms on 128 TPUs).

Every cell is timed from the first call to the last result being ready; the number of calls
is sized from a warm-up so that a cell takes about ``budget`` seconds (at least one chained
run or fused call); the modes take turns for ``reps`` rounds and each keeps its best (the
machine is shared and noisy); results are checked against the exact float recurrence. Device
utilization is the devices' occupied time over the cell's wall time (occupied = executing,
including blocking in collectives and waiting for inputs, as ``EmulatedDevice.busy_seconds``
counts it); "useful" is modelled compute only (computations/s x cost per computation).

``--simulate`` runs both sides on the simulator instead, in virtual time
(``pw.local_cluster(simulate=True, cpu="measured")`` for Pathways, ``bench.sim_multicontroller``
for the baseline): every role (coordinator, host, client; each multi-controller host) is a
virtual CPU of its own, charged the thread CPU time its handlers use, so the figures are those
of the modelled cluster with one core per process, not of this machine, and larger
configurations fit (``--sizes``, hosts x devices per host; default 4x4 and 16x8). Cells are
sized and timed in virtual seconds (``cluster.clock()``); the wall time each configuration's
simulation took is reported too.

``--fetch``: the Pathways client fetches the value of every output it times, as users commonly
do (``[y.result() for y in ys]``: every OpByOp call's, every chained run's, every fused call's),
instead of waiting for the last to be ready; the multi-controller is unchanged (its values stay
on its hosts, as in JAX).

Run: ``python -m bench.dispatch [--quick] [--no-append] [--fetch] [--profile] [--simulate
[--sizes 4x4,16x8]]``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import pathways as pw
from bench import profiling
from bench.multicontroller import MultiController, expected_value, trivial_body
from bench.results import (
    SIM_CPU,
    bench_parser,
    parse_sizes,
    plot_sweep,
    publish,
    security_for_all,
    wants_simulation,
)
from bench.sim_multicontroller import SimMultiController
from pathways import P, protocol

TITLE = "Dispatch overhead: Pathways vs multi-controller (paper Figures 5 and 6)"
SIM_TITLE = ("Dispatch overhead, simulated: Pathways vs multi-controller in virtual time"
             " (paper Figures 5 and 6)")
CHAIN = 128  # computations per chained run and per fused call
PER_HOST = 4
HOST_COUNTS = (1, 2, 4)
FIG5_COST = 0.0  # modelled seconds per computation in Figure 5: dispatch overhead only
SWEEP_MS = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20)
PARITY = 0.95  # "reaches multi-controller throughput" means >= 95% of it
TARGET_CHAINED = 0.90  # Chained >= 90% of multi-controller at every swept cost
TARGET_OPBYOP_MS = 1.0  # OpByOp within 95% at a cost <= 1 ms
TARGET_FUSED = 1.0  # Fused >= multi-controller
MODES = ("OpByOp", "Chained", "Fused")
UNIT = {"MC": 1, "OpByOp": 1, "Chained": CHAIN, "Fused": CHAIN}  # computations per unit
WARM_UNITS = {"MC": 16, "OpByOp": 16, "Chained": 1, "Fused": 1}
MIN_UNITS = {"MC": 32, "OpByOp": 32, "Chained": 1, "Fused": 1}
MAX_UNITS = {"MC": 20_000, "OpByOp": 5_000, "Chained": 40, "Fused": 40}
SIM_SIZES = "4x4,16x8"  # hosts x devices per host, with --simulate
SIM_QUICK_SIZES = "1x4,2x4"


@dataclass
class Cell:
    """One measurement: ``computations`` in ``wall`` seconds on ``hosts`` x ``per_host``
    devices."""

    mode: str  # "MC" or one of MODES
    hosts: int
    cost: float  # modelled seconds per computation
    computations: int
    wall: float
    occupied: float  # mean over devices of busy seconds / wall
    per_host: int = PER_HOST

    @property
    def rate(self) -> float:
        return self.computations / self.wall

    @property
    def useful(self) -> float:
        return min(1.0, self.rate * self.cost)


# ---- Pathways ---------------------------------------------------------------------------------

def finish(ys: list, fetch: bool, timeout: float) -> None:
    """Wait for the outputs ``ys`` of a cell's calls (in call order) as the user would: with
    ``fetch``, fetch every one's value (``[y.result() for y in ys]``); else wait for the last
    to be ready (each call's output feeds the next, so all are), fetching nothing."""
    if fetch:
        for y in ys:
            y.result(timeout)
    else:
        ys[-1].block_until_ready(timeout)


class PathwaysRig:
    """The three Pathways variants of the trivial computation on one client's mesh;
    ``clock``: what cells are timed with (a simulated cluster's ``clock`` for virtual
    time); ``fetch``: whether cells fetch the value of every call's output (``finish``)."""

    def __init__(self, client, hosts: int, per_host: int = PER_HOST,
                 clock: Callable[[], float] = time.perf_counter, fetch: bool = False):
        self.client, self.hosts, self.per_host, self.clock = client, hosts, per_host, clock
        self.fetch = fetch
        self.devices = hosts * per_host
        self.mesh = client.mesh((self.devices,), ("d",))
        self._data = sorted({client.cluster.data_address(d) for d in self.mesh.ids})
        self._fns: dict[tuple, object] = {}

    def _fn(self, mode: str, cost: float):
        key = (mode, cost)
        if key not in self._fns:
            if mode == "OpByOp":
                fn = pw.shard_map(trivial_body(1), self.mesh, P(), P(), cost=cost)
            elif mode == "Fused":
                fn = pw.shard_map(trivial_body(CHAIN), self.mesh, P(), P(), cost=CHAIN * cost)
            else:
                step = self._fn("OpByOp", cost)

                def chain(x):
                    for _ in range(CHAIN):
                        x = step(x)
                    return x

                fn = pw.program(chain)
            self._fns[key] = fn
        return self._fns[key]

    def busy(self) -> dict[int, float]:
        """Busy seconds of every device of the mesh so far, from the hosts' status."""
        futures = [self.client.session.request(a, protocol.Status(None)) for a in self._data]
        busy = {}
        for f in futures:
            for d, info in f.result(10)["devices"].items():
                busy[int(d)] = info["busy_seconds"]
        return {d: busy[d] for d in self.mesh.ids}

    def run(self, mode: str, cost: float, units: int, timeout: float) -> Cell:
        """Run ``units`` calls of the mode (each output into the next) and time them, to the
        last output ready or, with ``fetch``, every call's output fetched."""
        fn = self._fn(mode, cost)
        x = self.client.put(np.zeros(()), self.mesh, P())
        x.block_until_ready(timeout)
        ys = []  # every call's output, kept only when all are fetched
        busy0 = self.busy()
        t0 = self.clock()
        for _ in range(units):
            x = fn(x)
            if self.fetch:
                ys.append(x)
        finish(ys if self.fetch else [x], self.fetch, timeout)
        wall = self.clock() - t0
        busy1 = self.busy()
        steps = units * UNIT[mode]
        got, want = float(x.result(timeout)), expected_value(self.devices, steps)
        if got != want:
            raise AssertionError(f"{mode}: got {got} after {steps} steps, expected {want}")
        occupied = sum(busy1[d] - busy0[d] for d in busy0) / len(busy0) / wall
        return Cell(mode, self.hosts, cost, steps, wall, occupied, self.per_host)


def _timeout(mode: str, cost: float, units: int) -> float:
    return 120.0 + 4.0 * units * UNIT[mode] * cost


def measure_config(rig: PathwaysRig, mc: MultiController | SimMultiController, cost: float,
                   budget: float, reps: int) -> dict[str, Cell]:
    """The multi-controller and the three Pathways modes at one cost, on one configuration.

    Each mode is warmed up once (installing its program, connecting) and sized from that
    warm-up to about ``budget`` seconds; then ``reps`` rounds time every mode in turn, so
    that a slow spell of the shared machine hits all of them, and each keeps its best.
    Simulated, each side's seconds are its own simulation's virtual ones.
    """
    def run_mc(mode, c, units, timeout):
        r = mc.run(units, c, timeout=timeout)
        return Cell("MC", mc.hosts, c, units, r.wall, r.utilization, mc.per_host)

    runners = {"MC": run_mc, **{m: rig.run for m in MODES}}
    clocks = {"MC": mc.clock, **{m: rig.clock for m in MODES}}
    units = {}
    for mode, run in runners.items():
        warm = WARM_UNITS[mode]
        t0 = clocks[mode]()
        run(mode, cost, warm, _timeout(mode, cost, warm))
        per_unit = (clocks[mode]() - t0) / warm
        units[mode] = max(MIN_UNITS[mode], min(MAX_UNITS[mode], round(budget / per_unit)))
    best: dict[str, Cell] = {}
    for _ in range(reps):
        for mode, run in runners.items():
            cell = run(mode, cost, units[mode], _timeout(mode, cost, units[mode]))
            if mode not in best or cell.rate > best[mode].rate:
                best[mode] = cell
    return best


# ---- profiling --------------------------------------------------------------------------------

def profile_cells(cluster, rig: PathwaysRig, cost: float, seconds: float) -> str:
    """py-spy (GIL-holding samples) of every cluster process while each mode runs."""
    report = []
    for mode in MODES:
        units = MIN_UNITS[mode] if mode == "OpByOp" else 1
        report += profiling.record(profiling.cluster_processes(cluster),
                                   lambda m=mode, u=units: rig.run(m, cost, u, 120), seconds,
                                   mode)
    return "\n".join(report)


# ---- reporting --------------------------------------------------------------------------------

def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _row(figure: str, cells: dict[str, Cell]) -> dict:
    mc = cells["MC"]
    row = {"Figure": figure, "Devices": f"{mc.hosts}x{mc.per_host}",
           "Cost/comp (ms)": f"{mc.cost * 1e3:g}", "Multi-controller /s": _rate(mc.rate)}
    for mode in MODES:
        row[f"{mode} /s"] = _rate(cells[mode].rate)
        row[f"{mode}/MC"] = f"{cells[mode].rate / mc.rate:.2f}"
    order = ("MC", *MODES)
    row["Util busy/wall MC,Op,Ch,Fu"] = ", ".join(f"{cells[m].occupied:.0%}" for m in order)
    row["Useful MC,Op,Ch,Fu"] = ", ".join(f"{cells[m].useful:.0%}" for m in order)
    return row


def _print_cells(cells: dict[str, Cell]) -> None:
    mc = cells["MC"]
    parts = [f"MC {_rate(mc.rate)}/s ({mc.computations} in {mc.wall:.2f} s, util "
             f"{mc.occupied:.0%})"]
    for mode in MODES:
        c = cells[mode]
        parts.append(f"{mode} {_rate(c.rate)}/s = {c.rate / mc.rate:.2f}x ({c.computations} in "
                     f"{c.wall:.2f} s, util {c.occupied:.0%})")
    print(f"  {mc.hosts}x{mc.per_host} cost {mc.cost * 1e3:g} ms: " + "; ".join(parts),
          flush=True)


def parity_cost(sweep: dict[float, dict[str, Cell]], mode: str) -> float | None:
    """The smallest swept cost from which on ``mode`` keeps >= PARITY of multi-controller."""
    best = None
    for cost in sorted(sweep, reverse=True):
        cells = sweep[cost]
        if cells[mode].rate / cells["MC"].rate < PARITY:
            break
        best = cost
    return best


def _ms(cost: float | None) -> str:
    return "none in the sweep" if cost is None else f"{cost * 1e3:g} ms"


def targets(fig5: dict[int, dict[str, Cell]], sweep: dict[float, dict[str, Cell]]):
    """(line, met) for each target."""
    ratio = {m: {c: cells[m].rate / cells["MC"].rate for c, cells in sweep.items()}
             for m in MODES}
    worst_chained = min(ratio["Chained"].values())
    op_parity = parity_cost(sweep, "OpByOp")
    fused_all = [cells["Fused"].rate / cells["MC"].rate
                 for cells in [*fig5.values(), *sweep.values()]]
    worst_fused = min(fused_all)
    out = [
        (f"Chained >= {TARGET_CHAINED:.0%} of multi-controller at every swept cost: worst "
         f"{worst_chained:.2f}x", worst_chained >= TARGET_CHAINED),
        (f"OpByOp within {PARITY:.0%} of multi-controller at a cost <= {TARGET_OPBYOP_MS:g} ms:"
         f" from {_ms(op_parity)}",
         op_parity is not None and op_parity <= TARGET_OPBYOP_MS / 1e3),
        (f"Fused >= multi-controller (every cell): worst {worst_fused:.2f}x",
         worst_fused >= TARGET_FUSED),
    ]
    return out


# ---- main -------------------------------------------------------------------------------------

def run_config(hosts: int, costs, budget: float, reps: int, profile: bool, security: dict,
               fetch: bool = False):
    """Start a Pathways cluster and a multi-controller job of ``hosts`` hosts; measure each
    cost (``fetch``: see ``PathwaysRig``). Returns ({cost: cells}, profile text or None)."""
    results, prof = {}, None
    with MultiController(hosts, PER_HOST) as mc:
        mc.run(64, 0.0)  # warm-up: connections between the hosts
        with pw.local_cluster(islands=1, hosts_per_island=hosts,
                              devices_per_host=PER_HOST, **security) as cluster:
            with pw.connect(cluster.address) as client:
                rig = PathwaysRig(client, hosts, fetch=fetch)
                for cost in costs:
                    results[cost] = measure_config(rig, mc, cost, budget, reps)
                    _print_cells(results[cost])
                if profile:
                    prof = profile_cells(cluster, rig, FIG5_COST, 6.0)
    return results, prof


def run_config_simulated(hosts: int, per_host: int, costs, budget: float, reps: int,
                         seed: int, fetch: bool = False) -> dict:
    """``run_config`` on the simulator: a simulated Pathways cluster and a simulated
    multi-controller job of ``hosts`` x ``per_host`` devices, cells in virtual seconds.
    Returns {cost: cells}."""
    results = {}
    with SimMultiController(hosts, per_host) as mc:
        with pw.local_cluster(islands=1, hosts_per_island=hosts, devices_per_host=per_host,
                              simulate=True, seed=seed, cpu="measured") as cluster:
            with pw.connect(cluster.address) as client:
                rig = PathwaysRig(client, hosts, per_host, cluster.clock, fetch)
                for cost in costs:
                    results[cost] = measure_config(rig, mc, cost, budget, reps)
                    _print_cells(results[cost])
    return results


def _parser(simulate: bool):
    ap = bench_parser(__doc__, SIM_QUICK_SIZES + " simulated, two costs, short cells"
                      if simulate else "1 and 2 hosts, two costs, short cells",
                      None if simulate else
                      "py-spy the cluster during each mode on the largest config")
    ap.add_argument("--simulate", action="store_true",
                    help="on the simulator, in virtual time (see the module's text)")
    ap.add_argument("--fetch", action="store_true",
                    help="Pathways cells fetch the value of every call's output (y.result()),"
                         " not only wait for the last to be ready")
    if simulate:
        ap.add_argument("--sizes", default=None,
                        help=f"hosts x devices per host, comma-separated (default {SIM_SIZES};"
                             f" {SIM_QUICK_SIZES} with --quick); the sweep runs on the largest")
        ap.add_argument("--seed", type=int, default=0, help="the simulations' seed")
        ap.sized("--budget", float, 0.01, 0.2, "virtual seconds per timed cell")
    else:
        ap.sized("--budget", float, 0.3, 0.8, "seconds per timed cell")
    ap.sized("--reps", int, 1, 2, "timed rounds per cost (best kept)")
    return ap


def _notes(args, simulate: bool, sweep_size, budget: float, reps: int, parity, checks,
           walls: dict, elapsed: float) -> str:
    sweep_label = f"{sweep_size[0]}x{sweep_size[1]}"
    if simulate:
        setup = (
            f"Simulated, in virtual time: a Pathways cluster (pw.local_cluster(simulate=True,"
            f" seed={args.seed}, cpu=\"measured\"): coordinator, hosts and this client as roles"
            f" of one discrete-event simulation) and the multi-controller"
            f" (bench/sim_multicontroller.py: one role per host running the user loop, one"
            f" call per handler, and the same host Executor/ExecutorEnv as a Pathways host,"
            f" values over a simulated ICI link, no coordinator; a simulation of its own)."
            f" Every role is a virtual CPU of its own charged the thread CPU time of its"
            f" handlers (one core per process, not this {os.cpu_count()}-core machine);"
            f" control and client messages take DCN time, ICI values none beyond the same"
            f" modelled cost incl. ICI time for both.")
        timing = (f" enough calls for ~{budget:g} virtual s (>= 1 chained run or fused call);"
                  f" rates per virtual second; measured CPU varies between runs. " + SIM_CPU)
    else:
        setup = (
            f"Hosts are processes of {PER_HOST} emulated devices"
            f" on one {os.cpu_count()}-core machine (a Pathways cluster: coordinator + hosts +"
            f" this client; the multi-controller: one process per host, bench/multicontroller.py,"
            f" same host Executor/ExecutorEnv/IciLink as a Pathways host, same modelled cost incl."
            f" ICI time, ZeroMQ tcp loopback, no coordinator).")
        timing = (f" enough calls for ~{budget:g} s (>= 1 chained run or fused call); results"
                  f" checked exactly. Util = devices' occupied time / wall (blocking"
                  f" in collectives and waiting for inputs count as occupied); Useful ="
                  f" computations/s x modelled cost. A shared 2-core machine: expect +-10-20%"
                  f" noise.")
    lines = [
        "Trivial computation: psum of a replicated float64 scalar over all devices, then +1,"
        " each output into the next input. " + setup,
        "OpByOp: N calls of step, then "
        + ("fetch every call's output" if args.fetch else "wait for the last")
        + f". Chained: one @pw.program of {CHAIN} calls, run repeatedly. Fused: one shard_map"
        f" looping {CHAIN}x psum+1, cost {CHAIN}x; counts {CHAIN} computations per call."
        f" Figure 5 rows use a modelled cost of {FIG5_COST * 1e3:g} ms (dispatch overhead"
        f" only); Figure 6 sweeps the cost per computation on {sweep_label} devices.",
        *(["Every result fetched (--fetch): each Pathways cell's client fetches the value of"
           " every call's output (y.result() on each OpByOp call's, each chained run's and"
           " each fused call's output, as [y.result() for y in ys]) within the timed cell,"
           " instead of waiting for the last to be ready; the multi-controller is unchanged"
           " (its values stay on its hosts, as in JAX)."] if args.fetch else []),
        f"Each cell: one warm-up, then the best of {reps} timed rounds (modes interleaved) of"
        + timing + (" Results checked exactly. Util = devices' occupied time / wall; Useful ="
                    " computations/s x modelled cost." if simulate else ""),
        "Parity (smallest swept cost from which on a mode keeps >= 95% of multi-controller): "
        + ", ".join(f"{m} {_ms(parity[m])}" for m in MODES)
        + " (the paper: 2.3 ms on 128 TPUs).",
        "Targets: " + "; ".join(f"{text}: {'met' if ok else 'MISSED'}" for text, ok in checks)
        + ".",
    ]
    if simulate:
        lines.append("Wall time of each configuration's simulations (both sides, every cost): "
                     + ", ".join(f"{h}x{d} {w:.0f} s" for (h, d), w in walls.items()) + ".")
    else:
        lines.append("Security: " + (
            "none (--insecure): plain tcp for both." if args.insecure else
            "CURVE (--curve) with one throw-away key pair for the Pathways cluster and the"
            " multi-controller alike, over tcp." if args.curve else
            "the default of local clusters for the Pathways cluster (Unix sockets in a"
            " private directory, no CURVE); plain loopback tcp for the multi-controller."))
    lines.append(f"Total bench time {elapsed:.0f} s.")
    return "\n".join(lines)


def main(argv=None) -> int:
    simulate = wants_simulation(argv)
    args = _parser(simulate).parse_args(argv)
    if simulate:
        sizes = parse_sizes(args.sizes or (SIM_QUICK_SIZES if args.quick else SIM_SIZES))
    else:
        sizes = [(h, PER_HOST) for h in ((1, 2) if args.quick else HOST_COUNTS)]
    sweep_costs = [ms / 1e3 for ms in ((0.1, 2.0) if args.quick else SWEEP_MS)]
    budget, reps = args.budget, args.reps
    started = time.perf_counter()

    fig5: dict[tuple, dict[str, Cell]] = {}
    sweep: dict[float, dict[str, Cell]] = {}
    walls: dict[tuple, float] = {}  # simulated: real seconds each configuration took
    profile_text = None
    sweep_size = max(sizes, key=lambda s: (s[0] * s[1], s[0]))
    security_setting = (contextlib.nullcontext({}) if simulate else
                        security_for_all(args.insecure, args.curve))
    with security_setting as security:
        for size in sizes:
            hosts, per_host = size
            print(f"{hosts} host(s) x {per_host} devices:", flush=True)
            costs = [FIG5_COST] + (sweep_costs if size == sweep_size else [])
            if simulate:
                t0 = time.perf_counter()
                results = run_config_simulated(hosts, per_host, costs, budget, reps, args.seed,
                                               args.fetch)
                prof = None
                walls[size] = time.perf_counter() - t0
                print(f"  {hosts}x{per_host}: simulated in {walls[size]:.1f} s", flush=True)
            else:
                results, prof = run_config(hosts, costs, budget, reps,
                                           args.profile and size == sweep_size, security,
                                           args.fetch)
            fig5[size] = results[FIG5_COST]
            if size == sweep_size:
                sweep = {c: results[c] for c in sweep_costs}
                profile_text = prof
    elapsed = time.perf_counter() - started

    rows = [_row("5", fig5[s]) for s in sizes]
    rows += [_row("6", sweep[c]) for c in sweep_costs]
    checks = targets(fig5, sweep)
    parity = {m: parity_cost(sweep, m) for m in MODES}
    notes = _notes(args, simulate, sweep_size, budget, reps, parity, checks, walls, elapsed)

    title = SIM_TITLE if simulate else TITLE
    publish(title, rows, notes, profile_text, append=not (args.quick or args.no_append))
    if args.plot:
        plot_sweep(args.plot, f"{title} ({sweep_size[0]}x{sweep_size[1]} devices)",
                   "modelled cost per computation (ms)", "throughput / multi-controller",
                   {m: [(c * 1e3, sweep[c][m].rate / sweep[c]["MC"].rate) for c in sweep_costs]
                    for m in MODES}, logx=True, target=0.95)
    return 0


if __name__ == "__main__":
    sys.exit(main())
