"""The parts a ``Client`` is composed of, on their own, without a cluster: the runs in flight
(``RunBook``), the slices' newest mappings (``ClusterView``), the arrays' holds and freeing
(``ArrayLedger``, with real ``Array`` objects) and the suspended slices (``Suspensions``)."""

import concurrent.futures as cf
import gc
from types import SimpleNamespace

import numpy as np
import pytest

from pathways.client.array import Array
from pathways.client.cluster_view import ClusterView
from pathways.client.ledger import ArrayLedger
from pathways.client.runs import Run, RunBook
from pathways.client.suspension import Suspensions
from pathways.errors import PathwaysError, SliceSuspended
from pathways.program.ir import Aval
from pathways.program.mesh import Mesh
from pathways.program.sharding import P


def _run(program=("c", 0)) -> Run:
    return Run(cf.Future(), (), (), program)


def test_a_run_book_ends_each_run_once():
    book = RunBook()
    ids = [book.new_id() for _ in range(3)]
    assert ids == [0, 1, 2]
    runs = {i: _run(("c", i % 2)) for i in ids}
    for i, run in runs.items():
        book.add(i, run)
    assert book.statuses() == [runs[i].status for i in ids]
    assert book.pop(0) is runs[0] and book.pop(0) is None
    assert book.pop_program(("c", 1)) == [runs[1]] and len(book) == 1
    assert book.pop_all() == [runs[2]] and len(book) == 0 and book.pop_all() == []


def test_a_cluster_view_maps_old_meshes_of_a_slice_onto_its_newest():
    view = ClusterView(session=None, timeout=1.0)
    old = Mesh((2,), ("d",), (0, 1), slice_id=7, version=0)
    unsliced = Mesh((2,), ("d",), (0, 1))
    assert view.current(old) is old and view.slice_versions() == ()
    new = Mesh((2,), ("d",), (2, 3), slice_id=7, version=1)
    view.adopt(new)
    assert view.current(old) is new and view.current(new) is new
    assert view.current(unsliced) is unsliced
    assert view.slice_versions() == ((7, 1),)
    assert 0 not in view and view.hbm(0) is None
    with pytest.raises(PathwaysError, match="not on a live host"):
        view.data_address(0)


@pytest.fixture
def ledger():
    """A ledger whose ``free`` records the ids of what it frees, and a maker of real arrays
    on it (each with an id of its own)."""
    freed: list = []
    book = ArrayLedger(lambda a: freed.append(a.id))
    ids = iter(range(1000))
    owner = SimpleNamespace(ledger=book)
    mesh = Mesh.abstract((2,), ("d",))

    def array(status: cf.Future | None = None) -> Array:
        if status is None:
            status = cf.Future()
            status.set_result(None)
        return Array(owner, ("c", next(ids)), Aval((4,), np.dtype("float64")), mesh, P("d"),
                     status)

    return book, freed, array


def test_a_held_array_deleted_is_freed_by_its_last_holder(ledger):
    book, freed, array = ledger
    x = array()
    assert book.live() == [x]
    book.hold([x])
    book.hold([x])
    x.delete()
    assert freed == []
    book.unhold([x])
    assert freed == []
    book.unhold([x])
    assert freed == [x.id]


def test_a_held_array_not_deleted_stays(ledger):
    book, freed, array = ledger
    x = array()
    book.hold([x])
    book.unhold([x])
    assert freed == [] and not x.is_deleted()


def test_a_deleted_array_still_being_produced_is_freed_once_it_is(ledger):
    book, freed, array = ledger
    status: cf.Future = cf.Future()
    x = array(status)
    x.delete()
    assert freed == []
    status.set_result(None)
    assert freed == [x.id]


def test_an_array_collected_is_freed_and_leaves_the_live_set(ledger):
    book, freed, array = ledger
    x = array()
    x_id = x.id
    del x
    gc.collect()
    assert freed == [x_id] and book.live() == []


def test_an_array_found_live_while_being_collected_is_left_to_its_holder(ledger):
    """A weak reference still reaches an array while its finalizer runs: a save (a
    suspension's) on another thread can find it in ``live()`` and hold it then. The finalizer
    leaves it to that holder, which frees it once written, instead of freeing it under the
    hosts writing it (a mixed soak under load: "object ... was deleted before this reader
    asked for it")."""
    book, freed, array = ledger
    x = array()
    book.hold(book.live())
    x.__del__()  # the thread that dropped the last other reference finalizes it now
    assert x.is_deleted() and freed == []
    book.unhold([x])
    assert freed == [x.id]


def test_suspensions_mark_a_slice_once_and_refuse_its_meshes():
    sus = Suspensions()
    mesh = Mesh((2,), ("d",), (0, 1), slice_id=3)
    assert not sus
    with sus.lock:
        state = sus.begin(3, "by this client")
        with pytest.raises(PathwaysError, match="already suspended"):
            sus.begin(3, "again")
    assert sus and sus.get(3) is state
    with pytest.raises(SliceSuspended, match="slice 3 is suspended"):
        sus.check([Mesh((2,), ("d",), (4, 5), slice_id=2), mesh])
    state.directory = "/somewhere"
    assert sus.directories() == ["/somewhere"]
    sus.discard(3)
    sus.check([mesh])
    assert not sus and sus.directories() == []


def test_a_calls_arguments_are_freed_without_the_cyclic_garbage_collector(client):
    """A recursive closure in a tree walker is a reference cycle; one that held a call's
    leaves kept the first argument of a call (and its shards on the hosts) alive until the
    cyclic GC ran, which tests/e2e/test_lifecycle.py saw as a leak after a killed client."""
    import gc
    import weakref

    import pathways as pw
    from pathways import P

    mesh = client.mesh((2,), ("d",))
    step = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))

    @pw.program
    def twice(tree):
        return {"v": step(step(tree["v"]))}

    gc.disable()
    try:
        x = client.put(np.zeros(4), mesh, P("d"))
        first = weakref.ref(x)
        x = step(x)
        out = twice({"v": x})
        second = weakref.ref(x)
        x = out["v"]
        np.testing.assert_array_equal(x.result(timeout=30), np.full(4, 3.0))
        del out
        assert first() is None and second() is None
    finally:
        gc.enable()


def test_deletes_sent_back_to_back_leave_as_one_message_in_order():
    """A step that drops its old parameters deletes several arrays at once: the host gets one
    DeleteShards (one lock, each device's HBM freed once), other messages keep their place."""
    from pathways import protocol

    a, b, c = [(("k", 1), 0)], [(("k", 2), 0), (("k", 2), 1)], [(("k", 3), 0)]
    status = protocol.Status(7)
    sent = protocol.batch([protocol.DeleteShards(a), protocol.DeleteShards(b), status,
                           protocol.DeleteShards(c)])
    got = protocol.unbatch(protocol.unpack(protocol.pack(sent)))
    assert got == [protocol.DeleteShards(a + b), status, protocol.DeleteShards(c)]
    assert protocol.batch([protocol.DeleteShards(a), protocol.DeleteShards(c)]) \
        == protocol.DeleteShards(a + c)
