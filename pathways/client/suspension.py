"""Suspending and resuming a client's slice: its arrays go to disk and its devices to others.

``suspend`` is a transaction that frees last. It stops new calls on the slice (they raise
``SliceSuspended``), lets the runs already given to the devices finish, has the hosts write
every live array of the slice as a checkpoint (``pathways.client.checkpoint``: the bytes never
pass through the client), asks the coordinator to free the slice's devices (it keeps the slice)
and only once it has confirmed frees the arrays' device memory. A failure before that changes
nothing: the files go, the arrays and the slice stay, and a ``PathwaysError`` says so. If the
coordinator does not answer in time, the client asks it to undo the suspension
(``CancelSuspend``, which it handles after the ``Suspend``: one client's messages keep their
order) and waits as long again: the slice is then live on its devices as before, or, if its
devices went meanwhile to a client that preempted it, the suspension stands and the client
completes it (the arrays are safe on disk). Until the coordinator answers the slice is in
doubt: its arrays stay on the devices and on disk, calls raise ``SliceSuspended``, and
``resume`` waits for the answer.

``resume`` asks the coordinator to map the slice again (by the allocation rule: possibly other
devices) and has the new devices' hosts read the arrays back, under the same ``Array`` objects;
programs and compiled functions built on the old mesh are re-lowered at their next call, as
after a remap. The files go once every array is back (kept, and logged, if a read fails).

The coordinator can ask for a suspension (``SuspendNotice``) to make room for a client of higher
priority that asked for the slice's devices with ``client.mesh(..., preempt=True)``; the
client's runtime then suspends the slice by itself, by the same transaction, on a thread of its
own, and the user's next call on it raises ``SliceSuspended`` naming why. While the preempting
slice holds those devices, this slice's ``resume`` goes onto other devices of the island if
there are enough, else waits for them (up to its timeout), else raises a ``ResourceError``
naming the preempting client (``pathways.control.preemption``).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass, field

from .. import protocol
from ..errors import ClientClosed, CoordinatorLost, PathwaysError, ProgramError, SliceSuspended
from ..program.mesh import Mesh
from . import checkpoint, fanout

__all__ = ["Suspended", "Suspensions", "resume", "suspend", "suspend_for_coordinator"]

log = logging.getLogger("pathways.client.suspension")

ANSWER_GRACE = 10.0  # seconds past a resume's own wait for the coordinator's answer to arrive


@dataclass
class Suspended:
    """A slice being suspended or suspended: where its arrays went."""
    reason: str
    done: cf.Future = field(default_factory=cf.Future)  # settled (None), either way
    directory: str | None = None
    failed: bool = False  # settled as not suspended: the slice is live with its arrays
    arrays: list = field(default_factory=list)  # (weak reference to the Array, its name)
    saving: cf.Future | None = None  # the checkpoint being written
    doubt: str | None = None  # why the coordinator's answer is still awaited

    def error(self, slice_id) -> SliceSuspended:
        if self.doubt is not None:
            return SliceSuspended(
                f"the suspension of slice {slice_id} is in doubt ({self.doubt}): its arrays"
                " stay on its devices until the coordinator answers; client.resume(mesh)"
                " waits for that and gives back the live slice either way")
        return SliceSuspended(f"slice {slice_id} is suspended ({self.reason}): call"
                              " client.resume(mesh) to map it and its arrays onto devices again")


class Suspensions:
    """A client's slices suspended or being suspended, by slice id, and the lock that orders a
    slice's suspension against runs starting on it: a run starts either before the slice is
    marked (and the suspension waits for it) or after, and then raises ``SliceSuspended``."""

    def __init__(self, new_future=cf.Future):
        self.new_future = new_future  # what a suspension's ``done`` is (the session's kind)
        self.lock = threading.Lock()  # marking a slice suspended vs runs starting
        self._slices: dict[int, Suspended] = {}

    def __bool__(self) -> bool:
        return bool(self._slices)

    def get(self, slice_id) -> Suspended | None:
        return self._slices.get(slice_id)

    def begin(self, slice_id: int, reason: str) -> Suspended:
        """Mark ``slice_id`` as being suspended; the caller holds ``lock``."""
        if slice_id in self._slices:
            raise PathwaysError(f"slice {slice_id} is already suspended")
        state = self._slices[slice_id] = Suspended(reason, self.new_future())
        return state

    def discard(self, slice_id: int) -> None:
        """The slice is live again (its suspension failed or was undone)."""
        with self.lock:
            self._slices.pop(slice_id, None)

    def remove(self, slice_id: int) -> None:
        """The slice was resumed."""
        with self.lock:
            del self._slices[slice_id]

    def check(self, meshes) -> None:
        """Raise ``SliceSuspended`` if any of ``meshes`` is on a suspended slice."""
        for mesh in meshes:
            state = self._slices.get(getattr(mesh, "slice_id", None))
            if state is not None:
                raise state.error(mesh.slice_id)

    def directories(self) -> list[str]:
        """Where the suspended slices' arrays are on disk."""
        return [s.directory for s in list(self._slices.values()) if s.directory is not None]


