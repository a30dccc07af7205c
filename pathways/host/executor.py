"""One executor per host: one thread runs every emulated device of the host as a timeline.

The executor is a thin layer over three pieces:

- the pure core, ``pathways.host.timeline``: per device a ``Lane`` (kernels by sequence
  number, the one running, when the device is free) and one ``Timeline`` that decides, in
  *virtual* time, when each kernel starts and ends:

      start = max(device free, real time its dispatch reached the host, inputs ready)
      end   = start + max(real compute, modelled) + time spent waiting for peers

  where an input is ready at its producer's modelled end (same host) or at its real arrival
  (data from another host or a client, plus its modelled link time);
- the body runner, ``pathways.host.body_runner``: bodies in greenlets, parked (not a thread)
  while they wait in a collective (``pathways.host.exchange``), under a watchdog for their
  time limit;
- a driver, ``pathways.host.drivers``: the host's event loop (``run_on``) or a thread of its
  own (``start``), which calls ``turn`` and waits until ``next_deadline``.

In a turn the executor feeds the core its events -- a device's next kernel taken, its inputs
ready (the object store), its body done, HBM for its outputs admitted -- and carries out what
the core says: start a body once real time has reached its start, and at its modelled end
take HBM for its outputs and publish them (``on_done``: store puts, capability releases,
progress). The shards of one gang on this host whose ends come together are published as
one (``gang.on_done_all``: one store lock, one post to the loop), once no end of theirs is
still to come; a shard is never held for a peer whose body has not ended. A late wake-up
delays publication but is not booked as device time, so utilization means what the paper
means. Only devices whose lane changed are looked at for a next kernel. HBM back-pressure
is "not finished yet": a kernel
whose outputs do not fit keeps its device until frees make room, ahead of every other wait
for that HBM, for at most ``hbm_wait`` seconds (the kernel limit); then it fails with
``DeviceOutOfMemory`` and the device goes on with the next gang.

Kernels are ``pathways.host.device.DeviceWork``: ``execute(device) -> modelled seconds``,
``input_keys()`` (object-store keys to wait for), ``not_before`` (a modelled arrival of data
pushed to it), ``output_bytes()`` (HBM its outputs need, taken before ``on_done``),
``on_done(finish)`` (a ``Finish``: its modelled end and that HBM), ``on_error(exc)`` and
``gang`` (what the kernels of one gang share, or None).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable

from ..errors import PathwaysError
from ..program.cost import DeviceSpec
from .admission import Admissions
from .body_runner import BodyRunner, Shard, kernel_name
from .clock import MONOTONIC, Clock
from .device import (
    EmulatedDevice,
    Finish,
    KernelRecord,
    device_name,
    finished_all,
    report_error,
)
from .drivers import LoopDriver, ThreadDriver
from .exchange import Exchanges
from .hbm import HBM_WAIT, HbmGrant, no_room
from .timeline import End, Start, Timeline

log = logging.getLogger("pathways.host.executor")

COLLECTIVE_TIMEOUT = 60.0
KERNEL_LIMIT = 30.0  # seconds a body may run on the host's thread (a host's default)
TURN_BUDGET = 0.05  # real seconds a turn goes on starting work before the loop gets its say


class Executor:
    """Runs the kernels of a set of devices on one thread (see the module docstring).

    ``store``: the host's object store, for kernels with ``input_keys``. ``link``: what carries
    collective values to other hosts, as ``pathways.host.ici.IciLink`` does (``queue(key, src,
    dsts, value, lag)``, ``flush(failed)``, ``receive() -> [(key, src, dsts, value, lag)]``,
    ``readable()`` and ``fd``). ``clock``: the ``Clock`` it reads (``now`` is its time); a fake
    one's ``sleep`` is used for every timed wait. ``run_on(loop)`` runs it on an event loop,
    ``start()`` on a thread of its own.
    """

    def __init__(self, name: str = "host", store=None, link=None,
                 clock: Clock = MONOTONIC,
                 collective_timeout: float = COLLECTIVE_TIMEOUT,
                 kernel_limit: float | None = KERNEL_LIMIT):
        self.name, self.store, self.link = name, store, link
        self.clock, self.now = clock, clock.time
        self.collective_timeout = collective_timeout
        self.kernel_limit = kernel_limit  # a kernel's own ``limit`` attribute wins; None: none
        # how long a kernel may hold its device waiting for HBM for its outputs
        self.hbm_wait = kernel_limit or HBM_WAIT
        self.devices: dict[int, EmulatedDevice] = {}
        self.jax_of: dict = {}  # device id -> its own JAX device (pathways host --backend jax)
        self.lock = threading.Lock()  # device queues (enqueued from other threads)
        self.idle = threading.Condition(self.lock)  # wait_idle waiters
        self.idle_waiters = 0
        self.timeline = Timeline()  # when kernels start and end (the pure core)
        self.bodies = BodyRunner(self)
        self.exchanges = Exchanges(self)  # the collectives of the shards it runs
        self.driver: ThreadDriver | LoopDriver | None = None  # set by start or run_on
        self.closing = False
        self._inbox: deque = deque()
        self._timers: list = []  # (when, tick, fn) of ``at``
        self._tick = itertools.count()
        self._resumable: deque = deque()
        self.turn_cut = False  # the last turn stopped at its budget, with work left
        self._bands: dict = {}  # gang -> its _Band: its shards whose ends came so far
        # devices whose lane changed since a turn last looked (under ``lock``): only these
        # may have a next kernel to take
        self._changed_lanes: dict[int, EmulatedDevice] = {}
        self._ending: list = []  # bands (and lone shards) to finish at the end of this pass
        # outputs take HBM through the store's admissions (its own when there is no store)
        self._admit = (store.admissions if store is not None else Admissions(self.devices)).admit

    def start(self) -> None:
        """Run on a thread of its own (unless it runs already)."""
        if self.driver is None:
            self.driver = ThreadDriver(self)
            self.driver.start()

    def run_on(self, loop) -> None:
        """Run on ``loop``'s thread instead of a thread of its own (call it there): a host
        then has one thread for Plaque, its data service and its devices."""
        self.driver = LoopDriver(self, loop)
        self.driver.start()

    def add_device(self, device_id: int, spec=None, name: str | None = None) -> EmulatedDevice:
        """A new device run by this executor (any thread)."""
        device = EmulatedDevice(device_id, spec, name, self)
        with self.lock:
            self.devices[device_id] = device
            self.changed_lane(device)
        self.wake()
        return device

    # -- any thread ------------------------------------------------------------------------

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the executor thread at its next turn (one wake per batch)."""
        self._inbox.append(fn)
        self.wake()

    def wake(self) -> None:
        """A turn soon (any thread); before it runs, its first turn looks anyway."""
        if self.driver is not None:
            self.driver.wake()

    def abort_gang(self, gang_key, reason: str, root=None) -> None:
        """Fail every exchange, present and future, of ``gang_key`` on this executor (with
        ``root``, the failure's own error, when it is known)."""
        if self.on_thread():
            self.exchanges.abort_gang(gang_key, reason, root)
        else:
            self.call_soon(lambda: self.exchanges.abort_gang(gang_key, reason, root))

    def close(self, timeout: float = 5.0) -> bool:
        """Stop; queued kernels of every device, and the running ones, are told via
        ``on_error``. Returns whether it stopped within ``timeout``."""
        for device in list(self.devices.values()):
            device.close_queue()
        self.closing = True
        return True if self.driver is None else self.driver.close(timeout)

    def on_thread(self) -> bool:
        return self.driver is not None and self.driver.on_thread()

    # -- the driver's side -----------------------------------------------------------------

    def attach(self) -> None:
        """The driver's thread: bodies run on it and park back into it."""
        self.bodies.attach()

    def turn(self) -> None:
        """Queued calls, ICI values, then whatever can happen now, until nothing can or, in
        real time, the turn has run ``TURN_BUDGET`` seconds (``next_deadline`` then asks for
        the next turn at once): bodies run on the driver's thread, and an event loop that
        also carries Plaque must get its say between long bodies, where its ticks notice a
        lost coordinator before the next body starts."""
        self.turn_cut = False
        while self._inbox:
            fn = self._inbox.popleft()
            try:
                fn()
            except Exception:
                log.exception("executor %s: a queued call failed", self.name)
        if self.link is not None:
            now = self.now()
            receive = self.exchanges.receive
            for key, src, dsts, value, lag in self.link.receive():
                receive(key, src, dsts, value, now + min(lag, 0.0))
        ends = self.now() + TURN_BUDGET if self.clock.real else None
        busy = True
        while busy:
            busy = self._fire_due()
            while self._resumable:
                self.bodies.resume(*self._resumable.popleft())
                busy = True
            if self._ending:
                self._finish_ended()
                busy = True
            # the clock is read after work only (a device's next kernel may run a body)
            if not (busy and self._over(ends)) and self._changed_lanes:
                busy = self._take_all(ends) or busy
            busy = busy and not self._over(ends)
        if self._ending:  # (a turn cut at its budget publishes what ended before it goes)
            self._finish_ended()
        if self.link is not None:
            self.link.flush(self._unsent)

    def changed_lane(self, device: EmulatedDevice) -> None:
        """Under ``lock``: ``device``'s lane changed (a kernel queued, a seq skipped, the
        device freed or closing): the next turn looks whether it has a kernel to take."""
        self._changed_lanes[device.device_id] = device

    def _take_all(self, ends: float | None) -> bool:
        """Take the next kernel of each device whose lane changed, if it can start; those
        left when the turn's budget runs out are looked at by the next."""
        with self.lock:
            todo, self._changed_lanes = self._changed_lanes, {}
        took = False
        devices = list(todo.values())
        for i, device in enumerate(devices):
            if device.current is None and self._take_next(device):
                took = True
                if self._over(ends):  # the rest wait for the next turn
                    with self.lock:
                        for rest in devices[i + 1:]:
                            self.changed_lane(rest)
                    break
        return took

    def _over(self, ends: float | None) -> bool:
        """The turn has used its budget: it stops here and the next one comes at once."""
        if not self.turn_cut and ends is not None and self.now() >= ends:
            self.turn_cut = True
        return self.turn_cut

    def internal_error(self, exc: BaseException) -> None:
        """A turn failed with ``exc`` (a bug of the executor's own): what it may have left
        undone could hold the gangs waiting in a collective, so each fails now, naming it,
        instead of waiting for its peers' timeout. The executor keeps serving."""
        self.exchanges.abort_parked(f"{self.name} failed: {type(exc).__name__}: {exc}")

    def _unsent(self, key, exc: Exception) -> None:
        """The value of exchange ``key`` could not leave for another host: its gang fails
        here at once, with why (its peers learn it from the coordinator)."""
        log.error("executor %s: exchange %r could not be sent: %r", self.name, key, exc)
        self.exchanges.abort_gang(key[0], f"{self.name} could not send its value to another"
                                          f" host: {type(exc).__name__}: {exc}")

    def next_deadline(self) -> float | None:
        """When the next turn is due (0.0: at once; None: only when woken)."""
        if self._inbox or self._resumable or self.turn_cut or self._ending:
            return 0.0
        times = [t for t in (self.timeline.next_wake(),
                             self._timers[0][0] if self._timers else None) if t is not None]
        return min(times) if times else None

    def pending_calls(self) -> bool:
        return bool(self._inbox)

    def stop_running(self) -> None:
        """The driver stops: the bodies still running are stopped and told."""
        self.bodies.stop([d.current for d in self.devices.values() if d.current is not None])

    # -- the executor's thread ---------------------------------------------------------------

    def at(self, when: float, fn: Callable[[], object]) -> None:
        """Call ``fn()`` once the clock has reached ``when``."""
        heapq.heappush(self._timers, (when, next(self._tick), fn))
        self._changed()

    def park(self) -> None:
        """In a shard's greenlet: give the thread back until ``resume_later`` is called."""
        self.bodies.park()

    def resume_later(self, shard: Shard, error: BaseException | None) -> None:
        """Resume a parked shard at this turn, or raise ``error`` in it."""
        self._resumable.append((shard, error))
        self._changed()

    def body_done(self, shard: Shard) -> None:
        """``shard``'s body returned or raised: finish it at its modelled end."""
        if self.timeline.finish(shard, shard.ended_at):
            self._ended(shard, deferred=False)
        else:
            gang = shard.kernel.gang
            if gang is not None:  # its band waits for this end too
                self._band(gang).coming += 1
            self._changed()

    def _changed(self) -> None:
        if self.driver is not None:
            self.driver.changed()

    def _in_own_turn(self) -> bool:
        return self.on_thread() and self.driver.in_turn()

    def _fire_due(self) -> bool:
        now = self.now()
        fired = False
        while self._timers and self._timers[0][0] <= now:
            heapq.heappop(self._timers)[2]()
            fired = True
        for action in self.timeline.due(now):
            self._act(action, now)
            fired = True
        return fired

    def _act(self, action: Start | End, now: float) -> None:
        if type(action) is Start:
            self.bodies.begin(action.slot, now)
        else:
            self._ended(action.slot, deferred=True)

    # -- a device's next kernel --------------------------------------------------------------

    def _take_next(self, device: EmulatedDevice) -> bool:
        shard = device.take_next(lambda *slot: Shard(device, *slot))
        if shard is None:
            return False
        kernel = shard.kernel
        keys = shard.keys = kernel.input_keys()
        if not keys:
            self._inputs_ready(shard, 0.0)
            return True
        if self.store is None:
            return self._failed_early(shard, PathwaysError(
                f"{device.name}: kernel {kernel!r} has inputs but no object store"))
        ready = self.store.ready_at(keys)
        if ready is not None:  # the common case: inputs made before, no callbacks
            self._inputs_ready(shard, ready)
            return True
        shard.pending = len(keys) + 1  # +1: released below, once all are registered
        for key in keys:
            try:
                self.store.add_done_callback(key, lambda _k, s=shard: self._input_done(s))
            except Exception as exc:  # e.g. the input was deleted
                shard.error = exc
                self._input_done(shard)
        self._input_done(shard)
        return True

    def _input_done(self, shard: Shard) -> None:
        if not self._in_own_turn():  # a store callback from elsewhere: do it in a turn
            self.call_soon(lambda: self._input_done(shard))
            return
        shard.pending -= 1
        if shard.pending == 0:
            self._inputs_ready(shard)

    def _inputs_ready(self, shard: Shard, inputs_at: float | None = None) -> None:
        if shard.error is not None:
            self._failed_early(shard, shard.error)
            return
        if inputs_at is None:
            inputs_at = max((self.store.arrival(k) for k in shard.keys), default=0.0)
        at = max(inputs_at, shard.kernel.not_before or 0.0)
        now = self.now()
        if self.timeline.ready(shard, at, now):
            self.bodies.begin(shard, now)
        else:
            self._changed()

    def _failed_early(self, shard: Shard, error: BaseException) -> bool:
        self.timeline.failed(shard)
        shard.error, shard.done = error, True
        self._publish([shard])  # (a failed shard takes no HBM)
        return True

    # -- its modelled end --------------------------------------------------------------------

    def _band(self, gang) -> _Band:
        band = self._bands.get(gang)
        if band is None:
            band = self._bands[gang] = _Band(gang)
        return band

    def _ended(self, shard: Shard, deferred: bool) -> None:
        """Real time has reached ``shard``'s modelled end (``deferred``: an ``End`` the
        timeline kept): it is finished at the end of this pass, with the shards of its gang
        whose ends came too, once none is still to come (they come together: a gang's
        shards end at the same virtual time, give or take their own real time)."""
        gang = shard.kernel.gang
        if gang is None:
            self._ending.append([shard])
            return
        band = self._band(gang)
        if deferred:
            band.coming -= 1
        band.shards.append(shard)
        if not band.coming and not band.queued:
            band.queued = True
            self._ending.append(band)

    def _finish_ended(self) -> None:
        ending, self._ending = self._ending, []
        for shards in ending:
            if type(shards) is _Band:
                band, shards = shards, shards.shards
                band.queued = False
                if band.coming:  # another end of its gang was kept meanwhile: wait for it
                    continue
                del self._bands[band.gang]
            self._publish([s for s in shards if self._admit_outputs(s)])

    def _admit_outputs(self, shard: Shard) -> bool:
        """Take ``shard``'s outputs' HBM: True if it is taken (or it failed) and the shard
        may be published now; else it keeps its device until frees make room (``_admitted``
        publishes it then) or ``hbm_wait`` has passed (``_no_room``)."""
        if shard.error is None and shard.grant is None:
            device, nbytes = shard.device, shard.nbytes
            try:
                # a kernel's outputs go before any other wait: if they fit, they are taken
                # here (as ``admit`` would, urgent), else ``admit`` waits for room
                if not nbytes or device.hbm.try_allocate(nbytes):
                    shard.grant = HbmGrant(device.device_id, nbytes, device.hbm)
                    return True
                admission = self._admit(device.device_id, nbytes,
                                        lambda got: self._admitted(shard, got), urgent=True)
            except Exception as exc:  # e.g. a bad output_bytes(), more than the whole HBM
                shard.error = exc
                return True
            if shard.grant is None and shard.error is None:
                self.timeline.hold(shard)  # keeps its device until room is made
                self.at(self.now() + self.hbm_wait, lambda: self._no_room(shard, admission))
                return False
        return True

    def _no_room(self, shard: Shard, admission) -> None:
        """The kernel waited ``hbm_wait`` for its outputs' HBM: it fails, and its device
        (which it held all along) goes on."""
        if shard.grant is not None or shard.error is not None:
            return  # admitted (or failed) in time
        admission.cancel()
        shard.error = no_room(shard.device, shard.nbytes, self.hbm_wait,
                              f"the outputs of {kernel_name(shard.kernel)} ",
                              "give the host a longer kernel limit")
        self.timeline.admitted(shard, self.now())  # it occupied its device until now
        self._publish([shard])

    def _admitted(self, shard: Shard, got) -> None:
        """Its outputs' HBM, or why there is none (more than the whole HBM): at once, in
        ``_admit_outputs``, or later, for a shard that kept its device while it waited
        (then it is published here, alone, its device occupied until now)."""
        waited = shard.held
        if isinstance(got, BaseException):
            shard.error = got
        else:
            shard.grant = got
            if waited:
                self.timeline.admitted(shard, self.now())
        if waited:
            self._publish([shard])

    def _publish(self, shards: list) -> None:
        """Publish the outputs of ``shards`` (of one gang, or one shard), record each on its
        device and free it; a failed shard's kernel is told instead."""
        if not shards:
            return
        done = [s for s in shards if s.error is None]
        if len(done) > 1:
            try:
                done[0].kernel.gang.on_done_all([(s.kernel, Finish(s.end, s.grant))
                                                 for s in done])
                done = []
            except Exception:  # all or nothing: each then finds its own error
                log.debug("executor %s: publishing a gang's shards together failed", self.name,
                          exc_info=True)
        for shard in done:
            try:
                shard.kernel.on_done(Finish(shard.end, shard.grant))
            except Exception as exc:
                shard.error = exc
        now = self.now()
        records = []
        for shard in shards:
            kernel = shard.kernel
            if shard.error is not None:
                report_error(kernel, shard.error)
            labels = dict(kernel.labels or {})
            if shard.hosted:  # the device idled from its start while its host compiled
                labels["compile"] = shard.hosted
            if shard.waited:  # of its time on the device, this went on waiting for peers
                labels["waited"] = shard.waited
            records.append((shard.device, shard, KernelRecord(
                shard.seq, kernel_name(kernel), labels, shard.began, shard.end,
                shard.error is not None, shard.arrived, now)))
        finished_all(self, records)


class _Band:
    """The shards of one gang on this executor whose ends have come, finished together
    once no end of theirs is still ``coming`` (kept by the timeline for later)."""

    __slots__ = ("gang", "coming", "shards", "queued")

    def __init__(self, gang):
        self.gang = gang
        self.coming = 0
        self.shards: list = []
        self.queued = False  # in the executor's ``_ending``


def standalone_device(device_id: int, spec: DeviceSpec | None = None,
                      clock: Clock = MONOTONIC, name: str | None = None) -> EmulatedDevice:
    """A device with an executor of its own, on its own thread (tests and benchmarks of one
    device); closing the device stops the executor."""
    spec = spec if spec is not None else DeviceSpec()
    executor = Executor(device_name(spec, device_id, name), clock=clock)
    device = EmulatedDevice(device_id, spec, name, executor, own_executor=True)
    executor.devices[device_id] = device
    executor.changed_lane(device)
    executor.start()
    return device
