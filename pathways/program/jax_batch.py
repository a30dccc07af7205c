"""A JAX body's segments run once for all of a host's devices: one XLA computation, vmapped.

A host runs the shards of a gang on several of its devices. When those devices form a box of
the mesh (every combination of their coordinates is one of them; ``extents``: how many
coordinates each axis has among them), each segment of the body's plan is compiled once, for
the whole box: the per-device equations under ``jax.vmap`` once per mesh axis (outermost
first, named after the axis), jitted, on arguments stacked along a leading dimension of the
box's devices in row-major order. Collectives over axes the box holds whole (``inside``) run
inside that computation; those that reach other hosts cut the plan: they run between two
batched segments through the host's exchange, each device's value its own
(``pathways.program.jax_plan``). On 2 hosts x 4 devices (bench/jax_steps.py) such cut
batched plans took 0.6-0.85x the time per step of running the body per device (whose first
step compiled up to 15% faster), so a host always batches.

Inside a computation the collectives keep the per-device path's meaning:

- psum (and psum_scatter) gathers the group's values and adds them along the reduction tree
  (``reduction.tree_fold``), in ``reduction.sum_dtype`` (what ``reduction.ordered_sum``
  does), so values do not depend on where a device runs: bit for bit the per-device path's
  for elementwise bodies (XLA may still fold those additions into the matmul that made the
  values, which rounds differently, as fusing segments may);
- pmax / pmin fold the gathered values along the same tree;
- all_gather gathers one axis at a time (the last named innermost: the first named is major,
  as ``sharding.axis_group`` orders a group);
- ppermute and all_to_all over one axis are JAX's own (vmap's rules move data only); over
  several axes they cut the plan;
- axis_index reads the device's mesh coordinates, an argument of the computation (the
  same compiled computation serves every host whose box has the same extents).

Each device's kernel keeps its own timeline: the host's executor (``ExecutorEnv.batched``)
gathers its members' arguments, runs the computation once, and books each member a share of
its real time. ``flops`` and ``bytes`` of a batched segment are XLA's counts divided by the
number of devices (the gathers of inside collectives are counted too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ProgramError
from . import collectives, prng, reduction
from .ir import is_device_array
from .jax_plan import Segment, xla_cost
from .jaxpr_eval import COLLECTIVES, INLINED_CALLS, axes_of, communicates, eval_eqns, sub_jaxprs

__all__ = ["HostBatch"]

_MOVES_DATA = {"ppermute", "all_to_all"}  # collectives whose vmap rule JAX has: one axis only


@dataclass(frozen=True)
class HostBatch:
    """How a host's devices of a gang lie in the mesh: ``extents[i]`` coordinates of mesh
    axis ``axis_names[i]`` among them (their product is how many there are). ``devices``:
    their own JAX devices in box order, on a host whose devices are JAX's (``pathways host
    --backend jax``): a segment is then partitioned over them, each running its own part
    (``_placed``), not run on one device."""

    mesh_shape: tuple
    axis_names: tuple
    extents: tuple
    devices: tuple | None = None

    @property
    def size(self) -> int:
        return math.prod(self.extents)

    def inside(self, axes) -> bool:
        """Whether every device of a group over ``axes`` (a name or a tuple) is in the box."""
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        index = {a: i for i, a in enumerate(self.axis_names)}
        return all(self.extents[index[a]] == self.mesh_shape[index[a]] for a in axes)

    # -- planning (``jax_plan._plan_jaxpr``) -----------------------------------------------

    def holds(self, eqns) -> bool:
        """Whether the body of ``eqns`` runs whole inside batched segments: none of its
        collectives reaches devices outside the box (nor sits in a loop or conditional),
        so a call of it can be inlined into a segment (``keeps``)."""
        for eqn in eqns:
            if eqn.primitive.name in COLLECTIVES:
                if self.cuts(eqn):
                    return False
            elif communicates(eqn, COLLECTIVES) and not self.keeps(eqn):
                return False
        return True

    def cuts(self, eqn) -> bool:
        """Whether the collective ``eqn`` runs through the exchange, outside a segment."""
        prim, p = eqn.primitive.name, eqn.params
        if prim == "axis_index":
            return False
        axes = axes_of(p, "axes" if prim in ("psum", "psum_invariant", "pmax", "pmin")
                     else "axis_name")
        if prim in _MOVES_DATA and not isinstance(axes, str) and len(axes) != 1:
            return True
        return not self.inside(axes)

    def keeps(self, eqn) -> bool:
        """Whether ``eqn``, holding collectives, can still go into a segment: a call (inlined
        there) whose collectives, however deep in calls, the segment runs itself."""
        return eqn.primitive.name in INLINED_CALLS and all(
            self.holds(jaxpr.eqns) for jaxpr in sub_jaxprs(eqn))

    def segment(self, eqns, ins, outs, shared: set, name) -> Segment:
        """``eqns`` compiled once for every device of the box (see the module docstring),
        from ``ins`` to ``outs`` (``segment_vars``); ``shared``: variables whose value is the
        same on every device (not stacked)."""
        import jax

        stacked = [v not in shared for v in ins]
        axes, extents, n = self.axis_names, self.extents, self.size
        lower = _Lowering(self)

        impls = [prng.impl_of_dtype(v.aval.dtype) for v in ins]

        def per_device(coords, *values):  # keys cross its edges as their key data
            env = dict(zip(ins, prng.wrapped(values, impls)))
            eval_eqns(eqns, env, lambda eqn, args: lower.collective(eqn, args, coords))
            return prng.unwrapped(env[v] for v in outs)

        mapped = per_device
        in_axes = (0, *(0 if s else None for s in stacked))
        for axis in reversed(axes):
            mapped = jax.vmap(mapped, in_axes=in_axes, axis_name=axis)
        data = [prng.data_aval(v.aval) for v in ins]
        shapes = [shape for shape, _ in data]

        def run(coords, *values):
            values = [v.reshape(extents + shape) if s else v
                      for v, s, shape in zip(values, stacked, shapes)]
            results = mapped(coords.reshape(extents + coords.shape[1:]), *values)
            return tuple(r.reshape(self.stacked_shape(r.shape[len(extents):]))
                         for r in results)

        structs = [jax.ShapeDtypeStruct((n, len(axes)), np.int32)]
        structs += [jax.ShapeDtypeStruct(self.stacked_shape(shape) if s else shape, dtype)
                    for (shape, dtype), s in zip(data, stacked)]
        jitted = jax.jit(run, **self._placed(stacked))
        try:
            compiled = jitted.lower(*structs).compile()
        except Exception as exc:
            raise ProgramError(f"{name}: XLA could not compile a segment of the body for"
                               f" {n} devices: {exc}") from exc
        flops, nbytes = xla_cost(compiled)
        return Segment(ins, outs, jitted, flops / n, nbytes / n, batch=self, stacked=stacked)

    def stacked_shape(self, shape: tuple) -> tuple:
        """The shape of the box's values of one device's ``shape``, as a segment takes and
        gives them: stacked along a new leading dimension; on JAX's devices an array is its
        devices' blocks one after the other along its first dimension instead (each
        device's block is then its own buffer, unchanged: ``_call_placed``)."""
        if self.devices is not None and shape:
            return (self.size * shape[0],) + tuple(shape[1:])
        return (self.size,) + tuple(shape)

    def _placed(self, stacked: list) -> dict:
        """``jax.jit``'s shardings for a segment over the box's own devices (none for an
        emulated host's, run on one): each device holds its own row of the stacked
        arguments and results, so XLA partitions the computation over them, each device
        running its own part, the collectives inside between them."""
        if self.devices is None:
            return {}
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as JaxP

        rows = self.rows()
        whole = NamedSharding(rows.mesh, JaxP())
        return {"in_shardings": (rows, *(rows if s else whole for s in stacked)),
                "out_shardings": rows}

    def rows(self):
        """The sharding of a stacked value over the box's own JAX devices: each holds its
        own block (made once per box)."""
        hit = _ROWS.get(self.devices)
        if hit is None:
            from jax.sharding import Mesh, NamedSharding
            from jax.sharding import PartitionSpec as JaxP

            mesh = Mesh(np.array(self.devices, dtype=object), ("box",))
            hit = _ROWS[self.devices] = NamedSharding(mesh, JaxP("box"))
        return hit

    # -- running (``Plan.run``, on each device's greenlet) ---------------------------------

    def run(self, segment: Segment, args: list) -> list:
        """This device's outputs of ``segment`` on its ``args``: its host runs the segment
        once its devices of the box have all reached it (``ExecutorEnv.batched``)."""
        env = collectives.current_env()
        return env.batched(lambda coords, each: _call(segment, coords, each), args)


