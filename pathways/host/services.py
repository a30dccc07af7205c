"""What a host's operators may call on their host: ``HostServices``.

The Plaque operators of a lowered graph (``pathways.host.kernel``, ``pathways.host.routing``)
run inside a host process and reach it only through this protocol, handed to each operator
when the host's worker makes it (``pathways.host.operators.host_operators``). ``Host``
(``pathways.host.host``) is the one implementation; a simulated host implements the same
members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..program.cost import DeviceSpec
    from .clock import Clock
    from .exchange import ExecutorEnv
    from .object_store import Key, ObjectStore, Owner

__all__ = ["HostServices"]


class HostServices(Protocol):
    """Exactly what a kernel, send or routing operator may ask of the host that runs it.

    ``store`` is the host's object store (reading, failing, deleting and counting the uses of
    buffers), ``clock`` its clock; the methods say which thread may call them.
    """

    store: ObjectStore
    clock: Clock  # the host's clock: when data arrives, in the time its kernels run in
    spec: DeviceSpec  # its devices' (real ones take no modelled time: --backend jax)

    def enqueue(self, items) -> None:
        """Queue each ``(device, seq, work)`` of ``items`` (``work``: a
        ``pathways.host.device.DeviceWork``) as ``device``'s ``seq``-th kernel, all at once
        (a gang's kernels on this host). Any thread."""

    def kernel_env(self, mesh, flat_index: int, gang_key, device) -> ExecutorEnv:
        """Executor thread: where the collectives of the kernel running on ``device`` go."""

    def post_release(self, caps) -> None:
        """Executor thread: release each Plaque capability ``cap`` of ``caps`` (``[(cap,
        outputs)]``) on the host's loop, after handing its ``outputs`` to the run's driver
        (small results for the client)."""

    def abort_gang(self, gang_key, devices, reason: str, root=None) -> None:
        """Executor thread: stop this gang's collectives here and on its other hosts;
        ``root``: the failure's own error, which the gang's other kernels fail with."""

    def put(self, key: Key, value, owner: Owner, arrival: float | None = None) -> None:
        """Loop thread: store a buffer that came from outside (a transfer, routed rows) once
        its device's HBM has room, never blocking the thread."""

    def record_transfer(self, device: int, name: str, labels: dict, start: float,
                        end: float) -> None:
        """Data that arrived for ``device`` from ``start`` until ``end``, for traces."""
