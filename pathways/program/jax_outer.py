"""A ``pw.shard_map`` called inside a JAX transformation: ``jax.grad``, ``jax.vjp``,
``jax.value_and_grad``, ``jax.jvp``, ``jax.linearize``, ``jax.jit`` and ``jax.vmap`` of a
function that calls it (issue 46).

Its arguments are then JAX tracers, not ``pw.Array``s. The call becomes part of JAX's
computation, and runs on the cluster when JAX evaluates it:

- the call is a ``jax.pure_callback``: when it runs (at once, or each time a jitted function
  runs), its arguments are put on the function's mesh by its in_specs, the function runs
  there, and its results are fetched; under ``jax.vmap`` it runs once per element;
- it is a ``jax.custom_jvp`` whose tangent is JAX's primitive ``pw_tangent``: linear in the
  arguments' tangents, it runs on the cluster as the ``pw.shard_map`` of the body's own
  ``jax.jvp``, and its transpose (what ``jax.grad`` runs) as the ``pw.shard_map`` of the
  body's ``jax.vjp`` (the forward pass recomputed there, as ``jax.checkpoint`` would do).
  Under shard_map's types JAX's vjp of the body sums the cotangent of an argument over the
  devices that share it, as JAX's own shard_map transpose does.

So a loss computed by a sharded forward pass has JAX's gradient, and forward mode its
tangents; each runs on the cluster once per use (``jax.grad``: the call and its transpose).
Derivatives are first order (a second derivative is refused, naming the function). Only JAX
bodies are differentiated; an integer argument's cotangent and an integer output's tangent
are JAX's float0 zeros. The arguments are sent and the results fetched whole at every call:
for speed, keep the step inside the body (or in ``@pw.program``) and the arrays on the
cluster.
"""

from __future__ import annotations

import sys
import weakref

import numpy as np

from ..errors import ProgramError
from . import tree
from .ir import Aval, RemoteValue
from .replication import spec_axes

__all__ = ["call", "is_tracer", "traced"]

# per function, what it was made into here (not on the function: it is pickled to hosts)
_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _made(fn) -> dict:
    return _MADE.setdefault(fn, {})


def is_tracer(value) -> bool:
    """Whether ``value`` is a JAX tracer (False, importing nothing, without JAX)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.core.Tracer)


def traced(args) -> bool:
    """Whether a leaf of ``args`` is a JAX tracer."""
    return any(is_tracer(leaf) for leaf in tree.flatten(args)[0])


def call(fn, args):
    """``fn(*args)`` (a ``CompiledFunction`` without static arguments) for JAX values: as
    part of JAX's computation, by its tree of results. ``pw.Array`` arguments stay on the
    cluster, constants to JAX (no gradient flows to them)."""
    flat, leaves, out_def = fn.twin(args)
    remote = {i: leaf for i, leaf in enumerate(leaves) if isinstance(leaf, RemoteValue)}
    for i, leaf in enumerate(leaves):
        if i not in remote and not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise ProgramError(f"{fn.name}: argument leaf {i} is {type(leaf).__name__}; under a"
                               " JAX transformation a pw function takes JAX or numpy arrays,"
                               " and pw.Arrays")
    outs = _differentiable(flat, remote, len(leaves))(
        *[leaf for i, leaf in enumerate(leaves) if i not in remote])
    if out_def is None:
        return outs[0] if flat.single_output else tuple(outs)
    return tree.unflatten(out_def, list(outs))


def _differentiable(fn, remote: dict, n: int):
    """``fn`` on the JAX values of its ``n`` arguments (the others: ``remote``, position ->
    pw.Array), with derivatives on the cluster (made once per function when it has no
    pw.Array arguments)."""
    made = None if remote else _made(fn).get("call")
    if made is not None:
        return made
    import jax

    local = [i for i in range(n) if i not in remote]

    @jax.custom_jvp
    def f(*xs):
        return _on_cluster(fn, _merged(remote, local, xs))

    def jvp(xs, ts):
        outs = _on_cluster(fn, _merged(remote, local, xs))
        wrt = tuple(i for i, x in zip(local, xs) if _inexact(x))
        moved = tuple(k for k, o in enumerate(outs) if _inexact(o))
        got = iter(_tangent_p().bind(
            *xs, *[t for i, t in zip(local, ts) if i in wrt],
            tangent=_Tangent(fn, remote, local, wrt, moved)) if wrt and moved else ())
        return outs, tuple(next(got) if k in moved and wrt else _zeros(o)
                           for k, o in enumerate(outs))

    f.defjvp(jvp)
    if not remote:
        _made(fn)["call"] = f
    return f


def _inexact(x) -> bool:
    import jax

    return jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)


def _zeros(x):
    """The tangent or cotangent of a value that has none: JAX's zeros for its dtype (float0
    for an integer)."""
    import jax

    return (jax.numpy.zeros(np.shape(x), x.dtype) if _inexact(x)
            else np.zeros(np.shape(x), jax.dtypes.float0))


class _Tangent:
    """The tangent map of a pw function at given arguments, as JAX's ``pw_tangent``
    primitive carries it (``_tangent_p``): from the tangents of the arguments at positions
    ``wrt`` to those of the outputs ``moved``, computed on the cluster (``jax.jvp`` of the
    body), and its transpose, also there (``jax.vjp`` of the body)."""

    def __init__(self, fn, remote: dict, local: list, wrt: tuple, moved: tuple):
        self.fn, self.remote, self.local, self.wrt, self.moved = fn, remote, local, wrt, moved
        self.n = len(remote) + len(local)

    def apply(self, xs, ts) -> tuple:
        return _on_cluster(_body_derivative(self.fn, self.n, self.wrt, self.moved, "jvp"),
                           [*_merged(self.remote, self.local, xs), *ts])

    def transpose(self, xs, cts) -> tuple:
        return _on_cluster(_body_derivative(self.fn, self.n, self.wrt, self.moved, "vjp"),
                           [*_merged(self.remote, self.local, xs), *cts])

    def out_avals(self, xs) -> list:
        """JAX's avals of the tangents of the outputs ``moved``, for arguments like ``xs``."""
        import jax

        args = _arrays(_merged(self.remote, self.local, xs))
        outs = self.fn.abstract_eval([Aval.of(a) for a in args])
        return [jax.core.ShapedArray(outs[k].shape, outs[k].dtype) for k in self.moved]


