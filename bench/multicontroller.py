"""The "JAX multi-controller" baseline of the Pathways paper, on our own emulated TPUs.

In JAX's multi-controller model there is no coordinator: every host runs the same user
program, and each call of a compiled function is enqueued straight onto that host's local
devices, which run their kernels in program order; collectives meet over ICI. Here that is
built from the very pieces a Pathways host uses -- ``EmulatedDevice`` executors, a
``Rendezvous`` per host, ``LocalEnv`` kernel environments, the same modelled cost (body cost
plus ICI transfer time of the bytes sent off-host) and ZeroMQ over tcp loopback with Plaque's
wire framing. The two differ in how work reaches the devices (here: straight from the user
loop, no coordinator, no per-run messages or progress tracking) and in the host-to-host path
of collective contributions: here device threads send them directly, batched per destination
host, and a dedicated thread receives them, as the runtime of a multi-controller system would;
a Pathways host relays each one as its own Plaque message through its event loop
(``--no-batch`` sends one message per contribution here too, for comparison).

One process per host (multiprocessing, spawn), ``devices_per_host`` devices each; device ids
are global (``host * devices_per_host + k``) and flat mesh index = device id. Each process:

- binds one PULL socket; a receiver thread decodes batches of ``(key, src, dst, value)`` and
  delivers them into the host's Rendezvous;
- gives every device one PUSH socket per peer host. Through the LocalEnv ``send`` hook a device
  thread buffers its contributions per destination host, and sends each buffer as one message
  when it starts waiting for its own contributions (``collect``): one message per (device,
  peer host) per collective, not one per peer device;
- runs the user loop itself: after a barrier with the other hosts, ``for i in range(n)`` it
  enqueues, on each local device at the next sequence number, a kernel running ``body`` on the
  device's current value (kept on the device: the previous kernel's output), then waits for
  its devices to go idle.

Throughput is n / (latest device finish - earliest barrier exit), over all hosts (monotonic
clocks are system-wide on Linux); utilization is each device's busy time over that window.

Run: ``python bench/multicontroller.py --hosts 2 --n 2000 --cost 0.0005 [--no-batch]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np
import zmq

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script: make "bench" importable in spawned children too
    sys.path.insert(0, _ROOT)

from pathways import cost as cost_model  # noqa: E402
from pathways import host as pathways_host  # noqa: E402
from pathways.collectives import LocalEnv, Rendezvous, kernel_env, psum  # noqa: E402
from pathways.device import EmulatedDevice  # noqa: E402
from plaque import wire  # noqa: E402

AXIS = "d"
START_TIMEOUT = 60.0  # seconds for a host process to start, bind and connect
BARRIER_TIMEOUT = 60.0


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
    in the same order as psum (position 0 first), so equality is exact."""
    x = np.float64(x0)
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(steps):
            total = x
            for _ in range(devices - 1):
                total = total + x
            x = total + np.float64(1.0)
    return float(x)


# ---- inside a host process --------------------------------------------------------------------