def suspend(client, slice_id: int, reason: str, timeout: float) -> None:
    """Suspend ``slice_id`` (module doc); blocks until its devices are free. A
    ``PathwaysError`` says what went wrong and in what state the slice was left."""
    with client.suspensions.lock:
        state = client.suspensions.begin(slice_id, reason)
        running = client.runs.statuses()
    try:
        arrays = _save(client, slice_id, state, running, timeout)
    except Exception as exc:
        _abandon(client, slice_id, state)
        raise PathwaysError(f"could not suspend slice {slice_id}: {_said(exc, timeout)};"
                            " nothing changed: the slice is live with its arrays") from exc
    except BaseException:
        _abandon(client, slice_id, state)
        raise
    try:
        client.session.request(client.address, protocol.Suspend(None, client.id, slice_id)
                               ).result(timeout)
    except cf.TimeoutError:
        _roll_back(client, slice_id, state, arrays, timeout)
        return
    except ClientClosed:  # closing frees every array of the client: nothing to keep
        _abandon(client, slice_id, state)
        raise
    except CoordinatorLost as exc:  # no answer will ever come
        _abandon(client, slice_id, state, keep_files=True)
        raise PathwaysError(
            f"the suspension of slice {slice_id} got no answer ({exc}): its arrays were not"
            f" freed, and a copy is on disk at {state.directory}") from exc
    except Exception as exc:  # the coordinator refused: the slice is as it was
        _abandon(client, slice_id, state)
        raise PathwaysError(f"the coordinator refused to suspend slice {slice_id} ({exc}):"
                            " nothing changed: the slice is live with its arrays") from exc
    except BaseException:  # interrupted while waiting: the coordinator's answer settles it
        state.doubt = "its Suspend was interrupted before the coordinator answered"
        _cancel(client, slice_id, state, arrays)
        raise
    _complete(client, state, arrays)


def suspend_for_coordinator(client, slice_id: int, reason: str, timeout: float) -> None:
    """The coordinator asked for the slice (``SuspendNotice``): suspend it on a thread of the
    client's own, so the loop thread that received the notice goes on."""
    def run():
        try:
            suspend(client, slice_id, f"by the coordinator: {reason}", timeout)
        except Exception as exc:
            log.warning("could not suspend slice %s for the coordinator: %s", slice_id, exc)

    client.session.spawn(run, f"pathways-suspend-{slice_id}")


def _settled(done: cf.Future, timeout) -> bool:
    """Whether ``done`` settles within ``timeout`` seconds."""
    try:
        done.result(timeout)
    except cf.TimeoutError:
        return False
    return True


def _mark_settled(done: cf.Future) -> None:
    if not done.done():
        done.set_result(None)


def _save(client, slice_id, state: Suspended, running, timeout) -> dict:
    """Let the runs in flight finish, then write the slice's arrays to a new directory;
    returns them by name. Frees nothing."""
    for status in running:  # the gangs already given to devices finish
        status.exception(timeout)
    # held while they are chosen and written: an array another thread deletes meanwhile is
    # freed once the save is done, never under the hosts writing it
    candidates = [a for a in client.ledger.live() if a.mesh.slice_id == slice_id]
    client.ledger.hold(candidates)
    try:
        # arrays still being made (a generate) are waited for; failed ones have nothing to
        # keep
        arrays = [a for a in candidates if not a.is_deleted() and a.exception(timeout) is None]
        state.directory = _new_directory(client, f"pathways-suspended-{slice_id}-")
        names = {str(i): a for i, a in enumerate(arrays)}
        state.saving = checkpoint.save(client, os.path.join(state.directory, "arrays"),
                                       names, held=True)
        state.saving.result(timeout)
    finally:
        client.ledger.unhold(candidates)
    return names


def _new_directory(client, prefix: str) -> str:
    """A new directory of this user's alone under the client's ``suspend_dir``, named with
    the session's tokens (``mkdtemp``'s names would not replay in a simulation)."""
    parent = client.suspend_dir or tempfile.gettempdir()
    while True:
        path = os.path.join(parent, prefix + client.session.token())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path


def _roll_back(client, slice_id, state: Suspended, arrays: dict, timeout) -> None:
    """The coordinator did not confirm the suspension in time: ask it to undo it and settle
    by its answer (``_settle``). Returns if the suspension stands and was completed; raises
    ``PathwaysError`` if it was undone or the answer is still awaited after ``timeout``."""
    state.doubt = f"the coordinator did not answer its Suspend within {timeout:g} s"
    _cancel(client, slice_id, state, arrays)
    if not _settled(state.done, timeout):
        raise PathwaysError(
            f"the coordinator did not answer the suspension of slice {slice_id} within"
            f" {timeout:g} s, nor its cancellation within {timeout:g} s more: the slice is in"
            " doubt until it answers; its arrays stay on its devices (and on disk), calls on"
            " it raise SliceSuspended, and client.resume(mesh) waits for the answer")
    if state.failed:
        raise PathwaysError(
            f"the coordinator did not confirm the suspension of slice {slice_id} within"
            f" {timeout:g} s, so it was undone: the slice is live on its devices with its"
            " arrays, as before")
    log.warning("slice %s: the coordinator confirmed its suspension late, and kept it",
                slice_id)


