"""Pytest fixtures of a Pathways cluster, for a ``conftest.py``::

    from pathways.testing.fixtures import client, pw_cluster  # noqa: F401

``pw_cluster``: one island, 2 hosts x 4 emulated TPUs, in this process (the twin), shared by
the test session; ``pw_process_cluster``: the same as host processes over TCP with CURVE;
``client``: a client of ``pw_cluster`` for one test, closed after it.
``$PATHWAYS_TEST_BACKEND=jax`` makes ``pw_cluster`` host processes whose devices are their own
JAX devices (``local_cluster(backend="jax")``): the same tests, run on real devices.
"""

from __future__ import annotations

import os

import pytest

from ..client.client import connect
from ..cluster import local_cluster

__all__ = ["client", "in_process_only", "pw_cluster", "pw_process_cluster"]


BACKEND = os.environ.get("PATHWAYS_TEST_BACKEND", "emulated")

# a test of what only the in-process twin's emulated hosts do (modelled kernel time, batched
# segments, a body that only this process can unpickle): skipped when pw_cluster is of real
# devices
in_process_only = pytest.mark.skipif(BACKEND != "emulated",
                                     reason="needs pw_cluster's in-process emulated hosts")


@pytest.fixture(scope="session")
def pw_cluster():
    """One island, 2 hosts x 4 emulated TPUs, shared by the test session: the in-process twin
    (threads, same code paths)."""
    with local_cluster(islands=1, hosts_per_island=2, devices_per_host=4,
                       processes=BACKEND != "emulated", backend=BACKEND) as c:
        yield c


@pytest.fixture(scope="session")
def pw_process_cluster():
    """The same cluster as host processes over TCP with CURVE, shared by the test session."""
    with local_cluster(islands=1, hosts_per_island=2, devices_per_host=4) as c:
        yield c


@pytest.fixture
def client(pw_cluster):
    """A client of the session's twin cluster, closed after the test."""
    with connect(pw_cluster.address) as c:
        yield c
