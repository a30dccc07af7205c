"""A ``pw.shard_map`` called inside a JAX transformation: ``jax.grad``, ``jax.vjp``,
``jax.value_and_grad``, ``jax.jit`` and ``jax.vmap`` of a function that calls it (issue 46).

Its arguments are then JAX tracers, not ``pw.Array``s. The call becomes part of JAX's
computation, and runs on the cluster when JAX evaluates it:

- the call is a ``jax.pure_callback``: when it runs (at once, or each time a jitted function
  runs), its arguments are put on the function's mesh by its in_specs, the function runs
  there, and its results are fetched; under ``jax.vmap`` it runs once per element;
- its derivative is a ``jax.custom_vjp`` whose backward pass runs on the cluster too, as the
  ``pw.shard_map`` of the body's own ``jax.vjp`` (the forward pass recomputed there, as
  ``jax.checkpoint`` would do): in_specs the arguments' and then the output cotangents',
  out_specs the arguments'. Under shard_map's types JAX's vjp of the body sums the cotangent
  of an argument over the devices that share it, as JAX's own shard_map transpose does.

So a loss computed by a sharded forward pass has JAX's gradient. Forward mode (``jax.jvp``,
``jax.linearize``) gets JAX's own refusal for a custom_vjp function. Only JAX bodies are
differentiated; an integer argument's cotangent is JAX's float0 zeros. The arguments are sent
and the results fetched whole at every call: for speed, keep the step inside the body (or in
``@pw.program``) and the arrays on the cluster.
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
    pw.Array), with a backward pass on the cluster (made once per function when it has no
    pw.Array arguments)."""
    made = None if remote else _made(fn).get("call")
    if made is not None:
        return made
    import jax

    local = [i for i in range(n) if i not in remote]

    @jax.custom_vjp
    def f(*xs):
        return _on_cluster(fn, _merged(remote, local, xs))

    def forward(*xs):
        return _on_cluster(fn, _merged(remote, local, xs)), xs

    def backward(xs, cts):
        wrt = tuple(i for i, x in zip(local, xs)
                    if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact))
        got = iter(_on_cluster(_transposed(fn, n, wrt), [*_merged(remote, local, xs), *cts])
                   if wrt else ())
        return tuple(next(got) if i in wrt else np.zeros(np.shape(x), jax.dtypes.float0)
                     for i, x in zip(local, xs))

    f.defvjp(forward, backward)
    if not remote:
        _made(fn)["call"] = f
    return f


def _merged(remote: dict, local: list, xs) -> list:
    """The arguments in order: the pw.Arrays of ``remote`` and the values ``xs`` at the
    positions ``local``."""
    args = [None] * (len(remote) + len(local))
    for i, a in remote.items():
        args[i] = a
    for i, x in zip(local, xs):
        args[i] = x
    return args


def _on_cluster(fn, args) -> tuple:
    """``fn``'s results on ``args``: a host callback that puts its JAX values (a pw.Array
    is used where it is), runs ``fn`` on the cluster and fetches what it returns."""
    import jax

    args = [a if isinstance(a, RemoteValue) or hasattr(a, "shape") else jax.numpy.asarray(a)
            for a in args]  # (a weakly typed Python number, as JAX hands it to a custom_vjp)
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


def _transposed(fn, n: int, wrt: tuple):
    """The ``CompiledFunction`` of the backward pass of ``fn`` on ``n`` arguments: they, then
    a cotangent per output, in; the cotangents of the arguments at positions ``wrt`` out."""
    cache = _made(fn)
    made = cache.get((n, wrt))
    if made is not None:
        return made
    import jax

    # (locals, not ``fn``: the body below is pickled to the hosts, and fn with it otherwise)
    body, single, specs, check_rep = fn.body, fn.single_output, fn.arg_specs(n), fn.check_rep
    mesh = dict(zip(fn.mesh.axis_names, fn.mesh.axis_sizes))
    out_axes = [spec_axes(s or ()) for s in fn.out_specs]
    unmentioned = [tuple(a for a in mesh if a not in spec_axes(specs[i] or ())) for i in wrt]

    def backward(*args):
        xs, cts = list(args[:n]), args[n:]

        def forward(*diff):
            for i, d in zip(wrt, diff):
                xs[i] = d
            out = body(*xs)
            out = (out,) if single else tuple(out)
            if not check_rep:
                return out
            # an output is as varying as its spec, as its cotangent is: the cast transposes
            # to the sum over the devices that shared it (JAX's shard_map transpose)
            return tuple(_varying_over(o, axes) for o, axes in zip(out, out_axes))

        if not check_rep:  # no types to follow: JAX's rule without them
            cts = [ct / np.prod([mesh[a] for a in mesh if a not in axes])
                   for ct, axes in zip(cts, out_axes)]
        _, vjp = jax.vjp(forward, *[xs[i] for i in wrt])
        got = vjp(tuple(cts))
        if not check_rep:
            got = [jax.lax.psum(g, axes) if axes else g for g, axes in zip(got, unmentioned)]
        return tuple(got)

    made = cache[(n, wrt)] = type(fn)(  # a CompiledFunction, as fn is
        backward, fn.mesh, tuple(specs) + tuple(fn.out_specs), tuple(specs[i] for i in wrt),
        name=f"{fn.name}.vjp", check_rep=check_rep)
    return made


def _varying_over(value, axes):
    """``value`` cast to vary over every mesh axis of ``axes`` (inside a shard_map body)."""
    import jax

    kind = getattr(jax.typeof(value), "manual_axis_type", None)
    varying = getattr(kind, "varying", frozenset())
    more = tuple(a for a in sorted(axes) if a not in varying)
    return jax.lax.pcast(value, more, to="varying") if more else value