_ROWS: dict = {}  # a box's JAX devices -> HostBatch.rows


def _call(segment: Segment, coords: np.ndarray, each: list) -> list:
    """Run ``segment`` on the devices' arguments ``each`` (in box order), with their mesh
    coordinates ``coords``: each device's outputs, in the same order."""
    if segment.batch.devices is not None:
        return _call_placed(segment, coords, each)
    args = [coords]
    for j, stacked in enumerate(segment.stacked):
        if stacked:
            values = [a[j] for a in each]
            rows = _rows_of(values)
            args.append(rows if rows is not None else np.stack(values))
        else:
            args.append(each[0][j])
    outs = [np.asarray(o) for o in segment.compiled(*args)]
    return [[o[i] for o in outs] for i in range(len(each))]


def _call_placed(segment: Segment, coords: np.ndarray, each: list) -> list:
    """``_call`` on JAX's own devices: each device's block of an array stays where it is,
    a ``jax.Array`` on its device (one that came from the host is put there); a segment's
    arguments are made of them and its results split into them, with no copies (0-d values,
    which cannot be blocks, go by the host: they are tiny). Returns once the results are
    ready: the time is the kernels'."""
    import jax

    batch = segment.batch
    rows, devices = batch.rows(), batch.devices
    args = [coords]
    for j, stacked in enumerate(segment.stacked):
        values = [a[j] for a in each]
        shape = tuple(segment.ins[j].aval.shape)
        if not stacked:
            args.append(np.asarray(values[0]) if is_device_array(values[0]) else values[0])
        elif not shape:
            args.append(np.stack([np.asarray(v) for v in values]))
        else:
            blocks = [v if is_device_array(v) else jax.device_put(v, d)
                      for v, d in zip(values, devices)]
            args.append(jax.make_array_from_single_device_arrays(
                batch.stacked_shape(shape), rows, blocks))
    outs = jax.block_until_ready(segment.compiled(*args))
    results = [[None] * len(outs) for _ in each]
    for k, o in enumerate(outs):
        if segment.outs[k].aval.shape:
            block = {s.device: s.data for s in o.addressable_shards}
            for i, d in enumerate(devices):
                results[i][k] = block[d]
        else:
            values = np.asarray(o)
            for i in range(len(each)):
                results[i][k] = values[i, ...]  # (0-d: an array, not a numpy scalar)
    return results


