"""The island gang scheduler's pure core: one consistent order of gangs per island. No I/O.

A gang is one SPMD computation on a set of devices. Emulated TPUs, like real ones, run one
kernel at a time, and a kernel holding a collective blocks until all its peers arrive: if device
0 ran gang A before gang B while device 1 ran B before A, both would wait forever. So each island
has one scheduler that puts every gang, from every program and client, in a single order.

How: gangs are released one at a time, and a released gang takes, on each of its devices, that
device's next sequence number (numbers start at 0 and grow by one per gang on the device). Hosts
run each device's kernels in sequence-number order. Two gangs that share devices are then
ordered the same way on all of them by construction: the one released first has the smaller
number on every shared device.

Which gangs go next, and when, is a ``Policy``. Programs (the gangs submitted together) go in;
what comes out is numbered in the order returned, gang by gang. ``FifoPolicy`` returns every
program whole, at once, in submission order, so a program's gangs get consecutive numbers on
every device. The windowed policies return one gang at a time, choosing between clients each
time (each client's own gangs keep their order), and keep at most ``window`` programs admitted
and unfinished per island (the runtime reports each finished program with ``finished``):
``ProportionalSharePolicy`` gives clients device time in proportion to their weights,
``PriorityPolicy`` serves the highest priority first.

Example: submit [A on (0, 1)], then [B on (1, 2), C on (2,)]:
A gets {0: 0, 1: 0}; B gets {1: 1, 2: 0}; C gets {2: 1}.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ProgramError


@dataclass(frozen=True)
class Gang:
    """One SPMD computation of a client that must run on all of ``devices`` together."""

    gang_id: object
    client: object
    devices: tuple[int, ...]


Program = tuple[Gang, ...]
Release = tuple[object, dict[int, int]]  # (gang id, {device: sequence number})


class Policy(ABC):
    """Decides which submitted programs to release next, and in which order."""

    @abstractmethod
    def add(self, program: Program) -> None:
        """Hold a newly submitted program (a non-empty tuple of gangs)."""

    @abstractmethod
    def pop_ready(self) -> list[Program]:
        """Remove and return the programs to release now, in release order."""

    @abstractmethod
    def drop_client(self, client: object) -> list[Gang]:
        """Forget the held gangs of a client (it closed or was lost) and return them."""

    def done(self, program: Program) -> None:  # noqa: B027 (most policies need not know)
        """A released program has finished on this island (its devices are free of it)."""

    def waiting(self) -> dict:
        """Gangs held per client."""
        return {}


class FifoPolicy(Policy):
    """Release every program immediately, in submission order."""

    def __init__(self) -> None:
        self._held: deque[Program] = deque()

    def add(self, program: Program) -> None:
        self._held.append(program)

    def pop_ready(self) -> list[Program]:
        ready = list(self._held)
        self._held.clear()
        return ready

    def drop_client(self, client: object) -> list[Gang]:
        # FIFO holds nothing between calls, but stay correct if a caller interleaves add/drop.
        dropped = [g for p in self._held for g in p if g.client == client]
        kept = (tuple(g for g in p if g.client != client) for p in self._held)
        self._held = deque(p for p in kept if p)
        return dropped


class WindowedPolicy(Policy):
    """Releases gang by gang, choosing between clients, with at most ``window`` programs
    admitted (some gang released) and not yet finished; the rest wait.

    Each client's gangs wait in submission order. A pick takes the next gang of the client
    ``_choose`` prefers, among clients whose next gang may go (its program is admitted, or
    the window has room). Gangs of different clients therefore interleave one gang at a time
    on the devices, while each client's own gangs keep their order.
    """

    def __init__(self, window: int = 8) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._queues: dict[object, deque[tuple[Gang, Program, int]]] = {}
        self._admitted: set[Program] = set()
        self._exempt: set[Program] = set()
        self._arrivals = 0

    def add(self, program: Program, exempt: bool = False) -> None:
        """``exempt``: admit without waiting for room in the window. For a run that spans
        islands: admitted on one island while held on another, it could hold the first
        island's window while the second's is full of runs waiting for the first."""
        client = program[0].client
        if exempt:
            self._exempt.add(program)
        queue = self._queues.setdefault(client, deque())
        if not queue:
            self._activate(client)
        for gang in program:
            queue.append((gang, program, self._arrivals))
            self._arrivals += 1

    def pop_ready(self) -> list[Program]:
        out = []
        while True:
            ready = [c for c, q in self._queues.items()
                     if q and (q[0][1] in self._admitted or q[0][1] in self._exempt
                               or len(self._admitted) < self.window)]
            if not ready:
                return out
            client = self._choose(ready)
            gang, program, _ = self._queues[client].popleft()
            self._admitted.add(program)
            self._charge(client, gang)
            out.append((gang,))

    def done(self, program: Program) -> None:
        self._admitted.discard(program)
        self._exempt.discard(program)

    def drop_client(self, client: object) -> list[Gang]:
        queue = self._queues.pop(client, deque())
        self._exempt.difference_update(p for _, p, _ in queue)
        return [g for g, _, _ in queue]

    def waiting(self) -> dict:
        return {c: len(q) for c, q in self._queues.items() if q}

    @property
    def in_flight(self) -> int:
        """Programs admitted and not finished."""
        return len(self._admitted)

    def _head(self, client) -> int:
        return self._queues[client][0][2]

    def _activate(self, client) -> None:
        """A client with nothing waiting submits again."""

    def _charge(self, client, gang: Gang) -> None:
        """A gang of ``client`` was released."""

    @abstractmethod
    def _choose(self, ready: list) -> object:
        """The client whose next gang goes now."""


class ProportionalSharePolicy(WindowedPolicy):
    """Device time shared between clients in proportion to their weights.

    Start-time fair queueing over clients: each client has a virtual time that grows by
    ``cost(gang) / weight`` per gang released (default cost: the gang's device count); the
    next gang of the client with the smallest virtual time goes next. A client that was idle
    restarts at the current virtual time, so it saves up no credit while idle. With kernels
    of similar length the shares of device time follow the weights.

    >>> policy = ProportionalSharePolicy(weight_of={"a": 1, "b": 2}.get, window=4)
    """

    def __init__(self, weight_of, window: int = 8, cost=None) -> None:
        super().__init__(window)
        self.weight_of = weight_of
        self.cost = cost or (lambda gang: float(len(gang.devices)))
        self._vtime: dict[object, float] = {}
        self._now = 0.0

    def _activate(self, client) -> None:
        self._vtime[client] = max(self._vtime.get(client, 0.0), self._now)

    def _choose(self, ready):
        return min(ready, key=lambda c: (self._vtime[c], self._head(c)))

    def _charge(self, client, gang) -> None:
        weight = self.weight_of(client)
        weight = 1.0 if weight is None else weight
        if weight <= 0:
            raise ValueError(f"client {client!r} has weight {weight}; weights must be > 0")
        self._now = self._vtime[client]
        self._vtime[client] += self.cost(gang) / weight

    def drop_client(self, client: object) -> list[Gang]:
        self._vtime.pop(client, None)
        return super().drop_client(client)


class PriorityPolicy(WindowedPolicy):
    """Strict priority: the next gang of the highest-priority client goes first; submission
    order among equal priorities. Lower priorities wait while higher ones keep submitting.

    >>> policy = PriorityPolicy(priority_of={"batch": 0, "serving": 10}.get, window=4)
    """

    def __init__(self, priority_of, window: int = 8) -> None:
        super().__init__(window)
        self.priority_of = priority_of

    def _choose(self, ready):
        return min(ready, key=lambda c: (-(self.priority_of(c) or 0), self._head(c)))


class IslandScheduler:
    """Gives every gang on one island a place in one order, as per-device sequence numbers."""

    def __init__(self, island: int, policy: Policy | None = None) -> None:
        self.island = island
        self.policy = policy if policy is not None else FifoPolicy()
        self._next: dict[int, int] = {}  # device -> its next sequence number

    def submit(self, gangs: Iterable[Gang], spans_islands: bool = False) -> list[Release]:
        """Submit one program (its gangs in order); returns the gangs the policy releases now.

        The result may also hold gangs of earlier programs that the policy held back.
        ``spans_islands``: part of a run with gangs on other islands too; a windowed policy
        then admits it without waiting for room (see ``WindowedPolicy.add``).
        Raises ProgramError for a gang with no devices or the same device twice.
        """
        program = tuple(gangs)
        for gang in program:
            _check_gang(gang)
        if program:
            if spans_islands and isinstance(self.policy, WindowedPolicy):
                self.policy.add(program, exempt=True)
            else:
                self.policy.add(program)
        return self.release_ready()

    def release_ready(self) -> list[Release]:
        """Number and return the gangs of every program the policy releases now, in order."""
        return [
            (gang.gang_id, self._sequence(gang))
            for program in self.policy.pop_ready()
            for gang in program
        ]

    def finished(self, gangs: Iterable[Gang]) -> list[Release]:
        """A released program (its gangs, as submitted) is over here; release what may go."""
        self.policy.done(tuple(gangs))
        return self.release_ready()

    def drop_client(self, client: object) -> list[object]:
        """Forget a client's held (unreleased) gangs; returns their ids.

        Released gangs keep their numbers: hosts must still skip them so later gangs run.
        """
        return [gang.gang_id for gang in self.policy.drop_client(client)]

    def next_seq(self, device: int) -> int:
        """The number the next gang released on ``device`` will get (0 for a new device)."""
        return self._next.get(device, 0)

    def _sequence(self, gang: Gang) -> dict[int, int]:
        seqs = {}
        for device in gang.devices:
            seqs[device] = self._next.get(device, 0)
            self._next[device] = seqs[device] + 1
        return seqs


def _check_gang(gang: Gang) -> None:
    if not gang.devices:
        raise ProgramError(f"gang {gang.gang_id!r} of client {gang.client!r} has no devices")
    if len(set(gang.devices)) != len(gang.devices):
        raise ProgramError(
            f"gang {gang.gang_id!r} of client {gang.client!r} names a device twice: {gang.devices}"
        )
