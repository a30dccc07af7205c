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

Which gangs go next, and when, is a ``Policy``. Policies deal in programs, the list of gangs
submitted together, and release a program whole; the scheduler numbers its gangs back to back
in list order, so on every device they get consecutive numbers with nothing from another
program in between. ``FifoPolicy`` releases every program at once in submission order; a policy
that shares devices between clients may hold programs back and release them later, when the
runtime calls ``release_ready``.

Example: submit [A on (0, 1)], then [B on (1, 2), C on (2,)]:
A gets {0: 0, 1: 0}; B gets {1: 1, 2: 0}; C gets {2: 1}.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import ProgramError


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


class IslandScheduler:
    """Gives every gang on one island a place in one order, as per-device sequence numbers."""

    def __init__(self, island: int, policy: Policy | None = None) -> None:
        self.island = island
        self.policy = policy if policy is not None else FifoPolicy()
        self._next: dict[int, int] = {}  # device -> its next sequence number

    def submit(self, gangs: Iterable[Gang]) -> list[Release]:
        """Submit one program (its gangs in order); returns the gangs the policy releases now.

        The result may also hold gangs of earlier programs that the policy held back.
        Raises ProgramError for a gang with no devices or the same device twice.
        """
        program = tuple(gangs)
        for gang in program:
            _check_gang(gang)
        if program:
            self.policy.add(program)
        return self.release_ready()

    def release_ready(self) -> list[Release]:
        """Number and return the gangs of every program the policy releases now, in order."""
        return [
            (gang.gang_id, self._sequence(gang))
            for program in self.policy.pop_ready()
            for gang in program
        ]

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
