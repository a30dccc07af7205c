"""Data-dependent sparse routing: ``pw.expert_map``, the primitive behind Mixture of Experts.

A routed call ``expert_map(body, ...)(route, *token_args, *params)`` sends each token slot
``(t, j)`` (token t's j-th choice) to the device hosting expert ``route[t, j]`` and nowhere
else, runs ``body`` there once per expert on the rows it received, and returns the rows the
experts produced to the slots' home shards, as ``[T, k, ...]`` arrays (zeros where
``route == -1``: a dropped slot). ``body(*rows, *expert_params)`` may also return per-expert
values (e.g. weight gradients), which stay on the experts' devices as ``[E, ...]`` arrays.

Lowered, one call is three Plaque nodes (``pathways.lowering.lower``)::

    route (token devices) ──KEYED rows──► experts (expert devices) ──KEYED rows──► gather
                                                                                (token devices)

The route node emits to an expert device only the rows routed there; an expert device that
gets none learns from progress tracking that its input is complete and runs its experts on
empty batches. How many rows arrive is only known at run time, so the expert and gather nodes
are dispatched sequentially (on Plaque's "complete" notification) even in a program whose
other nodes are dispatched in parallel; the expert kernel still runs at the position the
island scheduler gave it on each device.

The three operators are in ``pathways.host.routing``; their spec in ``pathways.lowering.specs``.

Experts ``e`` of ``E`` live ``E / D`` per device, in order: expert e on device ``e // (E/D)``
of the expert mesh. Token slots are processed on an expert in global slot order (token-major),
so results are the same however the tokens are sharded.
"""

from __future__ import annotations

import numpy as np

from ..errors import ProgramError, ShardingError
from .compiled import Aval, CompiledFunction, Signature
from .mesh import Mesh
from .sharding import P


