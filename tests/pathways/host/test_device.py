"""Emulated devices: strict seq order, one kernel at a time, modelled time, HBM back-pressure.

Every device test runs twice: on a standalone device (an executor of its own on its own
thread, ``standalone_device``) and on an executor run by an event loop, as every host runs its
devices (``Executor.run_on``; ``executor_drivers``). Time is checked through a fake clock and
sleep, never against the wall clock; every device and thread a test starts is closed by a
fixture, and every wait has a timeout.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from executor_drivers import DRIVERS, WAIT, start, stop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pathways.errors import CollectiveTimeout, DeviceOutOfMemory, PathwaysError
from pathways.host.clock import Clock
from pathways.host.device import DeviceWork, EmulatedDevice
from pathways.host.executor import Executor, standalone_device
from pathways.host.hbm import HbmAccount
from pathways.program.cost import (
    DCN,
    ICI,
    DeviceSpec,
    estimate_kernel,
    kernel_time,
    resolve_cost,
    transfer_time,
)


class FakeTime:
    """A clock that only moves when slept on (by the device) or advanced (by a kernel)."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Kernel(DeviceWork):
    """A test kernel: logs its run, optionally advances fake time or runs a body."""

    def __init__(self, name, log=None, duration=0.0, body=None, labels=None):
        self.name, self.log, self.duration, self.body = name, log, duration, body
        self.labels = labels or {}
        self.errors: list[BaseException] = []
        self.completed = False

    def execute(self, device):
        if self.log is not None:
            self.log.append(self.name)
        if self.body is not None:
            self.body(device)
        return self.duration

    def on_error(self, exc):
        self.errors.append(exc)

    def on_done(self, finish):
        self.completed = True


@pytest.fixture(params=DRIVERS)
def make_device(request):
    """Build devices, each run by an executor of its own, that are always closed, even when
    the test fails: standalone ones ("thread") or ones an event loop runs ("loop")."""
    made: list[EmulatedDevice] = []
    executors: list[Executor] = []

    def make(device_id=0, **kwargs):
        if "clock" in kwargs:  # fake time: its clock and sleep
            kwargs["clock"] = Clock(kwargs.pop("clock"), kwargs.pop("sleep", None))
        spec = kwargs.pop("spec", DeviceSpec())
        if request.param == "thread":
            device = standalone_device(device_id, spec, **kwargs)
        else:
            executor = Executor(f"test-{device_id}", **kwargs)
            executors.append(executor)
            device = executor.add_device(device_id, spec)
            start(executor)
        made.append(device)
        return device

    yield make
    for device in made:
        assert device.close(timeout=WAIT)
    for executor in executors:
        assert stop(executor)


# -- order --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(list(range(8))), durations=st.lists(
    st.floats(0, 2, allow_nan=False), min_size=8, max_size=8))
def test_kernels_run_in_seq_order_one_at_a_time(make_device, order, durations):
    fake, ran = FakeTime(), []
    kernels, overlaps = {}, []

    def body(_device):  # a kernel starts only once every earlier one has finished (on_done)
        overlaps.append(not all(kernels[s].completed for s in range(ran[-1])))

    device = make_device(clock=fake.clock, sleep=fake.sleep)
    with device:
        for seq in order:
            kernels[seq] = Kernel(seq, ran, durations[seq], body)
            device.enqueue(seq, kernels[seq])
        assert device.wait_idle(WAIT)
        assert ran == list(range(8))
        assert not any(overlaps)
        timeline = device.timeline
        assert [r.seq for r in timeline] == list(range(8))
        for before, after in zip(timeline, timeline[1:]):
            assert before.end <= after.start
        for record, duration in zip(timeline, durations):
            assert record.end - record.start == pytest.approx(duration)
        assert device.busy_seconds == pytest.approx(sum(durations))
        assert device.next_seq == 8