_PRIMITIVE: list = []
SECOND = ("{}: JAX differentiated a pw function's derivative (a second derivative: jax.hessian,"
          " jax.grad of jax.grad, jax.jvp of jax.grad, ...); pw functions have first"
          " derivatives only")


def _differentiating() -> tuple:
    """The classes of JAX's tracers that differentiate (forward mode, linearization): a pw
    function's call or derivative meeting one is being differentiated once more."""
    from jax._src.interpreters import ad

    return tuple(getattr(ad, name) for name in ("JVPTracer", "LinearizeTracer")
                 if hasattr(ad, name))


def _tangent_p():
    """JAX's primitive for a pw function's tangent map (a ``_Tangent``, its ``tangent``
    parameter): linear in its last inputs (the tangents), the first ones (the arguments) its
    residuals. It runs on the cluster, and so does its transpose; under ``jax.vmap`` it runs
    once per element (as the pure_callback of a call does). Made once, when JAX is first
    needed."""
    if _PRIMITIVE:
        return _PRIMITIVE[0]
    import jax
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    p = Primitive("pw_tangent")
    p.multiple_results = True

    def split(args, tangent):
        return args[:len(tangent.local)], args[len(tangent.local):]

    def impl(*args, tangent):
        return list(tangent.apply(*split(args, tangent)))

    def abstract(*args, tangent):
        return tangent.out_avals(split(args, tangent)[0])

    def transpose(cts, *args, tangent):
        xs, _ = split(args, tangent)
        if any(ad.is_undefined_primal(x) for x in xs):
            raise ProgramError(SECOND.format(tangent.fn.name))
        cts = [ad.zeros_like_aval(a) if type(ct) is ad.Zero else ct
               for ct, a in zip(cts, tangent.out_avals(xs))]
        return [None] * len(xs) + list(tangent.transpose(xs, cts))

    def batched(args, dims, tangent):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        args = [batching.bdim_at_front(a, d, size) for a, d in zip(args, dims)]
        outs = jax.lax.map(lambda one: p.bind(*one, tangent=tangent), args)
        return list(outs), [0] * len(outs)

    def second(primals, tangents, tangent):
        raise ProgramError(SECOND.format(tangent.fn.name))

    p.def_impl(impl)
    p.def_abstract_eval(abstract)
    ad.primitive_transposes[p] = transpose
    ad.primitive_jvps[p] = second
    batching.primitive_batchers[p] = batched
    mlir.register_lowering(p, mlir.lower_fun(impl, multiple_results=True))
    _PRIMITIVE.append(p)
    return p


def _merged(remote: dict, local: list, xs) -> list:
    """The arguments in order: the pw.Arrays of ``remote`` and the values ``xs`` at the
    positions ``local``."""
    args = [None] * (len(remote) + len(local))
    for i, a in remote.items():
        args[i] = a
    for i, x in zip(local, xs):
        args[i] = x
    return args


def _arrays(args) -> list:
    """``args`` with a Python number (as JAX may hand a weakly typed one over) made a JAX
    array; pw.Arrays and arrays as they are."""
    import jax

    return [a if isinstance(a, RemoteValue) or hasattr(a, "shape") else jax.numpy.asarray(a)
            for a in args]


