"""Pipeline parallelism: a model cut into stages, each on its own slice, one program per step.

A ``Stage`` is plain numpy on ONE device's data: ``forward(params, x) -> (y, residuals)`` and
``backward(params, residuals, dy) -> (dparams, dx)``; there is no autodiff, the user writes the
backward. ``Pipeline`` gives every stage a slice of ``devices_per_stage`` devices (mesh axis
"data": micro-batches are split along it, params are replicated), compiles per stage a forward,
a backward that accumulates gradients and an SGD update, and traces a whole training step into
ONE ``@pw.program``. The schedule is program order: with GPipe every forward of every
micro-batch, then every backward in reverse. Each device runs its kernels in that order as soon
as their inputs arrive, so stage k works on micro-batch m+1 while stage k+1 works on m;
activations and their gradients move between slices by the runtime's transfers. With
``schedule="1f1b"`` each stage alternates forwards and backwards after a short warm-up (the
same result, up to the order in which gradients are summed).

    stages = [Stage((w1, b1), dense_forward, dense_backward),
              Stage((w2, b2), dense_forward, dense_backward)]
    pipe = Pipeline(client, stages, loss=mse, microbatches=4, lr=0.1)
    for x, t in batches:
        loss = pipe.step(x, t)   # a future: the next step is issued before this one ends
    print(loss.result(), pipe.params())

Semantics: ``loss(y, target) -> (value, dy)`` sees one device's rows of one micro-batch and
should return their mean (and its gradient). The step's loss is the mean of those values over
devices and micro-batches, and the update is plain SGD on its gradient, so a step equals one
SGD step on the whole batch whatever ``microbatches`` and ``devices_per_stage`` are (up to
rounding). Activations must keep the batch as their first dimension; params and residuals may
be any nest of tuples, lists and dicts of arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ProgramError
from ..program import collectives, jax_body
from ..program.compiled import Aval, shard_map
from ..program.sharding import P
from ..program.tracer import program

__all__ = ["SCHEDULES", "Pipeline", "Stage", "program_order", "stage_orders"]

AXIS = "data"
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its initial params and numpy forward/backward on one device's data.

    ``cost`` optionally models the seconds one forward of one micro-batch occupies a device
    (its backward is charged twice that); by default the runtime estimates from bytes.

    >>> w, b = np.eye(4), np.zeros(4)
    >>> stage = pw.Stage((w, b), forward=lambda p, x: (x @ p[0] + p[1], x),
    ...                  backward=lambda p, x, dy: ((x.T @ dy, dy.sum(0)), dy @ p[0].T))
    """

    init: object
    forward: Callable
    backward: Callable
    cost: float | None = None

    @classmethod
    def from_jax(cls, init, fn: Callable, cost: float | None = None) -> Stage:
        """A stage whose ``fn(params, x) -> y`` is written in JAX; its backward is ``jax.vjp``
        of ``fn``, recomputing the forward from the saved input (as ``jax.checkpoint`` does),
        so there is no backward to write.

        >>> import jax.numpy as jnp
        >>> w, b = np.eye(4), np.zeros(4)
        >>> stage = pw.Stage.from_jax((w, b), lambda p, x: jnp.tanh(x @ p[0] + p[1]))
        """
        jax = jax_body.require()

        def forward(params, x):
            return fn(params, x), x

        def backward(params, x, dy):
            # Each device's gradient stays its own (the update sums them once): the params
            # are made "varying" first, or JAX's transposition would already sum them.
            params = jax.tree.map(lambda p: jax.lax.pcast(p, AXIS, to="varying"), params)
            _, vjp = jax.vjp(fn, params, x)
            return vjp(dy)

        return cls(init, forward, backward, cost)


# ---- nests of arrays -------------------------------------------------------------------------

def _flatten(tree) -> tuple[list, object]:
    """The arrays of a nest of tuples, lists and dicts (keys sorted), and its structure."""
    if tree is None:
        return [], ("none", None, ())
    if isinstance(tree, (tuple, list)):
        parts = [_flatten(t) for t in tree]
        return [x for p in parts for x in p[0]], ("seq", type(tree), tuple(p[1] for p in parts))
    if isinstance(tree, dict):
        keys = sorted(tree)
        parts = [_flatten(tree[k]) for k in keys]
        return [x for p in parts for x in p[0]], ("dict", tuple(keys), tuple(p[1] for p in parts))
    if jax_body.is_jax_type(tree):  # a JAX stage's value, traced
        return [tree], None
    return [np.asarray(tree)], None