def _cancel(client, slice_id, state: Suspended, arrays: dict) -> None:
    """Ask the coordinator to undo the suspension (after the ``Suspend``: one client's
    messages keep their order); its answer settles the slice (``_settle``)."""
    try:
        cancel = client.session.request(client.address,
                                        protocol.CancelSuspend(None, client.id, slice_id))
    except PathwaysError as exc:  # closed or lost meanwhile
        cancel = cf.Future()
        cancel.set_exception(exc)
    cancel.add_done_callback(lambda f: _settle(client, slice_id, state, arrays, f))


def _settle(client, slice_id, state: Suspended, arrays: dict, answer: cf.Future) -> None:
    """The coordinator's answer to ``CancelSuspend``: the slice back on its devices (the
    arrays are still there: remove the files), or the suspension stands (complete it)."""
    error = answer.exception()
    if error is None and answer.result() is None:
        _complete(client, state, arrays)
        return
    if error is not None:
        log.warning("slice %s: no answer to the cancellation of its suspension (%s): its"
                    " arrays stay on its devices, and a copy at %s", slice_id, error,
                    state.directory)
    _abandon(client, slice_id, state,
             keep_files=error is not None and not isinstance(error, ClientClosed))


def _complete(client, state: Suspended, arrays: dict) -> None:
    """The coordinator confirmed the suspension: only now free the arrays' device memory."""
    for a in arrays.values():
        if not a.is_deleted():
            try:
                client.ledger.release(a)
            except PathwaysError:
                pass  # closed or coordinator lost: the hosts free what the client owned
    state.arrays = [(weakref.ref(a), name) for name, a in arrays.items()]
    state.doubt = None
    _mark_settled(state.done)


def _abandon(client, slice_id, state: Suspended, keep_files: bool = False) -> None:
    """The slice was not suspended: it is live again with its arrays; the files go first
    (once a save still writing has settled), unless they may be the only copy left."""
    if state.directory is not None and not keep_files:
        def remove(_f=None):
            shutil.rmtree(state.directory, ignore_errors=True)

        if state.saving is not None and not state.saving.done():
            state.saving.add_done_callback(remove)
        else:
            remove()
    client.suspensions.discard(slice_id)
    state.failed, state.doubt = True, None
    _mark_settled(state.done)


def _said(exc: Exception, timeout) -> str:
    if isinstance(exc, cf.TimeoutError):
        return f"its runs, or the writing of its arrays, did not finish within {timeout:g} s"
    return f"{type(exc).__name__}: {exc}"


def resume(client, mesh: Mesh, timeout: float) -> Mesh:
    """Map a suspended slice onto devices again and read its arrays back (module doc)."""
    slice_id = mesh.slice_id
    if slice_id is None:
        raise ProgramError("resume needs a mesh from client.mesh(...)")
    state = client.suspensions.get(slice_id)
    if state is None:
        raise PathwaysError(f"slice {slice_id} is not suspended")
    if not _settled(state.done, timeout):
        raise PathwaysError(f"slice {slice_id} is still being suspended after {timeout:g} s"
                            + (f" ({state.doubt})" if state.doubt else ""))
    if state.failed:  # its suspension failed or was undone: it is live with its arrays
        return client.cluster.current(mesh)
    try:
        sl = client.session.request(client.address, protocol.Resume(
            None, client.id, slice_id, float(timeout))).result(timeout + ANSWER_GRACE)
    except cf.TimeoutError:
        raise PathwaysError(f"the coordinator did not answer the resume of slice {slice_id}"
                            f" within {timeout + ANSWER_GRACE:g} s: it stays suspended"
                            ) from None
    client.cluster.refresh()
    new = Mesh(mesh.axis_sizes, mesh.axis_names, sl.devices, sl.slice_id, sl.island,
               sl.version, client=client)
    client.cluster.adopt(new)
    _read_back(client, state, new)
    client.suspensions.remove(slice_id)
    return new


def _read_back(client, state: Suspended, new: Mesh) -> None:
    """Have the hosts of ``new`` read the arrays back; the files go once all are back."""
    path = os.path.join(state.directory, "arrays")
    statuses = []
    for ref, name in state.arrays:
        a = ref()
        if a is None or a.is_deleted():
            continue
        array_id = client.shards.new_id()
        status = client.shards.generate(array_id, checkpoint.reader(path, name),
                                        a.aval.shape, a.aval.dtype, new, a.spec)
        a.rebind(array_id, new, status)
        statuses.append(status)

    def cleanup(error):
        if error is None:
            shutil.rmtree(state.directory, ignore_errors=True)
        else:  # free last: a failed read leaves the only copy where it is
            log.warning("reading the arrays of slice %s back failed (%s): they stay on disk"
                        " at %s (client.load reads them)", new.slice_id, error, path)

    fanout.when_all(statuses, cleanup)

