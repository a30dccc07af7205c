"""CURVE security: with keys, only peers holding the cluster's key get anything through; and a
multi-host run over real TCP between network namespaces joined by veth, with CURVE."""

import os
import shutil
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import zmq
from conftest import read_until

import pathways as pw
from pathways import P, protocol
from plaque.security import split_address


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    out = subprocess.run([sys.executable, "-m", "pathways", "keys", str(d)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "wrote" in out and (d / "cluster.key_secret").exists()
    assert (d / "cluster.key_secret").stat().st_mode & 0o077 == 0  # secret is private
    return d


@pytest.fixture(scope="module")
def secured(keys):
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2, keys=keys) as c:
        yield c


def psum_everywhere(client):
    mesh = client.mesh((4,), ("d",))
    f = pw.shard_map(lambda v: pw.psum(v, "d") + 1.0, mesh, P(), P())
    return f(client.put(np.ones(()), mesh, P())).result(timeout=30)


def test_a_client_with_the_key_runs_across_hosts(secured, keys):
    with pw.connect(secured.address, keys=keys) as c:
        assert psum_everywhere(c) == 5.0


def test_a_client_without_the_key_or_with_another_key_gets_nowhere(secured, tmp_path):
    with pytest.raises(pw.PathwaysError, match="no coordinator answered.*keys"):
        pw.connect(secured.address, timeout=2.0)
    subprocess.run([sys.executable, "-m", "pathways", "keys", str(tmp_path / "other")],
                   capture_output=True, timeout=60, check=True)
    with pytest.raises(pw.PathwaysError, match="no coordinator answered"):
        pw.connect(secured.address, timeout=2.0, keys=tmp_path / "other")


def test_unauthenticated_messages_never_reach_any_server_socket(secured, keys):
    with pw.connect(secured.address, keys=keys) as c:
        status = c.cluster_status()
        data = {h["data"] for h in status["hosts"].values()}
        ici = [h["ici"] for h in status["hosts"].values()]
    ctx = zmq.Context()
    try:
        for address in [secured.address, *data]:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(address)
            s.send_multipart(protocol.pack(protocol.Status(1)))  # a valid request, no key
            assert s.poll(1500) == 0  # never answered: it was never delivered
            s.close(0)
        for address in ici:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(address)
            s.send_multipart([b"\x80\x05garbage"], zmq.NOBLOCK)
            s.close(0)
    finally:
        ctx.destroy(linger=0)  # also closes a socket an assertion left open
    with pw.connect(secured.address, keys=keys) as c:  # everything still serves
        assert psum_everywhere(c) == 5.0
        assert all(p.poll() is None for p in secured.processes)


# ---- hosts in separate network namespaces, over real TCP, with CURVE ----------------------

def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=check)


@pytest.fixture
def namespaces():
    """Two network namespaces on a bridge 10.77.0.0/24 (this side 10.77.0.1)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = uuid.uuid4().hex[:5]
    bridge, names = f"pwbr{tag}", [f"pwns{tag}{i}" for i in range(2)]
    made = []
    try:
        if _ip("netns", "add", names[0], check=False).returncode:
            pytest.skip("cannot create network namespaces here")
        made.append(("netns", names[0]))
        _ip("netns", "add", names[1])
        made.append(("netns", names[1]))
        _ip("link", "add", bridge, "type", "bridge")
        made.append(("link", bridge))
        _ip("addr", "add", "10.77.0.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, ns in enumerate(names):
            outside, inside = f"pwv{tag}{i}", f"pwp{tag}{i}"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            made.append(("link", outside))
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", f"10.77.0.{i + 2}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield names
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces unavailable: {exc.stderr.strip()}")
    finally:
        for kind, name in reversed(made):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)


def test_hosts_in_separate_network_namespaces_run_a_program_with_curve(namespaces, keys,
                                                                        procs):
    env = dict(os.environ, PLAQUE_KEYS=str(keys), PLAQUE_DIE_WITH_PARENT="1")
    coord = subprocess.Popen([sys.executable, "-m", "pathways", "coordinator", "--bind",
                              "tcp://10.77.0.1"], stdout=subprocess.PIPE, text=True,
                             env=env)
    procs.append(coord)
    line = read_until(coord, "pathways coordinator at")[-1]
    assert line.startswith("pathways coordinator at tcp://10.77.0.1:"), line
    address = line.split()[-1]
    for i, ns in enumerate(namespaces):
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "pathways", "host",
             "--coordinator", address, "--bind", f"tcp://10.77.0.{i + 2}",
             "--devices", "2"], env=env))
    with pw.connect(address, keys=keys) as c:
        deadline = time.monotonic() + 30
        while len(c.devices()) < 4:
            assert all(p.poll() is None for p in procs), "a process exited"
            assert time.monotonic() < deadline, "the hosts never joined"
            time.sleep(0.1)
        info = c.cluster_status()["hosts"]
        assert sorted(h["data"].split(":")[1] for h in info.values()) == \
            ["//10.77.0.2", "//10.77.0.3"]  # each host on its own namespace's address
        assert psum_everywhere(c) == 5.0
    endpoint, named = split_address(address)  # as printed, the address names the keys
    assert named == str(keys)
    with pytest.raises(pw.PathwaysError, match="no coordinator answered"):
        pw.connect(endpoint, timeout=2.0)  # without the key: refused
