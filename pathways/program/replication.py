"""Replicated outputs (JAX's ``check_rep``): proven once per signature, else checked at run time.

An output whose ``out_specs`` leaves mesh axes out is read from one device of each group along
those axes, so it must be the same on all of them: returning a value that differs across them
would silently keep one device's answer. ``prove`` finds, without running anything on devices,
the axes each output is certainly replicated over; whatever it cannot prove is checked at run
time by ``check_replicas`` (one 16-byte digest per device, exchanged inside the kernel).

``prove`` runs the body once more on the client, on *tagged* zero shards: each value carries
the set of axes it is known to be the same along. Where it follows the whole body (nothing
escapes the analysis), an output that out_specs calls replicated along axes it varies along
is refused before anything runs, as JAX's types refuse it. The rules are JAX's:

- an argument is replicated along the axes its ``in_specs`` entry leaves out;
- numpy operations keep the axes all their tagged operands share (constants share all);
- ``psum``, ``pmean``, ``pmax``, ``pmin`` and ``all_gather`` over axes make the result
  replicated along them; ``ppermute``, ``all_to_all`` and ``psum_scatter`` make it vary along
  them;
- a value that leaves the analysis (``float(x)``, ``bool(x)`` in an ``if``, ``np.asarray(x)``,
  ``x.tolist()``, ``axis_index``) may carry variation anywhere afterwards: the axes it varied
  along are proven for no output;
- a write into an array (``x[i] = v``, ``out=``, ``x.fill(v)``) lowers the axes of every view
  of that memory to what the written value shares.

It assumes bodies are deterministic functions of their inputs and collectives (as JAX bodies
are): a body that draws from ``np.random`` or reads the clock is not proven wrong by it. A body
the analysis cannot follow is simply checked at run time. ``shard_map(..., check_rep=False)``
turns both off.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from ..errors import ProgramError
from .collectives import AbstractEnv, gather_group, kernel_env

__all__ = ["check_replicas", "prove", "spec_axes"]

_METADATA = frozenset({"shape", "dtype", "ndim", "size", "itemsize", "nbytes", "strides",
                       "flags"})
_MUTATING_METHODS = frozenset({"fill", "put", "itemset", "sort", "partition", "resize",
                               "setfield", "byteswap", "setflags"})
_MUTATING_FUNCTIONS = frozenset({np.copyto, np.put, np.place, np.putmask, np.fill_diagonal,
                                 np.put_along_axis})


def spec_axes(spec) -> frozenset:
    """The mesh axes a normalized partition spec shards over."""
    axes = set()
    for entry in spec:
        if isinstance(entry, str):
            axes.add(entry)
        elif entry is not None:
            axes.update(entry)
    return frozenset(axes)


class RepEnv(AbstractEnv):
    """The abstract environment of the tagged pass: collectives tag their results, and it
    keeps what escaped the analysis (``hidden``) and every view of each memory block."""

    tracks_rep = True

    def __init__(self, mesh_shape, axis_names):
        super().__init__(mesh_shape, axis_names)
        self.all = frozenset(self.axis_names)
        self.hidden: set = set()
        self._views: dict[int, tuple[np.ndarray, list]] = {}  # id(root) -> (root, wrappers)

    def collective(self, raw, gathers: bool, x, axes, args, kwargs):
        """``raw(x, *args, **kwargs)`` run untagged; its result replicated along ``axes``
        (its axis_name) if the collective ``gathers`` (psum, pmean, pmax, pmin, all_gather),
        else varying along them."""
        names = {axes} if isinstance(axes, str) else set(axes)
        rep = self.rep_of(x)
        out = raw(self.unwrap(x), *self.unwrap(args), **self.unwrap(kwargs))
        return Tagged(np.asarray(out), rep | names if gathers else rep - names, self)

    def escape(self, rep) -> None:
        """A value replicated along ``rep`` left the analysis: the other axes may vary in
        anything computed from now on."""
        self.hidden |= self.all - rep

    def rep_of(self, obj) -> frozenset:
        if isinstance(obj, Tagged):
            return obj.rep
        if isinstance(obj, (tuple, list)):
            rep = self.all
            for item in obj:
                rep &= self.rep_of(item)
            return rep
        if isinstance(obj, dict):
            return self.rep_of(list(obj.values()))
        return self.all

    def unwrap(self, obj):
        if isinstance(obj, Tagged):
            return obj.a
        if type(obj) in (tuple, list):
            return type(obj)(self.unwrap(item) for item in obj)
        if isinstance(obj, dict):
            return {k: self.unwrap(v) for k, v in obj.items()}
        return obj

    def wrap(self, result, rep):
        """``result`` of an operation on values sharing ``rep``, tagged; anything that is not
        an array leaves the analysis."""
        if isinstance(result, np.ndarray):
            return Tagged(result, rep, self)
        if isinstance(result, np.generic):
            return Tagged(np.asarray(result), rep, self)
        if isinstance(result, tuple) and hasattr(result, "_fields"):
            return type(result)(*(self.wrap(r, rep) for r in result))
        if type(result) in (tuple, list):
            return type(result)(self.wrap(r, rep) for r in result)
        if result is not None:
            self.escape(rep)
        return result

    def register(self, t: Tagged) -> None:
        root = _root(t.a)
        self._views.setdefault(id(root), (root, []))[1].append(t)

    def written(self, targets, rep) -> None:
        """Data sharing ``rep`` was written into ``targets``."""
        for t in targets:
            if isinstance(t, Tagged):
                for view in self._views.get(id(_root(t.a)), (None, [t]))[1]:
                    view.rep &= rep
            elif isinstance(t, np.ndarray):
                self.escape(rep)  # an array the analysis does not follow now holds it


def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (``a`` itself unless it is a view)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class Tagged(NDArrayOperatorsMixin):
    """An array of the tagged pass and the axes it is known to be the same along."""

    __slots__ = ("a", "rep", "env")
    __hash__ = None

    def __init__(self, a: np.ndarray, rep, env: RepEnv):
        self.a, self.rep, self.env = a, frozenset(rep), env
        env.register(self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        env = self.env
        rep = env.rep_of(inputs) & env.rep_of(kwargs)
        result = getattr(ufunc, method)(*env.unwrap(inputs), **env.unwrap(kwargs))
        out = kwargs.get("out")
        if method == "at":
            env.written(inputs[:1], rep)
            return None
        if out is not None:
            env.written(out, rep)
            return out[0] if len(out) == 1 else out
        return env.wrap(result, rep)

    def __array_function__(self, func, types, args, kwargs):
        env = self.env
        rep = env.rep_of(args) & env.rep_of(kwargs)
        result = func(*env.unwrap(args), **env.unwrap(kwargs))
        if func in _MUTATING_FUNCTIONS:
            env.written(args[:1], rep)
        out = kwargs.get("out")
        if out is not None:
            env.written(out if isinstance(out, tuple) else (out,), rep)
            return out
        return env.wrap(result, rep)

    def __getattr__(self, name):
        value = getattr(self.a, name)
        if name in _METADATA:
            return value
        if not callable(value):
            return self.env.wrap(value, self.rep)
        env = self.env

        def method(*args, **kwargs):
            rep = self.rep & env.rep_of(args) & env.rep_of(kwargs)
            result = value(*env.unwrap(args), **env.unwrap(kwargs))
            if name in _MUTATING_METHODS:
                env.written((self,), rep)
            if kwargs.get("out") is not None:
                env.written((kwargs["out"],), rep)
                return kwargs["out"]
            return env.wrap(result, rep)

        return method

    def __getitem__(self, index):
        rep = self.rep & self.env.rep_of(index)
        return self.env.wrap(self.a[self.env.unwrap(index)], rep)

    def __setitem__(self, index, value):
        env = self.env
        self.a[env.unwrap(index)] = env.unwrap(value)
        env.written((self,), env.rep_of(index) & env.rep_of(value))

    def __len__(self):
        return len(self.a)

    def __iter__(self):
        return (self.env.wrap(row, self.rep) for row in self.a)

    def _leave(self):
        self.env.escape(self.rep)
        return self.a

    def __array__(self, dtype=None, copy=None):
        a = self._leave()
        return a if dtype is None else a.astype(dtype)

    def __bool__(self):
        return bool(self._leave())

    def __float__(self):
        return float(self._leave())

    def __int__(self):
        return int(self._leave())

    def __index__(self):
        return self._leave().__index__()

    def __complex__(self):
        return complex(self._leave())

    def __contains__(self, item):
        return item in self._leave()

    def __repr__(self):
        return repr(self._leave())

    __str__ = __repr__

    def __copy__(self):
        return Tagged(self.a.copy(), self.rep, self.env)

    def __deepcopy__(self, memo):
        return self.__copy__()


def prove(body, shards, in_specs, mesh_shape, axis_names, n_outputs: int,
          single_output: bool) -> tuple[tuple[frozenset, ...], bool]:
    """For each output of ``body``, the mesh axes it is certainly the same along (empty sets
    when the analysis cannot follow the body); and whether the analysis followed all of it
    (nothing escaped): then an output is known to vary, as JAX's types say, along the axes
    not proven."""
    env = RepEnv(mesh_shape, axis_names)
    args = [Tagged(np.array(s, copy=True), env.all - spec_axes(spec), env)
            for s, spec in zip(shards, in_specs)]
    unknown = (frozenset(),) * n_outputs, False
    try:
        with kernel_env(env):
            outs = body(*args)
    except Exception:
        return unknown
    outs = (outs,) if single_output else outs
    if not isinstance(outs, (tuple, list)) or len(outs) != n_outputs:
        return unknown
    final = env.all - env.hidden
    exact = not env.hidden and all(isinstance(o, Tagged) for o in outs)
    return tuple((o.rep if isinstance(o, Tagged) else env.all) & final for o in outs), exact


def check_replicas(name: str, outs, checks, device) -> None:
    """Inside a running kernel: fail unless each output is the same on every device along the
    axes in ``checks`` (one tuple per output, empty when proven or not needed)."""
    for k, axes in enumerate(checks):
        if not axes:
            continue
        o = np.ascontiguousarray(outs[k])
        raw = o if o.dtype.hasobject else o.view(np.uint8)  # ml_dtypes' types have no buffer
        digest = np.frombuffer(hashlib.blake2b(raw.data, digest_size=16).digest(), np.uint64)
        digests, position = gather_group("check_rep", digest, axes)
        groups: dict[bytes, list[int]] = {}
        for p, d in enumerate(digests):
            groups.setdefault(np.asarray(d).tobytes(), []).append(p)
        if len(groups) > 1:
            parts = "; ".join(f"positions {ps}" for ps in groups.values())
            raise ProgramError(
                f"{name}: output {k} differs across devices along {axes} (out_specs leaves"
                f" those axes out, so it is returned from one device): on device {device},"
                f" the devices at {parts} along {axes} hold different values. Reduce it over"
                f" {axes} (pw.psum, pw.pmean, pw.all_gather), name the axes in out_specs, or"
                " pass check_rep=False to shard_map to keep one device's value unchecked")
