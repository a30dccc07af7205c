"""A collective's value that cannot leave its host fails its gang at once, with why, at the
caller and on the peers: not a peer's timeout a minute later (issue 30). The rest goes on."""

import numpy as np

import pathways as pw
from pathways import P
from pathways.host import ici
from pathways.testing import fails_once_then_recovers, twin


def psum_across_hosts_fails_once_then_recovers(owner, name, broken, message):
    """A psum across 2 hosts works; with ``owner.name`` broken it fails at once naming
    ``message`` (within 30 s: not the peers' 60 s collective timeout); then works again."""
    with twin(hosts_per_island=2, devices_per_host=2) as (_, client):
        mesh = client.mesh((4,), ("d",))
        total = pw.shard_map(lambda v: pw.psum(v, "d"), mesh, P("d"), P())
        x = client.put(np.arange(4.0), mesh, P("d"))
        want = fails_once_then_recovers(lambda: total(x), owner, name, broken, message)
        np.testing.assert_array_equal(want, [6.0])


def test_a_value_the_link_cannot_send_fails_the_gang_at_once_naming_why():
    real, broken = ici.encode, []

    def encode(items):
        if not broken:  # the first ICI message of the run cannot be made
            broken.append(True)
            raise ValueError("cannot include dtype 'E' in a buffer")
        return real(items)

    psum_across_hosts_fails_once_then_recovers(ici, "encode", encode,
                                               "cannot include dtype 'E' in a buffer")


def test_an_executor_that_fails_fails_its_waiting_gangs_at_once_and_keeps_serving():
    from pathways.host.exchange import Exchanges

    real, broken = Exchanges.receive, []

    def receive(self, *item):
        if self._parked and not broken:  # a bug of the executor's own, while a psum waits
            broken.append(True)
            raise RuntimeError("an executor bug")
        return real(self, *item)

    psum_across_hosts_fails_once_then_recovers(Exchanges, "receive", receive,
                                               "RuntimeError: an executor bug")
