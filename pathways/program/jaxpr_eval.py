"""A jaxpr's equations as JAX binds them again: which primitives are collectives, nested
calls and loops, and ``eval_eqns``, which binds a per-device jaxpr's equations on values inside
a jit trace (a plan's segments, ``pathways.program.jax_plan``; a host's batched ones,
``pathways.program.jax_batch``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ProgramError

__all__ = ["COLLECTIVES", "IDENTITIES", "INLINED_CALLS", "Jaxpr", "axes_of", "call_jaxpr",
           "communicates", "eval_eqns", "is_literal", "open_jaxpr", "sub_jaxprs"]

# The collective primitives a plan runs itself, and the ones that only retag a value's
# variation (JAX's check_vma bookkeeping): identities for us.
COLLECTIVES = {"psum", "psum_invariant", "pmax", "pmin", "ppermute", "all_gather",
                "all_gather_invariant", "reduce_scatter", "all_to_all", "axis_index"}
IDENTITIES = {"pvary"}
INLINED_CALLS = {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
                  "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint"}


def is_literal(var) -> bool:
    return type(var).__name__ == "Literal"


@dataclass
class Jaxpr:
    """The parts of a jaxpr a plan needs (constants first, then arguments). ``starts``: the
    indices of equations where a chained body begins (``jax_plan.chain_bodies``)."""

    constvars: list
    invars: list
    outvars: list
    eqns: list
    starts: tuple = ()


def open_jaxpr(jaxpr_param) -> tuple[Jaxpr, list]:
    """A closed or open jaxpr param as (Jaxpr, its constants)."""
    jaxpr = getattr(jaxpr_param, "jaxpr", jaxpr_param)
    consts = list(getattr(jaxpr_param, "consts", ()))
    return Jaxpr(list(jaxpr.constvars), list(jaxpr.invars), list(jaxpr.outvars),
                  list(jaxpr.eqns)), consts


def sub_jaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns") or hasattr(getattr(item, "jaxpr", None), "eqns"):
                yield getattr(item, "jaxpr", item)


def communicates(eqn, kinds=COLLECTIVES | IDENTITIES) -> bool:
    """Whether ``eqn`` is, or holds in a nested jaxpr, a collective (or a pvary)."""
    if eqn.primitive.name in kinds:
        return True
    return any(communicates(e, kinds) for j in sub_jaxprs(eqn) for e in j.eqns)


def call_jaxpr(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return eqn.params[key]
    raise ProgramError(f"cannot read the jaxpr of a {eqn.primitive.name} call")


def axes_of(p, key):
    axes = p[key]
    return axes if isinstance(axes, str) else tuple(axes)


def eval_eqns(eqns, env, collective=None) -> None:
    """Bind ``eqns`` on the values in ``env`` (inside a jit trace): nested calls are inlined,
    loops and conds traced anew from their jaxprs (``_RETRACED``) and pvary is an identity,
    so nothing needs JAX's shard_map axis context. ``collective``: what computes a
    collective equation, ``collective(eqn, args) -> outs`` (a batch's)."""
    def read(v):
        return v.val if is_literal(v) else env[v]

    for eqn in eqns:
        prim = eqn.primitive.name
        args = [read(v) for v in eqn.invars]
        if prim in IDENTITIES:
            outs = args
        elif collective is not None and prim in COLLECTIVES:
            outs = collective(eqn, args)
        elif prim in INLINED_CALLS:
            outs = _as_function(call_jaxpr(eqn), collective)(*args)
        elif prim in _RETRACED:
            with eqn.ctx.manager:
                outs = _RETRACED[prim](eqn.params, args, collective)
        else:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outs = [outs]
        env.update(zip(eqn.outvars, outs))


def _as_function(jaxpr_param, collective=None):
    """A jaxpr param (closed or open) as a function of its arguments: its equations bound by
    ``eval_eqns``; returns the list of its results."""
    sub, consts = open_jaxpr(jaxpr_param)

    def run(*args):
        inner = dict(zip(sub.constvars, consts))
        inner.update(zip(sub.invars, args))
        eval_eqns(sub.eqns, inner, collective)
        return [v.val if is_literal(v) else inner[v] for v in sub.outvars]

    return run


# Loops and conds are traced again from their jaxprs' equations, not bound with them: a body
# traced with JAX's check of how values vary (check_rep) has jaxprs whose types name each
# value's varying mesh axes, which a scan's or a while's carry and a cond's branches must
# match exactly; bound outside a shard_map, on values that name none, a loop whose carry
# starts replicated and comes out varying (a histogram's searchsorted) failed to compile.
# Traced anew, the same operations run in the same order: the same computation.

def _scan(p, args, collective):
    from jax import lax

    n_consts, n_carry = p["num_consts"], p["num_carry"]
    consts, init, xs = args[:n_consts], args[n_consts:n_consts + n_carry], \
        args[n_consts + n_carry:]
    body = _as_function(p["jaxpr"], collective)

    def step(carry, x):
        outs = body(*consts, *carry, *x)
        return outs[:n_carry], outs[n_carry:]

    carry, ys = lax.scan(step, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                         unroll=p["unroll"])
    return [*carry, *ys]


def _while(p, args, collective):
    from jax import lax

    n_cond, n_body = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts = args[:n_cond], args[n_cond:n_cond + n_body]
    test = _as_function(p["cond_jaxpr"], collective)
    body = _as_function(p["body_jaxpr"], collective)
    out = lax.while_loop(lambda c: test(*cond_consts, *c)[0],
                         lambda c: tuple(body(*body_consts, *c)),
                         tuple(args[n_cond + n_body:]))
    return list(out)


def _cond(p, args, collective):
    from jax import lax

    branches = [_as_function(b, collective) for b in p["branches"]]
    return list(lax.switch(args[0], [lambda *ops, b=b: tuple(b(*ops)) for b in branches],
                           *args[1:]))


_RETRACED = {"scan": _scan, "while": _while, "cond": _cond}
