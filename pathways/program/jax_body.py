"""JAX bodies: a ``shard_map`` body written with jax.numpy, jax.lax collectives and jax.grad.

A body that refers to JAX (``uses_jax``) is traced, on the client and again on each host, as
JAX itself would trace it: ``jax.make_jaxpr`` of ``jax.shard_map`` over an abstract mesh of the
same axis names and sizes. So JAX checks the specs (and, with ``check_rep``, that outputs
``out_specs`` calls replicated are), and ``jax.grad`` inside the body transposes collectives
exactly as under ``jax.shard_map``. The per-device jaxpr inside becomes a plan
(``pathways.program.jax_plan``: XLA-compiled segments between collectives that run through
``pathways.program.collectives``), cached per (function, argument avals) in each process. A kernel's
modelled time is the roofline (``pw.DeviceSpec``) of the flops and bytes XLA's cost analysis
reports for its segments, unless ``cost=`` is given. A host runs each segment once for all of
its devices of the gang (``pathways.program.jax_batch``; the plan is cached per box shape); a
collective that reaches another host runs between segments, through the host's exchange.

JAX's own configuration decides dtypes (``jax_enable_x64``, off by default: float64 arguments
become float32, as under ``jax.jit``): the client's setting where a function is first traced
travels with it to the hosts.
"""

from __future__ import annotations

import contextlib
import copyreg
import functools
import gc
import os
import re
import sys
import threading
import types
import uuid
from collections import OrderedDict

import numpy as np

from ..errors import ProgramError, ShardingError
from . import collectives, prng
from .ir import Aval
from .jax_batch import HostBatch
from .jax_plan import Plan, open_body, plan_body, shapes_of

__all__ = ["JaxBody", "NotNumpy", "came_from_jax", "is_jax_type", "out_shapes", "require",
           "returns_jax", "uses_jax"]

INSTALL_HINT = ("this body uses JAX, which is an optional extra: install it with"
                " .venv/bin/pip install -e '.[jax]' (or pip install 'pathways-open[jax]')")
PLANS_KEPT = 256

_on_host = False


def on_host(cpu_devices: int | None = None) -> None:
    """Configure JAX, when a body first needs it, for a host process: segments run on the
    executor's thread (no asynchronous dispatch to a worker thread and back) and XLA uses one
    thread per computation (a host shares its cores with its peers). ``cpu_devices``: the
    XLA CPU devices the process has (a host whose devices are JAX's own on CPU: ``pathways
    host --backend jax``)."""
    global _on_host
    _on_host = True
    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            flags += " --xla_cpu_multi_thread_eigen=false"
        if cpu_devices is not None:  # its own count, whatever the environment said
            flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", flags)
            flags += f" --xla_force_host_platform_device_count={cpu_devices}"
        os.environ["XLA_FLAGS"] = " ".join(flags.split())
        cache = compilation_cache()
        if cache is not None and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
            os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
            os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def compilation_cache() -> str | None:
    """The directory of JAX's persistent compilation cache for host processes, so a host
    (a second run, a restarted or added host) does not compile again what a host of this
    user compiled before: ``$PATHWAYS_JAX_CACHE`` (``off``: none), else
    ``$XDG_CACHE_HOME/pathways/jax`` (``~/.cache/...``). Made private (0700); one that is
    not this user's own or that others may write to is not used (cache entries are
    executables), nor is one that cannot be made."""
    where = os.environ.get("PATHWAYS_JAX_CACHE")
    if where == "off":
        return None
    if not where:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                 ".cache")
        where = os.path.join(base, "pathways", "jax")
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        st = os.stat(where)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return where


def require():
    """The ``jax`` module, or a ProgramError saying how to install the extra."""
    try:
        import jax
    except ImportError as exc:
        raise ProgramError(INSTALL_HINT) from exc
    global _on_host, _pickles_custom_vjp
    if _on_host:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
        _on_host = False  # done
        # what JAX brought (~100k objects: modules, classes, its caches) came after the
        # host's collector was settled (plaque.cli.settle_collector): freeze it too, or each
        # full collection rescans it (200-340 ms on a host that keeps its kernel records)
        gc.collect()
        gc.freeze()
    if not _pickles_custom_vjp:
        copyreg.pickle(jax.custom_vjp, _reduce_custom_vjp)
        _pickles_custom_vjp = True
    return jax


