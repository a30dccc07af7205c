"""The cost model of emulated hardware: how long a kernel or a transfer takes. Pure, no clocks.

Emulated TPUs really run each kernel's numpy body, but they are *occupied* for a modelled
duration, so utilization is measurable and the cluster can stand for hardware far larger than
this machine (the paper's "honest" emulated devices). The model is deliberately small:

- a device is a roofline: a kernel takes ``max(flops / peak flops, bytes / HBM bandwidth)``;
- a link (ICI inside an island, DCN between islands) is ``latency + bytes / bandwidth``;
- a user may give a compiled function an explicit ``cost=`` (seconds, or a function of the
  input shapes); otherwise ``estimate_kernel`` guesses from the arrays' sizes.

Worked example: an elementwise add of two 1 MiB float32 arrays on the default ``DeviceSpec``
moves 3 MiB (two in, one out) and does 262144 flops; bandwidth dominates:
3 MiB / 800 GB/s ~= 3.9 us.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DeviceSpec:
    """One emulated accelerator: HBM capacity (bytes), peak FLOP/s, HBM bandwidth (bytes/s).
    ``real``: a real device (``pathways host --backend jax``), whose kernels take the time
    they really take: no modelled time (``flops`` and ``hbm_bandwidth`` are not used).

    >>> spec = pw.DeviceSpec(hbm_bytes=32 << 30, flops=200e12)
    >>> seconds = 2 * 4096**3 / spec.flops    # a 4096-square matmul at peak, for cost=
    """

    hbm_bytes: int = 16 << 30
    flops: float = 100e12
    hbm_bandwidth: float = 800e9
    kind: str = "tpu-emu"
    real: bool = False


# what backs a host's devices: modelled TPUs, or its process's own JAX devices (real ones)
BACKENDS = ("emulated", "jax")


@dataclass(frozen=True)
class LinkSpec:
    """A modelled link: fixed latency (seconds) plus bytes / bandwidth (bytes/s)."""

    latency: float
    bandwidth: float


# Inter-chip interconnect inside an island, and the data-centre network between islands.
ICI = LinkSpec(latency=5e-6, bandwidth=100e9)
DCN = LinkSpec(latency=50e-6, bandwidth=12.5e9)


def check_seconds(value, what: str = "cost") -> float:
    """Return ``value`` as a float number of seconds, or raise ValueError saying what is wrong.

    Accepts ints, floats and numpy scalars; rejects bools, NaN, infinities and negatives.
    """
    if type(value) is float and 0.0 <= value < math.inf:  # the common case, checked cheaply
        return value
    # bool is an Integral, but ``cost=True`` is certainly a mistake, not one second.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number of seconds, got {type(value).__name__}: "
                         f"{value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be a finite, non-negative number of seconds, "
                         f"got {value!r}")
    return seconds


def kernel_time(flops: float, bytes_accessed: float, spec: DeviceSpec) -> float:
    """Roofline time of a kernel: whichever of compute and HBM traffic takes longer."""
    if flops < 0 or bytes_accessed < 0:
        raise ValueError(f"flops and bytes must be >= 0, got {flops!r} and {bytes_accessed!r}")
    return max(flops / spec.flops, bytes_accessed / spec.hbm_bandwidth)


def estimate_kernel(inputs: Iterable, outputs: Iterable, spec: DeviceSpec) -> float:
    """A crude default duration for a kernel the user gave no ``cost=`` for.

    Bytes are every input and output array read or written once; flops are one per output
    element, as if the kernel were elementwise. This under-counts matmuls and convolutions
    badly (O(n^3) flops on O(n^2) bytes), so real models should pass ``cost=``, which overrides
    this estimate. Arrays may be numpy arrays or anything with ``nbytes`` and ``size`` (e.g. a
    shape-and-dtype description), so the estimate can be made before the outputs exist.
    """
    outputs = list(outputs)
    nbytes = sum(_nbytes(a) for a in inputs) + sum(_nbytes(a) for a in outputs)
    flops = sum(_size(a) for a in outputs)
    return kernel_time(flops, nbytes, spec)


def transfer_time(nbytes: int, link: LinkSpec) -> float:
    """Time to move ``nbytes`` over ``link``; nothing to move costs nothing, not a latency."""
    if nbytes < 0:
        raise ValueError(f"cannot transfer a negative number of bytes: {nbytes!r}")
    if nbytes == 0:
        return 0.0
    return link.latency + nbytes / link.bandwidth


def resolve_cost(cost: float | Callable | None, in_shapes, default: float) -> float:
    """The modelled duration of one call of a compiled function, in seconds.

    ``cost`` is what the user gave: None (use ``default``, usually ``estimate_kernel``), a
    number of seconds, or a callable taking ``in_shapes`` (the input shapes, as the caller
    passes them) and returning seconds. Every answer is checked; a bad one raises ValueError.
    """
    if cost is None:
        return check_seconds(default, "default cost")
    if callable(cost):
        name = getattr(cost, "__name__", repr(cost))
        return check_seconds(cost(in_shapes), f"cost function {name}({in_shapes!r})")
    return check_seconds(cost, "cost")


def _nbytes(array) -> int:
    nbytes = getattr(array, "nbytes", None)
    return int(nbytes) if nbytes is not None else np.asarray(array).nbytes


def _size(array) -> int:
    size = getattr(array, "size", None)
    return int(size) if size is not None else np.asarray(array).size