def _rows_of(values: list) -> np.ndarray | None:
    """The array whose rows ``values`` are, in order (a batched segment's result passed on to
    the next as it was split: no need to stack it again), or None."""
    base = getattr(values[0], "base", None)
    if not isinstance(base, np.ndarray) or base.shape != (len(values), *values[0].shape) \
            or base.dtype != values[0].dtype:
        return None
    start, step = base.__array_interface__["data"][0], base.strides[0]
    for i, v in enumerate(values):
        if v.base is not base or v.__array_interface__["data"][0] != start + i * step \
                or v.strides != base.strides[1:]:
            return None
    return base


class _Lowering:
    """The collectives of a batched segment, as JAX operations on the vmapped axes (inside
    ``jax.vmap``: ``args`` are one device's values, ``coords`` its mesh coordinates)."""

    def __init__(self, batch: HostBatch):
        self.batch = batch
        self.size_of = dict(zip(batch.axis_names, batch.mesh_shape))
        self.number = {a: i for i, a in enumerate(batch.axis_names)}

    def collective(self, eqn, args, coords) -> list:
        from jax import lax
        from jax import numpy as jnp

        prim, p = eqn.primitive.name, eqn.params
        if prim == "axis_index":
            return [self.position(axes_of(p, "axis_name"), coords)]
        if prim in _MOVES_DATA:  # JAX's own rule under vmap
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(p))
            return list(outs) if eqn.primitive.multiple_results else [outs]
        if prim in ("psum", "psum_invariant"):
            return [_ordered_sum(self.gather(x, axes_of(p, "axes"))) for x in args]
        if prim in ("pmax", "pmin"):
            fold = jnp.maximum if prim == "pmax" else jnp.minimum
            return [_fold(self.gather(x, axes_of(p, "axes")), fold) for x in args]
        axes = axes_of(p, "axis_name")
        if prim in ("all_gather", "all_gather_invariant"):
            dim, tiled = p["all_gather_dimension"], p["tiled"]
            gathered = jnp.moveaxis(self.gather(args[0], axes), 0, dim)
            if tiled:
                shape = gathered.shape
                gathered = gathered.reshape(shape[:dim] + (shape[dim] * shape[dim + 1],)
                                            + shape[dim + 2:])
            return [gathered]
        if prim == "reduce_scatter":
            dim, tiled = p["scatter_dimension"], p["tiled"]
            total = _ordered_sum(self.gather(args[0], axes))
            pos = self.position(axes, coords)
            if tiled:
                block = total.shape[dim] // self.group_size(axes)
                return [lax.dynamic_slice_in_dim(total, pos * block, block, dim)]
            return [lax.dynamic_index_in_dim(total, pos, dim, keepdims=False)]
        raise ProgramError(f"{prim} is not supported inside a batched segment")  # (cut)

    def group_size(self, axes) -> int:
        axes = (axes,) if isinstance(axes, str) else axes
        return math.prod(self.size_of[a] for a in axes)

    def gather(self, x, axes):
        """Every group member's ``x`` along a new leading dimension, in position order."""
        from jax import lax

        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        for axis in reversed(axes):  # the last named innermost: the first named is major
            x = lax.all_gather(x, axis)
        n = self.group_size(axes)
        return x.reshape((n,) + x.shape[len(axes):])

    def position(self, axes, coords):
        """This device's position in its group over ``axes`` (the first named major)."""
        from jax import numpy as jnp

        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        pos = jnp.int32(0)
        for axis in axes:
            pos = pos * self.size_of[axis] + coords[self.number[axis]]
        return pos


def _ordered_sum(gathered):
    """``reduction.ordered_sum`` of the gathered values, in JAX: added along the reduction
    tree (``reduction.tree_fold``) in the values' ``sum_dtype``, rounded once at the end."""
    dtype = np.dtype(gathered.dtype)
    wide = reduction.sum_dtype(dtype)
    rows = [gathered[i].astype(wide) for i in range(gathered.shape[0])]
    return reduction.tree_fold(rows, lambda a, b: a + b).astype(dtype)


def _fold(gathered, fold):
    """The gathered values folded by ``fold`` along the reduction tree (pmax, pmin)."""
    return reduction.tree_fold([gathered[i] for i in range(gathered.shape[0])], fold)

