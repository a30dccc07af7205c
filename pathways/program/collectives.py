"""Collectives called inside SPMD bodies (psum, all_gather, ppermute...) and where they run.

A body runs once per device of a mesh, each time on that device's shard. A collective over mesh
axes first finds the device's *group*: the devices that share its coordinates on every other
axis, ordered by their coordinates on the named axes (``sharding.axis_group``). It then makes
one *exchange* with that group and computes its result locally from what it received.
Reductions (psum, pmean, pmax, pmin, psum_scatter) and all_gather go through the environment's
``reduce_all(members, position, x, op)``, which may compute them as it likes (a host folds its
own members first: ``pathways.host.hierarchy``) as long as the answer is the group's values
folded along the reduction tree (``pathways.program.reduction``): bitwise identical on every
member and on every path (psum of float32 included).

Collectives find their device through the kernel environment of the running context
(``kernel_env``: a context variable, so each thread, and each greenlet of a host's executor,
has its own).
An environment knows the mesh and the device's flat index and implements ``exchange``:

    exchange(members, position, outgoing, expect_from) -> {source position: value}

``outgoing`` maps destination positions to values; a value for the device's own position is
kept locally, never sent. Each exchange takes the environment's next sequence number, so the
members of a group, calling the same collectives in the same order, agree on which exchange a
message belongs to. ``axis_index`` exchanges nothing and takes no number.

Environments here: ``LocalEnv`` (threads sharing an in-memory ``Rendezvous``, plus a ``send``
hook for devices elsewhere), ``AbstractEnv`` (no peers: zeros of the right shapes,
for finding output shapes and dtypes) and ``run_spmd``, which runs a body on every device of a
mesh in threads, for tests and the reference interpreter. A host runs its kernels with
``pathways.host.exchange.ExecutorEnv``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import math
import sys
import threading
from collections.abc import Callable, Hashable

import numpy as np

from ..errors import ProgramError, ShardingError
from .reduction import REDUCTIONS, ordered_sum, sum_dtype
from .rendezvous import Abandoned, Rendezvous
from .sharding import axis_group, check_mesh

__all__ = [
    "AbstractEnv",
    "KernelEnv",
    "LocalEnv",
    "Rendezvous",
    "all_gather",
    "all_to_all",
    "axis_index",
    "current_env",
    "gather_group",
    "kernel_env",
    "ordered_sum",
    "pmax",
    "pmean",
    "pmin",
    "ppermute",
    "psum",
    "psum_scatter",
    "run_spmd",
    "sum_dtype",
]

_env: contextvars.ContextVar[KernelEnv | None] = contextvars.ContextVar("kernel_env",
                                                                       default=None)


def current_env() -> KernelEnv | None:
    """The kernel environment of this context, or None outside a compiled function."""
    return _env.get()


class kernel_env:  # noqa: N801 (used as a function: ``with kernel_env(env):``)
    """Make ``env`` the kernel environment of this context for the ``with`` block (nests);
    ``None``: no environment (a body traced by JAX inside a kernel must not see the kernel's).
    A class, not a generator: every kernel of a host enters one, and this costs a third."""

    __slots__ = ("env", "token")

    def __init__(self, env: KernelEnv | None):
        self.env = env

    def __enter__(self) -> KernelEnv | None:
        self.token = _env.set(self.env)
        return self.env

    def __exit__(self, *exc) -> None:
        _env.reset(self.token)


class _NoHostWork:
    """``KernelEnv.host_work`` where no device's time is kept: nothing to do."""

    until = None  # when the host work ended (unknown here)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


NO_HOST_WORK = _NoHostWork()


class KernelEnv:
    """Where one device runs one kernel: the mesh, the device's flat index, and a way to talk."""

    tracks_rep = False  # True in the replication analysis (pathways.program.replication)
    jax_device = None  # the JAX device a real device is (pathways host --backend jax)
    _seq = 0  # collectives so far (a subclass that skips __init__ starts at 0 too)

    def __init__(self, mesh_shape, axis_names, flat_index: int):
        self.mesh_shape, self.axis_names = check_mesh(mesh_shape, axis_names)
        if not 0 <= flat_index < math.prod(self.mesh_shape):
            raise ShardingError(f"flat index {flat_index} is outside mesh {self.mesh_shape}")
        self.flat_index = flat_index

    def host_work(self):
        """A context in which the body does its host's work, not its device's (compiling
        its program): where a device's time is kept, that time is not the kernel's. A
        no-op here."""
        return NO_HOST_WORK

    def host_work_until(self, ready_at: float) -> None:
        """The kernel's program became ready (compiled by its host) at ``ready_at``: where a
        device's time is kept, the kernel does not begin before. A no-op here."""

    def local_batch(self):
        """The ``HostBatch`` of the devices of this kernel's gang whose JAX segments run
        together with this device's (``pathways.program.jax_batch``), or None: this device
        runs its own. None here."""
        return None

    @property
    def collectives(self) -> int:
        """How many exchanges this kernel has begun."""
        return self._seq

    def next_collective(self) -> int:
        """The sequence number of this kernel's next exchange (0, 1, 2...)."""
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def exchange(
        self, members: list[int], position: int, outgoing: dict[int, object], expect_from: list[int]
    ) -> dict[int, object]:
        """Send ``outgoing[p]`` to ``members[p]``; return {source position: value received}."""
        raise NotImplementedError

    def gather_all(self, members, position: int, x) -> list:
        """Every member's ``x`` in position order (all_gather's answer): ``reduce_all`` with
        the "gather" reduction."""
        return self.reduce_all(members, position, x, "gather")

    def reduce_all(self, members, position: int, x, op: str = "sum"):
        """The group's ``x`` folded by ``REDUCTIONS[op]`` along the reduction tree: here, by
        gathering every value in one exchange and folding them on each member."""
        everyone = list(range(len(members)))
        got = self.exchange(members, position, {p: x for p in everyone}, everyone)
        return REDUCTIONS[op].fold([got[p] for p in everyone])


def _copy(value):
    # Mimic the network: a receiver must never share memory with the sender's array.
    return value.copy() if isinstance(value, np.ndarray) else value


class LocalEnv(KernelEnv):
    """A device whose peers are reached through a shared Rendezvous or a ``send`` hook.

    ``devices`` maps flat index -> physical device id; mailbox keys are
    ``(gang_key, sequence number)`` and sources/destinations are physical ids. Values for a
    device where ``is_local(device)`` is false go to ``send(dst_device, key, src_device,
    value)`` (a host routes them over the network into the peer host's Rendezvous).
    ``bytes_sent_local`` / ``bytes_sent_remote`` count array bytes sent, for ICI cost models.
    """

    def __init__(
        self,
        mesh_shape,
        axis_names,
        flat_index: int,
        devices: dict[int, Hashable],
        gang_key: Hashable,
        rendezvous: Rendezvous,
        send: Callable | None = None,
        timeout: float = 60.0,
        is_local: Callable[[Hashable], bool] | None = None,
        flush: Callable[[], None] | None = None,
    ):
        super().__init__(mesh_shape, axis_names, flat_index)
        self.devices = dict(devices)
        if len(set(self.devices.values())) != len(self.devices):
            raise ProgramError(f"devices {self.devices} map two flat indices to one device")
        self._flat_of = {dev: i for i, dev in self.devices.items()}
        self.gang_key, self.rendezvous = gang_key, rendezvous
        self.send, self.timeout, self.flush = send, timeout, flush
        self.is_local = is_local if is_local is not None else (lambda device: True)
        self.bytes_sent_local = 0
        self.bytes_sent_remote = 0

    def exchange(self, members, position, outgoing, expect_from):
        key = (self.gang_key, self.next_collective())
        me = self.devices[self.flat_index]
        received = {}
        for dst_pos, value in outgoing.items():
            if dst_pos == position:
                received[position] = _copy(value)
            else:
                self._send_one(key, me, self.devices[members[dst_pos]], value)
        if self.flush is not None:
            self.flush()  # a send hook may batch; what it holds must leave before we wait
        sources = [self.devices[members[s]] for s in expect_from if s != position]
        got = self.rendezvous.collect(key, me, sources, self.timeout)
        position_of = {flat: p for p, flat in enumerate(members)}
        received.update({position_of[self._flat_of[dev]]: v for dev, v in got.items()})
        if position in expect_from and position not in received:
            raise ProgramError(f"exchange {key!r} expects a value from itself but sends none")
        return {s: received[s] for s in expect_from}

    def _send_one(self, key, src: Hashable, dst: Hashable, value) -> None:
        nbytes = getattr(value, "nbytes", 0)
        if self.is_local(dst):
            self.rendezvous.deliver(key, src, dst, _copy(value))
            self.bytes_sent_local += nbytes
        elif self.send is None:
            raise ProgramError(f"device {dst!r} is not local and this LocalEnv has no send hook")
        else:
            self.send(dst, key, src, value)
            self.bytes_sent_remote += nbytes


class AbstractEnv(KernelEnv):
    """A device with no peers, for finding a body's output shapes and dtypes.

    Every expected source "sends" what this device sends to its own position (or, if it
    sends itself nothing, to its lowest destination): the answer real collectives would give
    if every device held this device's values. So ``psum(1, "i")`` is the size of axis "i",
    as on the devices, and shapes are right for every collective here. A device that sends
    nothing at all (a ppermute source of no pair) gets nothing, and ppermute falls back to
    zeros_like(x), the right shape.
    """

    def __init__(self, mesh_shape, axis_names, flat_index: int = 0):
        super().__init__(mesh_shape, axis_names, flat_index)

    def exchange(self, members, position, outgoing, expect_from):
        self.next_collective()
        if not outgoing:
            return {}
        mine = outgoing.get(position, outgoing[min(outgoing)])
        return {s: _copy(mine) for s in expect_from}


def _group(name: str, axes) -> tuple[KernelEnv, list[int], int]:
    """This context's environment and its group over ``axes``; errors name the collective."""
    env = current_env()
    if env is None:
        raise ProgramError(
            f"{name} called outside a compiled function: collectives only run inside a body "
            "executed on a mesh (run_spmd, or a program compiled for a mesh)"
        )
    if not isinstance(axes, str):
        axes = tuple(axes)
    members, position = _cached_group(tuple(env.mesh_shape), tuple(env.axis_names), axes,
                                      env.flat_index)
    return env, members, position


@functools.lru_cache(maxsize=4096)
def _cached_group(mesh_shape, axis_names, axes, flat_index):
    # every kernel of a body asks the same few questions: answer each once
    members, position = axis_group(mesh_shape, axis_names, axes, flat_index)
    return tuple(members), position


def gather_group(name: str, x, axes) -> tuple[list, int]:
    """Every member's ``x`` in position order, and this device's position, in the group of
    this device along ``axes`` (``name``: the collective asking, for errors)."""
    env, members, position = _group(name, axes)
    return env.gather_all(members, position, x), position


def _check_axis(name: str, what: str, axis: int, ndim: int) -> int:
    """``axis`` made non-negative, or a ProgramError if it is outside ``ndim`` dimensions."""
    if not -ndim <= axis < ndim:
        raise ProgramError(f"{name}: {what}={axis} is out of range for {ndim} dimension(s)")
    return axis % ndim


jax_tracing: contextvars.ContextVar[bool] = contextvars.ContextVar("jax_tracing", default=False)


def _as_jax(raw, x, args, kwargs):
    """``jax.lax``'s collective of the same name and meaning, called with these arguments (a
    pw collective inside a JAX body's trace)."""
    import jax

    bound = inspect.signature(raw).bind(x, *args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    return getattr(jax.lax, raw.__name__)(named.pop("x"), named.pop("axis_name"), **named)


def _is_tracer(x) -> bool:
    """Whether ``x`` is a JAX tracer (then a pw collective is JAX's, wherever it is traced)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.core.Tracer)


def _tracked(gathers: bool):
    """Let the replication analysis see this collective (``RepEnv.collective``), and a JAX
    body's trace bind JAX's own; elsewhere the collective runs as written."""
    def wrap(raw):
        @functools.wraps(raw)
        def collective(x, *args, **kwargs):
            if jax_tracing.get() or _is_tracer(x):
                return _as_jax(raw, x, args, kwargs)
            env = _env.get()
            if env is not None and env.tracks_rep:
                axes = args[0] if args else kwargs.get("axis_name")
                return env.collective(raw, gathers, x, axes, args, kwargs)
            return raw(x, *args, **kwargs)
        return collective
    return wrap


@_tracked(gathers=True)
def psum(x, axis_name):
    """Sum of ``x`` over the group along ``axis_name`` (one mesh axis or several), added along
    the reduction tree (``reduction.tree_fold``), bitwise the same on every member.

    >>> total = pw.shard_map(lambda x: pw.psum(x, "data"), mesh, P("data"), P())
    """
    env, members, position = _group("psum", axis_name)
    return env.reduce_all(members, position, np.asarray(x))


@_tracked(gathers=True)
def pmean(x, axis_name):
    """Mean of ``x`` over the group (psum divided by the group size; ints become floats).

    >>> col_mean = pw.shard_map(lambda x: pw.pmean(x.mean(axis=0), "data"), mesh,
    ...                         P("data"), P())
    """
    env, members, position = _group("pmean", axis_name)
    return np.asarray(env.reduce_all(members, position, np.asarray(x)) / len(members))


@_tracked(gathers=True)
def pmax(x, axis_name):
    """Elementwise maximum of ``x`` over the group (``jax.lax.pmax``; NaN propagates).

    >>> peak = pw.shard_map(lambda x: pw.pmax(x.max(), "data"), mesh, P("data"), P())
    """
    env, members, position = _group("pmax", axis_name)
    return env.reduce_all(members, position, np.asarray(x), "max")


@_tracked(gathers=True)
def pmin(x, axis_name):
    """Elementwise minimum of ``x`` over the group (``jax.lax.pmin``; NaN propagates).

    >>> low = pw.shard_map(lambda x: pw.pmin(x.min(), "data"), mesh, P("data"), P())
    """
    env, members, position = _group("pmin", axis_name)
    return env.reduce_all(members, position, np.asarray(x), "min")


@_tracked(gathers=False)
def psum_scatter(x, axis_name, scatter_dimension: int = 0, tiled: bool = False):
    """The psum of ``x`` over the group, of which member j keeps block j along
    ``scatter_dimension`` (``jax.lax.psum_scatter``). Not tiled, that dimension must have the
    group's size and disappears; tiled, it is split into group-size blocks.

    >>> part = pw.shard_map(lambda x: pw.psum_scatter(x, "data", tiled=True), mesh,
    ...                     P(), P("data"))       # the sum, sharded: reduce-scatter
    """
    x = np.asarray(x)
    dim = _check_axis("psum_scatter", "scatter_dimension", scatter_dimension, x.ndim)
    env, members, position = _group("psum_scatter", axis_name)
    n = len(members)
    if tiled and x.shape[dim] % n or not tiled and x.shape[dim] != n:
        need = f"divisible by {n}" if tiled else f"equal to {n}"
        raise ShardingError(f"psum_scatter: dimension {dim} of shape {x.shape} must be {need},"
                            f" the group size of axes {axis_name!r} (tiled={tiled})")
    # the sum of the whole blocks, then this member's block: the same additions, elementwise,
    # as summing each block alone (and one reduction a host can combine hierarchically)
    total = env.reduce_all(members, position, x)
    if tiled:
        size = x.shape[dim] // n
        return np.ascontiguousarray(np.take(total, range(position * size, (position + 1) * size),
                                            axis=dim))
    return np.ascontiguousarray(np.take(total, position, axis=dim))


@_tracked(gathers=True)
def all_gather(x, axis_name, axis: int = 0, tiled: bool = False):
    """Every member's ``x``, stacked along a new dimension ``axis`` (or concatenated if tiled).

    >>> whole = pw.shard_map(lambda x: pw.all_gather(x, "data", tiled=True), mesh,
    ...                      P("data"), P())
    """
    x = np.asarray(x)
    if tiled:
        axis = _check_axis("all_gather", "axis", axis, x.ndim)
    else:
        axis = _check_axis("all_gather", "axis", axis, x.ndim + 1)
    values, _ = gather_group("all_gather", x, axis_name)
    return np.concatenate(values, axis=axis) if tiled else np.stack(values, axis=axis)


@_tracked(gathers=False)
def ppermute(x, axis_name, perm):
    """Send ``x`` along the (source position, destination position) pairs of ``perm``.

    A device that is nobody's destination gets zeros_like(x).

    >>> ring = [(i, (i + 1) % 4) for i in range(4)]      # "model" has 4 devices
    >>> shift = pw.shard_map(lambda x: pw.ppermute(x, "model", ring), mesh,
    ...                      P(None, "model"), P(None, "model"))
    """
    x = np.asarray(x)
    env, members, position = _group("ppermute", axis_name)
    pairs = _check_perm(perm, len(members))
    outgoing = {dst: x for src, dst in pairs if src == position}
    sources = [src for src, dst in pairs if dst == position]
    got = env.exchange(members, position, outgoing, sources)
    return got[sources[0]] if sources and sources[0] in got else np.zeros_like(x)


def _check_perm(perm, n: int) -> list[tuple[int, int]]:
    """``perm`` as int pairs, checked in range with no repeated source or destination."""
    try:
        pairs = [(int(src), int(dst)) for src, dst in perm]
    except (TypeError, ValueError) as exc:
        raise ProgramError(f"ppermute: perm {perm!r} is not a list of (src, dst) pairs") from exc
    for src, dst in pairs:
        if not (0 <= src < n and 0 <= dst < n):
            raise ProgramError(f"ppermute: pair ({src}, {dst}) is outside a group of {n}")
    for i, what in ((0, "source"), (1, "destination")):
        if len({pair[i] for pair in pairs}) != len(pairs):
            raise ProgramError(f"ppermute: perm {perm!r} repeats a {what}")
    return pairs


@_tracked(gathers=False)
def all_to_all(x, axis_name, split_axis: int, concat_axis: int, tiled: bool = False):
    """Chunk j of ``x`` along ``split_axis`` goes to position j; what arrives is put together
    along ``concat_axis`` in source order (``jax.lax.all_to_all``).

    Not tiled (JAX's default): ``x.shape[split_axis]`` is the group size; that dimension
    goes, and the received chunks are stacked into a new dimension at ``concat_axis``.
    Tiled: ``split_axis`` is split into group-size chunks (it shrinks by the group size) and
    they are concatenated along ``concat_axis`` (it grows by it).

    >>> to_cols = pw.shard_map(lambda x: pw.all_to_all(x, "data", split_axis=1, concat_axis=0,
    ...                                                tiled=True),
    ...                        mesh, P("data", None), P(None, "data"))   # rows -> columns
    """
    x = np.asarray(x)
    split_axis = _check_axis("all_to_all", "split_axis", split_axis, x.ndim)
    concat_axis = _check_axis("all_to_all", "concat_axis", concat_axis, x.ndim)
    env, members, position = _group("all_to_all", axis_name)
    n = len(members)
    if tiled and x.shape[split_axis] % n or not tiled and x.shape[split_axis] != n:
        need = f"not divisible by the group size {n}" if tiled else \
            f"not the group size {n} (pass tiled=True to split it in chunks)"
        raise ShardingError(f"all_to_all: dimension {split_axis} of shape {x.shape} has size"
                            f" {x.shape[split_axis]}, {need} of axes {axis_name!r}")
    if tiled:
        chunks = np.split(x, n, axis=split_axis)
    else:
        chunks = [np.take(x, j, axis=split_axis) for j in range(n)]
    everyone = list(range(n))
    got = env.exchange(members, position, dict(enumerate(chunks)), everyone)
    received = [got[p] for p in everyone]
    if tiled:
        return np.concatenate(received, axis=concat_axis)
    return np.stack(received, axis=concat_axis)


def axis_index(axis_name) -> int:
    """This device's position along ``axis_name`` (no communication).

    >>> tag = pw.shard_map(lambda x: x * 0 + pw.axis_index("data"), mesh, P("data"), P("data"))
    """
    if jax_tracing.get() or (_env.get() is None and "jax" in sys.modules):
        try:  # inside a JAX trace (ours, or a plain jax.shard_map): JAX's own
            return sys.modules["jax"].lax.axis_index(axis_name)
        except NameError:
            if jax_tracing.get():
                raise
    env, _members, position = _group("axis_index", axis_name)
    if env.tracks_rep:  # the position varies along these axes wherever it goes next
        env.escape(env.all - ({axis_name} if isinstance(axis_name, str) else set(axis_name)))
    return position


_gang_ids = itertools.count()


def run_spmd(
    body: Callable, mesh_shape, axis_names, per_device_args: list[tuple], timeout: float = 30.0
) -> list:
    """Run ``body(*per_device_args[i])`` on every device i of a mesh, one thread each.

    Returns the results in flat-index order. If devices raise, raises the exception of the
    lowest flat index among those that failed on their own account, after every thread has
    ended: the first failure aborts the shared Rendezvous, so peers stuck waiting for the
    failed device stop at once instead of waiting ``timeout``. A body that never returns
    outside a collective is not interrupted.
    """
    mesh_shape, axis_names = check_mesh(mesh_shape, axis_names)
    n = math.prod(mesh_shape)
    if len(per_device_args) != n:
        raise ProgramError(f"run_spmd got {len(per_device_args)} argument tuples for {n} devices")
    rendezvous, gang_key = Rendezvous(), ("spmd", next(_gang_ids))
    devices = {i: i for i in range(n)}
    results: list = [None] * n
    errors: dict[int, BaseException] = {}

    def run(i: int) -> None:
        env = LocalEnv(mesh_shape, axis_names, i, devices, gang_key, rendezvous, timeout=timeout)
        try:
            with kernel_env(env):
                results[i] = body(*per_device_args[i])
        except Exception as exc:
            errors[i] = exc
            rendezvous.abort(f"device {i} raised {exc!r}")

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        own = [i for i in sorted(errors) if not isinstance(errors[i], Abandoned)]
        raise errors[(own or sorted(errors))[0]]
    return results
