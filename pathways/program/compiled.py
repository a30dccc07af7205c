"""Compiled functions: a numpy body mapped over the shards of a mesh (``shard_map``).

A compiled function knows its mesh, the partition spec of each argument and result, and its
cost. Output shapes and dtypes are found once per input signature by abstract evaluation: the
body runs on the client on zero-filled shards of the right shape, with collectives answering as
if every device held the same values (so ``psum(1, "i")`` is the size of "i"), and the answer
is cached. Every device's real outputs are then checked against it: a body whose output shape
or dtype depends on the data fails with an error instead of returning garbage. Outputs that
``out_specs`` says are replicated are proven so, or checked at run time
(``pathways.program.replication``). Calling one outside ``@pw.program`` runs it at once (OpByOp) and
returns futures; inside a program it records one equation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ProgramError, ShardingError
from . import collectives, flat_call, jax_body, jax_outer, replication, tree
from .arguments import check_arguments
from . import cost as cost_model
from .ir import Aval, current_trace, is_device_array
from .mesh import Mesh
from .sharding import P, as_spec, global_shape_of, normalize_spec, shard_shape, spec_for

COSTS_KEPT = 1024  # signatures whose modelled cost a compiled function remembers


@dataclass(frozen=True)
class Signature:
    """What a compiled function returns for one input signature: global output avals, one
    device's output avals, and per output the mesh axes whose replication is checked at run
    time (those out_specs leaves out that abstract evaluation could not prove)."""

    avals: tuple[Aval, ...]
    shards: tuple[Aval, ...]
    checks: tuple[tuple[str, ...], ...]
    ins: tuple[Aval, ...] = ()  # the global argument avals it is for


ABSTRACT_PASS = ("while finding its output shapes and dtypes (abstract evaluation: the body runs"
                 " once on the client on zero-filled shards, with collectives answering as if"
                 " every device held the same values)")


def _as_specs(specs):
    """``specs`` (a spec, or a tree of them) with JAX's PartitionSpecs as ``P``."""
    if not tree.is_node(specs):
        return as_spec(specs)
    leaves, treedef = tree.flatten(specs)
    return tree.unflatten(treedef, [as_spec(s) for s in leaves])


def _flat_specs(specs, what: str) -> tuple[tuple, bool]:
    """(tuple of specs, single) as a function with one argument or result per leaf reads
    ``specs``: a P or None is one spec (single), a tuple or list of them is one per item,
    anything else (a deeper tree) only fits a call through its flat twin: ((), False).
    Every leaf must be a P or None."""
    leaves = tree.flatten(specs)[0]
    if not all(s is None or isinstance(s, P) for s in leaves):
        raise ShardingError(f"{what} must be a P(...), or a tuple, list, dict or dataclass of"
                            f" them, got {specs!r}")
    if not tree.is_node(specs):
        return (specs,), True
    if isinstance(specs, (tuple, list)) and not any(tree.is_node(s) for s in specs):
        return tuple(specs), False
    return (), False


