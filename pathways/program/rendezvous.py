"""A thread-safe mailbox for collectives whose devices run in threads (``LocalEnv``).

Values are keyed by (exchange key, destination, source); an exchange key is
``(gang_key, sequence number)``, so a failed gang (``abort_gang``) fails every exchange of it,
present and future, and ``abort`` fails them all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from ..errors import CollectiveTimeout, ProgramError

__all__ = ["FAILED_GANGS_KEPT", "Abandoned", "Rendezvous"]

FAILED_GANGS_KEPT = 10_000  # failed gangs a mailbox (or a host's exchanges) remembers


class Rendezvous:
    """A thread-safe mailbox: values keyed by (exchange key, destination, source).

    ``collect`` removes what it returns, even when it times out, so a finished exchange leaves
    nothing behind (only a value arriving after its exchange gave up stays, until ``abort``).
    One condition per waiting (key, destination) shares a single lock, so a delivery wakes
    only the thread that wants it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._boxes: dict[tuple[Hashable, Hashable], dict[Hashable, object]] = {}
        self._waiters: dict[tuple[Hashable, Hashable], threading.Condition] = {}
        self._aborted: str | None = None
        self._failed_gangs: OrderedDict[Hashable, str] = OrderedDict()

    def deliver(self, key: Hashable, src: Hashable, dst: Hashable, value: object) -> None:
        """Leave ``value`` from ``src`` for ``dst``'s exchange ``key`` (dropped after abort)."""
        with self._lock:
            if self._aborted is not None or _gang(key) in self._failed_gangs:
                return
            box = self._boxes.setdefault((key, dst), {})
            if src in box:
                raise ProgramError(f"exchange {key!r}: {src!r} delivered to {dst!r} twice")
            box[src] = value
            waiter = self._waiters.get((key, dst))
            if waiter is not None:
                cond, needed = waiter
                if len(box) >= len(needed) and needed.issubset(box):
                    cond.notify()  # wake the collector once, when it has everything

    def collect(self, key: Hashable, dst: Hashable, sources, timeout: float) -> dict:
        """Wait until every source has delivered to ``dst`` for ``key``; return {src: value}.

        Raises CollectiveTimeout naming the missing sources after ``timeout`` seconds, or at
        once if the mailbox is aborted.
        """
        sources = list(sources)
        with self._lock:
            box = self._boxes.setdefault((key, dst), {})
            waiter = threading.Condition(self._lock)
            self._waiters[(key, dst)] = (waiter, frozenset(sources))
            try:
                waiter.wait_for(
                    lambda: self._aborted is not None or _gang(key) in self._failed_gangs
                    or all(s in box for s in sources), timeout
                )
            finally:
                del self._waiters[(key, dst)]
            missing = [s for s in sources if s not in box]
            # Take what arrived even on failure, so a failed exchange leaves nothing behind.
            got = {s: box.pop(s) for s in sources if s in box}
            if not box:
                self._boxes.pop((key, dst), None)  # abort may have cleared it already
            if self._aborted is not None:
                raise Abandoned(f"exchange {key!r} at {dst!r} abandoned: {self._aborted}")
            failed = self._failed_gangs.get(_gang(key))
            if failed is not None:
                raise Abandoned(f"exchange {key!r} at {dst!r} abandoned: {failed}")
            if missing:
                raise CollectiveTimeout(
                    f"exchange {key!r} at {dst!r}: no value from {missing} after {timeout}s "
                    "(a peer skipped this collective, called another one, or is lost)"
                )
            return got

    def abort(self, reason: str) -> None:
        """Wake every waiter with a CollectiveTimeout, drop stored values and later deliveries."""
        with self._lock:
            if self._aborted is None:
                self._aborted = reason
            self._boxes.clear()
            for waiter, _needed in self._waiters.values():
                waiter.notify_all()

    def abort_gang(self, gang_key: Hashable, reason: str) -> None:
        """Fail every exchange, present and future, whose key is ``(gang_key, seq)``.

        A device whose kernel failed calls this (on every host of the gang) so that its
        peers stop waiting for it at once instead of timing out.
        """
        with self._lock:
            self._failed_gangs[gang_key] = reason
            while len(self._failed_gangs) > FAILED_GANGS_KEPT:
                self._failed_gangs.popitem(last=False)
            for k in [k for k in self._boxes if _gang(k[0]) == gang_key]:
                del self._boxes[k]
            for (key, _dst), (waiter, _needed) in self._waiters.items():
                if _gang(key) == gang_key:
                    waiter.notify_all()

    def pending(self) -> int:
        """How many delivered values nobody has collected yet."""
        with self._lock:
            return sum(len(box) for box in self._boxes.values())



def _gang(key):
    return key[0] if isinstance(key, tuple) and key else None


class Abandoned(CollectiveTimeout):
    """An exchange woken by ``Rendezvous.abort``: a consequence of another device's failure.
    ``root``: that failure's own error (a ``RemoteError``) when it is known, which is what a
    kernel failing with this one fails with."""

    def __init__(self, *args, root=None):
        super().__init__(*args)
        self.root = root
