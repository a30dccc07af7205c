"""Mixture of Experts layers on ``expert_map``: a router, top-1 / top-2, capacity, backward.

One MoE layer over a token mesh (tokens sharded, one routing group per token device) and an
expert mesh (experts sharded, ``num_experts / devices`` each)::

    router     (token devices)  fp32 softmax, top-k, capacity -> route, gates, aux, load
    experts    (expert_map)     only the routed rows travel, to the experts chosen
    combine    (token devices)  y = x + sum_j gate_j * expert_j(x)   (dropped slots: y = x)

and its backward, which sends ``gate * dy`` along the same routes so each expert gets the
gradient rows of exactly the tokens it processed, and returns the input gradients home:

    combine_bwd (token devices) dgates, per-slot output gradients
    experts_bwd (expert_map)    dx rows; dW1, dW2 (or the updated weights) stay on the experts
    router_bwd  (token devices) dx = dy + sum_j dx_j + router path;  dWr (psum over tokens)

The loss a layer adds is ``aux_weight * aux``, the GShard/Switch load-balancing loss
``aux = E * sum_e f_e * P_e`` (f_e: share of tokens whose first choice is e, P_e: mean router
probability of e), averaged over the routing groups.

``dense_moe`` is the reference: the same layer computed densely in one process (dispatch and
combine as one-hot tensors, every expert on a capacity-padded batch).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ProgramError
from ..program import jax_body
from ..program.compiled import shard_map
from ..program.mesh import Mesh
from ..program.routing import expert_map
from ..program.sharding import P


def _compute_dtype(dtype):
    return np.promote_types(dtype, np.float32)  # the router is never below fp32


def softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def capacity(tokens: int, num_experts: int, top_k: int, capacity_factor) -> int | None:
    """Slots per expert per routing group: ceil(cf * tokens * k / E); None when dropless."""
    if capacity_factor is None:
        return None
    return max(1, math.ceil(capacity_factor * tokens * top_k / num_experts))


def router_probs(x, wr):
    dt = _compute_dtype(x.dtype)
    return softmax(x.astype(dt) @ wr.astype(dt))


def route_group(x, wr, top_k: int, capacity_factor):
    """Route one group of tokens: (route int32[n, k] with -1 for dropped, gates[n, k], probs,
    choices int[n, k] before dropping)."""
    probs = router_probs(x, wr)
    n, E = probs.shape
    choices = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    picked = np.take_along_axis(probs, choices, axis=1)
    gates = picked if top_k == 1 else picked / picked.sum(axis=1, keepdims=True)
    route = choices.astype(np.int32)
    cap = capacity(n, E, top_k, capacity_factor)
    if cap is not None:
        # First choices take places before second choices; within a choice, token order.
        taken = np.zeros(E, np.int64)
        for j in range(top_k):
            onehot = np.eye(E, dtype=np.int64)[choices[:, j]]
            place = np.cumsum(onehot, axis=0)[np.arange(n), choices[:, j]] - 1
            place += taken[choices[:, j]]
            taken += onehot.sum(axis=0)
            route[place >= cap, j] = -1
    return route, gates.astype(x.dtype), probs, choices


def aux_loss(probs, choices):
    """E * sum_e (share of first choices on e) * (mean probability of e), for one group."""
    E = probs.shape[1]
    f = np.bincount(choices[:, 0], minlength=E) / len(probs)
    return E * float((f * probs.mean(axis=0)).sum()), f


def router_grad(x, wr, top_k, dgates, aux_scale):
    """(dlogits) of one group, from the gates' gradient and ``aux_scale * aux``."""
    probs = router_probs(x, wr)
    n, E = probs.shape
    choices = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    picked = np.take_along_axis(probs, choices, axis=1)
    dg = dgates.astype(probs.dtype)
    if top_k == 1:
        dpicked = dg
    else:
        s = picked.sum(axis=1, keepdims=True)
        dpicked = dg / s - (dg * picked).sum(axis=1, keepdims=True) / s ** 2
    dp = np.zeros_like(probs)
    np.put_along_axis(dp, choices, dpicked, axis=1)  # top-k choices are distinct
    if aux_scale:
        f = np.bincount(choices[:, 0], minlength=E) / n
        dp += aux_scale * E * f / n
    return probs * (dp - (dp * probs).sum(axis=1, keepdims=True))


