"""Fusing a program's consecutive JAX calls: one compiled function, one kernel per device.

Inside ``@pw.program``, calls of JAX bodies (``pw.shard_map`` of jax.numpy code) that follow
each other on one mesh, where each value passed from one to the next already lies where the
next needs it (same placement: no transfer between them), become one ``FusedFunction``. Its
body is their per-device jaxprs chained (``jax_plan.chain_bodies``), planned as any JAX body:
segments run between the collectives that leave a host, each once for all of the host's devices
(``jax_batch``), and a host that holds every device the collectives reach runs the whole chain
as one XLA computation. So ten training steps of a program are one kernel per device, not ten,
as ``jax.jit`` of a loop of steps is one executable. What the program returns, and every value
a later call reads, are the fused function's outputs; values used only inside the chain never
leave the host.

Only the program that runs is fused: ``pw.reference`` evaluates the calls as traced, so it
checks the fusion. ``PATHWAYS_JAX_FUSE=off`` turns fusion off. A call with ``cost=`` or
``limit=`` of its own, a numpy body and a routed call (``expert_map``) are never fused.
"""

from __future__ import annotations

import functools
import os
import uuid

from . import jax_body
from .compiled import CompiledFunction, Signature
from .ir import Eqn, Program
from .jax_plan import chain_bodies, open_body
from .sharding import normalize_spec

__all__ = ["FUSE", "FusedFunction", "fused"]

FUSE = os.environ.get("PATHWAYS_JAX_FUSE", "on") != "off"


def fused(program: Program) -> Program:
    """``program`` with each run of fusable consecutive calls as one call (``program``
    itself when there is nothing to fuse, or ``PATHWAYS_JAX_FUSE=off``)."""
    if not FUSE:
        return program
    runs = _runs(program)
    if all(len(run) == 1 for run in runs):
        return program
    read_after = _read_after(program)
    eqns, at = [], 0
    for run in runs:
        at += len(run)
        eqns.append(run[0] if len(run) == 1 else _fuse(run, read_after[at]))
    return Program(program.name, program.inputs, tuple(eqns), program.outputs,
                   program.single_output)


def _fusable(eqn: Eqn) -> bool:
    fn = eqn.fn
    return (type(fn) in (CompiledFunction, FusedFunction) and fn.jax is not None
            and fn.cost is None and fn.limit is None)


def _where(mesh, spec, aval) -> tuple:
    """A value's placement on ``mesh``: the same tuple means the same shard on each device."""
    return tuple(normalize_spec(spec, len(aval.shape), mesh.axis_names))


def _runs(program: Program) -> list[list[Eqn]]:
    """The equations in order, grouped into runs that fuse (most of length one)."""
    runs: list[list[Eqn]] = []
    made: dict = {}  # variable of the current run -> its placement
    for eqn in program.eqns:
        run = runs[-1] if runs else None
        joins = (run is not None and _fusable(eqn) and _fusable(run[0])
                 and eqn.fn.mesh == run[0].fn.mesh and eqn.fn.jax.x64 == run[0].fn.jax.x64)
        if joins:
            specs = eqn.fn.arg_specs(len(eqn.inputs))
            joins = all(made.get(v, want) == want for v, want in
                        ((v, _where(eqn.fn.mesh, s, v.aval)) for v, s in zip(eqn.inputs, specs)))
        if not joins:
            runs.append([eqn])
            made = {}
        else:
            run.append(eqn)
        if _fusable(eqn):  # (a routed call's results lie on several meshes)
            for v, spec in zip(eqn.outputs, eqn.fn.out_specs):
                made[v] = _where(eqn.fn.mesh, spec, v.aval)
    return runs


def _read_after(program: Program) -> list[set]:
    """For each equation index i, the variables read by equations from i on or returned."""
    live = set(program.outputs)
    after = [set() for _ in range(len(program.eqns) + 1)]
    after[-1] = set(live)
    for i in range(len(program.eqns) - 1, -1, -1):
        live |= set(program.eqns[i].inputs)
        after[i] = set(live)
    return after


