"""The CPU time a simulated role is charged: its thread's CPU time, less garbage collections.

All roles of a simulation share one process, so one heap: a collection that happens during a
role's handler scans every role's objects (a gen-2 pass over a large simulated cluster takes
50-200 ms), a pause the role would not have on a machine of its own with only its own heap.
``thread_cpu()`` is ``time.thread_time()`` less the CPU this thread has spent in collections,
counted by a ``gc.callbacks`` hook (added on first use, per thread).
"""

from __future__ import annotations

import gc
import threading
import time

__all__ = ["collecting", "thread_cpu", "gc_seconds"]

_spent: dict[int, float] = {}  # thread id -> CPU seconds in collections so far
_began: dict[int, float] = {}  # thread id -> when its running collection began
_hooked = False


def _on_gc(phase: str, _info: dict) -> None:
    me = threading.get_ident()
    if phase == "start":
        _began[me] = time.thread_time()
    else:
        began = _began.pop(me, None)
        if began is not None:
            _spent[me] = _spent.get(me, 0.0) + time.thread_time() - began


def gc_seconds() -> float:
    """CPU seconds this thread has spent in garbage collections since ``thread_cpu`` was
    first used."""
    global _hooked
    if not _hooked:
        _hooked = True
        gc.callbacks.append(_on_gc)
    return _spent.get(threading.get_ident(), 0.0)


def thread_cpu() -> float:
    """This thread's CPU seconds, less those spent in garbage collections."""
    return time.thread_time() - gc_seconds()


def collecting() -> bool:
    """Whether this thread is inside a garbage collection (a ``__del__`` the collector runs)."""
    gc_seconds()  # the hook is in place
    return threading.get_ident() in _began
