"""``@pw.program``: record calls of compiled functions into one program, run with one call.

While a program function runs under tracing, its arguments are tracers (shape and dtype, no
value) and every compiled-function call appends one equation and returns new tracers. The
traced program is cached per input signature, so the Python function runs once per
signature. ``pw.reference(f)`` evaluates the same program in-process on numpy arrays.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..errors import ProgramError
from . import fusion, jax_outer, prng, tree
from .arguments import check_arguments, describe
from .compiled import CompiledFunction
from .ir import Aval, Eqn, Program, Var, current_trace, evaluate, tracing


class Tracer:
    """A value inside a program being traced: its shape and dtype are known, not its data."""

    def __init__(self, trace: Trace, var: Var):
        self._trace, self.var = trace, var

    aval = property(lambda self: self.var.aval)
    shape = property(lambda self: self.var.aval.logical_shape)  # a key array's: its keys'
    dtype = property(lambda self: self.var.aval.logical_dtype)
    ndim = property(lambda self: len(self.shape))

    def __repr__(self):
        return f"Tracer({self.var}:{self.var.aval})"

    def _refuse(self, *args, **kwargs):
        raise ProgramError("inside @pw.program only compiled functions (pw.shard_map) can act"
                           " on arrays; do this arithmetic inside a shard_map body")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __matmul__ = __neg__ = __getitem__ = _refuse
    __array__ = _refuse

    def __bool__(self):
        raise ProgramError("a traced array has no value yet: Python control flow cannot depend"
                           " on it inside @pw.program")


class Trace:
    """The state of one program being traced: fresh variable ids and the equations recorded
    so far, in call order."""

    def __init__(self):
        self.ids = itertools.count()
        self.eqns: list[Eqn] = []

    def new_var(self, aval: Aval) -> Var:
        return Var(next(self.ids), aval)

    def check_arguments(self, name: str, args) -> None:
        """Every leaf of a call's ``args`` is a value of this program; else ProgramError
        naming the argument and the leaf."""
        for i, arg in enumerate(args):
            for path, leaf in tree.with_paths(arg, f"argument {i}"):
                if not isinstance(leaf, Tracer) or leaf._trace is not self:
                    raise ProgramError(
                        f"{name}: {path} is {describe(leaf)}, not a value of this"
                        " program; pass arrays in as program arguments (a constant the body"
                        " needs can be closed over by the body)")

    def record(self, fn: CompiledFunction, args):
        """One equation calling ``fn`` on ``args`` (which ``check_arguments`` passed)."""
        vars_ = [a.var for a in args]
        out_avals = fn.abstract_eval([v.aval for v in vars_])
        outs = tuple(self.new_var(a) for a in out_avals)
        self.eqns.append(Eqn(fn, tuple(vars_), outs))
        tracers = tuple(Tracer(self, v) for v in outs)
        return tracers[0] if fn.single_output else tracers


def trace_program(fn, avals, name=None) -> Program:
    """Run ``fn`` on tracers of ``avals`` and return the recorded program."""
    trace = Trace()
    inputs = tuple(trace.new_var(a) for a in avals)
    with tracing(trace):
        out = fn(*(Tracer(trace, v) for v in inputs))
    single = not isinstance(out, (tuple, list))
    outs = (out,) if single else tuple(out)
    for i, o in enumerate(outs):
        if not isinstance(o, Tracer) or o._trace is not trace:
            raise ProgramError(f"program {name or fn.__name__} must return arrays it computed;"
                               f" output {i} is {type(o).__name__}")
    return Program(name or getattr(fn, "__name__", "program"), inputs, tuple(trace.eqns),
                   tuple(o.var for o in outs), single)


class ProgramFunction:
    """A Python function traced into one program; calling it runs the program once."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "program")
        self.__doc__ = getattr(fn, "__doc__", None)
        self._cache: dict[tuple, Program] = {}
        self._tree_cache: dict[tuple, tuple[Program, object]] = {}  # pytree arguments
        self._runnable: dict[int, tuple[Program, Program]] = {}  # id(traced) -> it, fused

    def trace(self, avals) -> Program:
        key = tuple(avals)
        if key not in self._cache:
            self._cache[key] = trace_program(self.fn, key, self.__name__)
        return self._cache[key]

    def trace_tree(self, in_def, avals) -> tuple[Program, object]:
        """The program for pytree arguments of structure ``in_def`` whose leaves have
        ``avals`` (one program input per leaf, one output per result leaf), and the results'
        structure."""
        key = (in_def, tuple(avals))
        if key not in self._tree_cache:
            out_def: list = []

            def flat_fn(*tracers):
                leaves, d = tree.flatten(self.fn(*tree.unflatten(in_def, tracers)))
                out_def.append(d)
                return tuple(leaves)

            self._tree_cache[key] = (trace_program(flat_fn, key[1], self.__name__), out_def[0])
        return self._tree_cache[key]

    def runnable(self, program: Program) -> Program:
        """What runs for the traced ``program``: its consecutive JAX calls fused
        (``pathways.program.fusion``), made once."""
        hit = self._runnable.get(id(program))
        if hit is None:
            hit = self._runnable[id(program)] = (program, fusion.fused(program))
        return hit[1]

    def __call__(self, *arrays):
        if current_trace() is not None:  # called while tracing another program: inlined
            return self.fn(*arrays)      # into it, as nested jax.jit calls are
        if arrays:  # (a program of no arguments runs where the functions it calls do)
            try:
                check_arguments(self.__name__, arrays)
            except ProgramError:  # inside jax.grad, jax.jit, ...: its calls are JAX's work,
                if not jax_outer.traced(arrays):  # one by one (``jax_outer``), as
                    raise                         # pw.reference runs them
                return self.fn(*arrays)
        leaves, in_def = tree.flatten(arrays)
        program, out_def = self.trace_tree(in_def, [Aval.of(a) for a in leaves])
        client = leaves[0].client if leaves else _client_of(program)
        outs = client.run_program(self.runnable(program), leaves)
        return tree.unflatten(out_def, outs)