def _fuse(run: list[Eqn], read_after: set) -> Eqn:
    """One equation calling a ``FusedFunction`` of the calls of ``run``."""
    mesh = run[0].fn.mesh
    ins, in_specs, wiring = [], [], []
    arg_of: dict = {}  # (variable from outside the run, its placement) -> argument index
    made_by: dict = {}  # variable made in the run -> ("out", call, result index)
    for m, eqn in enumerate(run):
        wires = []
        for v, spec in zip(eqn.inputs, eqn.fn.arg_specs(len(eqn.inputs))):
            if v in made_by:
                wires.append(made_by[v])
                continue
            key = (v, _where(mesh, spec, v.aval))
            if key not in arg_of:
                arg_of[key] = len(ins)
                ins.append(v)
                in_specs.append(spec)
            wires.append(("in", arg_of[key]))
        wiring.append(tuple(wires))
        made_by.update((v, ("out", m, k)) for k, v in enumerate(eqn.outputs))
    made = [(m, k, v, spec) for m, eqn in enumerate(run)
            for k, (v, spec) in enumerate(zip(eqn.outputs, eqn.fn.out_specs))]
    kept = [item for item in made if item[2] in read_after] or made[-1:]
    outputs = tuple(v for _, _, v, _ in kept)
    shards = tuple(run[m].fn.signature([v.aval for v in run[m].inputs]).shards[k]
                   for m, k, _, _ in kept)
    fn = FusedFunction([e.fn for e in run], [tuple(v.aval for v in e.inputs) for e in run],
                       wiring, [(m, k) for m, k, _, _ in kept], in_specs,
                       [spec for *_, spec in kept],
                       Signature(tuple(v.aval for v in outputs), shards,
                                 tuple(() for _ in outputs), tuple(v.aval for v in ins)))
    return Eqn(fn, tuple(ins), outputs)


def _name(fns) -> str:
    names = [f.name for f in fns]
    if len(set(names)) == 1:
        return f"{names[0]} x{len(names)}"
    return "+".join(names) if len(names) <= 4 else f"{names[0]}+...+{names[-1]}"


def _chained(wiring, exports, n, *bodies_and_shards):
    """The fused function's per-device body in Python: the members' bodies one after the
    other (what the fused plan computes; the bodies travel with it as partial arguments)."""
    bodies, shards = bodies_and_shards[:n], bodies_and_shards[n:]
    results = []
    for body, wires in zip(bodies, wiring):
        args = [shards[src[1]] if src[0] == "in" else results[src[1]][src[2]]
                for src in wires]
        outs = body(*args)
        results.append(outs if isinstance(outs, (tuple, list)) else (outs,))
    return tuple(results[m][k] for m, k in exports)


class FusedFunction(CompiledFunction):
    """Consecutive JAX calls of a program as one compiled function (see the module)."""

    def __init__(self, fns, in_avals, wiring, exports, in_specs, out_specs, sig: Signature):
        """``fns`` called on arguments of ``in_avals`` (per call), wired as ``wiring`` says,
        returning ``exports``; ``sig``: what the members' signatures make the fused one."""
        body = functools.partial(_chained, tuple(wiring), tuple(exports), len(fns),
                                 *(f.body for f in fns))
        super().__init__(body, fns[0].mesh, tuple(in_specs), tuple(out_specs),
                         name=_name(fns), check_rep=False)
        self.members = tuple(fns)
        self.calls = sum(f.calls for f in fns)
        self._signatures[sig.ins] = sig
        self.jax = FusedJax([(f.jax, avals, f.single_output)
                             for f, avals in zip(fns, in_avals)],
                            wiring, exports, self.name, sig)


class FusedJax(jax_body.JaxBody):
    """The JAX body of a ``FusedFunction``: its members' per-device jaxprs chained."""

    def __init__(self, parts, wiring, exports, name, sig: Signature):
        first = parts[0][0]
        self.parts, self.wiring, self.exports = list(parts), tuple(wiring), tuple(exports)
        self.body, self.name, self.check_rep, self.sig = None, name, False, sig
        self.axis_names, self.mesh_shape, self.x64 = first.axis_names, first.mesh_shape, \
            first.x64
        self.in_specs = self.out_specs = ()
        self.token = uuid.uuid4().hex
        self._last = None
        self._chain = None  # (jaxpr, constants), made once per process

    def __getstate__(self):
        return {**super().__getstate__(), "_chain": None}

    def retarget(self, axis_names, mesh_shape) -> FusedJax:
        if (tuple(axis_names), tuple(mesh_shape)) == (self.axis_names, self.mesh_shape):
            return self
        return FusedJax([(j.retarget(axis_names, mesh_shape), avals, single)
                         for j, avals, single in self.parts], self.wiring, self.exports,
                        self.name, self.sig)

    def avals(self, in_avals, single_output: bool) -> tuple[list, list]:
        return list(self.sig.avals), list(self.sig.shards)

    def _body(self, in_avals, single_output: bool, keep: bool) -> tuple:
        if self._chain is None:
            traced: dict = {}  # a body called again and again is traced once
            for j, avals, single in self.parts:
                key = (id(j), tuple(avals), single)
                if key not in traced:
                    traced[key] = open_body(j.traced(avals, single)[0], self.name)
            bodies = [traced[id(j), tuple(avals), single] for j, avals, single in self.parts]
            self._chain = chain_bodies(bodies, self.wiring, self.exports)
        return (*self._chain, list(self.sig.avals))
