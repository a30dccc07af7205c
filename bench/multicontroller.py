"""The "JAX multi-controller" baseline of the Pathways paper, on our own emulated TPUs.

In JAX's multi-controller model there is no coordinator: every host runs the same user
program, and each call of a compiled function is enqueued straight onto that host's local
devices, which run their kernels in program order; collectives meet over ICI. Here that is
built from exactly the pieces a Pathways host runs its kernels with: one
``pathways.host.executor.Executor`` per host owning all of the host's ``EmulatedDevice`` records
(one thread, every device a timeline in virtual time, bodies in greenlets that park at
collectives), ``ExecutorEnv`` kernel environments, the host's ``pathways.host.ici.IciLink`` for
collective values bound for other hosts, and the same modelled cost (body cost plus ICI
transfer time of the bytes sent off-host). So the two systems share the executor and the
whole collective path, and a benchmark ratio compares only how work reaches the devices:
here straight from the user loop, with no coordinator, no per-run messages, no object store
and no progress tracking.

One process per host (multiprocessing, spawn), ``devices_per_host`` devices each; device ids
are global (``host * devices_per_host + k``) and flat mesh index = device id. Each process:

- makes an ``IciLink`` (its own PULL socket; ``worker_of`` maps every device id to its host
  index) and an ``Executor`` with that link, which owns the host's devices
  (``add_device(d, name=f"mc-tpu{d}")``); the processes exchange their links' addresses
  through the parent and fill in ``link.peers`` (host index -> ICI address). The process
  has two threads, its main one (the user loop) and the executor's: no per-device threads,
  no receiver. The executor thread reads the link's PULL socket itself, and sends what
  its devices contribute to a collective as one message per peer host per executor turn
  (a value for several devices of a host travels once). The former ``--no-batch`` option
  (one message per contribution) is gone: the executor always batches this way, as it does
  on a Pathways host;
- runs the user loop itself: after a barrier with the other hosts, ``for i in range(n)`` it
  enqueues, on each local device at the next sequence number, a kernel running ``body`` on
  the device's current value (kept on the device: the previous kernel's output) under an
  ``ExecutorEnv`` with gang key ``(run number, i)``, then waits for its devices to go idle.
  A failing kernel aborts its gang on its own host's executor (the peers' exchanges of that
  gang then time out: there is nobody to tell them, as in a multi-controller job).

Throughput is n / (latest device finish - earliest barrier exit), over all hosts (monotonic
clocks are system-wide on Linux; a device "finishes" when its last kernel's output is
published, i.e. when real time reaches the kernel's modelled end); utilization is each
device's busy (virtual) time over that window.

Run: ``python -m bench.multicontroller --hosts 2 --n 2000 --cost 0.0005``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np
import zmq

from pathways.host import process as pathways_host
from pathways.host.device import DeviceWork
from pathways.host.exchange import ExecutorEnv
from pathways.host.executor import Executor
from pathways.host.ici import IciLink
from pathways.program import cost as cost_model
from pathways.program.collectives import kernel_env, psum
from pathways.program.reduction import tree_fold
from plaque import security

AXIS = "d"
START_TIMEOUT = 60.0  # seconds for a host process to start, bind and connect
BARRIER_TIMEOUT = 60.0
ICI_BIND = "tcp://127.0.0.1"  # where each host's IciLink binds its PULL socket


def trivial_body(steps: int = 1):
    """The paper's trivial computation: psum of a scalar over all devices, then add 1.

    ``steps`` > 1 repeats it inside one kernel (the "Fused" variant). The value grows 16x per
    step on 16 devices and soon overflows to inf: harmless for a throughput test, so the
    warning is silenced. Built as a closure so cloudpickle ships it to Pathways hosts by value.
    """
    def body(x):
        with np.errstate(over="ignore", invalid="ignore"):
            for _ in range(steps):
                x = psum(x, AXIS) + 1.0
        return x

    body.__name__ = "trivial" if steps == 1 else f"trivial_x{steps}"
    return body


def expected_value(devices: int, steps: int, x0: float = 0.0) -> float:
    """The trivial computation's result after ``steps`` steps, with the same float additions
    in the same order as psum (along the reduction tree), so equality is exact."""
    x = np.float64(x0)
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(steps):
            x = tree_fold([x] * devices, np.add) + np.float64(1.0)
    return float(x)


# ---- inside a host process --------------------------------------------------------------------

class StepKernel(DeviceWork):
    """One call of the step function on one device: reads the device's current value, runs
    the body, and makes the output the device's current value when the device is done."""

    __slots__ = ("node", "device_id", "gang", "body", "cost", "name", "labels", "_out")

    def __init__(self, node: _HostNode, device_id: int, gang: tuple, body, cost: float):
        self.node, self.device_id, self.gang = node, device_id, gang
        self.body, self.cost = body, cost
        self.name = body.__name__
        self.labels = {"gang": gang}
        self._out = None

    def execute(self, device) -> float:
        """On the executor thread, in the shard's greenlet (``device.current`` is the shard)."""
        node = self.node
        env = ExecutorEnv(node.mesh_shape, (AXIS,), self.device_id, node.flat_devices,
                          self.gang, node.executor, device.current)
        with kernel_env(env):
            self._out = self.body(node.values[self.device_id])
        remote = env.bytes_sent_remote
        return self.cost + env.link_seconds + (
            cost_model.transfer_time(remote, cost_model.ICI) if remote else 0.0)

    def on_done(self, finish) -> None:
        node = self.node
        node.values[self.device_id] = self._out
        node.finished_at[self.device_id] = time.monotonic()

    def on_error(self, exc) -> None:
        node = self.node
        if node.error is None:
            node.error = f"device {self.device_id} gang {self.gang}: {exc!r}"
        node.executor.abort_gang(self.gang, f"device {self.device_id} failed: {exc!r}")


