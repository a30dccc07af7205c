"""A seed replays bit for bit in one process, whatever ran in it before (issue 45, item 10):
Python's garbage collector, whose passes follow the process's history, is an event of the
simulation while one runs. (The fault simulation replays some of its seeds too, faults and
all: ``test_sim_faults.REPLAYED``.)"""

import gc

import numpy as np

import pathways as pw
from pathways import P
from pathways.sim.collector import Collector

_kept = []  # what earlier "work" of this process left alive: the collector's history differs


def cycles_run(history: int):
    """A script that leaves its arrays in reference cycles, after ``history`` objects of
    unrelated work; every message it caused and its end time."""
    _kept.append([{} for _ in range(history)])
    with pw.local_cluster(hosts_per_island=2, devices_per_host=2, simulate=True, seed=1,
                          cpu="fixed", cost=2e-5, record=True) as cluster:
        with pw.connect(cluster.address) as client:
            mesh = client.mesh((4,), ("d",))
            f = pw.shard_map(lambda b: b + 1.0, mesh, P("d"), P("d"))
            x = client.put(np.zeros(4), mesh, P("d"))
            for _ in range(60):
                y = f(x)
                box = {"array": y}
                box["self"] = box  # only a collection frees y once x moves on
                x = y
            np.testing.assert_array_equal(x.result(), np.full(4, 60.0))
        return list(cluster.net.deliveries), cluster.clock()


def test_arrays_freed_by_the_collector_replay_in_one_process():
    first = cycles_run(50)
    for history in (187, 324):
        again = cycles_run(history)
        assert again[0] == first[0]  # every message: time, ends, size, checksum
        assert again[1] == first[1]


def test_a_simulation_holds_the_collector_and_gives_it_back():
    was = gc.isenabled()
    gc.enable()
    try:
        with pw.local_cluster(hosts_per_island=1, devices_per_host=1, simulate=True):
            assert not gc.isenabled()  # the simulation collects at points of its own
            assert gc.get_freeze_count() > 0
        assert gc.isenabled()
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable() if was else gc.disable()


def test_the_collector_passes_come_at_fixed_handler_counts():
    collector = Collector(every=3)
    try:
        for _ in range(3 * 100):
            collector.handled()
        assert collector.passes == 100
    finally:
        collector.release()
