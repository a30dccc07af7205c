"""The host executor (``pathways.host.executor``) and the ICI wire format (``pathways.host.ici``).

What is checked, always in fake time (a clock that moves only when the executor sleeps):

- honest emulation: a record starts no earlier than its dispatch arrived, than its inputs'
  modelled arrival (a real ``ObjectStore``) or its ``not_before``; ``on_done`` runs only once
  the clock has reached the record's end; kernels queued back to back are contiguous even when
  every wake-up is late; and a hypothesis property test of all of these over random durations,
  enqueue orders, input arrivals and lateness (each start is exactly the latest of the
  device's previous end, the dispatch arrival and the inputs' arrival);
- collectives between the devices of one executor (``ExecutorEnv``): results bitwise equal to
  ``run_spmd``; a shard's record ends no earlier than its last peer reached the collective;
- deadlock and failure: an inconsistent gang order times out (a timer, in virtual time) and
  the devices serve later kernels; ``abort_gang`` fails a parked peer at once and later
  exchanges of the gang; a raising body, on_done or missing input is recorded as failed;
- HBM back-pressure: outputs that do not fit keep their device until a free makes room; ones
  larger than the whole HBM fail with DeviceOutOfMemory;
- the ICI wire format: hypothesis round trips over keys, dtypes and shapes (0-d and empty
  included), malformed messages raise ProtocolError, unencodable values raise ProgramError.

Executors run on the driver every host uses, an event loop (``Executor.run_on``, uvloop on a
thread: ``executor_drivers``); the property test of the virtual-time invariants also runs on
the thread driver of standalone devices (``Executor.start``), and so do the fd hygiene tests.
Every executor is closed by a fixture or a ``with`` block, every wait has a timeout and nothing
asserts timing.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import struct
import threading
import time

import numpy as np
import pytest
from conftest import wait_until
from executor_drivers import DRIVERS, WAIT, start, stop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pathways.errors import (
    CollectiveTimeout,
    DeviceOutOfMemory,
    KernelTimeout,
    PathwaysError,
    ProgramError,
)
from pathways.host import hierarchy
from pathways.host.batching import Batch
from pathways.host.clock import Clock
from pathways.host.device import DeviceWork
from pathways.host.exchange import ExecutorEnv
from pathways.host.executor import Executor
from pathways.host.hbm import HbmAccount
from pathways.host.ici import decode, encode
from pathways.host.object_store import ObjectStore
from pathways.program.collectives import (
    all_gather,
    all_to_all,
    kernel_env,
    ppermute,
    psum,
    run_spmd,
)
from pathways.program.cost import DeviceSpec
from plaque.wire import ProtocolError

OWNER = ("test-client", None)


class FakeTime:
    """Virtual time: moves only when the executor sleeps (or a test sets ``now``).

    ``late``: seconds added to successive sleeps (cycled), an OS that wakes the executor
    after its deadline. ``horizon``: time never passes it; a sleep that would cross it leaves
    the clock there and yields for a millisecond of real time, so the executor reads its
    inbox again. That lets a test act on a parked collective before its timeout can fire.
    """

    def __init__(self, late=(0.0,), horizon: float = math.inf):
        self.now = 0.0
        self.sleeps: list[float] = []
        self.horizon = horizon
        self._late = itertools.cycle(late)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        target = self.now + seconds + next(self._late)
        if target > self.horizon:
            self.now = max(self.now, self.horizon)
            time.sleep(0.001)
        else:
            self.now = target


class Kernel(DeviceWork):
    """A test kernel: returns ``duration``, optionally runs ``body(device)`` first.

    Records the clock when it executes (``ran_at``) and when ``on_done`` runs (``done_at``);
    ``finished`` is set by on_done or on_error.
    """

    def __init__(self, name, duration=0.0, *, clock, body=None, inputs=(), not_before=0.0,
                 nbytes=0, labels=None, log=None):
        self.name, self.duration, self.clock, self.body = name, duration, clock, body
        self.inputs, self.not_before, self.nbytes = list(inputs), not_before, nbytes
        self.labels = labels or {}
        self.log = log
        self.ran_at: float | None = None
        self.done_at: float | None = None
        self.errors: list[BaseException] = []
        self.finished = threading.Event()

    def __repr__(self):
        return f"Kernel({self.name!r})"

    def input_keys(self):
        return self.inputs

    def execute(self, device):
        self.ran_at = self.clock()
        if self.log is not None:
            self.log.append(self.name)
        if self.body is not None:
            self.body(device)
        return self.duration

    def output_bytes(self):
        return self.nbytes

    def on_done(self, finish):
        assert self.done_at is None, "on_done called twice"
        self.done_at = self.clock()
        self.finished.set()

    def on_error(self, exc):
        self.errors.append(exc)
        self.finished.set()


class GangKernel(Kernel):
    """One shard of a gang: runs ``fn(*args)`` under an ExecutorEnv, as a host's kernels do."""

    def __init__(self, executor, mesh, flat, device_of, gang, fn, args, duration=0.0,
                 before=None, **kwargs):
        super().__init__(f"{gang}[{flat}]", duration, clock=executor.now, body=self._shard,
                         **kwargs)
        self.executor, self.mesh, self.flat, self.device_of = executor, mesh, flat, device_of
        self.gang_key, self.fn, self.args, self.before = gang, fn, args, before
        self.result = None
        self.env: ExecutorEnv | None = None

    def _shard(self, device):
        shape, names = self.mesh
        self.env = ExecutorEnv(shape, names, self.flat, self.device_of, self.gang_key,
                               self.executor, device.current)
        if self.before is not None:
            self.before()
        with kernel_env(self.env):
            self.result = self.fn(*self.args)


