"""Shared fixtures: clusters that are always torn down, on each transport."""

import pytest

import plaque


@pytest.fixture(params=["inproc", "tcp"])
def cluster(request):
    """A 2-worker cluster on the in-process transport and on real processes over tcp."""
    with plaque.local_cluster(workers=2, transport=request.param) as c:
        yield c


@pytest.fixture
def tcp_cluster3():
    with plaque.local_cluster(workers=3, transport="tcp", heartbeat_timeout=2.0) as c:
        yield c
