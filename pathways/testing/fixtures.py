"""Pytest fixtures of a Pathways cluster, for a ``conftest.py``::

    from pathways.testing.fixtures import client, pw_cluster  # noqa: F401

``pw_cluster``: one island, 2 hosts x 4 emulated TPUs, in this process (the twin), shared by
the test session; ``pw_process_cluster``: the same as host processes over TCP with CURVE;
``client``: a client of ``pw_cluster`` for one test, closed after it.
"""

from __future__ import annotations

import pytest

from ..client.client import connect
from ..cluster import local_cluster

__all__ = ["client", "pw_cluster", "pw_process_cluster"]


@pytest.fixture(scope="session")
def pw_cluster():
    """One island, 2 hosts x 4 emulated TPUs, shared by the test session: the in-process twin
    (threads, same code paths)."""
    with local_cluster(islands=1, hosts_per_island=2, devices_per_host=4,
                       processes=False) as c:
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