@contextlib.contextmanager
def executor_of(fake: FakeTime, device_ids=(0,), *, spec=None, with_store=False, **kwargs):
    """An executor on fake time with these devices (not started: ``start`` or ``run_all``),
    always closed after (with the loop it ran on)."""
    devices: dict = {}  # the host's dict, as pathways.host.server keeps it
    store = ObjectStore(devices) if with_store else None
    executor = Executor("test-host", store=store, clock=Clock(fake.clock, fake.sleep), **kwargs)
    try:
        for d in device_ids:
            devices[d] = executor.add_device(d, spec)
        yield executor
    finally:
        assert stop(executor), "the executor did not stop"


@pytest.fixture
def make_executor():
    """``make_executor(fake, device_ids, ...)``: executors closed when the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda *args, **kwargs: stack.enter_context(executor_of(*args, **kwargs))


def run_all(executor: Executor, driver: str = "loop") -> None:
    """Start the executor if needed (by ``driver``: an event loop, or a thread of its own) and
    wait until every device has run what it was given."""
    start(executor, driver)
    for device in executor.devices.values():
        assert device.wait_idle(WAIT), f"{device.name} did not finish"


def record_of(device, seq):
    (record,) = [r for r in device.timeline if r.seq == seq]
    return record


# == 1. honest emulation ======================================================================


def test_a_kernel_starts_no_earlier_than_its_dispatch_arrived(make_executor):
    fake = FakeTime()
    ex = make_executor(fake)
    device = ex.devices[0]
    first = Kernel("first", 1.0, clock=fake.clock)
    device.enqueue(0, first)
    run_all(ex)
    fake.now = 5.0  # the executor is idle (no timers): the device was free from 1.0 on
    late = Kernel("late", 0.5, clock=fake.clock)
    device.enqueue(1, late)
    assert device.wait_idle(WAIT)
    a, b = device.timeline
    assert (a.arrived, a.start, a.end) == (0.0, 0.0, 1.0)
    assert (b.arrived, b.start, b.end) == (5.0, 5.0, 5.5)  # not booked from 1.0
    assert late.ran_at >= b.start and late.done_at >= b.end
    assert device.busy_seconds == pytest.approx(1.5)


@pytest.mark.parametrize("put_first", [True, False], ids=["input-ready", "input-later"])
def test_a_kernel_starts_no_earlier_than_its_inputs_arrive(make_executor, put_first):
    fake = FakeTime()
    ex = make_executor(fake, (0, 1), with_store=True)
    store, device = ex.store, ex.devices[0]
    key = (("in", 0), 0)
    if put_first:
        store.put(key, np.arange(4.0), OWNER, arrival=3.0)
    consumer = Kernel("consumer", 1.0, clock=fake.clock, inputs=[key])
    after = Kernel("after", 0.5, clock=fake.clock)
    pushed = Kernel("pushed", 0.25, clock=fake.clock, not_before=7.0)
    device.enqueue(0, consumer)
    device.enqueue(1, after)
    device.enqueue(2, pushed)
    start(ex)
    if not put_first:  # the consumer holds its device, waiting for an input nobody made yet
        wait_until(lambda: store.stats()["entries"]["awaited"] == 1, timeout=WAIT)
        assert consumer.ran_at is None and device.next_seq == 0
        store.put(key, np.arange(4.0), OWNER, arrival=3.0)
    assert device.wait_idle(WAIT)
    records = device.timeline
    assert [(r.start, r.end) for r in records] == [(3.0, 4.0), (4.0, 4.5), (7.0, 7.25)]
    assert consumer.ran_at >= 3.0 and pushed.ran_at >= 7.0
    assert not any(k.errors for k in (consumer, after, pushed))


def test_on_done_runs_once_the_clock_reached_the_end(make_executor):
    fake = FakeTime()
    ex = make_executor(fake, (0, 1))
    kernels = {d: [Kernel(f"{d}.{s}", 0.5 + d + s, clock=fake.clock) for s in range(3)]
               for d in (0, 1)}
    for d, ks in kernels.items():
        for seq, k in enumerate(ks):
            ex.devices[d].enqueue(seq, k)
    run_all(ex)
    for d, ks in kernels.items():
        for record, k in zip(ex.devices[d].timeline, ks):
            assert k.done_at is not None and k.done_at >= record.end
            assert record.published >= k.done_at >= record.end
            assert not record.error


class Together:
    """What a gang's kernels share (as ``pathways.host.kernel.KernelGang``): it publishes
    those whose ends came together in one call, or fails to (``fail``: then each kernel
    publishes itself)."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.calls: list = []

    def on_done_all(self, done):
        if self.fail:
            raise RuntimeError("could not publish them together")
        self.calls.append(sorted(kernel.name for kernel, _ in done))
        for kernel, finish in done:
            kernel.on_done(finish)


@pytest.mark.parametrize("fail", [False, True])
def test_a_gangs_shards_that_end_together_are_published_together(make_executor, fail):
    """Shards of one gang on a host whose ends come in one pass (or whose ends the timeline
    keeps for later, at the same virtual time) are published by one ``on_done_all``; a failed
    shard is told on its own; a shard whose peer has not run yet (its device is busy) is not
    held for it; publishing them together failing falls back to each kernel's ``on_done``."""
    fake = FakeTime()
    ex = make_executor(fake, (0, 1, 2, 3))
    gang, late = Together(fail), Together(fail)

    def boom(_device):
        raise RuntimeError("kernel bug")

    shards = [Kernel(f"g{d}", 1.0, clock=fake.clock, body=boom if d == 2 else None)
              for d in range(3)]
    busy = Kernel("busy", 2.0, clock=fake.clock)
    lagging = [Kernel(f"l{d}", 0.5, clock=fake.clock) for d in (0, 3)]
    for k in shards:
        k.gang = gang
    for k in lagging:
        k.gang = late
    ex.devices[3].enqueue(0, busy)  # l3 runs after it; l0 at once
    for d, k in enumerate(shards):
        ex.devices[d].enqueue(0, k)
    ex.devices[0].enqueue(1, lagging[0])
    ex.devices[3].enqueue(1, lagging[1])
    run_all(ex)
    assert gang.calls == ([] if fail else [["g0", "g1"]])
    assert [k.done_at for k in shards[:2]] == [1.0, 1.0] and shards[2].done_at is None
    assert "kernel bug" in str(shards[2].errors[0]) and ex.devices[2].timeline[0].error
    assert lagging[0].done_at == 1.5 and lagging[1].done_at == 2.5  # neither waited
    assert late.calls == []  # each was alone when its end came
    for d in range(4):
        for record in ex.devices[d].timeline:
            assert record.published >= record.end


