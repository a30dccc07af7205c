"""Suspending and resuming a client's slice: its arrays go to disk and its devices to others.

``suspend`` stops new calls on the slice (they raise ``SliceSuspended``), lets the runs already
given to the devices finish, has the hosts write every live array of the slice as a checkpoint
(``pathways.client.checkpoint``: the bytes never pass through the client), frees their device
memory and tells the coordinator, which frees the slice's devices but keeps the slice. ``resume``
asks the coordinator to map the slice again (by the allocation rule: possibly other devices)
and has the new devices' hosts read the arrays back, under the same ``Array`` objects; programs
and compiled functions built on the old mesh are re-lowered at their next call, as after a remap.

The coordinator can ask for a suspension (``SuspendNotice``) to make room for a client of higher
priority; the client's runtime then suspends the slice by itself, on a thread of its own, and the
user's next call on it raises ``SliceSuspended`` naming why.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass, field

from .. import protocol
from ..errors import PathwaysError, ProgramError, SliceSuspended
from ..program.mesh import Mesh
from . import checkpoint, fanout

__all__ = ["Suspended", "resume", "suspend", "suspend_for_coordinator"]

log = logging.getLogger("pathways.client.suspension")


@dataclass
class Suspended:
    """A slice being suspended or suspended: where its arrays went."""
    reason: str
    done: threading.Event = field(default_factory=threading.Event)
    directory: str | None = None
    failed: bool = False
    arrays: list = field(default_factory=list)  # (weak reference to the Array, its name)

    def error(self, slice_id) -> SliceSuspended:
        return SliceSuspended(f"slice {slice_id} is suspended ({self.reason}): call"
                              " client.resume(mesh) to map it and its arrays onto devices again")


def suspend(client, slice_id: int, reason: str, timeout: float) -> None:
    """Suspend ``slice_id`` (module doc); blocks until its devices are free."""
    with client._suspend_lock:
        if slice_id in client._suspended:
            raise PathwaysError(f"slice {slice_id} is already suspended")
        state = client._suspended[slice_id] = Suspended(reason)
        running = [entry[0] for entry in client._inflight.values()]
    try:
        for status in running:  # the gangs already given to devices finish
            status.exception(timeout)
        # arrays still being made (a generate) are waited for; failed ones have nothing to keep
        arrays = [a for a in _live(client) if a.mesh.slice_id == slice_id and not a._deleted
                  and a.exception(timeout) is None]
        state.directory = tempfile.mkdtemp(prefix=f"pathways-suspended-{slice_id}-",
                                           dir=client.suspend_dir)
        names = {str(i): a for i, a in enumerate(arrays)}
        checkpoint.save(client, os.path.join(state.directory, "arrays"), names).result(timeout)
        for a in arrays:
            client._release(a)
        client._request(client.address, protocol.Suspend(None, client.id, slice_id)).result(
            timeout)
    except BaseException:
        with client._suspend_lock:
            del client._suspended[slice_id]
        state.failed = True
        state.done.set()
        if state.directory is not None:
            shutil.rmtree(state.directory, ignore_errors=True)
        raise
    state.arrays = [(weakref.ref(a), name) for name, a in names.items()]
    state.done.set()


def suspend_for_coordinator(client, slice_id: int, reason: str, timeout: float) -> None:
    """The coordinator asked for the slice (``SuspendNotice``): suspend it on a thread of the
    client's own, so the loop thread that received the notice goes on."""
    def run():
        try:
            suspend(client, slice_id, f"by the coordinator: {reason}", timeout)
        except Exception as exc:
            log.warning("could not suspend slice %s for the coordinator: %r", slice_id, exc)

    threading.Thread(target=run, name=f"pathways-suspend-{slice_id}", daemon=True).start()


def resume(client, mesh: Mesh, timeout: float) -> Mesh:
    """Map a suspended slice onto devices again and read its arrays back (module doc)."""
    slice_id = mesh.slice_id
    if slice_id is None:
        raise ProgramError("resume needs a mesh from client.mesh(...)")
    state = client._suspended.get(slice_id)
    if state is None:
        raise PathwaysError(f"slice {slice_id} is not suspended")
    if not state.done.wait(timeout):
        raise PathwaysError(f"slice {slice_id} is still being suspended after {timeout:g} s")
    if state.failed:
        raise PathwaysError(f"the suspension of slice {slice_id} failed: its arrays stayed")
    sl = client._request(client.address, protocol.Resume(None, client.id, slice_id)).result(
        timeout)
    client._refresh_devices()
    new = Mesh(mesh.axis_sizes, mesh.axis_names, sl.devices, sl.slice_id, sl.island,
               sl.version, client=client)
    client._meshes[slice_id] = new
    path = os.path.join(state.directory, "arrays")
    statuses = []
    for ref, name in state.arrays:
        a = ref()
        if a is None or a._deleted:
            continue
        a.id, a.mesh = client._new_array_id(), new
        a._status = client._generate_into(a.id, checkpoint.reader(path, name), a.shape,
                                          a.dtype, new, a.spec)
        statuses.append(a._status)
    with client._suspend_lock:
        del client._suspended[slice_id]
    fanout.when_all(statuses,  # read back (or failed): the files are no longer needed
                    lambda _error: shutil.rmtree(state.directory, ignore_errors=True))
    return new


def check(client, meshes) -> None:
    """Raise ``SliceSuspended`` if any of ``meshes`` is on a suspended slice."""
    for mesh in meshes:
        state = client._suspended.get(getattr(mesh, "slice_id", None))
        if state is not None:
            raise state.error(mesh.slice_id)


def _live(client) -> list:
    """The client's arrays alive now (the set may change while it is read: read again)."""
    while True:
        try:
            return list(client._live)
        except RuntimeError:
            continue
