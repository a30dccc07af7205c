"""The plan of a JAX body: its per-device jaxpr cut at collectives, and how a device runs it.

``plan_of`` takes the jaxpr of ``jax.shard_map`` of a body (``pathways.program.jax_body`` traces it)
and turns the per-device jaxpr inside into steps:

- ``Segment``: the equations between two collectives, compiled once with ``jax.jit`` for the
  CPU (nested calls such as ``jax.jit`` or ``custom_jvp`` functions are inlined into it, and
  ``pvary``, JAX's replication bookkeeping, is an identity);
- ``Collective``: collective equations run by ``pathways.program.collectives`` (on a host,
  through its ICI path: the device's kernel parks there until its peers' values arrive).
  Reductions (psum, pmax, pmin) run in rounds: everything that does not need a reduction's
  result runs in the segment before it, and the reductions of a round over the same axes go
  as one exchange (their values concatenated: each element is reduced as alone), as XLA
  combines all-reduces: a training step's loss and gradient psums cost one round trip, not
  one per parameter;
- ``Call``, ``Scan``, ``While``, ``Cond``: a nested call, ``lax.scan``, ``while_loop`` or
  ``cond`` whose own jaxprs contain collectives, planned recursively; the loop runs here, the
  body's plan per iteration.

``Plan.run`` evaluates the steps on numpy values inside a kernel environment; ``Plan.flops``
and ``Plan.bytes`` are what XLA's cost analysis counts in its segments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..errors import ProgramError
from . import collectives, prng
from .ir import is_device_array
from .jaxpr_eval import (
    COLLECTIVES,
    IDENTITIES,
    INLINED_CALLS,
    Jaxpr,
    axes_of,
    call_jaxpr,
    communicates,
    eval_eqns,
    is_literal,
    open_jaxpr,
    sub_jaxprs,
)

__all__ = ["Plan", "chain_bodies", "open_body", "plan_body", "plan_of"]

@dataclass
class Segment:
    """Equations between collectives, compiled: reads ``ins``, defines ``outs``. ``batch``:
    None, or the ``pathways.program.jax_batch.HostBatch`` it was compiled for (one XLA
    computation for all of a host's devices; ``flops`` and ``bytes`` are then one device's
    share, and ``stacked`` says which inputs differ per device)."""

    ins: list
    outs: list
    compiled: object
    flops: float
    bytes: float
    batch: object = None
    stacked: list | None = None


@dataclass
class Collective:
    """Collective equations of the jaxpr, run here as the pw collective of the same name: one
    equation, or reductions of one kind over the same axes, run as one (``_run_collectives``)."""

    eqns: list


@dataclass
class Call:
    """A nested call whose jaxpr holds collectives: its own plan on its own variables."""

    eqn: object
    plan: Plan

    def run(self, args) -> list:
        return list(self.plan.run(args))


@dataclass
class Scan:
    """``lax.scan`` whose body holds collectives: the loop runs here, the body's plan per
    iteration (every device runs the same iterations, so collectives stay in step)."""

    eqn: object
    plan: Plan

    def run(self, args) -> list:
        p = self.eqn.params
        nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
        consts, carry, xs = args[:nc], list(args[nc:nc + nk]), args[nc + nk:]
        ys = [None] * length
        for i in reversed(range(length)) if p["reverse"] else range(length):
            outs = self.plan.run([*consts, *carry, *(x[i] for x in xs)])
            carry, ys[i] = list(outs[:nk]), outs[nk:]
        stacked = [np.stack([y[k] for y in ys]) if length else
                   np.zeros(v.aval.shape, v.aval.dtype)
                   for k, v in enumerate(self.eqn.outvars[nk:])]
        return carry + stacked


@dataclass
class While:
    """``lax.while_loop`` whose condition or body holds collectives, run here."""

    eqn: object
    cond: Plan
    plan: Plan

    def run(self, args) -> list:
        p = self.eqn.params
        cc, bc = p["cond_nconsts"], p["body_nconsts"]
        cond_consts, body_consts, carry = args[:cc], args[cc:cc + bc], list(args[cc + bc:])
        while bool(self.cond.run([*cond_consts, *carry])[0]):
            carry = list(self.plan.run([*body_consts, *carry]))
        return carry


@dataclass
class Cond:
    """``lax.cond`` / ``switch`` with collectives in a branch: the branch is chosen here."""

    eqn: object
    branches: list

    def run(self, args) -> list:
        index = int(np.clip(int(args[0]), 0, len(self.branches) - 1))
        return list(self.branches[index].run(args[1:]))


class Plan:
    """A per-device jaxpr as steps; ``run`` evaluates them on numpy values. ``ready_at``:
    when a host finished compiling it (the virtual time of the kernel that did), or None."""

    ready_at: float | None = None

    def __init__(self, jaxpr, consts, steps, name):
        self.jaxpr, self.consts, self.steps, self.name = jaxpr, consts, steps, name
        self.shard_out_avals = [v.aval for v in jaxpr.outvars]  # one device's results
        # what its arguments are kept as (a key's data: a nested plan's may be keys)
        self._in_dtypes = [prng.data_aval(v.aval)[1] for v in jaxpr.invars]
        self._results = [(v, is_literal(v)) for v in jaxpr.outvars]
        self.out_avals: list = []  # global results (of the top plan: see plan_of)
        costs = [_step_cost(step) for step in self.steps]
        self.flops = sum(c[0] for c in costs)
        self.bytes = sum(c[1] for c in costs)

    def run(self, args) -> tuple:
        """One device's results on its ``args``: numpy arrays; on a JAX device (``pathways
        host --backend jax``) the results of its segments stay ``jax.Array``s on it, ready
        (the kernel's time is theirs), and only what a collective between segments reads is
        copied to the host."""
        env = dict(zip(self.jaxpr.constvars, self.consts))
        kernel = collectives.current_env()
        device = kernel.jax_device if kernel is not None else None
        for var, value, dtype in zip(self.jaxpr.invars, args, self._in_dtypes):
            if device is None or not is_device_array(value) or value.dtype != dtype:
                value = np.asarray(value, dtype=dtype)
            env[var] = value
        for step in self.steps:
            if isinstance(step, Segment):
                args = [env[v] for v in step.ins]
                if step.batch is None:
                    if device is not None:  # a real device: its segments run on it
                        import jax

                        outs = jax.block_until_ready(step.compiled(*jax.device_put(args,
                                                                                   device)))
                    else:
                        outs = [np.asarray(o) for o in step.compiled(*args)]
                    env.update(zip(step.outs, outs))
                else:  # once for all of this host's devices: each gets its own
                    env.update(zip(step.outs, step.batch.run(step, args)))
            elif isinstance(step, Collective):
                if device is not None:  # collectives fold numpy values
                    for eqn in step.eqns:
                        _to_host(env, eqn.invars)
                _run_collectives(step.eqns, env)
            else:  # a call or a loop with collectives inside
                ins = [_read(env, v) for v in step.eqn.invars]
                env.update(zip(step.eqn.outvars, step.run(ins)))
        return tuple([np.asarray(v.val) if literal else env[v] for v, literal in self._results])


def _to_host(env: dict, variables) -> None:
    """The device-resident values of ``variables`` in ``env`` copied to the host."""
    for v in variables:
        if not is_literal(v) and is_device_array(env[v]):
            env[v] = np.asarray(env[v])


def _step_cost(step) -> tuple[float, float]:
    """(flops, bytes) XLA counts for a step: a scan's body times its length, a cond's
    costliest branch, a while loop's condition and body once (its trip count is not known
    before it runs: give such a body ``cost=``); collectives count as none here."""
    if isinstance(step, Segment):
        return step.flops, step.bytes
    if isinstance(step, Scan):
        return step.plan.flops * step.eqn.params["length"], \
            step.plan.bytes * step.eqn.params["length"]
    if isinstance(step, Cond):
        return max(b.flops for b in step.branches), max(b.bytes for b in step.branches)
    if isinstance(step, While):
        return step.cond.flops + step.plan.flops, step.cond.bytes + step.plan.bytes
    if isinstance(step, Call):
        return step.plan.flops, step.plan.bytes
    return 0.0, 0.0


def _read(env, var):
    return np.asarray(var.val) if is_literal(var) else env[var]


def shapes_of(closed, name) -> tuple[list, list]:
    """(global output avals, one device's output avals) of the shard_map ``closed`` holds:
    what ``plan_of`` would give as ``out_avals`` and ``shard_out_avals``, nothing compiled."""
    inner = _shard_map_eqn(closed, name).params["jaxpr"]
    return list(closed.out_avals), [v.aval for v in inner.outvars]


def _shard_map_eqn(closed, name):
    outer = closed.jaxpr
    if len(outer.eqns) != 1 or outer.eqns[0].primitive.name != "shard_map":
        raise ProgramError(f"{name}: unexpected trace (equations outside the shard_map)")
    _refuse_unsupported(outer.eqns[0].params["jaxpr"], name)
    return outer.eqns[0]


def _refuse_unsupported(jaxpr, name) -> None:
    """Refuse, when the body is traced (on the client, before anything runs), collectives
    the plan cannot run: ``axis_index_groups`` (collectives here span whole mesh axes)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in COLLECTIVES and eqn.params.get("axis_index_groups") is not None:
            raise ProgramError(f"{name}: {eqn.primitive.name} with axis_index_groups is not"
                               " supported (a collective spans whole mesh axes)")
        for sub in sub_jaxprs(eqn):
            _refuse_unsupported(sub, name)


def plan_of(closed, name, batch=None) -> Plan:
    """The plan of the per-device jaxpr inside the shard_map of ``closed``; ``batch``: None,
    or the ``HostBatch`` of the host devices whose segments run as one computation."""
    plan = plan_body(*open_body(closed, name), name, batch)
    plan.out_avals = list(closed.out_avals)
    return plan


def plan_body(body, consts, name, batch=None) -> Plan:
    """The plan of a per-device jaxpr (``open_body``'s, or several chained by
    ``chain_bodies``) on its constants; per device, not batched, if vmap would change its
    values (``vmap_invariant``)."""
    if batch is not None and not vmap_invariant(body):
        batch = None
    return _plan_jaxpr(body, consts, name, batch, {})


_VMAP_VARIANT_KEYS = ("rbg", "unsafe_rbg")


def vmap_invariant(jaxpr) -> bool:
    """Whether vmapping ``jaxpr`` over a host's devices leaves each device's values as run
    alone: not where XLA's RngBitGenerator draws bits (``lax.rng_bit_generator``, keys of
    the rbg and unsafe_rbg impls), whose bits JAX documents to change under vmap."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "rng_bit_generator" or any(
                prng.impl_of_dtype(getattr(getattr(v, "aval", None), "dtype", None))
                in _VMAP_VARIANT_KEYS for v in eqn.invars):
            return False
        if not all(vmap_invariant(sub) for sub in sub_jaxprs(eqn)):
            return False
    return True


def open_body(closed, name) -> tuple[Jaxpr, list]:
    """(the per-device jaxpr inside the shard_map of ``closed``, with the constants the body
    closed over as its first constant variables; those constants)."""
    outer = closed.jaxpr
    eqn = _shard_map_eqn(closed, name)
    inner = eqn.params["jaxpr"]
    # Arguments of the outer jaxpr are ours; the rest are constants the body closed over.
    const_of = dict(zip(outer.constvars, closed.consts))
    n_args = len(outer.invars)
    position = {v: i for i, v in enumerate(outer.invars)}
    n_consts = len(eqn.invars) - n_args
    if [position.get(v) for v in eqn.invars[n_consts:]] != list(range(n_args)) or any(
            v not in const_of for v in eqn.invars[:n_consts] if not is_literal(v)):
        raise ProgramError(f"{name}: unexpected trace (shard_map arguments out of order)")
    consts = [_read(const_of, v) if is_literal(v) else np.asarray(const_of[v])
              for v in eqn.invars[:n_consts]]
    return Jaxpr(inner.constvars + inner.invars[:len(consts)], inner.invars[len(consts):],
                  inner.outvars, inner.eqns), consts


def chain_bodies(bodies, wiring, exports) -> tuple[Jaxpr, list]:
    """One per-device jaxpr running ``bodies`` (``open_body``'s: (jaxpr, constants)) one
    after the other. ``wiring[m][i]`` says where argument i of body m comes from:
    ``("in", j)``, argument j of the chain, or ``("out", n, k)``, result k of an earlier body
    n; the chain returns the results ``exports`` names, as ``(n, k)``. Every variable is new
    (a body chained twice is two copies), so the result plans like any body."""
    from jax.extend.core import Var  # the optional extra: only JAX bodies get here

    n_in = 1 + max((src[1] for w in wiring for src in w if src[0] == "in"), default=-1)
    invars: list = [None] * n_in
    constvars, consts, eqns, results, starts = [], [], [], [], []
    for (body, cs), wires in zip(bodies, wiring):
        starts.append(len(eqns))
        new: dict = {}
        for v, c in zip(body.constvars, cs):
            new[v] = Var(v.aval)
            constvars.append(new[v])
            consts.append(c)
        for v, src in zip(body.invars, wires):
            if src[0] == "in":
                if invars[src[1]] is None:
                    invars[src[1]] = Var(v.aval)
                new[v] = invars[src[1]]
            else:
                new[v] = results[src[1]][src[2]]

        def read(v, new=new):
            return v if is_literal(v) else new[v]

        for e in body.eqns:
            outs = [v if type(v).__name__ == "DropVar" else new.setdefault(v, Var(v.aval))
                    for v in e.outvars]
            eqns.append(e.replace(invars=[read(v) for v in e.invars], outvars=outs))
        results.append([read(v) for v in body.outvars])
    return Jaxpr(constvars, invars, [results[n][k] for n, k in exports], eqns,
                  tuple(starts[1:])), consts


def _plan_jaxpr(jaxpr: Jaxpr, consts, name, batch=None, made=None) -> Plan:
    """Steps of ``jaxpr``: segments between the collectives it cuts at (with a ``batch``,
    only those reaching devices outside it: the others run inside its segments, and between
    chained bodies, so a body chained K times compiles once). Between two barriers (a cut
    collective that is not a reduction, a call or loop holding collectives, a chained body's
    start) the cut reductions run in rounds (``_rounds``): round r's reductions read only what
    r earlier rounds gave, each round's reductions of one kind and axes as one step, every
    other equation in the segment before the first round that needs its value. ``made``: the
    segments compiled for this plan so far, by structure (``_structure``): a segment equal to
    one of them (the same equations of a body chained again, wired alike) reuses its
    computation."""
    steps, chunk = [], []
    later = _uses_after(jaxpr)
    shared = set(jaxpr.constvars)  # the same value on every device
    made = {} if made is None else made
    starts = set(jaxpr.starts) if batch is not None else set()

    def segment(eqns, live) -> None:
        ins, outs = segment_vars(eqns, live)
        key = _structure(eqns, ins, outs, shared)
        twin = made.get(key)
        if twin is not None:
            steps.append(dataclasses.replace(twin, ins=ins, outs=outs))
        else:
            steps.append(_segment(eqns, ins, outs, name) if batch is None else
                         batch.segment(eqns, ins, outs, shared, name))
            made[key] = steps[-1]

    def flush(i):
        """The chunk since the last barrier, in rounds: each round's segment, then its
        reductions, one step per kind and axes."""
        rounds = _rounds(chunk)
        chunk.clear()
        # what is read after each round's segment: later rounds' equations, this and later
        # rounds' reductions, and what follows the chunk
        live = [set(later[i])]
        for eqns, reductions in reversed(rounds):
            reads = {v for e in eqns for v in e.invars if not is_literal(v)}
            reads |= {v for e in reductions for v in e.invars if not is_literal(v)}
            live.append(live[-1] | reads)
        live.reverse()  # live[r]: read by round r on, or after the chunk
        for r, (eqns, reductions) in enumerate(rounds):
            if eqns:  # its own list: a segment's function keeps it (and JAX traces it
                # again for arguments of another type)
                segment(list(eqns), live[r + 1] | {v for e in reductions for v in e.invars
                                                   if not is_literal(v)})
            groups: dict = {}
            for e in reductions:
                groups.setdefault(_combined_kind(e), []).append(e)
            steps.extend(Collective(group) for group in groups.values())

    for i, eqn in enumerate(jaxpr.eqns):
        if i in starts:
            flush(i)
        prim = eqn.primitive.name
        if prim in COLLECTIVES and (batch is None or batch.cuts(eqn)):
            if prim in _COMBINED:
                chunk.append((eqn, True))
                continue
            flush(i)
            steps.append(Collective([eqn]))
        elif prim not in COLLECTIVES and communicates(eqn, COLLECTIVES) and (
                batch is None or not batch.keeps(eqn)):
            flush(i)
            steps.append(_control_step(eqn, name, batch, made))
        else:
            chunk.append((eqn, False))
    flush(len(jaxpr.eqns))
    return Plan(jaxpr, consts, steps, name)


def _rounds(chunk) -> list[tuple[list, list]]:
    """``chunk``'s equations (in order, each with whether it is a cut reduction) as rounds
    ``[(equations, reductions)]``:
    an equation's round is the number of reductions on its longest chain of inputs (a
    reduction's, those before it), so round r's equations need only earlier rounds'
    reductions, and round r's reductions only what round r computed; in each round, the
    equations keep their order."""
    level: dict = {}
    rounds: list = []
    for eqn, reduction in chunk:
        r = max((level.get(v, 0) for v in eqn.invars if not is_literal(v)), default=0)
        while len(rounds) <= r:
            rounds.append(([], []))
        rounds[r][1 if reduction else 0].append(eqn)
        for v in eqn.outvars:
            level[v] = r + 1 if reduction else r
    return rounds


# the reductions a plan runs in rounds, and with which others they go as one
_COMBINED = {"psum": "sum", "psum_invariant": "sum", "pmax": "max", "pmin": "min"}


def _combined_kind(eqn) -> tuple:
    """The reductions an exchange can carry together: the same operation over the same axes."""
    return _COMBINED[eqn.primitive.name], axes_of(eqn.params, "axes")


def _control_step(eqn, name, batch=None, made=None):
    """The step of a call, scan, while or cond whose jaxprs hold collectives. With a
    ``batch``, a call's and a scan's bodies are batched too (every device runs them alike);
    a while loop's and a cond's run per device (their trip count or branch may differ)."""
    prim = eqn.primitive.name

    def plan(param, batch=None):
        return _plan_jaxpr(*open_jaxpr(param), name, batch, made)

    if prim in INLINED_CALLS:
        return Call(eqn, plan(call_jaxpr(eqn), batch))
    if prim == "scan":
        return Scan(eqn, plan(eqn.params["jaxpr"], batch))
    if prim == "while":
        return While(eqn, plan(eqn.params["cond_jaxpr"]), plan(eqn.params["body_jaxpr"]))
    if prim == "cond":
        return Cond(eqn, [plan(b) for b in eqn.params["branches"]])
    raise ProgramError(f"{name}: a collective inside {prim} is not supported in a pathways"
                       " body; move it out (a Python loop around a collective works)")


def _structure(eqns, ins, outs, shared) -> tuple:
    """What a segment computes, as a key: two segments with equal keys compute the same
    function of their inputs in order. Equations are known by primitive and parameters
    (the same dict: ``chain_bodies`` copies equations, not their parameters), variables by
    position (inputs, then each result in order), literals by value."""
    names = {v: k for k, v in enumerate(ins)}
    key: list = [tuple((str(v.aval), v in shared) for v in ins)]
    for e in eqns:
        args = tuple(("literal", repr(v.val), str(v.aval)) if is_literal(v) else names[v]
                     for v in e.invars)
        key.append((e.primitive.name, id(e.params), args, tuple(str(v.aval) for v in e.outvars)))
        for v in e.outvars:
            names.setdefault(v, len(names))
    key.append(tuple(names[v] for v in outs))
    return tuple(key)


def _uses_after(jaxpr: Jaxpr) -> list[set]:
    """For each equation index i, the variables read by equations from i on or returned."""
    live = {v for v in jaxpr.outvars if not is_literal(v)}
    after = [set() for _ in range(len(jaxpr.eqns) + 1)]
    after[len(jaxpr.eqns)] = set(live)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        live |= {v for v in jaxpr.eqns[i].invars if not is_literal(v)}
        after[i] = set(live)
    return after


def _segment(eqns, ins, outs, name) -> Segment:
    """Compile ``eqns`` into one XLA computation of ``ins`` (the variables they read from
    outside) to ``outs`` (``segment_vars``)."""
    import jax  # the optional extra: only JAX bodies get here

    impls = [prng.impl_of_dtype(v.aval.dtype) for v in ins]

    def run(*values):  # keys cross a segment's edges as their key data
        env = dict(zip(ins, prng.wrapped(values, impls)))
        eval_eqns(eqns, env)
        return prng.unwrapped(env[v] for v in outs)

    structs = [jax.ShapeDtypeStruct(*prng.data_aval(v.aval)) for v in ins]
    jitted = jax.jit(run)
    try:
        compiled = jitted.lower(*structs).compile()
    except Exception as exc:
        raise ProgramError(f"{name}: XLA could not compile a segment of the body: {exc}") \
            from exc
    flops, nbytes = xla_cost(compiled)
    # Calls go through the jitted function: JAX's C++ dispatch path, and its cache already
    # holds what was just compiled.
    return Segment(ins, outs, jitted, flops, nbytes)


def segment_vars(eqns, live_after) -> tuple[list, list]:
    """(variables ``eqns`` read from outside, in first-read order; variables they define that
    are read after them, in definition order)."""
    defined, ins = set(), []
    for eqn in eqns:
        for v in eqn.invars:
            if not is_literal(v) and v not in defined and v not in ins:
                ins.append(v)
        defined.update(eqn.outvars)
    return ins, [v for v in _ordered(eqns) if v in live_after]


def _ordered(eqns):
    for eqn in eqns:
        yield from (v for v in eqn.outvars if type(v).__name__ != "DropVar")


def xla_cost(compiled) -> tuple[float, float]:
    """(flops, bytes accessed) XLA reports for a compiled computation (0 if it reports none)."""
    try:
        analysis = compiled.cost_analysis()
    except Exception:
        return 0.0, 0.0
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    return max(0.0, float(analysis.get("flops", 0.0))), \
        max(0.0, float(analysis.get("bytes accessed", 0.0)))


def _run_collectives(eqns, env) -> None:
    """Run a ``Collective`` step's equations into ``env``: several reductions (of one kind,
    over the same axes) as one per dtype, their values flattened and concatenated, so one
    exchange carries them all; each element is reduced as it would be alone (the reduction
    is elementwise), so the results are bitwise those of one exchange each."""
    if len(eqns) == 1:
        _run_collective(eqns[0], env)
        return
    by_dtype: dict = {}
    for eqn in eqns:
        for var, out in zip(eqn.invars, eqn.outvars):
            x = np.asarray(_read(env, var))
            by_dtype.setdefault(x.dtype, []).append((x, out))
    prim, p = eqns[0].primitive.name, eqns[0].params
    for items in by_dtype.values():
        total = np.asarray(_collective(prim, p, np.concatenate([x.reshape(-1)
                                                                for x, _ in items])))
        start = 0
        for x, out in items:  # each its own array: a kept result must not keep the rest
            if type(out).__name__ != "DropVar":
                env[out] = np.array(total[start:start + x.size], dtype=out.aval.dtype) \
                    .reshape(out.aval.shape)
            start += x.size


def _run_collective(eqn, env) -> None:
    """Run one collective equation through pathways.program.collectives, into ``env``."""
    prim, p = eqn.primitive.name, eqn.params
    args = [_read(env, v) for v in eqn.invars]
    if prim in IDENTITIES:
        outs = args
    elif prim == "axis_index":
        outs = [collectives.axis_index(p["axis_name"])]
    else:  # axis_index_groups: refused when the body was traced (_refuse_unsupported)
        outs = [_collective(prim, p, x) for x in args]
    for var, value in zip(eqn.outvars, outs):
        if type(var).__name__ != "DropVar":
            env[var] = np.asarray(value, dtype=var.aval.dtype).reshape(var.aval.shape)


def _collective(prim, p, x):
    if prim in ("psum", "psum_invariant"):
        return collectives.psum(x, axes_of(p, "axes"))
    if prim == "pmax":
        return collectives.pmax(x, axes_of(p, "axes"))
    if prim == "pmin":
        return collectives.pmin(x, axes_of(p, "axes"))
    if prim == "ppermute":
        return collectives.ppermute(x, axes_of(p, "axis_name"), p["perm"])
    if prim in ("all_gather", "all_gather_invariant"):
        return collectives.all_gather(x, axes_of(p, "axis_name"), p["all_gather_dimension"],
                                      p["tiled"])
    if prim == "reduce_scatter":
        return collectives.psum_scatter(x, axes_of(p, "axis_name"), p["scatter_dimension"],
                                        p["tiled"])
    # all_to_all: the primitive always splits into group-size chunks and concatenates
    # (lax.all_to_all's untiled form reshapes around it)
    return collectives.all_to_all(x, axes_of(p, "axis_name"), p["split_axis"], p["concat_axis"],
                                  tiled=True)
