"""A client's programs, made once: lowered and installed per input placement, moved onto
remapped slices per mapping, and the one-equation programs of compiled functions called alone.

A program is lowered (``pathways.lowering``) for the placements of its inputs and installed on
the cluster once, under a program id of this client; every later call with the same placements
is then one run message. The caches key programs by ``id()`` and keep the program itself in the
entry, so the id stays valid for as long as the entry lives. Nothing here waits: an install is
one message, and its failure arrives as ``InstallFailed`` (the client fails the program's runs).
"""

from __future__ import annotations

import itertools

from .. import protocol
from ..lowering.lower import lower
from ..program.ir import Eqn, Program
from ..program.tracer import single_call_program

__all__ = ["ProgramCache"]


class ProgramCache:
    """The programs of client ``client_id``, lowered for ``dispatch`` ("parallel" or
    "sequential") with the devices of ``cluster`` (a ``ClusterView``) and installed through
    ``session``."""

    def __init__(self, client_id, dispatch: str, session, cluster):
        self._client_id, self._dispatch = client_id, dispatch
        self._session, self._cluster = session, cluster
        self._ids = itertools.count()
        self._lowered: dict[tuple, tuple] = {}  # (id(program), placements) -> (program, pid, out)
        self._retargeted: dict[tuple, tuple] = {}  # (id(program), versions) -> (program, new)
        self._op_programs: dict[tuple, object] = {}
        self._wanted: dict[tuple, frozenset] = {}  # pid -> output var ids the user fetched

    def wanted(self, pid) -> frozenset:
        """The outputs of program ``pid`` whose small results ride on its runs' end: those
        this client fetched from an earlier run, until one that came along goes unread (a
        value nobody reads is not shipped)."""
        return self._wanted.get(pid, frozenset())

    def want(self, pid, var_id) -> None:
        """The user fetched output ``var_id`` of a run of ``pid``: ship it from now on."""
        have = self._wanted.get(pid, frozenset())
        if var_id not in have:
            self._wanted[pid] = have | {var_id}

    def unwant(self, pid, var_id) -> None:
        """An output ``var_id`` of ``pid`` that came along went unread: ship it no more
        (until it is fetched again)."""
        have = self._wanted.get(pid, frozenset())
        if var_id in have:
            self._wanted[pid] = have - {var_id}

    def op_program(self, fn, avals):
        """The program that calls ``fn`` alone on arguments of ``avals`` (made once)."""
        key = (fn, tuple(avals))
        if key not in self._op_programs:
            self._op_programs[key] = single_call_program(fn, avals)
        return self._op_programs[key]

    def retarget(self, program):
        """``program`` with every compiled function on a remapped slice moved onto it."""
        versions = self._cluster.slice_versions()
        if not versions:
            return program
        key = (id(program), versions)
        hit = self._retargeted.get(key)
        if hit is not None:
            return hit[1]
        eqns, changed = [], False
        for eqn in program.eqns:
            fn = eqn.fn.retarget(self._cluster.current)
            changed |= fn is not eqn.fn
            eqns.append(Eqn(fn, eqn.inputs, eqn.outputs))
        new = Program(program.name, program.inputs, tuple(eqns), program.outputs,
                      program.single_output) if changed else program
        self._retargeted[key] = (program, new)  # keeps program alive: id() stays valid
        return new

    def install(self, program, placements) -> tuple:
        """The id of ``program`` installed for inputs at ``placements``, and where its
        outputs go (output variable id -> (mesh, spec)); lowered and installed at the first
        call with these placements."""
        key = (id(program), placements)
        hit = self._lowered.get(key)
        if hit is not None:
            return hit[1], hit[2]
        worker_of, island_of = self._cluster.hosts_and_islands()
        lowered = lower(program, list(placements), worker_of, island_of, self._dispatch)
        pid = (self._client_id, next(self._ids))
        payload = lowered.install_payload([e.fn.body for e in program.eqns])
        self._session.send(self._session.address, protocol.InstallProgram(pid, *payload))
        self._lowered[key] = (program, pid, lowered.outputs)  # keeps program alive: id() valid
        return pid, lowered.outputs