class CompiledFunction:
    """``body`` run on every device of ``mesh`` on its shard. Create with ``shard_map``.

    >>> step = pw.shard_map(lambda x: x * 2, mesh, P("data"), P("data"))
    >>> y = step(x)                          # outside a program: runs now, a future
    >>> avals = step.abstract_eval([x.aval])  # global output shapes and dtypes
    """

    routed = False  # True for a RoutedFunction: its rows go where the data says (expert_map)
    calls = 1  # the program calls one kernel runs (``pathways.program.fusion``: several)

    def __init__(self, body, mesh: Mesh, in_specs, out_specs, cost=None, name=None,
                 check_rep=True, limit=None):
        if not callable(body):
            raise ProgramError(f"shard_map needs a callable body, got {body!r}")
        if not isinstance(mesh, Mesh):
            raise ProgramError(f"shard_map needs a Mesh (client.mesh(...)), got {mesh!r}")
        self.body, self.mesh, self.cost = body, mesh, cost
        self.name = name or getattr(body, "__name__", "body")
        in_specs, out_specs = _as_specs(in_specs), _as_specs(out_specs)
        flat_in, self._broadcast_in = _flat_specs(in_specs, "in_specs")
        flat_out, single = _flat_specs(out_specs, "out_specs")
        self.in_specs, self.out_specs, self.single_output = flat_in, flat_out, single
        self._spec_trees = (in_specs, out_specs)  # as given: JAX's tree prefixes
        self._flat: dict[tuple, tuple] = {}  # per argument structure and avals: see twin
        self._statics: dict[tuple, CompiledFunction] = {}  # see without_statics
        self.check_rep = bool(check_rep)
        if limit is not None and not (isinstance(limit, (int, float)) and limit > 0):
            raise ProgramError(f"shard_map limit must be a number of seconds > 0, got {limit!r}")
        self.limit = limit
        self._signatures: dict[tuple, Signature] = {}
        self._costs: dict[tuple, float] = {}  # cost_of without a signature: by shapes
        self._sig_costs: dict[tuple, tuple] = {}  # cost_of of a kernel: by its signature
        self.jax = None  # a JaxBody once abstract evaluation finds the body written in JAX

    def __repr__(self):
        return f"<compiled {self.name} on {self.mesh}>"

    def _as_jax(self) -> None:
        """Run the body as JAX from now on (``pathways.program.jax_body``)."""
        m = self.mesh
        self.jax = jax_body.JaxBody(self.body, m.axis_names, m.axis_sizes, self.in_specs,
                                    self.out_specs, self.check_rep, self.name)

    def arg_specs(self, nargs: int) -> tuple:
        """The spec of each of ``nargs`` arguments (one P given applies to all)."""
        if self._broadcast_in:
            return self.in_specs * nargs
        if len(self.in_specs) != nargs:
            raise ProgramError(f"{self.name}: {len(self.in_specs)} in_specs for {nargs}"
                               " arguments")
        return self.in_specs

    def retarget(self, remapped) -> CompiledFunction:
        """This function on ``remapped(mesh)`` (self if that is the same mesh)."""
        mesh = remapped(self.mesh)
        if mesh is self.mesh:
            return self
        import copy

        other = copy.copy(self)
        other.mesh = mesh
        if self.jax is not None:
            other.jax = self.jax.retarget(mesh.axis_names, mesh.axis_sizes)
        return other

    def in_mesh(self, i: int) -> Mesh:
        """The mesh argument ``i`` must live on (one mesh for all, except routed calls)."""
        return self.mesh

    def out_mesh(self, k: int) -> Mesh:
        """The mesh result ``k`` lives on."""
        return self.mesh

    def shard_avals(self, in_avals, specs=None) -> list[Aval]:
        """One device's avals of arguments of ``in_avals`` (under ``specs``, by default the
        function's in_specs)."""
        m = self.mesh
        out = []
        specs = self.arg_specs(len(in_avals)) if specs is None else specs
        for i, (a, spec) in enumerate(zip(in_avals, specs)):
            try:
                spec = spec_for(a, spec, m.axis_names)
                out.append(Aval(shard_shape(a.shape, m.axis_sizes, m.axis_names, spec), a.dtype,
                                a.key))
            except ShardingError as exc:
                raise ShardingError(f"{self.name}: argument {i} {a}: {exc}") from None
        return out

    def abstract_eval(self, in_avals) -> tuple[Aval, ...]:
        """Global output avals for these input avals (evaluated once, then cached)."""
        return self.signature(in_avals).avals

    def signature(self, in_avals) -> Signature:
        """Output avals, global and per device, and the run-time replication checks, for
        these input avals (evaluated once, then cached)."""
        key = tuple(in_avals)
        sig = self._signatures.get(key)
        if sig is None:
            sig = self._signatures[key] = self._abstract_eval(key)
        return sig

    def _on_zeros(self, run, zeros):
        """``run(zeros)`` in the abstract pass: its errors say they came from there."""
        m = self.mesh
        with collectives.kernel_env(collectives.AbstractEnv(m.axis_sizes, m.axis_names)):
            try:
                out = run(zeros)
            except (ShardingError, ProgramError) as exc:
                raise type(exc)(f"{exc} ({ABSTRACT_PASS})") from exc
            except Exception as exc:
                if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "jax":
                    raise ProgramError(f"{self.name}: {jax_body.INSTALL_HINT}") from exc
                if jax_body.came_from_jax(exc):
                    raise jax_body.NotNumpy from exc
                raise ProgramError(f"{self.name} fails on shards of shapes "
                                   f"{[str(Aval.of(z)) for z in zeros]} {ABSTRACT_PASS}: "
                                   f"{exc!r}") from exc
            except KeyboardInterrupt:  # the user's Ctrl-C, as likely as the body's own
                raise
            except BaseException as exc:  # SystemExit...: the body's failure, not the caller's
                raise ProgramError(f"{self.name} raised {type(exc).__name__}({exc}) on shards"
                                   f" of shapes {[str(Aval.of(z)) for z in zeros]}"
                                   f" {ABSTRACT_PASS}") from exc
        if jax_body.returns_jax(out):
            raise jax_body.NotNumpy
        return out

    def _traced_by_jax(self, avals) -> bool:
        """Whether JAX traces the body on arguments of ``avals``: it refers to JAX, or it
        takes keys (JAX's: a body that takes them is JAX's too)."""
        return any(a.key for a in avals) or jax_body.uses_jax(self.body)

    def _abstract_eval(self, in_avals) -> Signature:
        m = self.mesh
        if self.jax is None and self._traced_by_jax(in_avals):
            self._as_jax()
        if self.jax is not None:
            self.shard_avals(in_avals)  # our errors for a wrong count or an uneven split
            outs, shards = self.jax.avals(in_avals, self.single_output)
            for k, (a, spec) in enumerate(zip(outs, self.out_specs)):
                if a.key is not None:  # a key output's spec names its keys' dimensions
                    try:
                        spec_for(a, spec, m.axis_names)
                    except ShardingError as exc:
                        raise ShardingError(f"{self.name}: output {k} {a}: {exc}") from None
            return Signature(tuple(outs), tuple(shards), tuple(() for _ in outs),
                             tuple(in_avals))
        zeros = [np.zeros(a.shape, a.dtype) for a in self.shard_avals(in_avals)]
        try:
            outs = self._as_tuple(self._on_zeros(lambda z: self.body(*z), zeros))
        except jax_body.NotNumpy:  # JAX in a way uses_jax could not see: trace it as JAX
            self._as_jax()
            return self._abstract_eval(in_avals)
        avals, specs = [], []
        for o, spec in zip(outs, self.out_specs):
            spec = normalize_spec(spec, o.ndim, m.axis_names)
            specs.append(spec)
            avals.append(Aval(global_shape_of(o.shape, m.axis_sizes, m.axis_names, spec), o.dtype))
        return Signature(tuple(avals), tuple(Aval.of(o) for o in outs),
                         self._rep_checks(in_avals, zeros, specs), tuple(in_avals))

    def _rep_checks(self, in_avals, zeros, out_specs) -> tuple[tuple[str, ...], ...]:
        """Per output, the axes it must be replicated along that no proof covers."""
        m = self.mesh
        left_out = [tuple(a for a in m.axis_names if a not in replication.spec_axes(s))
                    for s in out_specs]
        if not self.check_rep or not any(left_out):
            return tuple(() for _ in out_specs)
        in_specs = [normalize_spec(s, len(a.shape), m.axis_names)
                    for a, s in zip(in_avals, self.arg_specs(len(in_avals)))]
        proven, exact = replication.prove(self.body, zeros, in_specs, m.axis_sizes,
                                          m.axis_names, len(out_specs), self.single_output)
        checks = tuple(tuple(a for a in axes if a not in p) for axes, p in zip(left_out, proven))
        for k, axes in enumerate(checks if exact else ()):
            if axes:  # it varies along them, as JAX's types say: refused before the run
                raise ProgramError(
                    f"{self.name}: out_specs[{k}] is {out_specs[k]}, which says output {k} is"
                    f" replicated along {axes}, but it varies along them: it is computed from"
                    " arguments that vary along them, with no psum, pmean, pmax, pmin or"
                    f" all_gather over them (JAX refuses this too). Reduce it over {axes}, name"
                    " the axes in out_specs, or pass check_rep=False to shard_map to keep one"
                    " device's value unchecked")
        return checks

    def check_outputs(self, outs, sig: Signature, device) -> None:
        """Fail unless one device's outputs have the shapes and dtypes abstract evaluation
        found (a data-dependent shape or dtype would otherwise assemble into garbage)."""
        for k, (o, want) in enumerate(zip(outs, sig.shards)):
            if o.shape != want.shape or o.dtype != want.dtype:
                raise ProgramError(
                    f"{self.name}: output {k} on device {device} is {Aval.of(o)}, but abstract"
                    f" evaluation found {want} (the body run on zero-filled shards). Output"
                    " shapes and dtypes must not depend on the data: JAX refuses"
                    " data-dependent shapes under tracing too. Return a fixed-size result"
                    " (e.g. np.where(mask, x, 0) instead of x[mask]) of a fixed dtype")

    def _as_tuple(self, outs, on_device: bool = False) -> tuple:
        """The body's outputs as a tuple of numpy arrays (``on_device``: a ``jax.Array``
        stays on its device, for a host whose devices are JAX's)."""
        outs = (outs,) if self.single_output else outs
        if not isinstance(outs, (tuple, list)) or len(outs) != len(self.out_specs):
            raise ProgramError(f"{self.name} must return {len(self.out_specs)} array(s) to"
                               f" match out_specs, got {type(outs).__name__}")
        return tuple([o if on_device and is_device_array(o) else np.asarray(o) for o in outs])

    def run_shard(self, env, shards, spec, sig: Signature, device=None) -> tuple[tuple, float]:
        """Run the body on one device's shards under ``env``, check its outputs against
        ``sig``; (outputs, modelled seconds on a device of ``spec``)."""
        with collectives.kernel_env(env):
            outs = self.checked(self.run_body(shards, sig), sig, device,
                                getattr(env, "jax_device", None) is not None)
        return outs, self.cost_of(shards, outs, spec, sig)

    def run_body(self, shards, sig: Signature):
        """What the body returns on one device's ``shards`` (inside its kernel environment):
        a numpy body is called; a JAX body runs its compiled plan."""
        if self.jax is not None:
            outs = self.jax.run(shards, sig.ins, self.single_output)
            return outs[0] if self.single_output else outs
        return self.body(*shards)

    def checked(self, outs, sig: Signature, device, on_device: bool = False) -> tuple:
        """What the body returned on ``device``, as a tuple of arrays, once checked against
        ``sig`` (shapes, dtypes, and replication along ``sig.checks``, which exchanges a
        digest with the device's peers: call it inside the kernel's environment);
        ``on_device``: ``jax.Array`` results stay on their device (``_as_tuple``)."""
        outs = self._as_tuple(outs, on_device)
        self.check_outputs(outs, sig, device)
        if any(sig.checks):
            replication.check_replicas(self.name, outs, sig.checks, device)
        return outs

    def cost_of(self, inputs, outputs, spec, sig: Signature | None = None) -> float:
        """Modelled seconds of one execution: ``cost`` if given (a number, or a function of
        the input shapes), else the roofline estimate for a device of ``spec`` (of the flops
        and bytes XLA counts in a JAX body's plan for ``sig``). Worked out once per device
        spec and ``sig`` (a kernel's: its inputs and outputs have its shapes, and it is the
        same object at every run, so it is found by identity), or without one per shapes
        and dtypes in and out (a routed call's, which vary)."""
        if sig is not None:
            k = (id(sig), id(spec))
            hit = self._sig_costs.get(k)
            if hit is None or hit[0] is not sig or hit[1] is not spec:
                hit = (sig, spec, self._modelled(inputs, outputs, spec, sig))
                if len(self._sig_costs) < COSTS_KEPT:
                    self._sig_costs[k] = hit  # (it keeps both alive: their ids hold)
            return hit[2]
        key = (tuple((a.shape, a.dtype) for a in inputs),
               tuple((a.shape, a.dtype) for a in outputs), spec)
        seconds = self._costs.get(key)
        if seconds is None:
            seconds = self._modelled(inputs, outputs, spec, None)
            if len(self._costs) < COSTS_KEPT:
                self._costs[key] = seconds
        return seconds

    def _modelled(self, inputs, outputs, spec, sig: Signature | None) -> float:
        if self.jax is not None and sig is not None:
            flops, nbytes = self.jax.cost(sig.ins, self.single_output)
            default = cost_model.kernel_time(flops, nbytes, spec)
        else:
            default = cost_model.estimate_kernel(list(inputs), list(outputs), spec)
        return cost_model.resolve_cost(self.cost, [a.shape for a in inputs], default)

    def __call__(self, *args):
        fn, args = self.without_statics(args)
        if fn is not self:
            return fn(*args)
        trace = current_trace()
        if trace is not None:
            trace.check_arguments(self.name, args)
        else:
            try:
                check_arguments(self.name, args, self.mesh.client)
            except ProgramError:  # inside jax.grad, jax.jit, ...: a part of JAX's work
                if self.routed or not jax_outer.traced(args):
                    raise
                return jax_outer.call(self, args)
        flat, leaves, out_def = self.twin(args)
        outs = trace.record(flat, leaves) if trace is not None else run_op_by_op(flat, leaves)
        return outs if out_def is None else tree.unflatten(out_def, outs)

    def without_statics(self, args) -> tuple[CompiledFunction, tuple]:
        """(the function to call, its arguments): this one and ``args``, or, when some are
        static (non-arrays under a ``None`` in_spec, as JAX's shard_map takes them), a
        function of the others that hands every device the static ones as they are: made
        once per static values, which must be hashable (as JAX's static arguments)."""
        positions = flat_call.static_positions(self._spec_trees[0], args)
        if not positions:
            return self, args
        statics = tuple(args[i] for i in positions)
        key = (positions, statics)
        try:
            fn = self._statics.get(key)
        except TypeError:
            raise ProgramError(f"{self.name}: argument {positions[0]} has a None in_spec, so it"
                               " is handed to every device as it is (a static argument) and"
                               " must be hashable, as JAX's static arguments; pass an array"
                               " as a pw.Array with a spec instead") from None
        if fn is None:
            specs = tuple(s for i, s in enumerate(self._spec_trees[0]) if i not in positions)
            fn = CompiledFunction(flat_call.WithStatics(self.body, positions, statics, self.name),
                                  self.mesh, specs, self._spec_trees[1], cost=self.cost,
                                  name=self.name, check_rep=self.check_rep, limit=self.limit)
            if len(self._statics) < STATICS_KEPT:
                self._statics[key] = fn
        return fn, tuple(a for i, a in enumerate(args) if i not in positions)

    # ---- pytrees: a flat function per argument structure -----------------------------------

    def twin(self, args) -> tuple[CompiledFunction, list, object]:
        """(the flat function that runs this one on ``args``, the leaves of ``args``, the
        results' structure). The flat function takes one argument per leaf and returns one
        result per leaf, each with its spec from JAX's prefix semantics; it is this function
        itself when the call already is flat (arguments are arrays, and the body returns an
        array for a single spec or a tuple matching a tuple of specs: structure None). Made
        once per argument structure and leaf avals."""
        fast = _leaves_key(args)  # arrays only, the common case: no tree to walk
        hit = self._flat.get(fast) if fast is not None else None
        if hit is not None:
            return hit[0], list(args), hit[1]
        leaves, in_def = tree.flatten(args)
        key = (in_def, tuple([(a.shape, a.dtype) for a in leaves]))
        hit = self._flat.get(key)
        if hit is None:
            hit = self._flat[key] = self._twin(args, in_def, tuple(Aval.of(a) for a in leaves))
        if fast is not None:
            self._flat[fast] = hit
        return hit[0], leaves, hit[1]

    def _twin(self, args, in_def, avals) -> tuple[CompiledFunction, object]:
        in_specs = flat_call.in_leaf_specs(self.name, self._spec_trees[0], args)
        shard_avals = self.shard_avals(avals, in_specs)
        body = self.body

        def on_leaves(*leaves):
            return body(*tree.unflatten(in_def, leaves))

        out = self.out_tree(on_leaves, avals, in_specs, shard_avals)
        out_specs = tree.per_leaf(self._spec_trees[1], out, f"{self.name}: out_specs",
                                  "output")
        if flat_call.is_flat(self, args, out):
            return self, None
        out_def = tree.flatten(out)[1]
        flat = CompiledFunction(flat_call.FlatBody(body, in_def, out_def, self.name),
                                self.mesh, tuple(in_specs), tuple(out_specs), cost=self.cost,
                                name=self.name, check_rep=self.check_rep, limit=self.limit)
        return flat, out_def

    def out_tree(self, run, avals, in_specs, shard_avals):
        """What ``run`` (the body on argument leaves) returns on one device's shards
        (``shard_avals``; of global ``avals`` split by ``in_specs``): arrays, or JAX's
        shape-dtype structs for a JAX body."""
        if not self._traced_by_jax(avals):
            zeros = [np.zeros(a.shape, a.dtype) for a in shard_avals]
            try:
                return self._on_zeros(lambda z: run(*z), zeros)
            except jax_body.NotNumpy:
                pass
        m = self.mesh
        return jax_body.out_shapes(run, m.axis_names, m.axis_sizes, avals, in_specs, self.name)