def test_enqueue_from_many_threads_runs_in_order(make_device, threads):
    ran = []
    device = make_device()
    enqueuers = [
        threads(lambda p: [device.enqueue(s, Kernel(s, ran)) for s in range(p, 40, 4)], part)
        for part in range(4)
    ]
    for thread in enqueuers:
        thread.join(WAIT)
    assert device.wait_idle(WAIT)
    assert ran == list(range(40))


def test_device_waits_for_the_next_seq(make_device):
    ran = []
    device = make_device()
    device.enqueue(1, Kernel(1, ran))
    device.enqueue(2, Kernel(2, ran))
    assert not device.wait_idle(timeout=0.05)
    assert ran == [] and device.next_seq == 0
    device.enqueue(0, Kernel(0, ran))
    assert device.wait_idle(WAIT)
    assert ran == [0, 1, 2]


def test_bad_enqueues_are_rejected(make_device):
    device = make_device()
    device.enqueue(0, Kernel("a"))
    assert device.wait_idle(WAIT)
    with pytest.raises(ValueError, match="already ran"):
        device.enqueue(0, Kernel("again"))
    device.enqueue(5, Kernel("later"))
    with pytest.raises(ValueError, match="already enqueued"):
        device.enqueue(5, Kernel("twice"))
    with pytest.raises(ValueError, match="seq must be"):
        device.enqueue(-1, Kernel("negative"))
    with pytest.raises(TypeError):
        device.enqueue(6, object())


# -- modelled time ------------------------------------------------------------------------


def test_device_sleeps_the_modelled_remainder(make_device):
    fake = FakeTime()
    device = make_device(clock=fake.clock, sleep=fake.sleep)
    slow = Kernel("slow", duration=0.5, body=lambda d: setattr(fake, "now", fake.now + 2.0))
    device.enqueue(0, Kernel("modelled", duration=1.5))
    device.enqueue(1, slow)  # real elapsed (2 s) beats modelled (0.5 s): no sleep
    assert device.wait_idle(WAIT)
    assert fake.sleeps == [pytest.approx(1.5)]
    assert [(r.start, r.end) for r in device.timeline] == [(0.0, 1.5), (1.5, 3.5)]
    assert device.busy_seconds == pytest.approx(3.5)
    assert slow.completed


def test_outputs_are_published_at_the_modelled_end(make_device):
    fake, published = FakeTime(), []

    class Publisher(Kernel):
        def on_done(self, finish):
            published.append(fake.now)
            if self.name == "bad":
                raise RuntimeError("could not publish")

    device = make_device(clock=fake.clock, sleep=fake.sleep)
    bad = Publisher("bad", duration=1.0)
    device.enqueue(0, Publisher("good", duration=2.0))
    device.enqueue(1, bad)
    assert device.wait_idle(WAIT)
    assert published == [pytest.approx(2.0), pytest.approx(3.0)]
    assert [r.error for r in device.timeline] == [False, True]
    assert isinstance(bad.errors[0], RuntimeError)


def test_a_late_wake_up_is_not_booked_as_device_time(make_device):
    fake = FakeTime()

    def late_sleep(seconds):  # the OS wakes the executor 0.25 s after every deadline
        fake.sleep(seconds + 0.25)

    device = make_device(clock=fake.clock, sleep=late_sleep)
    for seq in reversed(range(3)):  # all dispatched at time 0 (seq 0 last: nothing starts early)
        device.enqueue(seq, Kernel(seq, duration=1.0))
    assert device.wait_idle(WAIT)
    timeline = device.timeline
    assert [(r.start, r.end) for r in timeline] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]
    assert device.busy_seconds == pytest.approx(3.0)
    assert fake.now >= 3.0  # but nothing was published before its modelled end


