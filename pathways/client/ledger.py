"""The lifetimes of a client's arrays: which are alive, which are held, and when each is freed.

The client refcounts the logical array (the ``Array`` object), not its shards: an array's
shards are freed on the hosts when the object is collected or deleted. A run in flight that
reads an array, or a save writing it, holds it: deleting it then frees it only once the last
holder lets go, so a delete never pulls an input from under a queued call; an array still being
produced is freed once its producing run has ended. The holds lock orders a delete against a
run being given the array (or a save choosing it): the hold is taken first, or the delete wins
and the call sees the array deleted.
"""

from __future__ import annotations

import itertools
import threading
import weakref

from ..errors import PathwaysError

__all__ = ["ArrayLedger"]


class ArrayLedger:
    """This client's live arrays and their holds; ``free(array)`` frees an array's shards on
    the hosts (``Shards.delete``, nothing once the client closed)."""

    def __init__(self, free):
        self._free = free
        self._lock = threading.Lock()  # the hold counts: runs starting vs deletes
        self._holds: dict[int, int] = {}  # id(array) -> holders (held arrays stay alive)
        # every Array not yet collected, in creation order: a set's order would follow
        # addresses in memory, and a simulation must replay what it sends for them
        self._live = weakref.WeakValueDictionary()
        self._made = itertools.count()

    def track(self, array) -> None:
        """A new array of this client."""
        self._live[next(self._made)] = array

    def live(self) -> list:
        """The client's arrays alive now, oldest first."""
        while True:  # the set may change while it is read (a collection): read again
            try:
                return list(self._live.values())
            except RuntimeError:
                continue

    def hold(self, arrays) -> None:
        """A run (or save) reads these arrays: their deletion waits for it."""
        with self._lock:
            for a in arrays:
                self._holds[id(a)] = self._holds.get(id(a), 0) + 1

    def unhold(self, arrays) -> None:
        """A run (or save) that read these arrays has finished: free those deleted
        meanwhile."""
        due = []
        with self._lock:
            for a in arrays:
                left = self._holds.pop(id(a), 0) - 1
                if left > 0:
                    self._holds[id(a)] = left
                elif a.is_deleted():
                    due.append(a)
        for a in due:
            self.release_when_unused(a)

    def release_when_unused(self, array) -> None:
        """Free a deleted array's shards once no run in flight reads or produces it."""
        with self._lock:
            if id(array) in self._holds:
                return  # the last run reading it frees it (unhold)
        if not array.done():  # its producing run is still going: free it after
            array.add_done_callback(self.release_when_unused)
            return
        try:
            self.release(array)
        except PathwaysError:
            pass  # closed or coordinator lost: the hosts free what the client owned

    def collected(self, array) -> None:
        """``array`` is being collected (and marked deleted): free its shards now, unless a
        save holds it. A weak reference still reaches an object while its finalizer runs, so
        a save on another thread can find it in ``live()`` then and hold it before it reads
        ``is_deleted()``; that save's ``unhold`` frees it once it is written."""
        with self._lock:
            if id(array) in self._holds:
                return
        self.release(array)

    def release(self, array) -> None:
        """Free ``array``'s shards now, held or not."""
        self._free(array)