_pickles_custom_vjp = False


def _reduce_custom_vjp(f):
    """How a ``jax.custom_vjp`` function pickles (a body's closure ships it to the hosts):
    made again from its function, then given its rules. Its class needs the function to be
    made at all, so pickle's default (an empty object, then its attributes) cannot."""
    return _custom_vjp, (f.fun, f.nondiff_argnums), dict(vars(f))


def _custom_vjp(fun, nondiff_argnums):
    return require().custom_vjp(fun, nondiff_argnums=nondiff_argnums)


# ---- which bodies are JAX bodies ---------------------------------------------------------------

def _in_jax(module_name) -> bool:
    return (module_name or "").split(".")[0] in ("jax", "jaxlib")


def is_jax_type(value) -> bool:
    """Whether ``value``'s class comes from JAX (a JAX array or tracer, a JAX exception)."""
    return _in_jax(type(value).__module__)


def _is_jax_value(value) -> bool:
    if isinstance(value, types.ModuleType):
        return _in_jax(value.__name__)
    return _in_jax(getattr(value, "__module__", None)) or is_jax_type(value)


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
    return any(is_jax_type(o) for o in items)


def came_from_jax(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside JAX (e.g. jax.lax.psum outside a JAX trace)."""
    if is_jax_type(exc):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}jax{os.sep}" in tb.tb_frame.f_code.co_filename


# ---- a JAX body and its plans ------------------------------------------------------------------

class JaxBody:
    """A body traced and run as JAX: ``plan`` (output avals, XLA's flops and bytes) and
    ``run`` on a device's shards. Pickles as the body and its specs; plans are rebuilt (and
    cached) in each process that runs it."""

    def __init__(self, body, axis_names, mesh_shape, in_specs, out_specs, check_rep, name):
        jax = require()
        self.body, self.name, self.check_rep = body, name, check_rep
        self.axis_names, self.mesh_shape = tuple(axis_names), tuple(mesh_shape)
        self.in_specs, self.out_specs = tuple(in_specs), tuple(out_specs)
        self.x64 = bool(jax.config.jax_enable_x64)
        self.token = uuid.uuid4().hex  # names this body in this process's plan cache
        self._last = None  # (argument avals, plan) of the latest run, in this process

    def __getstate__(self):
        # the token names the body in one process only: a random one on the wire would
        # make a simulation's messages differ from run to run of the same seed
        state = {**self.__dict__, "_last": None}
        del state["token"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state, token=uuid.uuid4().hex)

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

    def plan(self, in_avals, single_output: bool, batch: HostBatch | None = None) -> Plan:
        """The plan for global argument avals (``Aval``s), traced once per process; with a
        ``batch``, its segments run once for that box of a host's devices."""
        key = (self.token, tuple(in_avals), batch)
        with _plans_lock:
            plan = _plans.get(key)
            if plan is not None:
                _plans.move_to_end(key)
                return plan
            body, consts, out_avals = self._body(in_avals, single_output, batch is not None)
            with require().enable_x64(self.x64):
                plan = _plans[key] = plan_body(body, consts, self.name, batch)
            plan.out_avals = out_avals
            while len(_plans) > PLANS_KEPT:
                _plans.popitem(last=False)
            return plan

    def _body(self, in_avals, single_output: bool, keep: bool) -> tuple:
        """(the per-device jaxpr, its constants, the global output avals) for ``in_avals``.
        The trace this process's client made is taken up (``keep``: left for a per-device
        plan the host may need as well, a batched plan's or not)."""
        key = (self.token, tuple(in_avals))
        traced = (_avals.get if keep else _avals.pop)(key, None)
        if traced is None:
            traced = self._traced_avals(in_avals, single_output)
            if keep:
                _avals[key] = traced
        (outs, _), closed = traced
        return (*open_body(closed, self.name), outs)

    def avals(self, in_avals, single_output: bool) -> tuple[list, list]:
        """(global output avals, one device's output avals), as ``Aval``s, for global
        argument avals, from the trace alone: what a client needs, with nothing compiled
        (its hosts compile, in ``plan``). Traced once per process."""
        key = (self.token, tuple(in_avals))
        plan = _plans.get((*key, None))
        if plan is not None:
            return plan.out_avals, _ours(plan.shard_out_avals, [o.key for o in plan.out_avals])
        with _plans_lock:
            got = _avals.get(key)
            if got is None:
                got = _avals[key] = self._traced_avals(in_avals, single_output)
                while len(_avals) > PLANS_KEPT:
                    _avals.popitem(last=False)
            return got[0]

    def _traced_avals(self, in_avals, single_output: bool) -> tuple:
        """((global output avals, one device's), the closed jaxpr) of the body's trace."""
        closed, keys = self.traced(in_avals, single_output)
        outs, shards = shapes_of(closed, self.name)
        return (_ours(outs, keys), _ours(shards, keys)), closed

    def traced(self, in_avals, single_output):
        """(the closed jaxpr of the body's ``jax.shard_map`` on arguments of ``in_avals``,
        the impl of each output that is a key array, else None). Keys cross the shard_map
        as their key data (``prng``): the body gets keys, and gives its key outputs' data."""
        jax = require()
        from jax.sharding import AbstractMesh
        from jax.sharding import PartitionSpec as JaxP

        mesh = AbstractMesh(self.mesh_shape, self.axis_names)
        in_specs = tuple(JaxP(*s) if s is not None else JaxP() for s in self.in_specs)
        if len(in_specs) == 1 and len(in_avals) != 1:  # one spec for every argument
            in_specs = in_specs * len(in_avals)
        out_specs = tuple(JaxP(*s) if s is not None else JaxP() for s in self.out_specs)
        body = self.body
        in_keys = [a.key for a in in_avals]
        out_keys: list = []

        def flat(*args):
            outs = body(*prng.wrapped(args, in_keys))
            outs = (outs,) if single_output else tuple(outs)
            data = [prng.unwrap(o) for o in outs]
            out_keys[:] = [k for _, k in data]
            return tuple(d for d, _ in data)

        flat.__name__ = flat.__qualname__ = self.name  # JAX's errors name the function
        mapped = jax.shard_map(_naming_missing_axes(self.name, self.axis_names)(flat),
                               mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                               check_vma=self.check_rep)
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
        with _traced(self.name, in_avals), jax.enable_x64(self.x64):
            return jax.make_jaxpr(mapped)(*structs), out_keys

    def run(self, shards, in_avals, single_output: bool) -> tuple:
        """One device's outputs (numpy) for its ``shards``, inside its kernel environment
        (where its host runs several devices of the gang, their segments run together:
        ``pathways.program.jax_batch``)."""
        env = collectives.current_env()
        batch = env.local_batch() if env is not None else None
        last = self._last
        if last is not None and last[0] is in_avals and last[1] is batch:
            plan = last[2]  # every kernel of a program: one lookup
        else:
            plan = _plans.get((self.token, tuple(in_avals), batch))
            if plan is None:  # traced and compiled: the host's work, not the device's
                work = env.host_work() if env is not None else collectives.NO_HOST_WORK
                with work:
                    plan = self.plan(in_avals, single_output, batch)
                plan.ready_at = work.until
            self._last = (in_avals, batch, plan)
        if plan.ready_at is not None and env is not None:  # no device starts before its
            env.host_work_until(plan.ready_at)  # program is compiled
        with self._x64(self.x64):
            return plan.run(shards)

    def cost(self, in_avals, single_output: bool) -> tuple[float, float]:
        """(flops, bytes) XLA counts for one device's run: of the plan that ran last in this
        process, if it was for ``in_avals``, else of the per-device plan."""
        last = self._last
        plan = last[2] if last is not None and last[0] is in_avals else \
            self.plan(in_avals, single_output)
        return plan.flops, plan.bytes


def _ours(avals, keys) -> list[Aval]:
    """JAX's ``avals`` (of key data where ``keys`` names an impl) as ``Aval``s."""
    return [Aval(tuple(a.shape), np.dtype(a.dtype), k) for a, k in zip(avals, keys)]


_plans: OrderedDict[tuple, Plan] = OrderedDict()
_avals: OrderedDict[tuple, tuple] = OrderedDict()  # ``avals`` of bodies not planned: (its
# answer, the closed jaxpr, which ``plan`` takes up if a host of this process runs the body)
_plans_lock = threading.RLock()


def out_shapes(fn, axis_names, mesh_shape, in_avals, in_specs, name):
    """What ``fn`` returns (a tree of ShapeDtypeStructs, one device's shapes) on arguments of
    global ``in_avals`` split by ``in_specs``, traced as under ``jax.shard_map``: for the
    structure of what a body returns, before its out_specs are known (every output is taken
    as replicated, unchecked: the body's own trace checks its specs)."""
    jax = require()
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as JaxP

    shapes = []
    keys = [a.key for a in in_avals]

    def keep(*args):
        out = fn(*prng.wrapped(args, keys))
        shapes.append(jax.tree.map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype), out))
        return jax.tree.map(lambda o: jax.numpy.zeros((), prng.unwrap(o)[0].dtype), out)

    mapped = jax.shard_map(_naming_missing_axes(name, axis_names)(keep),
                           mesh=AbstractMesh(tuple(mesh_shape), tuple(axis_names)),
                           in_specs=tuple(JaxP(*(s or ())) for s in in_specs),
                           out_specs=JaxP(), check_vma=False)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
    with _traced(name, in_avals):
        jax.make_jaxpr(mapped)(*structs)
    return shapes[0]


