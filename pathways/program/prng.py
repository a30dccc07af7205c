"""JAX's typed PRNG keys (``jax.random.key``) on a cluster: kept as their key data.

A typed key array has an extended dtype (``key<fry>``) that numpy cannot hold. Pathways keeps
one as its key data (``jax.random.key_data``: uint32, with the impl's key shape as trailing
dimensions: four threefry keys are ``uint32[4, 2]``) and the impl's name in its ``Aval``
(``Aval.key``). Stores, transfers, specs and checkpoints see the data; a JAX body gets keys
(``wrap``) and its key outputs leave as data (``unwrap``); ``Array.result`` and
``pw.reference`` give key arrays back. A spec names the key array's own dimensions only: the
data's trailing ones stay whole on every device.

Only JAX's named impls travel ("threefry2x32", "rbg", "unsafe_rbg"): a custom ``PRNGImpl``
has no name a host could make it again from. Nothing here imports JAX before a key exists.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from ..errors import ProgramError

__all__ = ["data_aval", "data_of", "impl_of", "impl_of_dtype", "is_key", "key_dtype", "key_ndim",
           "unwrap", "unwrapped", "wrap", "wrapped"]


def _jax():
    return sys.modules.get("jax")


def is_key(value) -> bool:
    """Whether ``value`` is a JAX array of typed PRNG keys (False, importing nothing, if JAX
    is not loaded)."""
    jax = _jax()
    return (jax is not None and isinstance(value, jax.Array)
            and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key))


def impl_of(keys) -> str:
    """The name of the impl of the key array ``keys``; ProgramError for a custom one."""
    impl = _jax().random.key_impl(keys)
    if not isinstance(impl, str):
        raise ProgramError(f"a key array of the custom PRNG impl {impl!r} cannot be sent to"
                           " a cluster; use one of JAX's named impls (threefry2x32, rbg,"
                           " unsafe_rbg), or its key data (jax.random.key_data)")
    return impl


def data_of(keys) -> tuple[np.ndarray, str]:
    """(the key data of the key array ``keys`` as numpy, its impl's name)."""
    impl = impl_of(keys)
    return np.asarray(_jax().random.key_data(keys)), impl


@functools.cache
def _sample(impl: str):
    jax = _jax() or __import__("jax")
    return jax.random.key(0, impl=impl)


def key_ndim(impl: str) -> int:
    """How many trailing dimensions the key data of ``impl`` adds (threefry2x32: 1)."""
    return _jax().random.key_data(_sample(impl)).ndim


def key_dtype(impl: str):
    """JAX's dtype of ``impl``'s keys (``key<fry>``)."""
    return _sample(impl).dtype


def wrap(data, impl: str):
    """The key array whose key data is ``data`` (numpy or JAX, traced or not)."""
    return (_jax() or __import__("jax")).random.wrap_key_data(data, impl=impl)


def unwrap(value) -> tuple[object, str | None]:
    """(``value``'s key data, its impl) for a key array (traced or not); (``value``, None)
    for anything else."""
    jax, dtype = _jax(), getattr(value, "dtype", None)
    if jax is None or dtype is None or not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return value, None
    return jax.random.key_data(value), impl_of(value)


def impl_of_dtype(dtype) -> str | None:
    """The impl's name of a key dtype (of a JAX aval: a value inside a traced body), or None
    for any other dtype. (JAX has no public way from a key dtype to its impl: its ``_impl``
    is read.)"""
    jax = _jax()
    if jax is None or dtype is None or not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return None
    return dtype._impl.name


def data_aval(aval) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of what a value of the JAX aval ``aval`` is kept as: its key data for
    keys, itself for the rest."""
    impl = impl_of_dtype(aval.dtype)
    if impl is None:
        return tuple(aval.shape), aval.dtype
    data = _jax().random.key_data(_sample(impl))
    return tuple(aval.shape) + data.shape, np.dtype(data.dtype)


def wrapped(values, impls) -> list:
    """``values`` with those whose impl in ``impls`` is not None made keys (``wrap``)."""
    return [v if k is None else wrap(v, k) for v, k in zip(values, impls)]


def unwrapped(values) -> tuple:
    """``values`` with each key array as its key data (``unwrap``)."""
    return tuple(unwrap(v)[0] for v in values)