def _on_cluster(fn, args) -> tuple:
    """``fn``'s results on ``args``: a host callback that puts its JAX values (a pw.Array
    is used where it is), runs ``fn`` on the cluster and fetches what it returns."""
    import jax

    args = _arrays(args)
    if any(isinstance(a, _differentiating()) for a in args):
        raise ProgramError(SECOND.format(fn.name))
    avals = [Aval.of(a) for a in args]
    outs = fn.abstract_eval(avals)
    if any(a.key is not None for a in (*outs, *avals)):
        raise ProgramError(f"{fn.name}: PRNG keys cannot cross a JAX transformation into a pw"
                           " function; pass their key data (jax.random.key_data)")
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in outs)
    specs = fn.arg_specs(len(args))
    local = [i for i, a in enumerate(args) if not isinstance(a, RemoteValue)]

    def run(*values):
        client, arrays = fn.mesh.client, list(args)
        for i, v in zip(local, values):
            arrays[i] = client.put(np.asarray(v), fn.mesh, specs[i])
        results = fn(*arrays)  # pw.Arrays now: it runs on the cluster, as any call
        results = (results,) if fn.single_output else results
        return tuple(np.asarray(r.result(), dtype=a.dtype) for r, a in zip(results, outs))

    return tuple(jax.pure_callback(run, shapes, *[args[i] for i in local],
                                   vmap_method="sequential"))


def _body_derivative(fn, n: int, wrt: tuple, moved: tuple, kind: str):
    """The ``CompiledFunction`` of a derivative of ``fn`` on ``n`` arguments, with respect to
    those at positions ``wrt``, of its outputs ``moved``: ``kind`` "jvp" takes the arguments
    and then their tangents and gives the outputs' tangents; "vjp" takes the arguments and
    then the outputs' cotangents, and gives the arguments' cotangents."""
    cache = _made(fn)
    made = cache.get((kind, n, wrt, moved))
    if made is not None:
        return made
    import jax

    # (locals, not ``fn``: the bodies below are pickled to the hosts, and fn with them)
    body, single, specs, check_rep = fn.body, fn.single_output, fn.arg_specs(n), fn.check_rep
    mesh = dict(zip(fn.mesh.axis_names, fn.mesh.axis_sizes))
    out_specs = tuple(fn.out_specs[k] for k in moved)
    out_axes = [spec_axes(s or ()) for s in out_specs]
    unmentioned = [tuple(a for a in mesh if a not in spec_axes(specs[i] or ())) for i in wrt]

    def outputs(xs, diff, cast):
        xs = list(xs)
        for i, d in zip(wrt, diff):
            xs[i] = d
        out = body(*xs)
        out = (out,) if single else tuple(out)
        out = tuple(out[k] for k in moved)
        if not cast:
            return out
        # an output is as varying as its spec, as its cotangent is: the cast transposes to
        # the sum over the devices that shared it (JAX's shard_map transpose)
        return tuple(_varying_over(o, axes) for o, axes in zip(out, out_axes))

    def jvp(*args):
        xs, ts = args[:n], args[n:]
        return tuple(jax.jvp(lambda *d: outputs(xs, d, False), tuple(xs[i] for i in wrt),
                             tuple(ts))[1])

    def vjp(*args):
        xs, cts = args[:n], args[n:]
        if not check_rep:  # no types to follow: JAX's rule without them
            cts = [ct / np.prod([mesh[a] for a in mesh if a not in axes])
                   for ct, axes in zip(cts, out_axes)]
        _, back = jax.vjp(lambda *d: outputs(xs, d, check_rep), *[xs[i] for i in wrt])
        got = back(tuple(cts))
        if not check_rep:
            got = [jax.lax.psum(g, axes) if axes else g for g, axes in zip(got, unmentioned)]
        return tuple(got)

    wrt_specs = tuple(specs[i] for i in wrt)
    if kind == "jvp":
        made = type(fn)(jvp, fn.mesh, tuple(specs) + wrt_specs, out_specs,
                        name=f"{fn.name}.jvp", check_rep=check_rep)
    else:
        made = type(fn)(vjp, fn.mesh, tuple(specs) + out_specs, wrt_specs,
                        name=f"{fn.name}.vjp", check_rep=check_rep)
    cache[(kind, n, wrt, moved)] = made  # (a CompiledFunction, as fn is)
    return made


def _varying_over(value, axes):
    """``value`` cast to vary over every mesh axis of ``axes`` (inside a shard_map body)."""
    import jax

    kind = getattr(jax.typeof(value), "manual_axis_type", None)
    varying = getattr(kind, "varying", frozenset())
    more = tuple(a for a in sorted(axes) if a not in varying)
    return jax.lax.pcast(value, more, to="varying") if more else value