def test_back_to_back_kernels_are_contiguous_despite_late_wake_ups(make_executor):
    fake = FakeTime(late=(0.25, 0.1, 0.4))  # every deadline overslept
    ex = make_executor(fake)
    device = ex.devices[0]
    kernels = [Kernel(s, 1.0, clock=fake.clock) for s in range(4)]
    for seq, k in reversed(list(enumerate(kernels))):  # any order: seq 0 last
        device.enqueue(seq, k)
    run_all(ex)
    records = device.timeline
    assert [(r.start, r.end) for r in records] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0),
                                                     (3.0, 4.0)]
    assert device.busy_seconds == pytest.approx(4.0)
    for record, k in zip(records, kernels):
        assert record.published >= k.done_at >= record.end  # lateness delays publication only
    assert fake.now >= 4.0 + 0.25


@st.composite
def workloads(draw):
    """Kernels spread over up to 3 devices, some with an input, enqueued in any order."""
    n = draw(st.integers(1, 12))
    specs = draw(st.lists(st.tuples(
        st.integers(0, 2),  # device
        st.one_of(st.just(0.0), st.floats(0, 2)),  # modelled duration
        st.one_of(st.none(), st.floats(0, 6)),  # the modelled arrival of its input, if any
        st.one_of(st.just(0.0), st.floats(0, 6)),  # not_before
    ), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    return dict(
        specs=specs, order=order,
        before_start=draw(st.integers(0, n)),  # how many are enqueued before the thread runs
        inputs_first=draw(st.booleans()),  # inputs put before the kernels, or after
        late=draw(st.lists(st.floats(0, 0.5), min_size=1, max_size=4)),
        driver=draw(st.sampled_from(["loop", "thread"])),
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_virtual_time_invariants_hold_for_any_workload(w):
    fake = FakeTime(late=w["late"])
    with executor_of(fake, (0, 1, 2), with_store=True) as ex:
        store = ex.store
        by_device: dict[int, list] = {0: [], 1: [], 2: []}
        kernels = []
        for i, (d, duration, arrival, not_before) in enumerate(w["specs"]):
            inputs = [] if arrival is None else [(("in", i), d)]
            k = Kernel(i, duration, clock=fake.clock, inputs=inputs, not_before=not_before)
            k.device, k.seq, k.arrival = d, len(by_device[d]), arrival
            by_device[d].append(k)
            kernels.append(k)

        def put_inputs():
            for k in kernels:
                if k.arrival is not None:
                    store.put(k.inputs[0], np.zeros(2), OWNER, arrival=k.arrival)

        if w["inputs_first"]:
            put_inputs()
        for n, i in enumerate(w["order"]):
            if n == w["before_start"]:
                start(ex, w["driver"])
            k = kernels[i]
            ex.devices[k.device].enqueue(k.seq, k)
        start(ex, w["driver"])
        if not w["inputs_first"]:
            put_inputs()
        run_all(ex, w["driver"])

        for d, ks in by_device.items():
            records = ex.devices[d].timeline
            assert [r.seq for r in records] == list(range(len(ks)))
            previous_end = -math.inf
            for r, k in zip(records, ks):
                assert not r.error and not k.errors
                ready = max(r.arrived, k.not_before, 0.0 if k.arrival is None else k.arrival)
                assert r.start >= r.arrived  # (a)
                assert k.arrival is None or r.start >= k.arrival  # (b)
                assert r.start >= k.not_before
                assert k.ran_at >= r.start  # the body ran once real time reached the start
                assert k.done_at >= r.end and r.published >= k.done_at  # (c)
                assert r.start == max(previous_end, ready)  # (d): contiguous unless it waited
                assert r.end == r.start + k.duration  # lateness is never booked
                previous_end = r.end
            for before, after in zip(ks, ks[1:]):  # one at a time: published before the next
                assert after.ran_at >= before.done_at
            assert ex.devices[d].busy_seconds == pytest.approx(sum(k.duration for k in ks))


# == 2. collectives inside one executor =======================================================

MESH = ((2, 2), ("data", "model"))
DEVICE_OF = {0: 13, 1: 10, 2: 12, 3: 11}  # flat index -> device id: deliberately not identity
RING = [(i, (i + 1) % 4) for i in range(4)]


def every_collective(x):
    return (
        psum(x, "data"),
        psum(x, ("data", "model")),
        all_gather(x, "model", axis=1),
        all_gather(x, ("model", "data"), tiled=True),
        ppermute(x, ("data", "model"), RING),
        ppermute(x, "model", [(0, 1)]),  # position 0 of each group gets zeros
        all_to_all(x, "model", split_axis=0, concat_axis=1, tiled=True),
    )


def shard_inputs(seed: int) -> list[tuple]:
    """float32 values over 16 orders of magnitude: any other summation order shows."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-8, 8, size=(4, 4, 6))
    return [((rng.standard_normal((4, 6)) * scale[i]).astype(np.float32),) for i in range(4)]


def enqueue_gang(ex, gang, fn, args, seqs, device_of=DEVICE_OF, mesh=MESH, duration=0.0,
                 **kwargs):
    """One GangKernel per flat index, enqueued at ``seqs[flat]`` on its device."""
    kernels = []
    for flat, device in device_of.items():
        k = GangKernel(ex, mesh, flat, device_of, gang, fn, args[flat], duration, **kwargs)
        ex.devices[device].enqueue(seqs[flat], k)
        kernels.append(k)
    return kernels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_collectives_match_run_spmd_bitwise(make_executor, seed):
    fake = FakeTime()
    ex = make_executor(fake, sorted(DEVICE_OF.values()))
    args = shard_inputs(seed)
    kernels = enqueue_gang(ex, (7, seed), every_collective, args, seqs=[0] * 4)
    run_all(ex)
    expected = run_spmd(every_collective, *MESH, args, timeout=WAIT)
    for k, want in zip(kernels, expected):
        assert not k.errors, k.errors
        assert len(k.result) == len(want)
        for got, ref in zip(k.result, want):
            assert got.dtype == ref.dtype and got.shape == ref.shape
            assert got.tobytes() == ref.tobytes()  # bitwise, float32 psum included
        assert k.env.bytes_sent_remote == 0
    totals = [k.result[1] for k in kernels]
    assert all(t.tobytes() == totals[0].tobytes() for t in totals)
    # every member owns its results: no two share memory (as if they came over a network)
    results = [r for k in kernels for r in k.result]
    for a, b in itertools.combinations(results, 2):
        assert not np.shares_memory(a, b)


def test_a_shard_ends_no_earlier_than_its_last_peer_arrives(make_executor):
    fake = FakeTime()
    device_of = {i: i for i in range(4)}
    ex = make_executor(fake, range(4))
    busy = Kernel("busy", 5.0, clock=fake.clock)
    ex.devices[3].enqueue(0, busy)  # device 3 reaches the collective only at 5.0
    args = shard_inputs(3)
    kernels = enqueue_gang(ex, (1,), every_collective, args, seqs=[0, 0, 0, 1],
                           device_of=device_of, duration=0.5)
    run_all(ex)
    late = record_of(ex.devices[3], 1)
    assert late.start == 5.0
    for d in range(3):
        r = record_of(ex.devices[d], 0)
        assert r.start == 0.0  # it held its device while parked
        assert r.end >= late.start
    for d in range(4):
        r = record_of(ex.devices[d], 1 if d == 3 else 0)
        assert r.end >= late.start and r.published >= r.end and not r.error
    expected = run_spmd(every_collective, *MESH, args, timeout=WAIT)
    for k, want in zip(kernels, expected):
        assert all(g.tobytes() == w.tobytes() for g, w in zip(k.result, want))


# == 3. deadlock and failure ==================================================================

PAIR = ((2,), ("i",))


def pair_sum(x):
    return psum(x, "i")


def enqueue_crossed_gangs(ex, consistent: bool):
    """Gangs A and B on devices 0 and 1 (in opposite orders unless consistent), then C."""
    ones = [(np.ones(3, np.float32) * (d + 1),) for d in range(2)]
    device_of = {0: 0, 1: 1}
    orders = {0: ["A", "B"], 1: ["A", "B"] if consistent else ["B", "A"]}
    gangs = {}
    for name in ("A", "B", "C"):
        seqs = [2 if name == "C" else orders[d].index(name) for d in range(2)]
        gangs[name] = enqueue_gang(ex, (ord(name),), pair_sum, ones, seqs, device_of, PAIR)
    return gangs


def test_a_timed_out_batch_names_the_members_that_did_not_come():
    batch = Batch(("gang", ("batch", 1)), (4, 5, 6))
    batch.box[5] = ("args",)
    assert batch.missing_sources() == [4, 6]


@pytest.mark.parametrize("consistent", [True, False])
def test_inconsistent_gang_order_times_out_and_devices_keep_serving(make_executor, consistent):
    fake = FakeTime()
    ex = make_executor(fake, (0, 1), collective_timeout=0.2)
    gangs = enqueue_crossed_gangs(ex, consistent)
    run_all(ex)  # detected: nothing hangs
    if consistent:
        assert all(not k.errors for ks in gangs.values() for k in ks)
        assert not any(r.error for d in ex.devices.values() for r in d.timeline)
    else:
        first = [gangs["A"][0], gangs["B"][1]]  # what each device ran first
        for k, device in zip(first, ex.devices.values()):
            assert len(k.errors) == 1 and isinstance(k.errors[0], CollectiveTimeout)
            assert "after 0.2s" in str(k.errors[0])
            assert f"no value from [{1 - device.device_id}]" in str(k.errors[0])  # who
            r = record_of(device, 0)
            assert r.error and r.end - r.start >= 0.2 - 1e-9  # the device stayed occupied
        assert fake.sleeps[0] == pytest.approx(0.2)  # one timed wait, not polling
    for k in gangs["C"]:  # later kernels are served
        assert not k.errors and k.done_at is not None
        assert k.result.tobytes() == np.full(3, 3.0, np.float32).tobytes()


@pytest.mark.parametrize("abort_on_error", [False, True], ids=["plain", "host-like"])
def test_a_deadlock_fails_every_kernel_of_both_gangs(make_executor, abort_on_error):
    # host-like: on_error aborts the kernel's gang, as pathways.host.kernel.Kernel.on_error does
    fake = FakeTime()
    ex = make_executor(fake, (0, 1), collective_timeout=0.2)
    gangs = enqueue_crossed_gangs(ex, consistent=False)
    if abort_on_error:
        for k in gangs["A"] + gangs["B"]:
            k.on_error = lambda exc, k=k: (Kernel.on_error(k, exc),
                                           ex.abort_gang(k.gang_key, f"{k.name} failed"))
    run_all(ex)
    timed_out = {k.name: bool(k.errors) and isinstance(k.errors[0], CollectiveTimeout)
                 for k in gangs["A"] + gangs["B"]}
    assert all(timed_out.values()), timed_out


def test_abort_gang_fails_a_parked_peer_at_once(make_executor):
    fake = FakeTime(horizon=10.0)  # the 60 s collective timeout cannot fire
    ex = make_executor(fake, (0, 1))
    entered = threading.Event()
    x = (np.ones(2, np.float32),)
    gang = ("client", 3, 0)
    shard0 = GangKernel(ex, PAIR, 0, {0: 0, 1: 1}, gang, pair_sum, x, before=entered.set)
    ex.devices[0].enqueue(0, shard0)
    after = Kernel("after", 0.0, clock=fake.clock)  # 0 s: the clock is stuck at the horizon
    ex.devices[0].enqueue(1, after)
    start(ex)
    assert entered.wait(WAIT)  # it parks in psum on this same executor turn
    ex.abort_gang(gang, "device 1 lost")
    assert ex.devices[0].wait_idle(WAIT)
    (error,) = shard0.errors
    assert isinstance(error, CollectiveTimeout) and "device 1 lost" in str(error)
    r = record_of(ex.devices[0], 0)
    assert r.error and r.end <= fake.horizon < ex.collective_timeout  # not its timeout
    assert not after.errors and after.done_at is not None  # the device carries on
    # a later exchange of the aborted gang fails without waiting at all
    shard1 = GangKernel(ex, PAIR, 1, {0: 0, 1: 1}, gang, pair_sum, x)
    ex.devices[1].enqueue(0, shard1)
    assert ex.devices[1].wait_idle(WAIT)
    assert isinstance(shard1.errors[0], CollectiveTimeout)
    r1 = record_of(ex.devices[1], 0)
    assert r1.error and r1.end == r1.start


def test_failing_bodies_and_publications_are_recorded_and_told(make_executor):
    fake = FakeTime()
    ex = make_executor(fake, with_store=True)
    device, ran = ex.devices[0], []

    def boom(_device):
        raise RuntimeError("kernel bug")

    class BadPublish(Kernel):
        def on_done(self, finish):
            super().on_done(finish)
            raise RuntimeError("could not publish")

    gone = (("gone", 0), 0)
    ex.store.reserve(gone, 8, OWNER)
    assert ex.store.delete(gone)  # a tombstone: readers get KeyError
    raising = Kernel("raises", 1.0, clock=fake.clock, body=boom, log=ran)
    negative = Kernel("negative", -1.0, clock=fake.clock, log=ran)
    publish = BadPublish("publish", 1.0, clock=fake.clock, log=ran)
    missing = Kernel("missing-input", 1.0, clock=fake.clock, inputs=[gone], log=ran)
    fine = Kernel("fine", 1.0, clock=fake.clock, log=ran)
    for seq, k in enumerate([raising, negative, publish, missing, fine]):
        device.enqueue(seq, k)
    run_all(ex)
    assert ran == ["raises", "negative", "publish", "fine"]  # the missing input never ran
    assert [r.error for r in device.timeline] == [True, True, True, True, False]
    assert isinstance(raising.errors[0], RuntimeError) and raising.done_at is None
    assert isinstance(negative.errors[0], ValueError)
    assert "could not publish" in str(publish.errors[0])
    assert isinstance(missing.errors[0], KeyError)
    assert not fine.errors and fine.done_at is not None
    for before, after in zip(device.timeline, device.timeline[1:]):
        assert after.start >= before.end


def test_a_kernel_with_inputs_but_no_store_fails(make_executor):
    fake = FakeTime()
    ex = make_executor(fake)
    k = Kernel("k", 1.0, clock=fake.clock, inputs=[(("x", 0), 0)])
    ex.devices[0].enqueue(0, k)
    run_all(ex)
    assert isinstance(k.errors[0], PathwaysError) and "no object store" in str(k.errors[0])


@pytest.mark.parametrize("driver", DRIVERS)
def test_close_tells_every_kernel_still_held(driver):
    fake = FakeTime(horizon=1.0)
    ex = Executor("closing", clock=Clock(fake.clock, fake.sleep))
    closed = False  # closed once only (see test_closing_twice_leaves_reused_fds_alone)
    try:
        for d in (0, 1):
            ex.add_device(d)
        entered = threading.Event()
        parked = GangKernel(ex, PAIR, 0, {0: 0, 1: 1}, (9,), pair_sum, (np.ones(1),),
                            before=entered.set)
        queued = Kernel("queued", clock=fake.clock)
        ex.devices[0].enqueue(0, parked)
        ex.devices[0].enqueue(1, queued)
        start(ex, driver)
        assert entered.wait(WAIT)
        closed = stop(ex)
        assert closed
    finally:
        if not closed:
            assert stop(ex)
    for k in (parked, queued):
        assert len(k.errors) == 1 and isinstance(k.errors[0], PathwaysError)
        assert "closed" in str(k.errors[0])


# == 4. HBM back-pressure =====================================================================

SMALL_HBM = DeviceSpec(hbm_bytes=100)


def wait_for_a_turn(ex, fake, device_id, seq):
    """Run a no-op kernel on another device: once it is done, the executor has fired every
    timer due at the current fake time (timers fire before new kernels are taken)."""
    probe = Kernel(f"probe{seq}", clock=fake.clock)
    ex.devices[device_id].enqueue(seq, probe)
    assert probe.finished.wait(WAIT)


def test_outputs_that_do_not_fit_keep_their_device_until_freed(make_executor):
    fake = FakeTime(horizon=1.0)  # the wait's bound (30 s) is never reached
    ex = make_executor(fake, (0, 1), spec=SMALL_HBM)
    device = ex.devices[0]
    assert device.hbm.try_allocate(60)  # someone else's buffer
    big = Kernel("big", 1.0, clock=fake.clock, nbytes=60)
    nxt = Kernel("next", 0.5, clock=fake.clock)
    device.enqueue(0, big)
    device.enqueue(1, nxt)
    start(ex)
    wait_until(lambda: fake.now >= 1.0, timeout=WAIT)
    wait_for_a_turn(ex, fake, 1, 0)  # big has reached its end and found no room
    assert big.ran_at == 0.0 and not big.finished.is_set()
    assert nxt.ran_at is None and device.next_seq == 0 and device.timeline == []
    fake.now, fake.horizon = 4.0, math.inf  # the executor is idle: nothing is due
    device.hbm.free(60)
    assert device.wait_idle(WAIT)
    a, b = device.timeline
    assert (a.start, a.end, a.error) == (0.0, 4.0, False)  # occupied until room was made
    assert big.done_at >= 4.0 and a.published >= a.end
    assert (b.start, b.end) == (4.0, 4.5)
    assert device.hbm.used == 60  # the output's bytes, taken before on_done


def test_outputs_that_never_fit_fail_after_the_kernel_limit_and_free_the_device(
        make_executor):
    """A kernel holds its device (and its gang's place in the order) while its outputs wait
    for HBM, but not without bound: after its kernel limit it fails, saying what it needed
    and what is held, and the next kernel runs."""
    fake = FakeTime()
    ex = make_executor(fake, spec=SMALL_HBM, kernel_limit=5.0)
    device = ex.devices[0]
    assert device.hbm.try_allocate(60)  # a live array nobody deletes
    big = Kernel("big", 1.0, clock=fake.clock, nbytes=60)
    nxt = Kernel("next", 0.5, clock=fake.clock, nbytes=40)
    device.enqueue(0, big)
    device.enqueue(1, nxt)
    run_all(ex)
    (error,) = big.errors
    assert isinstance(error, DeviceOutOfMemory) and big.done_at is None
    message = str(error)
    assert "outputs of big waited 5 s for 60 bytes" in message
    assert "only 40 of its 100 bytes are free (60 held" in message
    a, b = device.timeline
    assert (a.start, a.end, a.error) == (0.0, 6.0, True)  # held its device until it gave up
    assert (b.start, b.end, b.error) == (6.0, 6.5, False) and not nxt.errors
    assert device.hbm.used == 100  # the live array and next's output; nothing of big's


def test_outputs_larger_than_the_whole_hbm_fail(make_executor):
    fake = FakeTime()
    ex = make_executor(fake, spec=SMALL_HBM)
    device = ex.devices[0]
    huge = Kernel("huge", 1.0, clock=fake.clock, nbytes=101)
    nxt = Kernel("next", 1.0, clock=fake.clock, nbytes=100)
    device.enqueue(0, huge)
    device.enqueue(1, nxt)
    run_all(ex)
    (error,) = huge.errors
    assert isinstance(error, DeviceOutOfMemory) and huge.done_at is None
    assert [r.error for r in device.timeline] == [True, False]
    assert device.hbm.used == 100 and not nxt.errors


class RacyHbm(HbmAccount):
    """An HBM account where another thread's free lands right after a failed try_allocate
    (the interleaving is forced, on the executor thread, so the test is deterministic)."""

    blocker = 0

    def try_allocate(self, nbytes):
        fits = super().try_allocate(nbytes)
        if not fits and self.blocker:
            blocker, self.blocker = self.blocker, 0
            self.free(blocker)
        return fits


def test_a_free_racing_with_the_failed_allocation_is_not_lost(make_executor):
    fake = FakeTime()
    ex = make_executor(fake, spec=SMALL_HBM)
    device = ex.devices[0]
    device.hbm = RacyHbm(100, device.name)
    assert device.hbm.try_allocate(60)
    device.hbm.blocker = 60
    k = Kernel("k", 1.0, clock=fake.clock, nbytes=60)
    device.enqueue(0, k)
    start(ex)
    assert device.wait_idle(2.0)
    assert k.done_at is not None


# == 5. the ICI wire format ===================================================================

INT64 = st.integers(-(2**63), 2**63 - 1)
DTYPES = [np.dtype(t) for t in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4",
                                "f8", "c8", "c16", ">i4", ">f8", ">c16")]


@st.composite
def wire_values(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    a = draw(hnp.arrays(dtype, shape))
    layout = draw(st.sampled_from(["c", "fortran", "strided"]))
    if layout == "fortran":
        a = np.asfortranarray(a)
    elif layout == "strided" and a.ndim:
        a = np.repeat(a, 2, axis=-1)[..., ::2]  # equal values, not contiguous
    return a


wire_items = st.lists(st.tuples(
    st.tuples(st.lists(INT64, max_size=4).map(tuple), INT64),  # (gang key, seq)
    INT64,  # source device
    st.lists(INT64, max_size=5),  # destination devices
    wire_values(),
), max_size=4)


def check_round_trip(items, decoded):
    assert len(decoded) == len(items)
    for ((gang, seq), src, dsts, value), got in zip(items, decoded):
        a = np.asarray(value)
        (gang2, seq2), src2, dsts2, v, lag = got
        assert lag == 0.0
        assert (gang2, seq2, src2, tuple(dsts2)) == (tuple(gang), seq, src, tuple(dsts))
        assert v.dtype == a.dtype and v.shape == a.shape
        assert v.tobytes() == a.tobytes()  # bitwise: NaNs and -0.0 too
        assert v.flags.writeable and v.flags.c_contiguous
        assert not np.shares_memory(v, a)


@settings(max_examples=200, deadline=None)
@given(items=wire_items)
def test_ici_round_trip(items):
    originals = [np.array(value, copy=True) for *_, value in items]
    frames = encode(items)
    assert len(frames) == len(items) + 1
    check_round_trip(items, decode([bytes(f) for f in frames]))  # as the network delivers
    decoded = decode(frames)  # straight from encode's memoryviews: still fresh arrays
    check_round_trip(items, decoded)
    for (*_, v, _lag) in decoded:
        v.fill(0)  # writable, and shares nothing with the sender
    for (*_, value), original in zip(items, originals):
        assert np.asarray(value).tobytes() == original.tobytes()


@settings(max_examples=100, deadline=None)
@given(items=wire_items, data=st.data())
def test_ici_rejects_truncated_headers_and_wrong_frame_counts(items, data):
    frames = [bytes(f) for f in encode(items)]
    cut = data.draw(st.integers(0, len(frames[0]) - 1))
    with pytest.raises(ProtocolError):
        decode([frames[0][:cut], *frames[1:]])
    with pytest.raises(ProtocolError):
        decode([*frames, b"\0" * 8])  # one frame too many
    if items:
        with pytest.raises(ProtocolError):
            decode(frames[:-1])  # one too few
    with pytest.raises(ProtocolError):
        decode([frames[0] + b"\0", *frames[1:]])  # bytes left over


def one_item_header(dtype: bytes, shape=(), gang=(1,), dsts=(2,)) -> bytes:
    ints = (*gang, 0, 5, *dsts, *shape)
    return (struct.pack("<I", 1) + struct.pack("<BBHB", len(gang), len(dtype), len(dsts),
                                               len(shape))
            + struct.pack(f"<{len(ints)}q", *ints) + struct.pack("<d", 0.0) + dtype)


GARBAGE = {
    "no-frames": [],
    "empty-header": [b""],
    "short-count": [b"\xff" * 3],
    "huge-count": [b"\xff\xff\xff\xff"],  # 2**32 - 1 items in a one-frame message
    "wrong-value-size": [one_item_header(b"<i8"), b"\0" * 4],
    "partial-item": [one_item_header(b"<f4", shape=(3,)), b"\0" * 13],
    "object-dtype": [one_item_header(b"|O"), b"\0" * 8],  # objects never come off the wire
    "bad-dtype": [one_item_header(b"not a dtype"), b"\0" * 8],
    "non-text-dtype": [one_item_header(b"\xff\xfe"), b"\0" * 8],
    "two-unknown-dims": [one_item_header(b"<i8", shape=(-1, -1)), b"\0" * 8],
}


@pytest.mark.parametrize("frames", list(GARBAGE.values()), ids=list(GARBAGE))
def test_ici_rejects_garbage(frames):
    with pytest.raises(ProtocolError):
        decode(frames)


@pytest.mark.parametrize("shape", [(-1,), (-1, 2)], ids=str)
def test_ici_rejects_negative_dimensions(shape):
    with pytest.raises(ProtocolError):
        decode([one_item_header(b"<i8", shape=shape), b"\0" * 32])


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.binary(max_size=64), max_size=4))
def test_ici_decode_of_random_bytes_is_a_protocol_error_or_valid(frames):
    try:
        items = decode(frames)
    except ProtocolError:
        return
    for (gang, seq), src, dsts, value in items:  # a valid message: check its shape only
        assert all(isinstance(i, int) for i in (*gang, seq, src, *dsts))
        assert isinstance(value, np.ndarray) and not value.dtype.hasobject


@pytest.mark.parametrize("gang", [("a",), (1.5,), (None,), (2**63,), (1, "b"), tuple(range(256))],
                         ids=["str", "float", "none", "too-big", "mixed", "too-long"])
def test_ici_encode_refuses_keys_that_are_not_ints(gang):
    with pytest.raises(ProgramError):
        encode([((gang, 0), 1, [2], np.zeros(2))])


def test_ici_encode_refuses_object_arrays():
    with pytest.raises(ProgramError, match="numeric"):
        encode([(((1,), 0), 1, [2], np.array([1, "a"], dtype=object))])


# == executor hygiene =========================================================================


def test_closing_twice_leaves_reused_fds_alone():
    ex = Executor("twice", clock=Clock(FakeTime().clock))
    ex.start()  # the thread driver: its wake pipe
    assert ex.close(WAIT)
    fds = (ex.driver._wake_r, ex.driver._wake_w)  # now closed: another file gets the numbers
    r, w = os.pipe()
    try:
        for fd in fds:
            os.dup2(r, fd)
        assert ex.close(WAIT)
        for fd in fds:
            os.fstat(fd)  # EBADF if the second close took someone else's file
    finally:
        for fd in {r, w, *fds}:
            with contextlib.suppress(OSError):
                os.close(fd)


class LoopbackLink:
    """An ICI link to one pretend peer host holding device 1 of a group of two: whatever
    device 0 sends (its node of the reduction tree, ``hierarchy``) is answered with ``reply``
    as the peer's node, from a host that reached the collective ``lag`` seconds of virtual
    time behind its real time; the reply arrives ``transit`` later on ``fake``."""

    worker_of = {0: 0, 1: 1}
    node = (1, 2)  # the node the peer's reply names

    def __init__(self, fake: FakeTime, reply, lag: float, transit: float):
        self.fake, self.reply, self.lag, self.transit = fake, reply, lag, transit
        self.sent: list = []
        self._queued: list = []
        self._arrived: list = []
        self.fd, self._w = os.pipe()

    def queue(self, key, src, dsts, value, lag=0.0):
        self._queued.append((key, src, tuple(dsts), np.asarray(value).copy(), lag))

    def flush(self, failed=None):
        for key, src, dsts, value, lag in self._queued:
            self.sent.append((key, src, dsts, value, lag))
            self.fake.now += self.transit
            self._arrived.append((key, hierarchy.code(self.node, 2), (0,),
                                  np.asarray(self.reply), self.lag))
        self._queued = []

    def readable(self):
        return bool(self._arrived)

    def receive(self):
        got, self._arrived = self._arrived, []
        return got

    def close(self):
        os.close(self.fd)
        os.close(self._w)


def test_a_remote_value_counts_from_its_senders_virtual_time(make_executor):
    """A value from another host is available at its real arrival less its sender's lag (how
    far the sender's virtual time was behind real time), so the sender's lateness is not
    booked on this device; the lag travels on the wire."""
    fake = FakeTime()
    link = LoopbackLink(fake, reply=10.0, lag=-1.5, transit=2.0)
    try:
        ex = make_executor(fake, (0,), link=link)
        k = GangKernel(ex, ((2,), ("d",)), 0, {0: 0, 1: 1}, (7,),
                       lambda v: psum(v, "d"), (np.float64(1.0),), duration=1.0)
        ex.devices[0].enqueue(0, k)
        run_all(ex)
        assert k.result == 11.0 and not k.errors
        (record,) = ex.devices[0].timeline
        # sent at virtual 0; the reply came at real 2.0 from a sender 1.5 behind: 0.5
        assert (record.start, record.end) == (0.0, pytest.approx(0.5 + 1.0))
        (sent,) = link.sent
        assert sent[:3] == (((7,), 0), hierarchy.code((0, 1), 2), (1,))
        assert sent[4] == pytest.approx(0.0)
    finally:
        link.close()


def test_a_node_another_host_was_not_meant_to_send_fails_the_collective_at_once(
        make_executor):
    """Hosts that disagree on the algorithm (say, different PATHWAYS_FLAT_HOSTS) would wait
    for values that never come: an unexpected node fails the collective at once, saying
    why, instead of after the collective timeout."""
    fake = FakeTime()
    link = LoopbackLink(fake, reply=10.0, lag=0.0, transit=0.0)
    link.node = (0, 1)  # the node this host holds itself: never one it expects
    try:
        ex = make_executor(fake, (0,), link=link, collective_timeout=30.0)
        k = GangKernel(ex, ((2,), ("d",)), 0, {0: 0, 1: 1}, (8,),
                       lambda v: psum(v, "d"), (np.float64(1.0),), duration=1.0)
        ex.devices[0].enqueue(0, k)
        run_all(ex)
        assert k.result is None and len(k.errors) == 1
        assert isinstance(k.errors[0], ProgramError)
        assert "PATHWAYS_FLAT_HOSTS" in str(k.errors[0])
        assert record_of(ex.devices[0], 0).end < 30.0  # failed at once, not at the timeout
    finally:
        link.close()


def test_the_lag_survives_the_wire():
    items = [(((3, 4), 2), 0, [5, 6], np.arange(3.0), -0.125)]
    (got,) = decode([bytes(f) for f in encode(items)])
    assert got[0] == ((3, 4), 2) and got[4] == -0.125


# == 5. one client never stalls another =======================================================


def test_a_body_past_its_limit_is_stopped_and_the_device_goes_on(make_executor):
    fake = FakeTime()
    ex = make_executor(fake, kernel_limit=0.2)
    device, ran = ex.devices[0], []

    def spin(_device):
        while True:  # a body that never returns, in pure Python
            pass

    def sleep_long(_device):
        for _ in range(10_000):  # returns only after far more than its limit
            time.sleep(0.01)

    stuck = Kernel("stuck", 1.0, clock=fake.clock, body=spin, log=ran)
    slow = Kernel("slow", 1.0, clock=fake.clock, body=sleep_long, log=ran)
    after = Kernel("after", 1.0, clock=fake.clock, log=ran)
    for seq, k in enumerate([stuck, slow, after]):
        device.enqueue(seq, k)
    run_all(ex)
    assert ran == ["stuck", "slow", "after"]
    for k in (stuck, slow):
        (err,) = k.errors
        assert isinstance(err, KernelTimeout) and "limit of 0.2 s" in str(err), err
    assert not after.errors and after.done_at is not None
    assert [r.error for r in device.timeline] == [True, True, False]


def test_a_kernel_limit_of_its_own_beats_the_executor_default(make_executor):
    fake = FakeTime()
    ex = make_executor(fake, kernel_limit=None)  # no default: only the kernel's own limit
    device = ex.devices[0]
    flag = threading.Event()

    class Limited(Kernel):
        limit = 0.2

    def wait_forever(_device):
        while not flag.is_set():
            pass

    k = Limited("limited", 1.0, clock=fake.clock, body=wait_forever)
    device.enqueue(0, k)
    try:
        run_all(ex)
    finally:
        flag.set()
    assert isinstance(k.errors[0], KernelTimeout)


def test_a_reader_of_a_buffer_deleted_before_it_asked_fails_at_once(make_executor):
    fake = FakeTime()
    ex = make_executor(fake, with_store=True)
    key = (("x", 0), 0)
    ex.store.put(key, np.ones(4), OWNER)
    assert ex.store.delete(key)  # gone (not a tombstone: nothing was pending)
    reader = Kernel("reader", 1.0, clock=fake.clock, inputs=[key])
    later = Kernel("later", 1.0, clock=fake.clock)
    ex.devices[0].enqueue(0, reader)
    ex.devices[0].enqueue(1, later)
    run_all(ex)
    assert isinstance(reader.errors[0], KeyError) and "deleted" in str(reader.errors[0])
    assert later.done_at is not None
