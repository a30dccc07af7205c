"""JAX bodies: a ``shard_map`` body written with jax.numpy, jax.lax collectives and jax.grad.

A body that refers to JAX (``uses_jax``) is traced, on the client and again on each host, as
JAX itself would trace it: ``jax.make_jaxpr`` of ``jax.shard_map`` over an abstract mesh of the
same axis names and sizes. So JAX checks the specs (and, with ``check_rep``, that outputs
``out_specs`` calls replicated are), and ``jax.grad`` inside the body transposes collectives
exactly as under ``jax.shard_map``. The per-device jaxpr inside is cut into a *plan*:

- ``Segment``: the equations between two collectives, compiled once with ``jax.jit`` for the
  CPU (nested calls such as ``jax.jit`` or ``custom_jvp`` functions are inlined into it);
- ``Collective``: one collective equation, run by ``pathways.collectives`` (on a host, through
  its ICI path: the device's kernel parks there until its peers' values arrive);
- ``Call``, ``Scan``, ``While``, ``Cond``: a nested call, ``lax.scan``, ``while_loop`` or
  ``cond`` whose own jaxprs contain collectives, planned recursively; the loop runs here, the
  body's plan per iteration.

Plans are cached per (function, mesh axes, argument avals) in each process. A kernel's
modelled time is the roofline (``pw.DeviceSpec``) of the flops and bytes XLA's cost analysis
reports for its segments, unless ``cost=`` is given.

JAX's own configuration decides dtypes (``jax_enable_x64``, off by default: float64 arguments
become float32, as under ``jax.jit``); the client's setting travels with the function.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from . import collectives
from .errors import ProgramError, ShardingError

__all__ = ["JaxBody", "NotNumpy", "came_from_jax", "out_shapes", "require", "returns_jax",
           "uses_jax"]

INSTALL_HINT = ("this body uses JAX, which is an optional extra: install it with"
                " .venv/bin/pip install -e '.[jax]' (or pip install 'pathways-open[jax]')")
PLANS_KEPT = 256

# The collective primitives a plan runs itself, and the ones that only retag a value's
# variation (JAX's check_vma bookkeeping): identities for us.
_COLLECTIVES = {"psum", "psum_invariant", "pmax", "pmin", "ppermute", "all_gather",
                "all_gather_invariant", "reduce_scatter", "all_to_all", "axis_index"}
_IDENTITIES = {"pvary"}
_INLINED_CALLS = {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
                  "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint"}


_on_host = False


def on_host() -> None:
    """Configure JAX, when a body first needs it, for a host process: segments run on the
    executor's thread (no asynchronous dispatch to a worker thread and back) and XLA uses one
    thread per computation (a host shares its cores with its peers)."""
    global _on_host
    _on_host = True
    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false"
                                       " intra_op_parallelism_threads=1").strip()


def require():
    """The ``jax`` module, or a ProgramError saying how to install the extra."""
    try:
        import jax
    except ImportError as exc:
        raise ProgramError(INSTALL_HINT) from exc
    global _on_host
    if _on_host:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
        _on_host = False  # done
    return jax


# ---- which bodies are JAX bodies ---------------------------------------------------------------

def _is_jax_value(value) -> bool:
    if isinstance(value, types.ModuleType):
        return value.__name__.split(".")[0] in ("jax", "jaxlib")
    module = getattr(value, "__module__", None) or type(value).__module__ or ""
    return module.split(".")[0] in ("jax", "jaxlib") or \
        type(value).__module__.split(".")[0] in ("jax", "jaxlib")


def uses_jax(fn, depth: int = 3) -> bool:
    """Whether ``fn`` refers to JAX: a name, closure cell or default it reads (through the
    Python functions it calls, ``depth`` deep) is a jax module, function or array. Does not
    import jax; a body that does not mention jax is a numpy body."""
    seen: set[int] = set()

    def look(f, depth) -> bool:
        while hasattr(f, "func") and callable(f.func):  # functools.partial
            if any(_is_jax_value(a) for a in getattr(f, "args", ())):
                return True
            f = f.func
        if id(f) in seen or depth < 0:
            return False
        seen.add(id(f))
        code = getattr(f, "__code__", None)
        if code is None:
            return _is_jax_value(f)
        values = [c.cell_contents for c in (getattr(f, "__closure__", None) or ())
                  if _filled(c)]
        values += list(getattr(f, "__defaults__", None) or ())
        scope = getattr(f, "__globals__", {})
        for name in _names(code):
            if name in scope:
                values.append(scope[name])
        for value in values:
            if _is_jax_value(value):
                return True
            if isinstance(value, types.FunctionType) and look(value, depth - 1):
                return True
        return False

    return look(fn, depth)


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


class NotNumpy(Exception):
    """The abstract pass of a numpy body found JAX in it (a JAX array out, or JAX's error)."""


def returns_jax(outs) -> bool:
    """Whether a body's result holds JAX arrays (a body run eagerly on numpy that is JAX)."""
    items = outs if isinstance(outs, (tuple, list)) else (outs,)
    return any(type(o).__module__.split(".")[0] in ("jax", "jaxlib") for o in items)


def came_from_jax(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside JAX (e.g. jax.lax.psum outside a JAX trace)."""
    if type(exc).__module__.split(".")[0] in ("jax", "jaxlib"):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}jax{os.sep}" in tb.tb_frame.f_code.co_filename


# ---- a JAX body and its plans ------------------------------------------------------------------

class JaxBody:
    """A body traced and run as JAX: ``signature`` on the client, ``run`` on a device, and
    ``flops_bytes`` for the cost model. Pickles as the body and its specs; plans are rebuilt
    (and cached) in each process that runs it."""

    def __init__(self, body, axis_names, mesh_shape, in_specs, out_specs, check_rep, name):
        jax = require()
        self.body, self.name, self.check_rep = body, name, check_rep
        self.axis_names, self.mesh_shape = tuple(axis_names), tuple(mesh_shape)
        self.in_specs, self.out_specs = tuple(in_specs), tuple(out_specs)
        self.x64 = bool(jax.config.jax_enable_x64)
        self.token = uuid.uuid4().hex  # names this body in every process's plan cache
        self._last = None  # (argument avals, plan) of the latest run, in this process

    def __getstate__(self):
        return {**self.__dict__, "_last": None}

    @staticmethod
    def _x64(on: bool):
        return require().enable_x64(on)

    def retarget(self, axis_names, mesh_shape) -> JaxBody:
        if (tuple(axis_names), tuple(mesh_shape)) == (self.axis_names, self.mesh_shape):
            return self
        other = JaxBody.__new__(JaxBody)
        other.__dict__.update(self.__dict__, axis_names=tuple(axis_names),
                              mesh_shape=tuple(mesh_shape), token=uuid.uuid4().hex,
                              _last=None)
        return other

    def plan(self, in_avals, single_output: bool) -> Plan:
        """The plan for global argument avals (``Aval``s), traced once per process."""
        key = (self.token, tuple(in_avals))
        with _plans_lock:
            plan = _plans.get(key)
            if plan is not None:
                _plans.move_to_end(key)
                return plan
            plan = _plans[key] = self._trace(in_avals, single_output)
            while len(_plans) > PLANS_KEPT:
                _plans.popitem(last=False)
            return plan

    def _trace(self, in_avals, single_output) -> Plan:
        jax = require()
        from jax.sharding import AbstractMesh
        from jax.sharding import PartitionSpec as JaxP

        mesh = AbstractMesh(self.mesh_shape, self.axis_names)
        in_specs = tuple(JaxP(*s) if s is not None else JaxP() for s in self.in_specs)
        out_specs = tuple(JaxP(*s) if s is not None else JaxP() for s in self.out_specs)
        body = self.body

        def flat(*args):
            outs = body(*args)
            return (outs,) if single_output else tuple(outs)

        mapped = jax.shard_map(flat, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                               check_vma=self.check_rep)
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
        with _traced(self.name, in_avals), jax.enable_x64(self.x64):
            closed = jax.make_jaxpr(mapped)(*structs)
        with jax.enable_x64(self.x64):
            plan = _plan_of(closed, self.name)
        plan.out_avals = list(closed.out_avals)
        return plan

    def run(self, shards, in_avals, single_output: bool) -> tuple:
        """One device's outputs (numpy) for its ``shards``, inside its kernel environment."""
        last = self._last
        if last is not None and last[0] is in_avals:  # every kernel of a program: one lookup
            plan = last[1]
        else:
            plan = self.plan(in_avals, single_output)
            self._last = (in_avals, plan)
        with self._x64(self.x64):
            return plan.run(shards)


_plans: OrderedDict[tuple, Plan] = OrderedDict()
_plans_lock = threading.RLock()


@dataclass
class Segment:
    """Equations between collectives, compiled: reads ``ins``, defines ``outs``."""

    ins: list
    outs: list
    compiled: object
    flops: float
    bytes: float


@dataclass
class Collective:
    eqn: object


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
    """A per-device jaxpr as steps; ``run`` evaluates them on numpy values."""

    def __init__(self, jaxpr, consts, steps, name):
        self.jaxpr, self.consts, self.steps, self.name = jaxpr, consts, steps, name
        self.shard_out_avals = [v.aval for v in jaxpr.outvars]  # one device's results
        self.out_avals: list = []  # global results (the top plan's, set by its tracer)
        costs = [_step_cost(step) for step in self.steps]
        self.flops = sum(c[0] for c in costs)
        self.bytes = sum(c[1] for c in costs)

    def run(self, args) -> tuple:
        env = dict(zip(self.jaxpr.constvars, self.consts))
        for var, value in zip(self.jaxpr.invars, args):
            env[var] = np.asarray(value, dtype=var.aval.dtype)
        for step in self.steps:
            if isinstance(step, Segment):
                outs = step.compiled(*[env[v] for v in step.ins])
                env.update(zip(step.outs, (np.asarray(o) for o in outs)))
            elif isinstance(step, Collective):
                _run_collective(step.eqn, env)
            else:  # a call or a loop with collectives inside
                ins = [_read(env, v) for v in step.eqn.invars]
                env.update(zip(step.eqn.outvars, step.run(ins)))
        return tuple(_read(env, v) for v in self.jaxpr.outvars)


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
    return np.asarray(var.val) if _is_literal(var) else env[var]


def _is_literal(var) -> bool:
    return type(var).__name__ == "Literal"


def _plan_of(closed, name) -> Plan:
    """The plan of the per-device jaxpr inside the shard_map of ``closed``."""
    outer = closed.jaxpr
    if len(outer.eqns) != 1 or outer.eqns[0].primitive.name != "shard_map":
        raise ProgramError(f"{name}: unexpected trace (equations outside the shard_map)")
    eqn = outer.eqns[0]
    inner = eqn.params["jaxpr"]
    # Arguments of the outer jaxpr are ours; the rest are constants the body closed over.
    const_of = dict(zip(outer.constvars, closed.consts))
    n_args = len(outer.invars)
    position = {v: i for i, v in enumerate(outer.invars)}
    if [position.get(v) for v in eqn.invars[-n_args:]] != list(range(n_args)) or any(
            v not in const_of for v in eqn.invars[:-n_args] if not _is_literal(v)):
        raise ProgramError(f"{name}: unexpected trace (shard_map arguments out of order)")
    consts = [_read(const_of, v) if _is_literal(v) else np.asarray(const_of[v])
              for v in eqn.invars[:len(eqn.invars) - n_args]]
    body = _Jaxpr(inner.constvars + inner.invars[:len(consts)], inner.invars[len(consts):],
                  inner.outvars, inner.eqns)
    return _plan_jaxpr(body, consts, name)


@dataclass
class _Jaxpr:
    """The parts of a jaxpr a plan needs (constants first, then arguments)."""

    constvars: list
    invars: list
    outvars: list
    eqns: list


def _open(jaxpr_param) -> tuple[_Jaxpr, list]:
    """A closed or open jaxpr param as (_Jaxpr, its constants)."""
    jaxpr = getattr(jaxpr_param, "jaxpr", jaxpr_param)
    consts = list(getattr(jaxpr_param, "consts", ()))
    return _Jaxpr(list(jaxpr.constvars), list(jaxpr.invars), list(jaxpr.outvars),
                  list(jaxpr.eqns)), consts


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns") or hasattr(getattr(item, "jaxpr", None), "eqns"):
                yield getattr(item, "jaxpr", item)


def _communicates(eqn, kinds=_COLLECTIVES | _IDENTITIES) -> bool:
    """Whether ``eqn`` is, or holds in a nested jaxpr, a collective (or a pvary)."""
    if eqn.primitive.name in kinds:
        return True
    return any(_communicates(e, kinds) for j in _sub_jaxprs(eqn) for e in j.eqns)


def _plan_jaxpr(jaxpr: _Jaxpr, consts, name) -> Plan:
    steps, pending = [], []
    later = _uses_after(jaxpr)

    def close(i):
        if pending:
            steps.append(_segment(pending, later[i], name))
            pending.clear()

    for i, eqn in enumerate(jaxpr.eqns):
        prim = eqn.primitive.name
        if prim in _COLLECTIVES:
            close(i)
            steps.append(Collective(eqn))
        elif _communicates(eqn, _COLLECTIVES):
            close(i)
            steps.append(_control_step(eqn, name))
        else:
            pending.append(eqn)
    close(len(jaxpr.eqns))
    return Plan(jaxpr, consts, steps, name)


def _control_step(eqn, name):
    """The step of a call, scan, while or cond whose jaxprs hold collectives."""
    prim = eqn.primitive.name

    def plan(param):
        return _plan_jaxpr(*_open(param), name)

    if prim in _INLINED_CALLS:
        return Call(eqn, plan(_call_jaxpr(eqn)))
    if prim == "scan":
        return Scan(eqn, plan(eqn.params["jaxpr"]))
    if prim == "while":
        return While(eqn, plan(eqn.params["cond_jaxpr"]), plan(eqn.params["body_jaxpr"]))
    if prim == "cond":
        return Cond(eqn, [plan(b) for b in eqn.params["branches"]])
    raise ProgramError(f"{name}: a collective inside {prim} is not supported in a pathways"
                       " body; move it out (a Python loop around a collective works)")


def _call_jaxpr(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return eqn.params[key]
    raise ProgramError(f"cannot read the jaxpr of a {eqn.primitive.name} call")


def _uses_after(jaxpr: _Jaxpr) -> list[set]:
    """For each equation index i, the variables read by equations from i on or returned."""
    live = {v for v in jaxpr.outvars if not _is_literal(v)}
    after = [set() for _ in range(len(jaxpr.eqns) + 1)]
    after[len(jaxpr.eqns)] = set(live)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        live |= {v for v in jaxpr.eqns[i].invars if not _is_literal(v)}
        after[i] = set(live)
    return after


def _segment(eqns, live_after, name) -> Segment:
    """Compile ``eqns`` into one XLA computation of the variables they read from outside."""
    jax = require()
    defined, ins = set(), []
    for eqn in eqns:
        for v in eqn.invars:
            if not _is_literal(v) and v not in defined and v not in ins:
                ins.append(v)
        defined.update(eqn.outvars)
    outs = [v for v in _ordered(eqns) if v in live_after]

    def run(*values):
        env = dict(zip(ins, values))
        _eval(eqns, env)
        return tuple(env[v] for v in outs)

    structs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in ins]
    jitted = jax.jit(run)
    try:
        compiled = jitted.lower(*structs).compile()
    except Exception as exc:
        raise ProgramError(f"{name}: XLA could not compile a segment of the body: {exc}") \
            from exc
    flops, nbytes = _cost(compiled)
    # Calls go through the jitted function: JAX's C++ dispatch path, and its cache already
    # holds what was just compiled.
    return Segment(ins, outs, jitted, flops, nbytes)


def _ordered(eqns):
    for eqn in eqns:
        yield from (v for v in eqn.outvars if type(v).__name__ != "DropVar")


def _cost(compiled) -> tuple[float, float]:
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


def _eval(eqns, env) -> None:
    """Bind ``eqns`` on the values in ``env`` (inside a jit trace): nested calls are inlined
    and pvary is an identity, so nothing needs JAX's shard_map axis context."""
    def read(v):
        return v.val if _is_literal(v) else env[v]

    for eqn in eqns:
        prim = eqn.primitive.name
        args = [read(v) for v in eqn.invars]
        if prim in _IDENTITIES:
            outs = args
        elif prim in _INLINED_CALLS:
            sub, consts = _open(_call_jaxpr(eqn))
            inner = dict(zip(sub.constvars, consts))
            inner.update(zip(sub.invars, args))
            _eval(sub.eqns, inner)
            outs = [v.val if _is_literal(v) else inner[v] for v in sub.outvars]
        else:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outs = [outs]
        env.update(zip(eqn.outvars, outs))


def _run_collective(eqn, env) -> None:
    """Run one collective equation through pathways.collectives, into ``env``."""
    prim, p = eqn.primitive.name, eqn.params
    args = [_read(env, v) for v in eqn.invars]
    if prim in _IDENTITIES:
        outs = args
    elif prim == "axis_index":
        outs = [collectives.axis_index(p["axis_name"])]
    else:
        if p.get("axis_index_groups") is not None:
            raise ProgramError(f"{prim} with axis_index_groups is not supported")
        outs = [_collective(prim, p, x) for x in args]
    for var, value in zip(eqn.outvars, outs):
        if type(var).__name__ != "DropVar":
            env[var] = np.asarray(value, dtype=var.aval.dtype).reshape(var.aval.shape)


def _axes(p, key):
    axes = p[key]
    return axes if isinstance(axes, str) else tuple(axes)


def _collective(prim, p, x):
    if prim in ("psum", "psum_invariant"):
        return collectives.psum(x, _axes(p, "axes"))
    if prim == "pmax":
        return collectives.pmax(x, _axes(p, "axes"))
    if prim == "pmin":
        return collectives.pmin(x, _axes(p, "axes"))
    if prim == "ppermute":
        return collectives.ppermute(x, _axes(p, "axis_name"), p["perm"])
    if prim in ("all_gather", "all_gather_invariant"):
        return collectives.all_gather(x, _axes(p, "axis_name"), p["all_gather_dimension"],
                                      p["tiled"])
    if prim == "reduce_scatter":
        return collectives.psum_scatter(x, _axes(p, "axis_name"), p["scatter_dimension"],
                                        p["tiled"])
    # all_to_all: the primitive always splits into group-size chunks and concatenates
    # (lax.all_to_all's untiled form reshapes around it)
    return collectives.all_to_all(x, _axes(p, "axis_name"), p["split_axis"], p["concat_axis"],
                                  tiled=True)


def out_shapes(fn, axis_names, mesh_shape, shard_avals, name):
    """What ``fn`` returns on shards of ``shard_avals`` (a tree of ShapeDtypeStructs), traced
    with collectives over the mesh's axes (for a pytree body's output structure)."""
    jax = require()
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in shard_avals]
    with _traced(name, shard_avals):
        return jax.make_jaxpr(fn, axis_env=list(zip(axis_names, mesh_shape)),
                              return_shape=True)(*structs)[1]


@contextlib.contextmanager
def _traced(name, avals):
    """Trace a body here: pw collectives mean jax.lax's, no kernel environment is seen (a host
    traces inside a kernel), and JAX's errors become ProgramErrors naming the function."""
    token = collectives.jax_tracing.set(True)
    env_token = collectives._env.set(None)
    try:
        yield
    except (ProgramError, ShardingError):
        raise
    except Exception as exc:
        raise ProgramError(f"{name}: JAX could not trace the body on arguments"
                           f" {[str(a) for a in avals]}: {exc}") from exc
    finally:
        collectives._env.reset(env_token)
        collectives.jax_tracing.reset(token)


@contextlib.contextmanager
def no_plans():
    """Drop every cached plan on the way in and out (tests)."""
    _plans.clear()
    try:
        yield
    finally:
        _plans.clear()


def loaded() -> bool:
    """Whether jax has been imported in this process."""
    return "jax" in sys.modules