def _unflatten(structure, leaves):
    """The nest of ``structure`` holding ``leaves`` (the inverse of ``_flatten``)."""
    it = iter(leaves)

    def build(s):
        if s is None:
            return next(it)
        kind, tag, children = s
        values = [build(c) for c in children]
        if kind == "none":
            return None
        if kind == "dict":
            return dict(zip(tag, values))
        return tag(*values) if hasattr(tag, "_fields") else tag(values)

    try:
        return build(structure)
    finally:
        del build  # a recursive closure is a cycle: it would keep the leaves until a GC


# ---- schedules (pure) ------------------------------------------------------------------------

def stage_orders(schedule: str, stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Each stage's sequence of ("F" or "B", micro-batch) under ``schedule``.

    GPipe: all forwards, then all backwards in reverse. 1F1B: stage s runs S-s-1 warm-up
    forwards, then alternates one forward and one backward, then drains its backwards, so it
    holds the residuals of at most S-s micro-batches at a time.
    """
    M = microbatches
    if schedule == "gpipe":
        return [[("F", m) for m in range(M)] + [("B", m) for m in reversed(range(M))]
                for _ in range(stages)]
    if schedule == "1f1b":
        orders = []
        for s in range(stages):
            warm = min(stages - s - 1, M)
            order = [("F", m) for m in range(warm)]
            for i in range(M - warm):
                order += [("F", warm + i), ("B", i)]
            orders.append(order + [("B", m) for m in range(M - warm, M)])
        return orders
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")


def program_order(orders: list[list[tuple[str, int]]]) -> list[tuple[str, int, int]]:
    """Interleave per-stage sequences into one program order of (kind, stage, micro-batch).

    Each round takes the next operation of every stage whose inputs are computed: F(s, m) needs
    F(s-1, m); B(s, m) needs F(s, m) and B(s+1, m). Each stage keeps its own order, which is
    what its devices execute.
    """
    S = len(orders)
    done: set[tuple[str, int, int]] = set()
    pos, out = [0] * S, []
    total = sum(len(o) for o in orders)
    while len(out) < total:
        progressed = False
        for s in range(S):
            if pos[s] == len(orders[s]):
                continue
            kind, m = orders[s][pos[s]]
            if kind == "F":
                needs = [("F", s - 1, m)] if s else []
            else:
                needs = [("F", s, m)] + ([("B", s + 1, m)] if s + 1 < S else [])
            if all(n in done for n in needs):
                out.append((kind, s, m))
                done.add((kind, s, m))
                pos[s] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"the stage orders deadlock after {len(out)} operations")
    return out


# ---- kernel bodies: closures over the user's functions, shipped to the hosts ------------------

# The activation (or its gradient) is argument 0 of every kernel: it is the one input that
# arrives from another slice.

def _forward_body(forward, pdef):
    def stage_forward(x, *params):
        y, residuals = forward(_unflatten(pdef, params), x)
        # Residuals can have any shape: each device's go out as block i of a new leading axis.
        return (y, *(r[None] for r in _flatten(residuals)[0]))
    return stage_forward


def _backward_body(backward, pdef, rdef, n_params, n_res, accumulate, want_dx):
    def stage_backward(dy, *args):
        params = _unflatten(pdef, args[:n_params])
        residuals = _unflatten(rdef, [r[0] for r in args[n_params:n_params + n_res]])
        dparams, dx = backward(params, residuals, dy)
        grads, gdef = _flatten(dparams)
        if gdef != pdef:
            raise ProgramError(f"backward returned dparams shaped {gdef}, but the params are"
                               f" {pdef}")
        if accumulate:
            grads = [a[0] + g for a, g in zip(args[n_params + n_res:], grads)]
        # Each device's partial gradient is its own (summed only by the update), so it goes
        # out as block i of a new leading axis, as residuals do: not as a replicated value.
        grads = tuple(g[None] for g in grads)
        return (dx, *grads) if want_dx else grads
    return stage_backward


def _update_body(lr, scale):
    def sgd_update(*args):
        n = len(args) // 2
        # One all-reduce per step: the gradients of the stage's devices, summed once here
        # rather than in each micro-batch's backward.
        return tuple((p - lr * (collectives.psum(g[0], AXIS) / scale)).astype(p.dtype, copy=False)
                     for p, g in zip(args[:n], args[n:]))
    return sgd_update


def _loss_body(loss):
    def pipeline_loss(y, target):
        value, dy = loss(y, target)
        return collectives.pmean(value, AXIS), dy
    return pipeline_loss


def _chunks(flat, sizes) -> list[tuple]:
    """``flat`` cut into consecutive tuples of ``sizes``."""
    out, i = [], 0
    for n in sizes:
        out.append(tuple(flat[i:i + n]))
        i += n
    return out


def _mean(*values):
    return np.asarray(sum(values) / len(values))


# ---- the pipeline ----------------------------------------------------------------------------

@dataclass
class _Kernels:
    """The compiled functions of one stage for one micro-batch shape."""

    forward: object
    backward_first: object  # the first backward of a step starts the gradient sum
    backward: object
    update: object


class Pipeline:
    """``stages`` on one slice each, trained by SGD with ``step``; see the module docstring.

    ``island`` is None (the resource manager chooses), one island for all stages, or a list
    with one island per stage. ``schedule`` is "gpipe" or "1f1b".

    >>> def dense(w, b):
    ...     return pw.Stage((w, b), forward=lambda p, x: (x @ p[0] + p[1], x),
    ...                     backward=lambda p, x, dy: ((x.T @ dy, dy.sum(0)), dy @ p[0].T))
    >>> def mse(y, t):                   # one device's rows: their mean, and its gradient
    ...     return ((y - t) ** 2).mean(), 2 * (y - t) / y.size
    >>> stage1, stage2 = dense(np.eye(4), np.zeros(4)), dense(np.eye(4), np.zeros(4))
    >>> pipe = pw.Pipeline(client, [stage1, stage2], loss=mse, microbatches=4, lr=0.1)
    >>> x, target = np.ones((8, 4)), np.zeros((8, 4))
    >>> loss = pipe.step(x, target)      # a pw.Array, returned before the step runs
    >>> float(loss.result())
    1.0
    >>> params = pipe.params()           # fetched: one nest of arrays per stage
    """

    def __init__(self, client, stages, loss, microbatches: int, devices_per_stage: int = 1,
                 lr: float = 0.01, island=None, schedule: str = "gpipe"):
        stages = list(stages)
        if not stages or not all(isinstance(s, Stage) for s in stages):
            raise ValueError("a Pipeline needs a non-empty list of Stage")
        if int(microbatches) < 1 or int(devices_per_stage) < 1:
            raise ValueError("microbatches and devices_per_stage must be at least 1")
        stage_orders(schedule, len(stages), 1)  # checks the name
        islands = list(island) if isinstance(island, (list, tuple)) else [island] * len(stages)
        if len(islands) != len(stages):
            raise ValueError(f"{len(islands)} islands given for {len(stages)} stages")
        self.client, self.stages, self.loss = client, stages, loss
        self.microbatches, self.devices_per_stage = int(microbatches), int(devices_per_stage)
        self.lr, self.schedule = float(lr), schedule
        self.meshes = [client.mesh((self.devices_per_stage,), (AXIS,), island=i)
                       for i in islands]
        self._defs, self._params = [], []
        for s, (stage, mesh) in enumerate(zip(stages, self.meshes)):
            leaves, pdef = _flatten(stage.init)
            if not leaves:
                raise ValueError(f"stage {s} has no parameters")
            self._defs.append(pdef)
            self._params.append(tuple(client.put(p, mesh, P()) for p in leaves))
        self._programs: dict[tuple, object] = {}

    def params(self) -> list:
        """The current params of every stage, fetched, in each stage's own structure."""
        return [_unflatten(d, [a.result() for a in arrays])
                for d, arrays in zip(self._defs, self._params)]

    def step(self, x, target):
        """One training step on a batch; returns the mean loss as a ``pw.Array`` at once.

        The batch is cut into micro-batches on the client and put on the first (inputs) and
        last (targets) stage's slice; one program run does the rest. The updated params are
        the program's outputs and become this pipeline's params for the next step.
        """
        xs, ts = self._split(x, "x"), self._split(target, "target")
        first, last = self.meshes[0], self.meshes[-1]
        args = ([self.client.put(v, first, P(AXIS)) for v in xs]
                + [self.client.put(v, last, P(AXIS)) for v in ts]
                + [a for arrays in self._params for a in arrays])
        loss, *flat = self._program_for(xs[0], ts[0])(*args)
        self._params = _chunks(flat, [len(p) for p in self._params])
        return loss

    def traced(self, x, target):
        """The step's traced program for a batch like ``x``, ``target`` (printable IR)."""
        xs, ts = self._split(x, "x"), self._split(target, "target")
        avals = [Aval.of(v) for v in xs + ts] + [a.aval for arrays in self._params for a in arrays]
        return self._program_for(xs[0], ts[0]).trace(avals)

    def _split(self, value, what) -> list[np.ndarray]:
        value = np.asarray(value)
        rows = self.microbatches * self.devices_per_stage
        if value.ndim == 0 or value.shape[0] % rows:
            raise ValueError(f"{what} of shape {value.shape}: the batch (first dimension) must"
                             f" be divisible by microbatches x devices_per_stage = {rows}")
        return np.split(value, self.microbatches)

    def _program_for(self, x, target):
        key = (x.shape, x.dtype, target.shape, target.dtype)
        if key not in self._programs:
            kernels, loss, mean = self._compile(x)
            self._programs[key] = self._make_program(kernels, loss, mean)
        return self._programs[key]

    def _compile(self, x):
        """Compiled functions per stage, then the loss and the mean of the losses."""
        shard = np.zeros((x.shape[0] // self.devices_per_stage, *x.shape[1:]), x.dtype)
        kernels = []
        for s in range(len(self.stages)):
            k, shard = self._stage_kernels(s, shard)
            kernels.append(k)
        last = self.meshes[-1]
        loss = shard_map(_loss_body(self.loss), last, (P(AXIS), P(AXIS)), (P(), P(AXIS)),
                         name="loss")
        mean = shard_map(_mean, last, (P(),) * self.microbatches, P(), name="mean_loss")
        return kernels, loss, mean

    def _stage_kernels(self, s, x_shard):
        """Stage s's kernels, and its output shard; a forward on zeros finds its residuals."""
        stage, mesh, pdef, D = self.stages[s], self.meshes[s], self._defs[s], self.devices_per_stage
        n = len(self._params[s])
        zeros = [np.zeros(a.shape, a.dtype) for a in self._params[s]]
        with collectives.kernel_env(collectives.AbstractEnv((D,), (AXIS,))):
            y, residuals = stage.forward(_unflatten(pdef, zeros), x_shard)
        leaves, rdef = _flatten(residuals)
        rep, dat, batch = (P(),) * n, (P(AXIS),) * len(leaves), P(AXIS)
        grad = (P(AXIS),) * n  # per-device partial gradients, block i of a leading axis
        bwd_cost = None if stage.cost is None else 2 * stage.cost

        def backward(accumulate):
            body = _backward_body(stage.backward, pdef, rdef, n, len(leaves), accumulate, s > 0)
            ins = (batch,) + rep + dat + (grad if accumulate else ())
            outs = ((batch,) if s > 0 else ()) + grad
            return shard_map(body, mesh, ins, outs, cost=bwd_cost, name=f"stage{s}_backward")

        forward = shard_map(_forward_body(stage.forward, pdef), mesh, (batch,) + rep,
                            (batch,) + dat, cost=stage.cost, name=f"stage{s}_forward")
        update = shard_map(_update_body(self.lr, self.microbatches * D), mesh, rep + grad, rep,
                           name=f"stage{s}_update")
        return _Kernels(forward, backward(False), backward(True), update), np.asarray(y)

    def _make_program(self, kernels, loss, mean):
        S, M = len(self.stages), self.microbatches
        sizes = [len(p) for p in self._params]
        order = program_order(stage_orders(self.schedule, S, M))

        def pipeline_step(*args):
            xs, ts, params = args[:M], args[M:2 * M], _chunks(args[2 * M:], sizes)
            acts = {(0, m): xs[m] for m in range(M)}  # (stage, m) -> its input activation
            grads_in, residuals, losses = {}, {}, [None] * M  # (stage, m) -> dy; residuals
            acc: list = [None] * S
            for kind, s, m in order:
                k = kernels[s]
                if kind == "F":
                    y, *residuals[s, m] = k.forward(acts.pop((s, m)), *params[s])
                    if s + 1 < S:
                        acts[s + 1, m] = y
                    else:
                        losses[m], grads_in[s, m] = loss(y, ts[m])
                    continue
                args = (grads_in.pop((s, m)), *params[s], *residuals.pop((s, m)))
                outs = (k.backward_first(*args) if acc[s] is None
                        else k.backward(*args, *acc[s]))
                if s > 0:
                    grads_in[s - 1, m], *outs = outs
                acc[s] = tuple(outs)
            new = [kernels[s].update(*params[s], *acc[s]) for s in range(S)]
            return (mean(*losses), *[p for stage in new for p in stage])

        return program(pipeline_step)