_LEAVES = object()  # marks a ``twin`` key of arguments that are all arrays
STATICS_KEPT = 256  # static argument values a function keeps its function of the rest for


def _leaves_key(args) -> tuple | None:
    """``twin``'s key for arguments that are all arrays (shape and dtype, no tree), else
    None: a call's usual case costs no tree walk and no ``Aval`` per argument."""
    key = [_LEAVES]
    for a in args:
        if tree.is_node(a):
            return None
        try:
            key.append((a.shape, a.dtype))
        except AttributeError:
            return None
    return tuple(key)


def shard_map(body, mesh: Mesh, in_specs, out_specs, cost=None, name=None,
              check_rep=True, limit=None) -> CompiledFunction:
    """Compile ``body`` to run on every device of ``mesh`` on its shard of the arguments.

    ``in_specs``/``out_specs`` are partition specs (``P('data')``; a tuple for several).
    ``cost`` is the modelled time of one execution in seconds, or a function of the input
    shard shapes; by default it is estimated from the bytes touched.

    >>> step = pw.shard_map(lambda x: pw.psum(x, "data") + 1, mesh, P("data"), P("data"))
    """
    return CompiledFunction(body, mesh, in_specs, out_specs, cost=cost, name=name,
                            check_rep=check_rep, limit=limit)


def run_op_by_op(fn: CompiledFunction, args):
    """A compiled-function call outside a program: a one-equation program, run at once
    (``args`` as ``check_arguments`` passed them)."""
    client = args[0].client if args else fn.mesh.client
    program = client.op_program(fn, [Aval.of(a) for a in args])
    return client.run_program(program, args)