def _client_of(program: Program):
    """The client a program of no arguments runs on: its functions' meshes'."""
    for eqn in program.eqns:
        client = getattr(getattr(eqn.fn, "mesh", None), "client", None)
        if client is not None:
            return client
    raise ProgramError(f"program {program.name} has no arguments and calls no function on a"
                       " mesh: nothing says which client runs it")


def program(fn) -> ProgramFunction:
    """Decorator: trace ``fn`` into one program of compiled-function calls.

    >>> @pw.program
    ... def chain(x):
    ...     for _ in range(128):
    ...         x = step(x)
    ...     return x
    >>> z = chain(x)      # one client call runs all 128 steps
    """
    return ProgramFunction(fn)


def single_call_program(fn: CompiledFunction, avals) -> Program:
    trace = Trace()
    inputs = tuple(trace.new_var(a) for a in avals)
    outs = fn.abstract_eval(list(avals))
    out_vars = tuple(trace.new_var(a) for a in outs)
    return Program(fn.name, inputs, (Eqn(fn, inputs, out_vars),), out_vars, fn.single_output)


def reference(f):
    """A function computing ``f`` (a program or compiled function) in-process on numpy.

    >>> want = pw.reference(chain)(x0)            # numpy in, numpy out; no cluster
    >>> np.allclose(chain(client.put(x0, mesh, P("data"))).result(), want)
    """
    if not isinstance(f, (ProgramFunction, CompiledFunction)):
        raise ProgramError(f"pw.reference needs a @pw.program or shard_map, got {f!r}")

    def run(*args):
        fn = f
        if isinstance(f, CompiledFunction):  # static arguments: as a call hands them over
            fn, args = f.without_statics(args)
        leaves, in_def = tree.flatten(args)
        leaves = [a if prng.is_key(a) else np.asarray(a) for a in leaves]
        avals = [Aval.of(a) for a in leaves]
        if isinstance(fn, ProgramFunction):
            prog, out_def = fn.trace_tree(in_def, avals)
        else:
            flat, _, out_def = fn.twin(tree.unflatten(in_def, leaves))
            prog = single_call_program(flat, avals)
        outs = evaluate(prog, *[prng.data_of(a)[0] if v.key else a
                                for a, v in zip(leaves, avals)])
        outs = [o if v.aval.key is None else prng.wrap(o, v.aval.key)  # keys, as they came
                for o, v in zip((outs,) if prog.single_output else outs, prog.outputs)]
        outs = outs[0] if prog.single_output else tuple(outs)
        return outs if out_def is None else tree.unflatten(out_def, outs)

    return run