def ffn(x, w1, w2):
    """One expert: relu(x @ w1) @ w2."""
    return np.maximum(x @ w1, 0) @ w2


def ffn_grad(x, g, w1, w2):
    """(dx, dw1, dw2) of ``ffn`` for output gradient rows ``g``."""
    pre = x @ w1
    h = np.maximum(pre, 0)
    dh = (g @ w2.T) * (pre > 0)
    return dh @ w1.T, x.T @ dh, h.T @ g


class JaxExpert:
    """An ``expert(x, w1, w2)`` written in JAX, as ``forward`` (``ffn``'s contract) and
    ``grad`` (``ffn_grad``'s: ``jax.vjp`` of it). Both are jitted, with the rows padded with
    zeros to the next power of two: an expert sees a different number of rows at every call,
    and this bounds the compilations to one per power of two. Padding is exact for experts
    that treat rows independently (as the routing assumes): padded rows' outputs are cut off
    and, with a zero gradient, add nothing to the weights' gradients."""

    def __init__(self, expert):
        jax_body.require()
        self.expert = expert
        self._jitted = None  # (forward, backward), made where first called

    def __getstate__(self):  # jitted functions are rebuilt on each host
        return {"expert": self.expert, "_jitted": None}

    def _fns(self):
        if self._jitted is None:
            jax = jax_body.require()

            def backward(x, g, w1, w2):
                return jax.vjp(self.expert, x, w1, w2)[1](g)

            self._jitted = (jax.jit(self.expert), jax.jit(backward))
        return self._jitted

    def forward(self, x, w1, w2):
        n = len(x)
        return np.asarray(self._fns()[0](_pad_rows(x), w1, w2))[:n]

    def grad(self, x, g, w1, w2):
        n = len(x)
        dx, dw1, dw2 = self._fns()[1](_pad_rows(x), _pad_rows(g.astype(x.dtype)), w1, w2)
        return np.asarray(dx)[:n], np.asarray(dw1), np.asarray(dw2)


def _pad_rows(a):
    """``a`` with zero rows appended up to the next power of two (at least one row)."""
    n = 1 << max(0, (len(a) - 1).bit_length())
    return a if n == len(a) else np.concatenate([a, np.zeros((n - len(a), *a.shape[1:]),
                                                             a.dtype)])


