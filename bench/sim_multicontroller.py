"""The multi-controller baseline on the simulator: bench/multicontroller.py in virtual time.

``bench.multicontroller`` runs one process per host, each running the user loop ``x = step(x)``
on its own devices with no coordinator. ``SimMultiController`` runs the same job as roles of
one discrete-event simulation (``pathways.sim``), so that it can be compared with a simulated
Pathways cluster (``pw.local_cluster(simulate=True)``) on equal terms:

- each host is one role (``RoleLoop``: its own virtual CPU, charged the thread CPU time each
  of its handlers uses) with the host's ``Executor`` (the same as a Pathways host's, on a
  ``Clock`` that is the role's own, driven by the role's loop as a simulated Pathways host's
  is) and a ``SimIciLink`` to the other hosts over a ``SimNet`` at no network time: the
  kernel's modelled cost books its ICI time, as on a simulated Pathways cluster;
- the kernels are ``bench.multicontroller``'s: the same body under the same ``ExecutorEnv``,
  the previous kernel's output kept on the device;
- the user loop shares its host's CPU with the executor, as the user thread and the executor
  thread of a real host share its GIL: each call of ``step`` (one kernel per local device) is
  a handler of its own, so the executor's turns take turns with the dispatching;
- every host starts its loop at the same virtual time (the barrier costs nothing here).

Throughput, utilization and the exact check are ``MultiController.run``'s: n / (latest device
finish - start), each device's busy time over that window, every device's final value equal
to ``expected_value``. Times are virtual seconds (``clock()``).
"""

from __future__ import annotations

import asyncio

import numpy as np

from bench.multicontroller import McResult, StepKernel, checked, trivial_body
from pathways.host.clock import Clock
from pathways.host.executor import Executor
from pathways.sim import RoleLoop, SimNet, VirtualTimeLoop
from pathways.simulated.sockets import SimIciLink

__all__ = ["SimMultiController"]


class _SimStepKernel(StepKernel):
    """``StepKernel`` whose finish is read on the host's virtual clock."""

    __slots__ = ()

    def on_done(self, finish) -> None:
        node = self.node
        node.values[self.device_id] = self._out
        node.finished_at[self.device_id] = node.executor.now()
        node.kernel_done()

    def on_error(self, exc) -> None:
        super().on_error(exc)
        self.node.kernel_done()


class _SimHost:
    """One host of the job: its role, ICI link, executor and devices, and its user loop."""

    def __init__(self, host: int, hosts: int, per_host: int, loop, net, cpu: str | None):
        self.host, self.per_host = host, per_host
        self.mesh_shape = (hosts * per_host,)
        self.flat_devices = {i: i for i in range(hosts * per_host)}
        self.local = range(host * per_host, (host + 1) * per_host)
        worker_of = {d: d // per_host for d in range(hosts * per_host)}
        self.role = RoleLoop(loop, f"mc-host-{host}", cpu)
        self.link = SimIciLink(net, self.role, f"mc-host-{host}/ici", worker_of)
        self.executor = Executor(f"mc-host{host}", link=self.link,
                                 clock=Clock(self.role.now, on_loop=True), kernel_limit=None)
        self.link.on_arrival = self.executor.wake
        self.devices = {d: self.executor.add_device(d, name=f"mc-tpu{d}") for d in self.local}
        self.executor.run_on(self.role)
        self.values = {d: np.zeros(()) for d in self.local}
        self.finished_at = {d: 0.0 for d in self.local}
        self.next_seq = 0
        self.error: str | None = None
        self.busy0: dict[int, float] = {}  # busy seconds of each device when the run began
        self.remaining = 0  # kernels of the current run not finished yet
        self.on_finished = None  # called when ``remaining`` reaches 0

    def start(self, at: float, run_no: int, n: int, cost: float, steps: int, x0: float,
              on_finished) -> None:
        """Run ``n`` calls from virtual time ``at``; ``on_finished()`` when all are done."""
        body = trivial_body(steps)
        self.error = None
        for d in self.local:
            self.values[d] = np.asarray(x0, dtype=np.float64)
        self.busy0 = {d: dev.busy_seconds for d, dev in self.devices.items()}
        self.remaining, self.on_finished = n * len(self.devices), on_finished
        seq0 = self.next_seq
        self.next_seq += n

        def step(i: int) -> None:  # one call of the user loop: x = step(x) on every device
            gang = (run_no, i)
            for d, dev in self.devices.items():
                dev.enqueue(seq0 + i, _SimStepKernel(self, d, gang, body, cost))
            if i + 1 < n:
                self.role.call_soon(step, i + 1)

        if n:
            self.role.call_at(at, step, 0)
        else:
            on_finished()

    def kernel_done(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.on_finished()

    def result(self) -> dict:
        return {"end": max(self.finished_at.values()),
                "busy": {d: dev.busy_seconds - self.busy0[d]
                         for d, dev in self.devices.items()},
                "values": {d: float(v) for d, v in self.values.items()}}

    def close(self) -> None:
        self.executor.close()
        self.link.close()


class SimMultiController:
    """``hosts`` simulated hosts of ``devices_per_host`` devices ready to run the trivial
    computation (see the module's text); ``MultiController``'s ``run`` and ``close``, times
    in virtual seconds. ``cpu``: how a handler is charged (``pathways.sim.roles``)."""

    def __init__(self, hosts: int, devices_per_host: int = 4, cpu: str | None = "measured"):
        self.hosts, self.per_host = hosts, devices_per_host
        self.loop = VirtualTimeLoop()
        self.net = SimNet(self.loop)  # ICI only: no network time (the kernels' cost has it)
        self.nodes = [_SimHost(h, hosts, devices_per_host, self.loop, self.net, cpu)
                      for h in range(hosts)]
        addresses = dict(enumerate(node.link.address for node in self.nodes))
        for node in self.nodes:
            node.link.peers = addresses
        self._runs = 0

    def clock(self) -> float:
        """Virtual seconds since the job started."""
        return self.loop.time()

    @property
    def roles(self) -> dict[str, RoleLoop]:
        return {node.role.name: node.role for node in self.nodes}

    def run(self, n: int, cost: float, steps: int = 1, x0: float = 0.0,
            timeout: float | None = None) -> McResult:
        """Every host runs ``x = step(x)`` ``n`` times (each step ``steps`` psum+1 of modelled
        ``cost`` seconds in all) until its devices are done (``timeout``: virtual seconds);
        checks every device's result."""
        if timeout is None:
            timeout = 60.0 + 3.0 * n * cost
        self._runs += 1
        done = self.loop.create_future()
        left = [len(self.nodes)]

        def host_finished() -> None:
            left[0] -= 1
            if left[0] == 0 and not done.done():
                done.set_result(None)

        start = self.loop.time()
        for node in self.nodes:
            node.start(start, self._runs, n, cost, steps, x0, host_finished)
        try:
            self.loop.run_until_complete(asyncio.wait_for(asyncio.shield(done), timeout))
        except TimeoutError:
            raise TimeoutError(f"simulated multi-controller: {n} calls not done after"
                               f" {timeout:g} virtual s") from None
        errors = [node.error for node in self.nodes if node.error is not None]
        if errors:
            raise RuntimeError(f"simulated multi-controller: {errors[0]}")
        results = [node.result() for node in self.nodes]
        return checked(results, self.hosts, self.per_host, n, cost, steps, x0, start)

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.loop.close()

    def __enter__(self) -> SimMultiController:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
