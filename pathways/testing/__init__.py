"""Helpers for tests of programs that run on Pathways, the ones this project's own tests use.

- ``twin(...)``: a cluster and a connected client in this process (the in-process twin: the
  real coordinator and hosts as threads, real messages, no processes), torn down on exit;
- ``wait_until(predicate, timeout)``: poll a condition another thread or process makes true,
  failing instead of hanging;
- ``store_bytes(client)`` and ``wait_for_store_bytes(client, want)``: what the hosts' object
  stores hold, asked of the hosts themselves (frees travel asynchronously), to check that a
  program leaves nothing behind;
- ``rand(*shape, seed=)``: reproducible float32 arguments;
- ``fails_once_then_recovers(call, owner, name, broken, message)``: a program works, fails
  at once with ``owner.name`` replaced by a broken one, and works again once it is back;
- ``fixtures``: the same as pytest fixtures (``from pathways.testing.fixtures import
  pw_cluster, client`` in a ``conftest.py``).

Plaque's own (the transport conformance suite, a simulated network) are in ``plaque.testing``.

>>> with twin(hosts_per_island=1, devices_per_host=2) as (cluster, client):
...     mesh = client.mesh((2,), ("d",))
...     x = client.put(np.arange(4.0), mesh, P("d"))
...     x.delete()
...     wait_for_store_bytes(client, 0)
0
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from .. import protocol
from ..client.client import connect
from ..cluster import local_cluster
from ..errors import PathwaysError

__all__ = ["fails_once_then_recovers", "host_stats", "jax_specs", "rand", "store_bytes",
           "twin", "wait_for_store_bytes", "wait_until"]


@contextlib.contextmanager
def twin(islands: int = 1, hosts_per_island: int = 2, devices_per_host: int = 4, **options):
    """An in-process cluster (``local_cluster(processes=False, ...)``) and a client of it:
    yields ``(cluster, client)``; both are closed on exit, even when the block raises."""
    with local_cluster(islands=islands, hosts_per_island=hosts_per_island,
                       devices_per_host=devices_per_host, processes=False,
                       **options) as cluster, connect(cluster.address) as client:
        yield cluster, client


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.001) -> None:
    """Poll ``predicate`` until it is true; ``AssertionError`` after ``timeout`` seconds. Use a
    longer ``interval`` when checking costs a round trip."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition never became true")
        time.sleep(interval)


def host_stats(client, timeout: float = 10.0) -> list[dict]:
    """The object-store statistics of every host, asked of the hosts directly."""
    return [client.session.request(address, protocol.Status(None)).result(timeout)["store"]
            for address in sorted(client.cluster.data_addresses())]


def store_bytes(client) -> int:
    """Bytes the hosts' object stores hold now, all clients together."""
    return sum(sum(s["bytes"].values()) if isinstance(s.get("bytes"), dict) else 0
               for s in host_stats(client))


def wait_for_store_bytes(client, want: int, timeout: float = 5.0) -> int:
    """Poll the hosts until their stores hold ``want`` bytes or ``timeout`` passes; returns
    what they hold then (compare it: frees reach the hosts after ``delete`` returns)."""
    deadline = time.monotonic() + timeout
    got = store_bytes(client)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = store_bytes(client)
    return got


def jax_specs(specs):
    """``specs`` (a P, or a tree of them; None: replicated) as JAX's PartitionSpecs, to run
    the same body under ``jax.shard_map`` for comparison. Needs JAX."""
    from jax.sharding import PartitionSpec

    from ..program.sharding import P

    if specs is None or isinstance(specs, P):
        return PartitionSpec(*(specs or ()))
    if isinstance(specs, dict):
        return {k: jax_specs(v) for k, v in specs.items()}
    return type(specs)(jax_specs(s) for s in specs)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    """Standard normal float32 values of ``shape``: the same ones for the same ``seed``."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def fails_once_then_recovers(call, owner, name: str, broken, message: str,
                             timeout: float = 30.0):
    """``call()`` (a program's call: a future) works; with ``owner.name`` replaced by
    ``broken`` it fails with a ``PathwaysError`` matching ``message`` within ``timeout``
    (a fault must fail its gang at once, not after a waiting peer's collective timeout);
    with it restored, the call gives the first result again, which is returned."""
    import pytest  # a test's helper: the kit itself imports without pytest

    want = call().result(timeout)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(owner, name, broken)
        with pytest.raises(PathwaysError, match=message):
            call().result(timeout)
    np.testing.assert_array_equal(call().result(timeout), want)
    return want