class RoutedFunction(CompiledFunction):
    """A compiled expert body with token-to-expert routing. Create with ``expert_map``.

    >>> tm, em = client.mesh((4,), ("tokens",)), client.mesh((4,), ("experts",))
    >>> ffn = pw.expert_map(lambda x, w: x @ w, tm, em, num_experts=8)
    >>> route = client.put(np.arange(16, dtype=np.int32).reshape(16, 1) % 8, tm, P("tokens"))
    >>> x = client.put(np.ones((16, 3)), tm, P("tokens"))               # T = 16 rows, d = 3
    >>> w = client.put(np.stack([np.eye(3) * e for e in range(8)]), em, P("experts"))
    >>> rows = ffn(route, x, w)   # [T, k, d]: row t went to expert t % 8, which scales it
    >>> rows.result()[:3, 0]
    array([[0., 0., 0.],
           [1., 1., 1.],
           [2., 2., 2.]])
    """

    routed = True  # lowered as route -> experts -> gather, evaluated by ``evaluate``

    def __init__(self, body, tokens: Mesh, experts: Mesh, num_experts: int, token_args: int,
                 slot_args=(), row_outputs: int = 1, cost=None, name=None):
        for what, m in (("tokens", tokens), ("experts", experts)):
            if not isinstance(m, Mesh):
                raise ProgramError(f"expert_map: {what} must be a Mesh, got {m!r}")
            if len(m.axis_sizes) != 1:
                raise ShardingError(f"expert_map: the {what} mesh must be 1-D, got shape"
                                    f" {m.axis_sizes}")
        if num_experts < 1 or num_experts % experts.size:
            raise ShardingError(f"expert_map: {num_experts} experts cannot be spread evenly"
                                f" over {experts.size} expert devices")
        if token_args < 1:
            raise ProgramError("expert_map: at least one token argument is needed")
        if any(not 0 <= i < token_args for i in slot_args):
            raise ProgramError(f"expert_map: slot_args {tuple(slot_args)} must index the"
                               f" {token_args} token arguments")
        if row_outputs < 1:
            raise ProgramError("expert_map: at least one row output is needed")
        super().__init__(body, experts, None, None, cost=cost, name=name)
        self.token_mesh, self.num_experts = tokens, num_experts
        self.token_args, self.slot_args = token_args, frozenset(slot_args)
        self.row_outputs = row_outputs
        self.per_device = num_experts // experts.size
        self._out_count = None

    def twin(self, args) -> tuple[RoutedFunction, list, None]:
        """A routed call takes arrays and returns a tuple of them (or one array): it is its
        own flat function, whatever the specs it derives (see ``CompiledFunction.twin``)."""
        return self, list(args), None

    # ---- placement of arguments and results -----------------------------------------------
    def arg_specs(self, nargs: int) -> tuple:
        if nargs < 1 + self.token_args:
            raise ProgramError(f"{self.name}: call with (route, {self.token_args} token"
                               f" arrays, expert params...), got {nargs} arguments")
        t, e = P(self.token_mesh.axis_names[0]), P(self.mesh.axis_names[0])
        return (t,) * (1 + self.token_args) + (e,) * (nargs - 1 - self.token_args)

    def retarget(self, remapped) -> RoutedFunction:
        mesh, tokens = remapped(self.mesh), remapped(self.token_mesh)
        if mesh is self.mesh and tokens is self.token_mesh:
            return self
        import copy

        other = copy.copy(self)
        other.mesh, other.token_mesh = mesh, tokens
        return other

    def in_mesh(self, i: int) -> Mesh:
        return self.token_mesh if i <= self.token_args else self.mesh

    def out_mesh(self, k: int) -> Mesh:
        return self.token_mesh if k < self.row_outputs else self.mesh

    @property
    def out_specs(self):
        t, e = P(self.token_mesh.axis_names[0]), P(self.mesh.axis_names[0])
        n = self._out_count or self.row_outputs
        return (t,) * self.row_outputs + (e,) * (n - self.row_outputs)

    @out_specs.setter
    def out_specs(self, value):  # CompiledFunction.__init__ assigns it; we derive it
        pass

    @property
    def single_output(self):
        return (self._out_count or self.row_outputs) == 1

    @single_output.setter
    def single_output(self, value):
        pass

    # ---- shapes ---------------------------------------------------------------------------
    def split_avals(self, in_avals):
        """Check the arguments; (T, k, row avals per slot, per-expert param avals)."""
        if len(in_avals) < 1 + self.token_args:
            self.arg_specs(len(in_avals))
        route, tokens = in_avals[0], in_avals[1:1 + self.token_args]
        params = in_avals[1 + self.token_args:]
        if len(route.shape) != 2 or route.dtype.kind not in "iu":
            raise ProgramError(f"{self.name}: route must be an int array [tokens, k] of expert"
                               f" indices (-1 = dropped), got {route}")
        T, k = route.shape
        if T % self.token_mesh.size:
            raise ShardingError(f"{self.name}: {T} tokens cannot be split evenly over"
                                f" {self.token_mesh.size} token devices")
        rows = []
        for i, a in enumerate(tokens):
            lead = (T, k) if i in self.slot_args else (T,)
            if tuple(a.shape[:len(lead)]) != lead:
                what = "[tokens, k, ...] (a slot argument)" if i in self.slot_args else \
                    "[tokens, ...]"
                raise ShardingError(f"{self.name}: token argument {i} {a} must be {what}"
                                    f" with tokens={T}, k={k}")
            rows.append(Aval(tuple(a.shape[len(lead):]), a.dtype))
        per_expert = []
        for i, a in enumerate(params):
            if not a.shape or a.shape[0] != self.num_experts:
                raise ShardingError(f"{self.name}: expert parameter {i} {a} must have a"
                                    f" leading dimension of {self.num_experts} experts")
            per_expert.append(Aval(tuple(a.shape[1:]), a.dtype))
        return T, k, rows, per_expert

    def _abstract_eval(self, in_avals):
        T, k, rows, per_expert = self.split_avals(in_avals)
        row_outs, expert_outs = self.call_expert(
            [np.zeros((1, *a.shape), a.dtype) for a in rows],
            [np.zeros(a.shape, a.dtype) for a in per_expert])
        if self._out_count is None:
            self._out_count = len(row_outs) + len(expert_outs)
        avals = [Aval((T, k, *o.shape[1:]), o.dtype) for o in row_outs]
        avals += [Aval((self.num_experts, *o.shape), o.dtype) for o in expert_outs]
        return Signature(tuple(avals), (), ())

    def call_expert(self, rows, params, avals=None, where="in the reference"):
        """Run the body on one expert's rows; (row outputs, per-expert outputs). With the
        call's global output ``avals``, each output must match them (``where``: the device,
        for the error): a data-dependent shape or dtype would otherwise be silently
        broadcast or cast into the result."""
        n = rows[0].shape[0]
        try:
            outs = self.body(*rows, *params)
        except Exception as exc:
            raise ProgramError(f"{self.name} fails on {n} rows of "
                               f"{[str(Aval.of(r)) for r in rows]}: {exc!r}") from exc
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        outs = tuple(np.asarray(o) for o in outs)
        if len(outs) < self.row_outputs:
            raise ProgramError(f"{self.name} must return at least {self.row_outputs} row"
                               f" output(s), got {len(outs)}")
        if self._out_count is not None and len(outs) != self._out_count:
            raise ProgramError(f"{self.name} returned {len(outs)} outputs, not"
                               f" {self._out_count}")
        row_outs, expert_outs = outs[:self.row_outputs], outs[self.row_outputs:]
        for i, o in enumerate(row_outs):
            if o.ndim < 1 or o.shape[0] != n:
                raise ProgramError(f"{self.name}: row output {i} has shape {o.shape}; it must"
                                   f" have one row per input row ({n})")
        if avals is not None:
            self._check_outputs(row_outs, expert_outs, avals, where)
        return row_outs, expert_outs

    def _check_outputs(self, row_outs, expert_outs, avals, where) -> None:
        want = [Aval((len(o), *a.shape[2:]), a.dtype) for o, a in zip(row_outs, avals)]
        want += [Aval(a.shape[1:], a.dtype) for a in avals[self.row_outputs:]]
        for k, (o, w) in enumerate(zip((*row_outs, *expert_outs), want)):
            if Aval.of(o) != w:
                raise ProgramError(
                    f"{self.name}: output {k} {where} is {Aval.of(o)}, but abstract evaluation"
                    f" found {w} (the body run on one zero-filled row). Output shapes (beyond"
                    " the rows) and dtypes must not depend on the data, as under JAX tracing")

    # ---- the reference: the same routing, in one process ----------------------------------
    def evaluate(self, args) -> list:
        route = np.asarray(args[0])
        tokens = [np.asarray(a) for a in args[1:1 + self.token_args]]
        params = [np.asarray(a) for a in args[1 + self.token_args:]]
        avals = self.abstract_eval([Aval.of(a) for a in (route, *tokens, *params)])
        T, k = route.shape
        check_route(route, self.num_experts, self.name)
        outs = [np.zeros(a.shape, a.dtype) for a in avals]
        flat = route.reshape(-1)
        for e in range(self.num_experts):
            slots = np.flatnonzero(flat == e)
            rows = [slot_rows(a, slots, k, i in self.slot_args) for i, a in enumerate(tokens)]
            row_outs, expert_outs = self.call_expert(rows, [p[e] for p in params], avals)
            for o, r in zip(outs, row_outs):
                o.reshape(T * k, *o.shape[2:])[slots] = r
            for o, r in zip(outs[self.row_outputs:], expert_outs):
                o[e] = r
        return outs


