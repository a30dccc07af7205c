"""What starts a host: ``serve_host`` joins the coordinator's Plaque cluster and serves until
it is stopped or lost.

It asks the coordinator where its Plaque cluster listens, makes the ``Host`` (devices,
executor, object store) with its ICI link, runs the executor on the process's event loop (one
thread for Plaque, the data service and the devices), and hands the Plaque worker the host's
operator table (``pathways.host.operators``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import sys

import zmq

import plaque
from plaque import security
from plaque.endpoint import serve_worker_core
from plaque.transport import InprocTransport
from plaque.worker import WorkerCore
from plaque.zmq_transport import ZmqTransport, context_for

from .. import protocol
from ..errors import PathwaysError
from ..lowering.specs import OPERATORS_SERVICE
from ..program import jax_body
from ..program.cost import BACKENDS, DeviceSpec
from ..service import RouterService
from .clock import MONOTONIC, Clock
from .data_service import DataService
from .executor import KERNEL_LIMIT
from .host import Host
from .ici import IciLink
from .operators import operator_table

__all__ = ["build_host", "jax_devices", "serve_host", "SWITCH_INTERVAL"]

SWITCH_INTERVAL = 0.0005


def _coordinator_info(address: str, ctx: zmq.Context, timeout: float = 30.0) -> dict:
    """Ask the coordinator where its Plaque cluster listens."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    security.connect(s, address)
    try:
        s.send_multipart(protocol.pack(protocol.Info(0)))
        reply = protocol.unpack(s.recv_multipart())
    except zmq.Again:
        raise plaque.CoordinatorLost(f"no coordinator answered at {address}") from None
    finally:
        s.close(0)
    if not isinstance(reply, protocol.Answer) or not isinstance(reply.value, dict):
        raise plaque.ProtocolError(f"the coordinator at {address} answered {reply!r}")
    return reply.value


def build_host(island: int, num_devices: int, spec: DeviceSpec | None,
               kernel_limit: float | None, loop, *, link, serve, address: str, plaque: str,
               coordinator_timeout: float, clock: Clock = MONOTONIC,
               hostname: str | None = None,
               jax_devices: list | None = None) -> tuple[Host, DataService, WorkerCore]:
    """A host wired to run on ``loop``'s thread: the ``Host`` (its devices' executor runs on
    the loop), its ICI link (``link(worker_of)``), its data service (``serve(handle)`` makes
    its socket, started here) and the Plaque ``WorkerCore`` (at transport ``address``, joining
    the Plaque coordinator at ``plaque``) whose operators are the host's, not yet started.
    ``serve_host`` gives it ZeroMQ sockets and real time; a simulated cluster its own
    sockets, virtual time (``clock``) and a ``hostname`` of its own (then no pid: it is no
    process). ``jax_devices``: its devices' own JAX devices (``--backend jax``), or None."""
    host = Host(island, num_devices, spec, kernel_limit, clock, jax_devices)
    host.loop = loop
    host.ici = host.executor.link = link(host.worker_of)
    host.executor.run_on(loop)  # one thread: the loop runs the devices too
    data = DataService(host, serve)
    core = WorkerCore(address, plaque,
                      info={"role": "host", "island": island, "devices": num_devices,
                            "data": data.address, "ici": host.ici.address,
                            "pid": os.getpid() if hostname is None else None,
                            "hostname": hostname or socket.gethostname(), "spec": host.spec},
                      coordinator_timeout=coordinator_timeout,
                      services={OPERATORS_SERVICE: operator_table(host)})
    core.on_user = host.on_user
    host.core = core
    data.start(loop)
    return host, data, core


def jax_devices(num_devices: int, spec: DeviceSpec) -> tuple[list, DeviceSpec]:
    """The devices of a host whose devices are JAX's own (``--backend jax``): this process's
    ``jax.local_devices()`` (GPUs or TPUs where there are, else ``num_devices`` XLA CPU
    devices), and their spec: real (kernels take their real time), of their kind, with the
    HBM their memory statistics give (``spec``'s where they give none, as on CPU).
    PathwaysError if there are not ``num_devices`` of them."""
    jax = jax_body.require()
    local = jax.local_devices()
    if len(local) != num_devices:
        raise PathwaysError(
            f"--devices {num_devices}, but JAX has {len(local)} local"
            f" {local[0].platform if local else ''} device(s) in this process: give --devices"
            f" {len(local)}, or make {num_devices} visible to it (CUDA_VISIBLE_DEVICES for"
            " GPUs)")
    stats = local[0].memory_stats() or {}
    hbm = int(stats.get("bytes_limit") or spec.hbm_bytes)
    kind = str(getattr(local[0], "device_kind", "") or local[0].platform)
    return local, dataclasses.replace(spec, hbm_bytes=hbm, kind=kind, real=True)


async def serve_host(coordinator: str, island: int, num_devices: int, bind: str,
                     spec: DeviceSpec | None = None, coordinator_timeout: float = 10.0,
                     kernel_limit: float | None = KERNEL_LIMIT,
                     backend: str = "emulated") -> str:
    """Serve a host until the coordinator stops it (or it is lost); returns why it stopped.

    A coordinator at an ``inproc://`` address is the in-process twin's: the host then runs
    in a thread of that process, on its Plaque in-process transport and ``inproc://``
    sockets (``bind`` should be ``inproc://``), and leaves JAX's process-wide settings alone.
    ``backend``: "emulated" (modelled devices) or "jax" (JAX's local devices, ``jax_devices``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    loop = asyncio.get_running_loop()
    # Threads and the event loop take turns on the GIL; Python's default 5 ms switch
    # interval would add up to 5 ms to every hand-off between them (a dispatch arriving, a
    # kernel finishing), so hand over far more often.
    sys.setswitchinterval(SWITCH_INTERVAL)
    in_process = security.in_process(coordinator)
    if in_process and backend != "emulated":
        raise ValueError("an in-process host is emulated: backend='jax' runs hosts as"
                         " processes, each with its own JAX devices")
    local = None
    if not in_process:
        jax_body.on_host(cpu_devices=num_devices if backend == "jax" else None)
    if backend == "jax":
        local, spec = jax_devices(num_devices, spec or DeviceSpec())
    ctx, own_ctx = context_for(coordinator)
    info = await loop.run_in_executor(None, _coordinator_info, coordinator, ctx)
    transport = InprocTransport() if in_process else ZmqTransport(bind, context=ctx)
    host, data, core = build_host(
        island, num_devices, spec, kernel_limit, loop,
        link=lambda worker_of: IciLink(ctx, bind, worker_of),
        serve=lambda handle: RouterService(ctx, bind, handle),
        address=transport.address, plaque=info["plaque"],
        coordinator_timeout=coordinator_timeout, jax_devices=local)
    try:
        # the moment the core exits (coordinator lost or stopping), the queued kernels are
        # dropped, not run: nobody is left to use their results
        return await serve_worker_core(core, transport,
                                       on_exit=lambda _: host.executor.close(timeout=0))
    finally:
        host.close()
        data.service.close()
        security.release(ctx)
        if own_ctx:
            ctx.term()
