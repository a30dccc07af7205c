"""The CPU time a simulated role is charged: its thread's CPU time, less garbage collections.

All roles of a simulation share one process, so one heap: a collection that happens during a
role's handler scans every role's objects (a gen-2 pass over a large simulated cluster takes
50-200 ms), a pause the role would not have on a machine of its own with only its own heap.
``thread_cpu()`` is ``time.thread_time()`` less the CPU this thread has spent in collections,
counted by a ``gc.callbacks`` hook (added on first use, per thread).

A role's work must also stay on its thread to be measured: numpy's BLAS (OpenBLAS, MKL) runs a
large matrix product on a pool of threads, whose CPU no thread meter sees (a 512x256 @
256x512 product was charged half its CPU, and the share varied 3x between runs). While a
simulation runs, ``one_thread()`` holds those pools at one thread (threadpoolctl), as a
role models one core.
"""

from __future__ import annotations

import gc
import threading
import time

from threadpoolctl import threadpool_limits

__all__ = ["collecting", "thread_cpu", "gc_seconds", "one_thread"]

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


_held = {"count": 0, "limits": None}  # simulations running; what restores the pools
_held_lock = threading.Lock()


class one_thread:  # noqa: N801 (used as a function: ``held = one_thread()``)
    """Native thread pools (BLAS) at one thread until ``release()`` (any number held at once,
    released in any order; the pools' own sizes come back when the last is released)."""

    def __init__(self):
        with _held_lock:
            if _held["count"] == 0:
                _held["limits"] = threadpool_limits(limits=1)
            _held["count"] += 1
        self._released = False

    def release(self) -> None:
        with _held_lock:
            if self._released:
                return
            self._released = True
            _held["count"] -= 1
            if _held["count"] == 0:
                _held["limits"].restore_original_limits()
                _held["limits"] = None