@contextlib.contextmanager
def _traced(name, avals):
    """Trace a body here: pw collectives mean jax.lax's, no kernel environment is seen (a host
    traces inside a kernel), and JAX's errors become ProgramErrors naming the function."""
    token = collectives.jax_tracing.set(True)
    try:
        with collectives.kernel_env(None):
            yield
    except (ProgramError, ShardingError):
        raise
    except Exception as exc:  # some of JAX's say nothing (an AssertionError): name the type
        raise ProgramError(f"{name}: JAX could not trace the body on arguments"
                           f" {[str(a) for a in avals]}: {str(exc) or type(exc).__name__}") from exc
    finally:
        collectives.jax_tracing.reset(token)


def _naming_missing_axes(name, axis_names):
    """Wrap a body to be traced so that its failure in a JAX collective over an axis the
    mesh does not have says so: JAX's own error for it may be empty (jax.lax.psum's is a
    bare AssertionError). The axis is in JAX's frames of the traceback, which JAX's
    outermost API call strips: so this looks inside the trace, before that call does."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args):
            try:
                return fn(*args)
            except (ProgramError, ShardingError):
                raise
            except Exception as exc:
                found = _missing_axis(exc.__traceback__, axis_names)
                if found is None:
                    raise
                raise ProgramError(f"{name}: {found[0]} over axis {found[1]!r}, which the"
                                   f" mesh {tuple(axis_names)} does not have") from exc
        return call
    return wrap


def _missing_axis(tb, axis_names) -> tuple[str, object] | None:
    """(function, axis) if the innermost call from outside JAX into JAX on traceback ``tb``
    takes an ``axis_name`` (jax.lax's collectives all do) holding an axis neither the mesh
    nor an enclosing JAX call (a vmap's ``axis_name``) binds; else None."""
    calls = []  # (called from outside JAX, function, its axes) of JAX frames with axes
    caller_in_jax = False
    while tb is not None:
        frame = tb.tb_frame
        in_jax = f"{os.sep}jax{os.sep}" in frame.f_code.co_filename
        if in_jax and "axis_name" in frame.f_locals:
            calls.append((not caller_in_jax, frame.f_code.co_name,
                          _flat_axes(frame.f_locals["axis_name"])))
        caller_in_jax, tb = in_jax, tb.tb_next
    entries = [i for i, (entry, _, _) in enumerate(calls) if entry]
    if not entries:
        return None
    _, function, axes = calls[entries[-1]]
    bound = set(axis_names).union(*(a for _, _, a in calls[:entries[-1]]))
    missing = [a for a in axes if a not in bound]
    return (function, missing[0]) if missing else None


def _flat_axes(axis_name) -> tuple:
    """The axis names in an ``axis_name`` argument: one name, or nested tuples of them."""
    if isinstance(axis_name, (tuple, list)):
        return tuple(a for each in axis_name for a in _flat_axes(each))
    return (axis_name,)