class _HostNode:
    """One emulated host of the multi-controller job: its ICI link and its executor, which
    owns the host's devices (``connect`` gives the link its peers and starts the executor)."""

    def __init__(self, host: int, hosts: int, per_host: int, ctx: zmq.Context):
        self.host, self.per_host = host, per_host
        self.mesh_shape = (hosts * per_host,)
        self.flat_devices = {i: i for i in range(hosts * per_host)}
        self.local = range(host * per_host, (host + 1) * per_host)
        worker_of = {d: d // per_host for d in range(hosts * per_host)}
        self.link = IciLink(ctx, ICI_BIND, worker_of)
        self.executor = Executor(f"mc-host{host}", link=self.link)
        self.devices = {d: self.executor.add_device(d, name=f"mc-tpu{d}") for d in self.local}
        self.values = {d: np.zeros(()) for d in self.local}
        self.finished_at = {d: 0.0 for d in self.local}
        self.next_seq = 0
        self.error: str | None = None

    def connect(self, addresses: list[str]) -> None:
        """``addresses[h]``: host ``h``'s ICI address; then start running kernels."""
        self.link.peers = dict(enumerate(addresses))
        self.executor.start()

    def run(self, barrier, run_no: int, n: int, cost: float, steps: int, x0: float,
            timeout: float) -> dict:
        """One timed run of ``n`` calls; returns start, finish, busy seconds and values."""
        body = trivial_body(steps)
        self.error = None
        for d in self.local:
            self.values[d] = np.asarray(x0, dtype=np.float64)
        busy0 = {d: dev.busy_seconds for d, dev in self.devices.items()}
        barrier.wait(BARRIER_TIMEOUT)
        start = time.monotonic()
        devices = list(self.devices.items())
        seq = self.next_seq
        for i in range(n):  # the user loop: x = step(x), dispatched to the local devices
            gang = (run_no, i)
            for d, dev in devices:
                dev.enqueue(seq, StepKernel(self, d, gang, body, cost))
            seq += 1
        self.next_seq = seq
        deadline = time.monotonic() + timeout
        for dev in self.devices.values():
            if not dev.wait_idle(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"host {self.host}: devices not idle after {timeout:.0f} s")
        if self.error is not None:
            raise RuntimeError(self.error)
        return {"start": start, "end": max(self.finished_at.values()),
                "busy": {d: dev.busy_seconds - busy0[d] for d, dev in self.devices.items()},
                "values": {d: float(v) for d, v in self.values.items()}}

    def close(self) -> None:
        """Stop the executor (its thread uses the link), then close the link."""
        if not self.executor.close(timeout=2.0):
            print(f"mc-host{self.host}: executor thread still running at close",
                  file=sys.stderr, flush=True)
        self.link.close()


def _host_main(conn, barrier, host: int, hosts: int, per_host: int) -> None:
    """A host process: bind, learn the peers, then serve run requests from the parent."""
    # Same interpreter setting as a Pathways host (the user loop and the executor thread hand
    # the GIL to each other constantly), whatever pathways.host.process currently chooses.
    sys.setswitchinterval(getattr(pathways_host, "SWITCH_INTERVAL", sys.getswitchinterval()))
    ctx = zmq.Context()
    node = None
    try:
        node = _HostNode(host, hosts, per_host, ctx)
        conn.send(("bound", node.link.address))
        if not conn.poll(START_TIMEOUT):
            return
        node.connect(conn.recv())
        conn.send(("ready", os.getpid()))
        while conn.poll(3600):
            msg = conn.recv()
            if msg[0] != "run":
                break
            try:
                conn.send(("result", node.run(barrier, *msg[1:])))
            except Exception:
                barrier.abort()
                conn.send(("error", traceback.format_exc()))
    except (EOFError, BrokenPipeError):
        pass  # the parent is gone
    finally:
        if node is not None:
            node.close()
        security.release(ctx)  # its CURVE authenticator, if any (ctx.term() would wait for it)
        ctx.term()


# ---- the parent's side ------------------------------------------------------------------------

@dataclass
class McResult:
    hosts: int
    devices: int
    computations: int
    cost: float
    wall: float
    busy: dict  # device -> busy seconds during the run
    values: dict  # device -> final value

    @property
    def rate(self) -> float:
        """Computations per second."""
        return self.computations / self.wall

    @property
    def utilization(self) -> float:
        """Mean over devices of busy time / wall time."""
        return sum(self.busy.values()) / len(self.busy) / self.wall


def checked(results: list[dict], hosts: int, per_host: int, n: int, cost: float, steps: int,
            x0: float, start: float) -> McResult:
    """The hosts' ``results`` of ``n`` calls from ``start`` as one ``McResult``, every
    device's value checked against the exact recurrence (``AssertionError`` if one
    differs)."""
    end = max(r["end"] for r in results)
    busy = {d: b for r in results for d, b in r["busy"].items()}
    values = {d: v for r in results for d, v in r["values"].items()}
    devices = hosts * per_host
    want = expected_value(devices, n * steps, x0)
    wrong = {d: v for d, v in values.items() if v != want}
    if wrong:
        raise AssertionError(f"multi-controller results differ from {want}: {wrong}")
    return McResult(hosts, devices, n, cost, end - start, busy, values)


class MultiController:
    """``hosts`` processes ready to run the trivial computation; use as a context manager."""

    def __init__(self, hosts: int, devices_per_host: int = 4):
        self.hosts, self.per_host = hosts, devices_per_host
        ctx = mp.get_context("spawn")
        self._barrier = ctx.Barrier(hosts)
        self._conns, self.processes = [], []
        self._runs = 0
        try:
            for h in range(hosts):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_host_main, name=f"mc-host{h}", daemon=True,
                                args=(child, self._barrier, h, hosts, devices_per_host))
                p.start()
                child.close()
                self._conns.append(parent)
                self.processes.append(p)
            addresses = [self._expect(c, "bound", START_TIMEOUT) for c in self._conns]
            for c in self._conns:
                c.send(addresses)
            self.pids = [self._expect(c, "ready", START_TIMEOUT) for c in self._conns]
        except BaseException:
            self.close()
            raise

    def clock(self) -> float:
        """Seconds to time its runs with from outside: real ones (``SimMultiController``'s
        are virtual)."""
        return time.perf_counter()

    def _expect(self, conn, kind: str, timeout: float):
        try:
            if not conn.poll(timeout):
                raise TimeoutError(f"a multi-controller host sent no {kind!r} within "
                                   f"{timeout:.0f} s")
            msg = conn.recv()
        except EOFError:
            codes = [p.exitcode for p in self.processes]
            raise RuntimeError(f"a multi-controller host process died (exit codes {codes})"
                               ) from None
        if msg[0] == "error":
            raise RuntimeError(f"multi-controller host failed:\n{msg[1]}")
        if msg[0] != kind:
            raise RuntimeError(f"expected {kind!r} from a multi-controller host, got {msg[0]!r}")
        return msg[1]

    def run(self, n: int, cost: float, steps: int = 1, x0: float = 0.0,
            timeout: float | None = None) -> McResult:
        """Every host runs ``x = step(x)`` ``n`` times (each step ``steps`` psum+1 of modelled
        ``cost`` seconds in all) and waits for its devices; checks every device's result."""
        if timeout is None:
            timeout = 60.0 + 3.0 * n * cost
        self._runs += 1
        for c in self._conns:
            c.send(("run", self._runs, n, cost, steps, x0, timeout))
        results = [self._expect(c, "result", timeout + BARRIER_TIMEOUT + 10) for c in self._conns]
        start = min(r["start"] for r in results)
        return checked(results, self.hosts, self.per_host, n, cost, steps, x0, start)

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(("stop",))
            except (OSError, ValueError):
                pass
        for p in self.processes:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self._conns:
            c.close()

    def __enter__(self) -> MultiController:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--devices-per-host", type=int, default=4)
    ap.add_argument("--n", type=int, default=2000, help="computations per run")
    ap.add_argument("--cost", type=float, default=0.0, help="modelled seconds per computation")
    ap.add_argument("--steps", type=int, default=1, help="psum+1 steps inside one kernel")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    with MultiController(args.hosts, args.devices_per_host) as mc:
        mc.run(min(args.n, 100), args.cost, args.steps)  # warm-up: connections, first calls
        for _ in range(args.reps):
            r = mc.run(args.n, args.cost, args.steps)
            print(f"{args.hosts} hosts x {args.devices_per_host} devices, cost "
                  f"{args.cost * 1e3:g} ms: {r.rate * args.steps:,.0f} computations/s "
                  f"({r.wall:.3f} s for {args.n} x {args.steps}), "
                  f"utilization {r.utilization:.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