class MoELayer:
    """A Mixture of Experts feed-forward layer with residual, over a token and an expert mesh.

    ``forward`` and ``backward`` are called inside ``@pw.program``. Parameters: router
    ``wr[d, E]`` (replicated on the token mesh) and experts ``w1[E, d, f]``, ``w2[E, f, d]``
    (sharded over the expert mesh).

    >>> tm, em = client.mesh((4,), ("data",)), client.mesh((4,), ("expert",))
    >>> layer = pw.moe.MoELayer(tm, em, num_experts=8, top_k=2, capacity_factor=1.25)
    >>> rng, (T, d, f) = np.random.default_rng(0), (32, 4, 8)
    >>> x, dy = (client.put(rng.normal(size=(T, d)), tm, P("data")) for _ in range(2))
    >>> wr = client.put(rng.normal(size=(d, 8)), tm, P())
    >>> w1 = client.put(rng.normal(size=(8, d, f)), em, P("expert"))
    >>> w2 = client.put(rng.normal(size=(8, f, d)), em, P("expert"))
    >>> y, saved, aux, load = layer.forward(x, wr, w1, w2)
    >>> dx, dwr, dw1, dw2 = layer.backward(dy, saved, wr, w1, w2)
    >>> y.shape, dw1.shape
    ((32, 4), (8, 4, 8))

    ``expert(x, w1, w2)`` replaces ``ffn`` (one expert on its rows); written in JAX, its
    backward is ``jax.vjp`` of it (``JaxExpert``), else ``expert_grad`` must be given.
    """

    def __init__(self, tokens: Mesh, experts: Mesh, num_experts: int, top_k: int = 1,
                 capacity_factor: float | None = 1.25, aux_weight: float = 0.01,
                 name: str = "moe", expert=None, expert_grad=None):
        if top_k not in (1, 2) or top_k > num_experts:
            raise ProgramError(f"top_k must be 1 (Switch) or 2 (GShard) and at most the number"
                               f" of experts, got {top_k}")
        if capacity_factor is not None and capacity_factor <= 0:
            raise ProgramError(f"capacity_factor must be > 0 or None (dropless), got"
                               f" {capacity_factor}")
        self.tokens, self.experts, self.num_experts = tokens, experts, num_experts
        self.top_k, self.capacity_factor, self.aux_weight = top_k, capacity_factor, aux_weight
        self.name = name
        if expert is not None and expert_grad is None:
            if not jax_body.uses_jax(expert):
                raise ProgramError("a numpy expert needs its expert_grad(x, g, w1, w2) ->"
                                   " (dx, dw1, dw2); a JAX expert gets jax.vjp's")
            jitted = JaxExpert(expert)
            expert, expert_grad = jitted.forward, jitted.grad
        expert, self._expert_grad = expert or ffn, expert_grad or ffn_grad
        grad_of = self._expert_grad
        ax = tokens.axis_names[0]
        t, r = P(ax), P()
        k, cf, E, groups = top_k, capacity_factor, num_experts, tokens.size

        def router(x, wr):
            route, gates, probs, choices = route_group(x, wr, k, cf)
            aux, _ = aux_loss(probs, choices)
            load = np.zeros((1, E + 1), np.int64)  # slots kept per expert, then dropped
            kept = route[route >= 0]
            load[0, :E] = np.bincount(kept, minlength=E)
            load[0, E] = route.size - kept.size
            return route, gates, np.full((1,), aux, np.float32), load

        def combine(x, gates, rows):
            return x + (gates[..., None] * rows).sum(axis=1).astype(x.dtype)

        def combine_bwd(dy, gates, rows):
            dgates = (dy[:, None, :] * rows).sum(axis=-1).astype(gates.dtype)
            return dgates, (gates[..., None] * dy[:, None, :]).astype(dy.dtype)

        aux_scale = aux_weight / groups

        def router_bwd(x, wr, dgates, dy, dx_rows, lr=None):
            from ..program.collectives import psum

            dlogits = router_grad(x, wr, k, dgates, aux_scale)
            dx = dy + dx_rows.sum(axis=1) + (dlogits @ wr.astype(dlogits.dtype).T)
            dwr = psum(x.astype(dlogits.dtype).T @ dlogits, ax)
            return dx.astype(x.dtype), (dwr if lr is None else wr - lr * dwr).astype(wr.dtype)

        self._router_bwd_body = router_bwd

        def expert_bwd(x, g, w1, w2):
            dx, dw1, dw2 = grad_of(x, g, w1, w2)
            return dx.astype(x.dtype), dw1.astype(w1.dtype), dw2.astype(w2.dtype)

        self.router = shard_map(router, tokens, (t, r), (t, t, t, t), name=f"{name}_router")
        self.ffn = expert_map(expert, tokens, experts, E, name=f"{name}_experts")
        self.combine = shard_map(combine, tokens, t, t, name=f"{name}_combine")
        self.combine_bwd = shard_map(combine_bwd, tokens, t, (t, t), name=f"{name}_combine_bwd")
        self.ffn_bwd = expert_map(expert_bwd, tokens, experts, E, token_args=2, slot_args=(1,),
                                  name=f"{name}_experts_bwd")
        self.router_bwd = shard_map(router_bwd, tokens, (t, r, t, t, t), (t, r),
                                    name=f"{name}_router_bwd")
        self._sgd: dict = {}

    def forward(self, x, wr, w1, w2):
        """(y, saved, aux per group [G], load per group [G, E + 1]) for tokens ``x[T, d]``."""
        route, gates, aux, load = self.router(x, wr)
        rows = self.ffn(route, x, w1, w2)
        return self.combine(x, gates, rows), (x, route, gates, rows), aux, load

    def backward(self, dy, saved, wr, w1, w2, lr: float | None = None):
        """(dx, dwr, dw1, dw2); with ``lr``, (dx, wr, w1, w2) after one plain SGD step: the
        router and the experts update their weights where they compute their gradients."""
        x, route, gates, rows = saved
        dgates, g = self.combine_bwd(dy, gates, rows)
        ffn_bwd, router_bwd = (self.ffn_bwd, self.router_bwd) if lr is None else self._sgd_fns(lr)
        dx_rows, dw1, dw2 = ffn_bwd(route, x, g, w1, w2)
        dx, dwr = router_bwd(x, wr, dgates, dy, dx_rows)
        return dx, dwr, dw1, dw2

    def _sgd_fns(self, lr):
        if lr not in self._sgd:
            grad_of = self._expert_grad

            def expert_step(x, g, w1, w2):
                dx, dw1, dw2 = grad_of(x, g, w1, w2)
                return dx.astype(x.dtype), (w1 - lr * dw1).astype(w1.dtype), \
                    (w2 - lr * dw2).astype(w2.dtype)

            def router_step(x, wr, dgates, dy, dx_rows):
                return self._router_bwd_body(x, wr, dgates, dy, dx_rows, lr)

            t, r = P(self.tokens.axis_names[0]), P()
            self._sgd[lr] = (
                expert_map(expert_step, self.tokens, self.experts, self.num_experts,
                           token_args=2, slot_args=(1,), name=f"{self.name}_experts_step"),
                shard_map(router_step, self.tokens, (t, r, t, t, t), (t, r),
                          name=f"{self.name}_router_step"))
        return self._sgd[lr]


