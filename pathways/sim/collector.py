"""Garbage collection as an event of the simulation, so a seed replays in one process too.

Python's cyclic collector runs when its allocation counters pass a threshold, and those
counters carry the process's whole history (earlier simulations, the test before). A client
array in a reference cycle is freed -- and its shards' delete sent -- when a collection
finds it, so the same seed sent its deletes at other points of the run (and so other messages
at other times) each time it ran in the same process.

While a simulation is up, a ``Collector`` holds the automatic collector off: it collects what
is garbage already, freezes what lives (so its own passes do not rescan the process's old
heap) and disables collection. The simulation then collects at fixed points of its own: after
every ``every`` handlers of its roles, the young generation, the middle one every tenth pass
and the oldest every hundredth, as the collector's own thresholds do. When the last simulation
releases its hold, the collector is as it was (enabled or not, nothing left frozen by us).
"""

from __future__ import annotations

import gc
import threading

__all__ = ["Collector", "EVERY"]

EVERY = 100  # handlers of a simulation between two of its collections

_state = {"holds": 0, "enabled": True, "frozen": 0}  # what the last release restores
_lock = threading.Lock()


class Collector:
    """One simulation's hold on the garbage collector (see the module's text): ``handled()``
    after each handler of its roles; ``release()`` once, when the simulation ends."""

    def __init__(self, every: int = EVERY):
        if every < 1:
            raise ValueError(f"a collection every {every!r} handlers: at least 1")
        self.every, self.handlers, self.passes = every, 0, 0
        self._released = False
        with _lock:
            if _state["holds"] == 0:
                _state.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count())
            _state["holds"] += 1
            gc.disable()
        gc.collect()  # the garbage of what ran before is not this simulation's
        gc.freeze()

    def handled(self) -> None:
        """One more handler ran: collect if it was the ``every``-th since the last pass."""
        self.handlers += 1
        if self.handlers % self.every == 0:
            self.collect()

    def collect(self) -> None:
        """One pass, of the generation the pass count gives."""
        self.passes += 1
        gc.collect(2 if self.passes % 100 == 0 else 1 if self.passes % 10 == 0 else 0)

    def release(self) -> None:
        """The simulation ended; the last release restores the collector."""
        with _lock:
            if self._released:
                return
            self._released = True
            _state["holds"] -= 1
            if _state["holds"] > 0:
                return
            if _state["frozen"] == 0:  # frozen before us: someone else's to undo
                gc.unfreeze()
            if _state["enabled"]:
                gc.enable()