def test_utilization_from_the_timeline(make_device):
    fake = FakeTime()
    device = make_device(clock=fake.clock, sleep=fake.sleep)
    device.enqueue(0, Kernel("a", duration=1.0, labels={"client": 1}))
    assert device.wait_idle(WAIT)
    fake.now = 3.0  # idle for two seconds
    device.enqueue(1, Kernel("b", duration=1.0))
    assert device.wait_idle(WAIT)
    assert device.utilization(0.0, 4.0) == pytest.approx(0.5)
    assert device.utilization(0.5, 1.0) == pytest.approx(1.0)
    assert device.utilization() == pytest.approx(0.5)
    assert device.timeline[0].labels == {"client": 1}
    with pytest.raises(ValueError):
        device.utilization(2.0, 1.0)


# -- failures, skip, close ----------------------------------------------------------------


def test_a_failing_kernel_does_not_kill_the_device(make_device):
    ran = []

    def boom(_device):
        raise RuntimeError("kernel bug")

    class BadOnError(Kernel):
        def on_error(self, exc):
            raise RuntimeError("on_error bug too")

    device = make_device()
    failing = Kernel("boom", ran, body=boom)
    negative = Kernel("negative", ran, duration=-1.0)
    device.enqueue(0, failing)
    device.enqueue(1, negative)
    device.enqueue(2, BadOnError("worse", ran, body=boom))
    device.enqueue(3, Kernel("fine", ran))
    assert device.wait_idle(WAIT)
    assert ran == ["boom", "negative", "worse", "fine"]
    assert [r.error for r in device.timeline] == [True, True, True, False]
    assert isinstance(failing.errors[0], RuntimeError) and not failing.completed
    assert isinstance(negative.errors[0], ValueError)


def test_skip_lets_later_seqs_run(make_device):
    ran = []
    device = make_device()
    device.enqueue(2, Kernel(2, ran))
    assert device.skip(1)
    dropped = Kernel(3, ran)
    device.enqueue(3, dropped)
    assert device.skip(3, "its run failed: boom")  # already queued: dropped and told why
    assert not device.skip(3)
    device.enqueue(0, Kernel(0, ran))
    assert device.wait_idle(WAIT)
    assert ran == [0, 2]
    assert isinstance(dropped.errors[0], PathwaysError)
    assert str(dropped.errors[0]).endswith("seq 3 was skipped because its run failed: boom")
    assert device.next_seq == 4 and not device.skip(0)


def test_a_kernel_dispatched_after_its_seq_was_skipped_is_told_and_dropped(make_device):
    """A run failed and the coordinator skipped its seqs before a late (sequential) dispatch
    reached the host: the kernel must fail, not raise at its dispatcher nor run."""
    ran = []
    device = make_device()
    assert device.skip(0, "its run failed: boom") and device.skip(2)
    device.enqueue(1, Kernel(1, ran))
    assert device.wait_idle(WAIT) and device.next_seq == 3  # 0 and 2 passed: skipped
    late = [Kernel("late0", ran), Kernel("late2", ran)]
    device.enqueue(2, late[1])  # skipped, and already passed
    device.enqueue(0, late[0])
    device.enqueue(3, Kernel(3, ran))
    assert device.wait_idle(WAIT)
    assert ran == [1, 3]
    for kernel in late:
        assert "was skipped" in str(kernel.errors[0]) and not kernel.completed
    assert "because its run failed: boom" in str(late[0].errors[0])
    with pytest.raises(ValueError, match="already ran"):  # told once: a second is misuse
        device.enqueue(0, Kernel("again", ran))


def test_close_is_idempotent_and_tells_queued_kernels(make_device):
    device = make_device()
    waiting = Kernel("never")
    device.enqueue(1, waiting)
    assert device.close(timeout=WAIT)
    assert device.close(timeout=WAIT)
    assert isinstance(waiting.errors[0], PathwaysError)
    with pytest.raises(PathwaysError, match="closed"):
        device.enqueue(2, Kernel("late"))


# -- the faithful deadlock ----------------------------------------------------------------