def init_params(rng, d: int, hidden: int, num_experts: int, dtype=np.float32):
    """Router and expert weights for one layer: (wr[d, E], w1[E, d, f], w2[E, f, d])."""
    wr = rng.normal(0, 1 / math.sqrt(d), (d, num_experts))
    w1 = rng.normal(0, 1 / math.sqrt(d), (num_experts, d, hidden))
    w2 = rng.normal(0, 1 / math.sqrt(hidden), (num_experts, hidden, d))
    return wr.astype(dtype), w1.astype(dtype), w2.astype(dtype)


# ---- the dense reference -----------------------------------------------------------------

def dense_moe(x, wr, w1, w2, groups: int, top_k: int, capacity_factor):
    """The same layer, densely in one process: (y, aux averaged over groups, load[E + 1]).

    Routing decisions are taken token by token with explicit counters; dispatch and combine
    are one-hot tensors ``[n, E, C]``; every expert runs on its full capacity-padded batch.
    """
    T, d = x.shape
    E = wr.shape[1]
    n = T // groups
    ys, auxes, load = [], [], np.zeros(E + 1, np.int64)
    dt = _compute_dtype(x.dtype)
    for g in range(groups):
        xg = x[g * n:(g + 1) * n].astype(dt)
        logits = xg @ wr.astype(dt)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        # choices by repeated argmax (the first maximum wins a tie)
        masked, choices = probs.copy(), np.zeros((n, top_k), np.int64)
        for j in range(top_k):
            choices[:, j] = masked.argmax(axis=1)
            masked[np.arange(n), choices[:, j]] = -np.inf
        picked = probs[np.arange(n)[:, None], choices]
        gates = picked if top_k == 1 else picked / picked.sum(axis=1, keepdims=True)
        cap = capacity(n, E, top_k, capacity_factor) or n * top_k
        dispatch = np.zeros((n, E, cap), dt)
        combine = np.zeros((n, E, cap), dt)
        used = [0] * E
        for j in range(top_k):
            for t in range(n):
                e = choices[t, j]
                if used[e] < cap:
                    dispatch[t, e, used[e]] = 1.0
                    combine[t, e, used[e]] = gates[t, j]
                    load[e] += 1
                else:
                    load[E] += 1
                used[e] += 1
        batches = np.einsum("nec,nd->ecd", dispatch, xg)  # [E, C, d], padded with zeros
        outs = np.stack([ffn(batches[e], w1[e].astype(dt), w2[e].astype(dt))
                         for e in range(E)])
        ys.append(xg + np.einsum("nec,ecd->nd", combine, outs))
        f = np.bincount(choices[:, 0], minlength=E) / n
        auxes.append(E * float((f * probs.mean(axis=0)).sum()))
    return np.concatenate(ys).astype(x.dtype), float(np.mean(auxes)), load
