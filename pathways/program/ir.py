"""The program IR: a short list of equations, one per compiled-function call, the abstract
values they act on, the state of tracing, and the reference interpreter.

An equation names the compiled function and its input and output variables; whatever the
number of shards, a call is one equation. ``str(program)`` prints it readably. ``evaluate``
runs a program in this process on global numpy arrays (every device's body on a thread, with
real collectives), which every distributed result is checked against.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass

import numpy as np

from . import collectives, prng, sharding

_state = threading.local()  # this thread's stack of programs being traced


@dataclass(frozen=True)
class Aval:
    """The abstract value of a global array: shape and dtype; for JAX's typed PRNG keys
    (``pathways.program.prng``), those of its key data, and ``key``, its impl's name."""

    shape: tuple[int, ...]
    dtype: np.dtype
    key: str | None = None

    @classmethod
    def of(cls, x) -> Aval:
        """The aval of a numpy or JAX array, a key array, or a ``pw.Array`` (its own)."""
        own = getattr(x, "aval", None)  # a pw.Array's, a traced value's (not JAX's own)
        if isinstance(own, Aval):
            return own
        if prng.is_key(x):
            data, impl = prng.data_of(x)
            return cls(data.shape, data.dtype, impl)
        return cls(tuple(int(n) for n in x.shape), np.dtype(x.dtype))

    @property
    def logical_shape(self) -> tuple[int, ...]:
        """The shape a user sees: a key array's, without its key data's trailing dims."""
        if self.key is None:
            return self.shape
        return self.shape[:len(self.shape) - prng.key_ndim(self.key)]

    @property
    def logical_dtype(self):
        """The dtype a user sees: a key array's is JAX's (``key<fry>``)."""
        return self.dtype if self.key is None else prng.key_dtype(self.key)

    def __str__(self):
        name = self.dtype.name if self.key is None else f"key<{self.key}>"
        return f"{name}[{','.join(map(str, self.logical_shape))}]"


def is_device_array(value) -> bool:
    """Whether ``value`` is a ``jax.Array`` (without importing JAX: none exists before): a
    buffer a host whose devices are JAX's keeps on its device."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.Array)


class RemoteValue:
    """A value that lives on a cluster and knows its ``client``, ``shape`` and ``dtype``, and
    whether it was deleted: ``pw.Array`` derives from it, so programs recognise arguments
    without importing the client."""

    __slots__ = ()

    def is_deleted(self) -> bool:
        """Whether the value was deleted (``pw.Array.delete``): it can no longer be used."""
        raise NotImplementedError


def current_trace():
    """The program being traced on this thread (innermost), or None."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def tracing(trace):
    """Make ``trace`` this thread's current trace for the ``with`` block."""
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(trace)
    try:
        yield trace
    finally:
        stack.pop()


@dataclass(frozen=True, eq=False)
class Var:
    """A variable of a program: an id unique in its program, and its abstract value."""

    id: int
    aval: Aval

    def __str__(self):
        return f"v{self.id}"


@dataclass(frozen=True, eq=False)
class Eqn:
    """One call of a compiled function (``fn``: a ``CompiledFunction``, or a
    ``RoutedFunction`` whose ``routed`` is True): input variables in, output variables out.
    However many shards the function has, a call is one equation."""

    fn: object  # a CompiledFunction
    inputs: tuple[Var, ...]
    outputs: tuple[Var, ...]

    def __str__(self):
        outs = ", ".join(f"{v}:{v.aval}" for v in self.outputs)
        ins = ", ".join(map(str, self.inputs))
        m = self.fn.mesh
        mesh = ",".join(f"{a}={n}" for a, n in zip(m.axis_names, m.axis_sizes))
        return f"{outs} = {self.fn.name}[{mesh}]({ins})"


@dataclass(eq=False)
class Program:
    """A traced program: its input variables, its equations in call order (each reads only
    inputs and earlier outputs) and the variables it returns (``single_output``: one value,
    not a tuple). What ``lower`` places on devices and ``evaluate`` runs in process."""

    name: str
    inputs: tuple[Var, ...]
    eqns: tuple[Eqn, ...]
    outputs: tuple[Var, ...]
    single_output: bool = True

    def __str__(self):
        ins = ", ".join(f"{v}:{v.aval}" for v in self.inputs)
        lines = [f"program {self.name}({ins}):"]
        lines += [f"  {e}" for e in self.eqns]
        lines.append(f"  return {', '.join(map(str, self.outputs))}")
        return "\n".join(lines)


def evaluate_eqn(eqn: Eqn, args: list, timeout: float = 60.0) -> list:
    """Run one equation on global numpy arrays, in process."""
    fn, m = eqn.fn, eqn.fn.mesh
    if fn.routed:
        return fn.evaluate(args)
    specs = fn.arg_specs(len(args))
    per_input = [sharding.split(a, m.axis_sizes, m.axis_names,
                                sharding.normalize_spec(s, a.ndim, m.axis_names))
                 for a, s in zip(args, specs)]
    per_device = [tuple(shards[i] for shards in per_input) for i in range(m.size)]
    sig = fn.signature([v.aval for v in eqn.inputs])  # (a key array's data: its aval says)

    def body(*shards):
        env = collectives.current_env()
        return fn.checked(fn.run_body(shards, sig), sig, env.flat_index)

    results = collectives.run_spmd(body, m.axis_sizes, m.axis_names, per_device, timeout=timeout)
    outs = []
    for k, spec in enumerate(fn.out_specs):
        shards = [r[k] for r in results]
        spec = sharding.normalize_spec(spec, shards[0].ndim, m.axis_names)
        outs.append(sharding.assemble(shards, m.axis_sizes, m.axis_names, spec))
    return outs


def evaluate(program: Program, *args):
    """The reference interpreter: run ``program`` on global numpy arrays in this process."""
    env = {v: a for v, a in zip(program.inputs, args)}
    for eqn in program.eqns:
        outs = evaluate_eqn(eqn, [env[v] for v in eqn.inputs])
        env.update(zip(eqn.outputs, outs))
    outs = [env[v] for v in program.outputs]
    return outs[0] if program.single_output else tuple(outs)
