"""Fixtures of the program tests: a client of one host of 8 devices."""

import pytest

import pathways as pw


@pytest.fixture(scope="module")
def one_host():
    """One host of 8 devices (the twin): every mesh of it is one box, so a JAX body whose
    collectives stay on it runs as one computation for all 8."""
    with pw.local_cluster(hosts_per_island=1, devices_per_host=8, processes=False) as c, \
            pw.connect(c.address) as client:
        yield client