class _OutboxRendezvous(Rendezvous):
    """A Rendezvous whose remote sends are buffered per (source device, destination host) and
    leave, one message per host, when the source device starts to collect."""

    def __init__(self, host: int, per_host: int, push: dict[int, dict[int, zmq.Socket]],
                 batch: bool = True):
        super().__init__()
        self.host, self.per_host, self.push, self.batch = host, per_host, push, batch
        self._outbox: dict[int, dict[int, list]] = {d: {} for d in push}

    def send(self, dst_device, key, src_device, value) -> None:
        """The LocalEnv ``send`` hook; runs on ``src_device``'s thread only."""
        if not self.batch:  # one message per contribution (the ablation)
            item = [(key, src_device, dst_device, value)]
            self.push[src_device][dst_device // self.per_host].send_multipart(
                wire.encode(wire.Kind.USER, self.host, item), copy=False)
            return
        box = self._outbox[src_device]
        items = box.get(dst_device // self.per_host)
        if items is None:
            items = box[dst_device // self.per_host] = []
        items.append((key, src_device, dst_device, value))

    def collect(self, key, dst, sources, timeout):
        box = self._outbox.get(dst)
        if box:
            socks = self.push[dst]
            for peer, items in box.items():
                socks[peer].send_multipart(wire.encode(wire.Kind.USER, self.host, items),
                                           copy=False)
            box.clear()
        return super().collect(key, dst, sources, timeout)


class _StepKernel:
    """One call of the step function on one device: reads the device's current value, runs
    the body, and makes the output the device's current value when the device is done."""

    __slots__ = ("node", "device_id", "gang", "body", "cost", "name", "labels", "_out")

    def __init__(self, node: _HostNode, device_id: int, gang, body, cost: float):
        self.node, self.device_id, self.gang = node, device_id, gang
        self.body, self.cost = body, cost
        self.name = body.__name__
        self.labels = {"gang": gang}
        self._out = None

    def execute(self, device) -> float:
        node = self.node
        env = LocalEnv(node.mesh_shape, (AXIS,), self.device_id, node.flat_devices, self.gang,
                       node.rendezvous, send=node.rendezvous.send, is_local=node.is_local)
        with kernel_env(env):
            self._out = self.body(node.values[self.device_id])
        remote = env.bytes_sent_remote
        return self.cost + (cost_model.transfer_time(remote, cost_model.ICI) if remote else 0.0)

    def on_done(self) -> None:
        node = self.node
        node.values[self.device_id] = self._out
        node.finished_at[self.device_id] = time.monotonic()

    def on_error(self, exc) -> None:
        node = self.node
        if node.error is None:
            node.error = f"device {self.device_id} gang {self.gang}: {exc!r}"
        node.rendezvous.abort(f"device {self.device_id} failed: {exc!r}")


class _HostNode:
    """One emulated host of the multi-controller job: its devices, sockets and receiver."""

    def __init__(self, host: int, hosts: int, per_host: int, ctx: zmq.Context,
                 pull: zmq.Socket, peer_addresses: list[str], batch: bool):
        self.host, self.per_host = host, per_host
        self.mesh_shape = (hosts * per_host,)
        self.flat_devices = {i: i for i in range(hosts * per_host)}
        self.local = range(host * per_host, (host + 1) * per_host)
        push: dict[int, dict[int, zmq.Socket]] = {}
        for d in self.local:
            push[d] = {}
            for peer, address in enumerate(peer_addresses):
                if peer != host:
                    s = ctx.socket(zmq.PUSH)
                    s.setsockopt(zmq.LINGER, 0)
                    s.setsockopt(zmq.SNDHWM, 100_000)
                    s.connect(address)
                    push[d][peer] = s
        self.sockets = [s for per_peer in push.values() for s in per_peer.values()]
        self.rendezvous = _OutboxRendezvous(host, per_host, push, batch)
        self.devices = {d: EmulatedDevice(d, name=f"mc-tpu{d}") for d in self.local}
        self.values = {d: np.zeros(()) for d in self.local}
        self.finished_at = {d: 0.0 for d in self.local}
        self.next_seq = 0
        self.error: str | None = None
        self._pull = pull
        self._stop = threading.Event()
        self._receiver = threading.Thread(target=self._receive, name="mc-receiver", daemon=True)
        self._receiver.start()

    def is_local(self, device) -> bool:
        return device in self.devices

    def _receive(self) -> None:
        pull, deliver = self._pull, self.rendezvous.deliver
        pull.setsockopt(zmq.RCVTIMEO, 100)
        while not self._stop.is_set():
            try:
                frames = pull.recv_multipart()
            except zmq.Again:
                continue
            for key, src, dst, value in wire.decode(frames)[2]:
                deliver(key, src, dst, value)

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
                dev.enqueue(seq, _StepKernel(self, d, gang, body, cost))
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
        self._stop.set()
        for dev in self.devices.values():
            dev.close(timeout=1.0)
        self._receiver.join(2.0)
        for s in self.sockets:
            s.close(0)


def _host_main(conn, barrier, host: int, hosts: int, per_host: int, batch: bool) -> None:
    """A host process: bind, learn the peers, then serve run requests from the parent."""
    # Same interpreter setting as a Pathways host (device threads and the receiver hand the
    # GIL to each other constantly), whatever pathways.host currently chooses.
    sys.setswitchinterval(getattr(pathways_host, "SWITCH_INTERVAL", sys.getswitchinterval()))
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.setsockopt(zmq.RCVHWM, 100_000)
    pull.bind_to_random_port("tcp://127.0.0.1")
    node = None
    try:
        conn.send(("bound", pull.getsockopt_string(zmq.LAST_ENDPOINT)))
        if not conn.poll(START_TIMEOUT):
            return
        node = _HostNode(host, hosts, per_host, ctx, pull, conn.recv(), batch)
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
        pull.close(0)
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


class MultiController:
    """``hosts`` processes ready to run the trivial computation; use as a context manager."""

    def __init__(self, hosts: int, devices_per_host: int = 4, batch: bool = True):
        self.hosts, self.per_host, self.batch = hosts, devices_per_host, batch
        ctx = mp.get_context("spawn")
        self._barrier = ctx.Barrier(hosts)
        self._conns, self.processes = [], []
        self._runs = 0
        try:
            for h in range(hosts):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_host_main, name=f"mc-host{h}", daemon=True,
                                args=(child, self._barrier, h, hosts, devices_per_host, batch))
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
        end = max(r["end"] for r in results)
        busy = {d: b for r in results for d, b in r["busy"].items()}
        values = {d: v for r in results for d, v in r["values"].items()}
        devices = self.hosts * self.per_host
        want = expected_value(devices, n * steps, x0)
        wrong = {d: v for d, v in values.items() if v != want}
        if wrong:
            raise AssertionError(f"multi-controller results differ from {want}: {wrong}")
        return McResult(self.hosts, devices, n, cost, end - start, busy, values)

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
    ap.add_argument("--no-batch", action="store_true",
                    help="send each collective contribution as its own message")
    args = ap.parse_args(argv)
    with MultiController(args.hosts, args.devices_per_host, batch=not args.no_batch) as mc:
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
