"""Hierarchical collectives on the real host code (a simulated cluster of 8 hosts): every
reduction equals ``pw.reference``'s bitwise, by the flat and the tree algorithm alike, and a
host receives one message per tree level, not one per other host."""

import ml_dtypes
import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.host import hierarchy

HOSTS, PER_HOST = 8, 2


def bodies():
    """(name, body, in spec, out spec) of every reduction, over groups within a host ("d":
    its two devices), across hosts ("h": one device of each) and both ("h", "d")."""
    return [
        ("psum all", lambda x: pw.psum(x, ("h", "d")), P(("h", "d")), P()),
        ("psum h", lambda x: pw.psum(x, "h"), P(("h", "d")), P("d")),
        ("pmean d", lambda x: pw.pmean(x, "d"), P(("h", "d")), P("h")),
        ("pmax", lambda x: pw.pmax(x, ("h", "d")), P(("h", "d")), P()),
        ("pmin h", lambda x: pw.pmin(x, "h"), P(("h", "d")), P("d")),
        ("psum_scatter", lambda x: pw.psum_scatter(x, ("h", "d"), tiled=True),
         P(), P(("h", "d"))),
        ("all_gather", lambda x: pw.all_gather(x, ("h", "d"), tiled=True),
         P(("h", "d")), P()),
    ]


def inputs(rng):
    # magnitudes 1e-8 to 1e8: any other order of additions shows in the bits
    n = HOSTS * PER_HOST * 16  # 16 values per device: enough to cut into 8 chunks
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
    return [x.astype(np.float32), x.astype(ml_dtypes.bfloat16)]


@pytest.mark.parametrize("flat_hosts,scatter_bytes", [(0, 1 << 40), (99, 1 << 40), (0, 1)],
                         ids=["tree", "flat", "scatter"])
def test_reductions_equal_the_reference_bitwise_on_eight_hosts(flat_hosts, scatter_bytes,
                                                              monkeypatch):
    monkeypatch.setattr(hierarchy, "FLAT_HOSTS", flat_hosts)
    monkeypatch.setattr(hierarchy, "SCATTER_BYTES", scatter_bytes)
    cut = []  # values the scatter algorithm cut into chunks
    chunks = hierarchy.chunks
    monkeypatch.setattr(hierarchy, "chunks", lambda v, n: cut.append(n) or chunks(v, n))
    rng = np.random.default_rng(11)
    with pw.local_cluster(hosts_per_island=HOSTS, devices_per_host=PER_HOST,
                          simulate=True) as cluster, pw.connect(cluster.address) as client:
        mesh = client.mesh((HOSTS, PER_HOST), ("h", "d"))
        for name, body, in_spec, out_spec in bodies():
            f = pw.shard_map(body, mesh, in_spec, out_spec)
            for x in inputs(rng):
                got = f(client.put(x, mesh, in_spec)).result(timeout=60)
                want = pw.reference(f)(x)
                assert got.dtype == want.dtype and got.shape == want.shape, name
                assert got.tobytes() == want.tobytes(), (name, x.dtype)
    # every reduction but all_gather scattered when it could (whole hosts: 8 chunks)
    assert (set(cut) == {HOSTS}) if scatter_bytes == 1 else not cut


def test_a_host_receives_one_message_per_tree_level(monkeypatch):
    monkeypatch.setattr(hierarchy, "FLAT_HOSTS", 0)
    with pw.local_cluster(hosts_per_island=HOSTS, devices_per_host=PER_HOST,
                          simulate=True) as cluster, pw.connect(cluster.address) as client:
        mesh = client.mesh((HOSTS * PER_HOST,), ("d",))
        step = pw.shard_map(lambda x: pw.psum(x, "d") * 0.5, mesh, P(), P())

        @pw.program
        def chain(x):
            for _ in range(10):
                x = step(x)
            return x

        x = client.put(np.float64(1.0), mesh, P())
        x = chain(x)
        x.result(timeout=60)  # installed and warm
        links = [host.ici for host, _, _ in cluster.hosts]
        before = [link.sent["messages"] for link in links]
        x = chain(x)
        assert float(x.result(timeout=60)) == pw.reference(chain)(np.float64(8.0 ** 10))
        sent = [link.sent["messages"] - b for link, b in zip(links, before)]
        # log2(8) = 3 levels: 3 messages out of each host per psum (turns may merge some)
        assert sum(sent) <= 10 * HOSTS * 3 and max(sent) <= 10 * 3


@pytest.mark.parametrize("scatter", [False, True], ids=["tree", "scatter"])
def test_a_host_killed_mid_reduction_fails_its_gangs_and_seven_hosts_go_on(scatter,
                                                                          monkeypatch):
    """8 hosts of one device: a host is killed while reductions that need it are in flight.
    They fail with HostLost naming it, within a bound; a mesh of the 7 others (a tree that is
    not a power of two) keeps reducing, with the reference's bits."""
    monkeypatch.setattr(hierarchy, "FLAT_HOSTS", 0)
    monkeypatch.setattr(hierarchy, "SCATTER_BYTES", 1 if scatter else 1 << 40)
    n = 64 if scatter else 1
    with pw.local_cluster(hosts_per_island=8, devices_per_host=1, simulate=True, seed=5,
                          heartbeat_timeout=2.0) as cluster:
        with pw.connect(cluster.address) as a, pw.connect(cluster.address) as b:
            hosts = {d.id: d.host for d in a.devices()}
            everywhere = a.mesh((8,), ("d",))
            victim = hosts[everywhere.ids[3]]
            slow = pw.shard_map(lambda v: pw.psum(v, "d") + 1.0, everywhere, P(), P(),
                                cost=0.2)
            doomed = [slow(a.put(np.zeros(n), everywhere, P())) for _ in range(3)]
            b.mesh((8,), ("all",))
            safe = tuple(d for d, h in hosts.items() if h != victim)
            seven = pw.Mesh((7,), ("d",), safe, client=b)
            step = pw.shard_map(lambda v: pw.psum(v, "d") * np.float32(0.5), seven, P("d"),
                                P("d"))
            x0 = np.random.default_rng(2).standard_normal(7 * n).astype(np.float32)
            x = b.put(x0, seven, P("d"))
            cluster.kill_host(victim, at=cluster.clock() + 0.05)
            want = x0
            for _ in range(5):
                x = step(x)
                want = pw.reference(step)(want)
            assert x.result(timeout=30).tobytes() == want.tobytes()
            killed_at = cluster.clock()
            for y in doomed:
                with pytest.raises(pw.HostLost, match=f"host {victim}"):
                    y.result(timeout=60)
            assert cluster.clock() - killed_at < 10.0  # virtual seconds: a bound, not a speed
