"""The runs a client has given the cluster and not yet seen end.

A run is in flight from its ``RunProgram`` until the coordinator says it ended (``RunDone``,
``RunFailed``), its program failed to install (``InstallFailed``), or the session ended (the
client closed, the coordinator went silent). The book keeps, for each run, what its end must
settle: the status future its output arrays wait on and the input arrays it holds (their
deletion waits for it). It is plain bookkeeping with no lock of its own: runs are added on user
threads (under the suspensions' lock, ``pathways.client.suspension``) and ended on the session's
loop thread, each by one dict operation.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
from dataclasses import dataclass

__all__ = ["Run", "RunBook"]


@dataclass(frozen=True)
class Run:
    """A run in flight: ``status`` resolves (to None, or the run's error) when it ends and is
    the future of its new outputs; ``inputs`` the arrays it reads, held until it ends;
    ``outputs`` the arrays it returns; ``program`` the id of the program it runs."""

    status: cf.Future
    inputs: tuple
    outputs: tuple
    program: tuple


class RunBook:
    """The runs in flight by run id, and the ids of the runs to come."""

    def __init__(self):
        self._runs: dict[int, Run] = {}
        self._ids = itertools.count()

    def new_id(self) -> int:
        """The id of the next run (this client's runs count from 0)."""
        return next(self._ids)

    def add(self, run_id: int, run: Run) -> None:
        self._runs[run_id] = run

    def pop(self, run_id: int) -> Run | None:
        """The run ``run_id``, no longer in flight; None if it was not (ended already)."""
        return self._runs.pop(run_id, None)

    def pop_program(self, program: tuple) -> list[Run]:
        """Every run of ``program``, no longer in flight (its install failed)."""
        out = []
        for run_id, run in list(self._runs.items()):
            if run.program == program:
                del self._runs[run_id]
                out.append(run)
        return out

    def pop_all(self) -> list[Run]:
        """Every run, no longer in flight (the session ended)."""
        out = []
        for run_id in list(self._runs):
            run = self._runs.pop(run_id, None)
            if run is not None:
                out.append(run)
        return out

    def status_at(self, index: int) -> cf.Future | None:
        """The status of the ``index``-th oldest run in flight (0: the oldest), or None if
        fewer are."""
        try:
            run = next(itertools.islice(self._runs.values(), index, None), None)
        except RuntimeError:  # a run ended on the loop thread meanwhile: look again
            return self.status_at(index)
        return None if run is None else run.status

    def statuses(self) -> list[cf.Future]:
        """The status of every run in flight now."""
        return [run.status for run in list(self._runs.values())]

    def __len__(self) -> int:
        return len(self._runs)