class Collective(Kernel):
    """A gang's kernel: blocks in a rendezvous with its peers, as a TPU all-reduce does.

    When one rendezvous times out, every barrier of the step is aborted, as a runtime aborts
    the whole step once it detects a deadlock. Without that the outcome would depend on a
    race: the device that times out first could move on and complete the other gang with
    its still-waiting peer.
    """

    def __init__(self, name, barriers):
        super().__init__(name, body=self._rendezvous)
        self.barriers = barriers

    def _rendezvous(self, device):
        try:
            self.barriers[self.name].wait()
        except threading.BrokenBarrierError:
            for barrier in self.barriers.values():
                barrier.abort()
            raise CollectiveTimeout(f"{self.name} on {device.name}: peers never arrived") from None


@pytest.mark.parametrize("consistent", [True, False])
def test_inconsistent_gang_order_deadlocks_and_is_detected(make_device, consistent):
    barriers = {g: threading.Barrier(2, timeout=0.5) for g in "AB"}
    devices = [make_device(0), make_device(1)]
    orders = [["A", "B"], ["A", "B"] if consistent else ["B", "A"]]
    kernels = []
    for device, order in zip(devices, orders):
        for seq, gang in enumerate(order):
            kernels.append(Collective(gang, barriers))
            device.enqueue(seq, kernels[-1])
    for device in devices:
        assert device.wait_idle(WAIT)  # detected: nothing hangs
    if consistent:
        assert [k.errors for k in kernels] == [[]] * 4
        assert not any(r.error for d in devices for r in d.timeline)
    else:
        assert all(len(k.errors) == 1 for k in kernels)
        assert all(isinstance(k.errors[0], CollectiveTimeout) for k in kernels)
        assert all(r.error for d in devices for r in d.timeline)


# -- HBM ----------------------------------------------------------------------------------


def test_an_allocation_takes_hbm_if_it_fits_now_and_never_waits():
    hbm = HbmAccount(100, "tpu:0")
    with pytest.raises(DeviceOutOfMemory, match=r"tpu:0.*101.*100"):
        hbm.try_allocate(101)  # more than the whole HBM: it never fits
    assert hbm.used == 0
    assert hbm.try_allocate(60) and not hbm.try_allocate(60)  # no room now: no wait either
    assert hbm.used == 60 and hbm.peak == 60
    hbm.free(60)
    assert hbm.try_allocate(60)
    hbm.close()
    assert not hbm.try_allocate(1) and hbm.closed
    hbm.free(60)  # frees still work after close
    assert hbm.used == 0
    with pytest.raises(AssertionError, match="double free"):
        hbm.free(1)


def test_device_owns_an_hbm_account_of_its_spec(make_device):
    device = make_device(spec=DeviceSpec(hbm_bytes=1 << 20))
    assert device.hbm.capacity == 1 << 20
    with pytest.raises(DeviceOutOfMemory):
        device.hbm.try_allocate(2 << 20)


# -- cost model ---------------------------------------------------------------------------


def test_cost_model():
    spec = DeviceSpec()
    assert kernel_time(spec.flops, 0, spec) == pytest.approx(1.0)
    assert kernel_time(0, spec.hbm_bandwidth * 2, spec) == pytest.approx(2.0)
    a = np.zeros(1 << 18, np.float32)
    assert estimate_kernel([a, a], [a], spec) == pytest.approx(3 * a.nbytes / spec.hbm_bandwidth)
    assert transfer_time(0, DCN) == 0.0
    assert transfer_time(100e9, ICI) == pytest.approx(1.0 + 5e-6)
    assert resolve_cost(None, [(4,)], 0.25) == 0.25
    assert resolve_cost(2, [(4,)], 0.25) == 2.0
    assert resolve_cost(lambda shapes: shapes[0][0] * 1e-3, [(4,)], 0.25) == pytest.approx(4e-3)
    for bad in (-1.0, "1s", True, float("nan"), lambda shapes: -2):
        with pytest.raises(ValueError, match="seconds"):
            resolve_cost(bad, [(4,)], 0.25)