def slot_rows(a, slots, k, per_slot):
    """The rows of token argument ``a`` for flat slot indices ``slots`` (t * k + j): one row
    per slot for a slot argument (``per_slot``, ``[T, k, ...]``), else the slot's token's."""
    if per_slot:
        return a.reshape(-1, *a.shape[2:])[slots]
    return a[slots // k]


def check_route(route, num_experts, name) -> None:
    """``ProgramError`` naming ``name`` if ``route`` holds an expert index outside
    ``[-1, num_experts)``."""
    bad = (route < -1) | (route >= num_experts)
    if bad.any():
        raise ProgramError(f"{name}: route has expert indices outside [-1, {num_experts}):"
                           f" {sorted(set(route[bad].tolist()))[:5]}")


def expert_map(body, tokens: Mesh, experts: Mesh, num_experts: int, token_args: int = 1,
               slot_args=(), row_outputs: int = 1, cost=None, name=None) -> RoutedFunction:
    """Route token rows to the experts a router chose, run ``body`` per expert, bring rows back.

    Call the result as ``f(route, *token_args, *params)``: ``route`` is ``int32[T, k]`` (expert
    of each token's k choices, -1 = dropped), sharded over ``tokens``; token arguments are
    ``[T, ...]`` (or ``[T, k, ...]`` for the indices in ``slot_args``); ``params`` are
    ``[num_experts, ...]``, sharded over ``experts``. ``body(*rows, *one_expert_params)``
    returns ``row_outputs`` arrays with one row per input row, then any per-expert arrays.

    >>> tm, em = client.mesh((4,), ("tokens",)), client.mesh((4,), ("experts",))
    >>> ffn = pw.expert_map(lambda x, w: np.maximum(x @ w, 0), tokens=tm, experts=em,
    ...                     num_experts=8)
    >>> route = client.put(np.full((16, 2), -1, np.int32), tm, P("tokens"))  # k = 2, all dropped
    >>> x = client.put(np.ones((16, 3)), tm, P("tokens"))
    >>> w = client.put(np.ones((8, 3, 3)), em, P("experts"))
    >>> rows = ffn(route, x, w)            # [T, k, d]; zeros where route == -1
    >>> rows.shape, float(abs(rows.result()).sum())
    ((16, 2, 3), 0.0)
    """
    return RoutedFunction(body, tokens, experts, num_experts, token_args, slot_args,
                          row_outputs, cost=cost, name=name)
