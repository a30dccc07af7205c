"""Secure by default: a local cluster (``pw.local_cluster``, ``pathways up``) listens only on
Unix sockets in a private directory, which the kernel lets no other user enter; given TCP, it
makes a throw-away CURVE key pair in a private directory instead (as ``plaque.local_cluster``
does), so a stranger on this machine gets nothing into any of its sockets, let alone code run.
Either way the address it reports is all a client of the same user needs.

Whether a stranger's message gets into a TCP socket is read off the stranger's own socket:
ZeroMQ sends no message before the handshake, and a socket monitor tells whether the handshake
succeeded or failed, so no test waits for something not to happen. The stranger's message is a
pickle that, unpickled anywhere, creates a directory (``Mkdir``): on an insecure cluster it
does. Another user's connect to a Unix socket is refused by the kernel at once.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import zmq
from conftest import listening_ports, read_until, wait_until
from zmq.utils.monitor import recv_monitor_message

import pathways as pw
import plaque
from pathways import P, protocol
from pathways.cluster import LOOPBACK, LocalCluster
from plaque import security, wire

HANDSHAKE = {zmq.EVENT_HANDSHAKE_SUCCEEDED: "succeeded",
             zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "failed",
             zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "failed",
             zmq.EVENT_HANDSHAKE_FAILED_AUTH: "failed"}


class Mkdir:
    """Unpickled anywhere, creates ``path``: the stranger's stand-in for arbitrary code."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def stranger(ctx, address: str, frames: list, kind=zmq.DEALER, keys=None) -> str:
    """Connect a ``kind`` socket to ``address`` without the cluster's key (or as a CURVE
    client with the keys in ``keys``), send ``frames`` and say how the handshake ended:
    "succeeded" or "failed" (then nothing was sent)."""
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        security.client(s, keys)
    events = 0
    for event in HANDSHAKE:
        events |= event
    monitor = s.get_monitor_socket(events)
    try:
        s.connect(address)
        try:
            s.send_multipart(frames, zmq.NOBLOCK)  # queued until a handshake succeeds
        except zmq.Again:  # the handshake failed already, and its pipe went: nothing sent
            pass
        while True:
            assert monitor.poll(30_000), f"no handshake with {address} at all"
            event = recv_monitor_message(monitor)["event"]
            if event in HANDSHAKE:
                return HANDSHAKE[event]
    finally:
        s.disable_monitor()
        monitor.close(0)
        s.close(0)


def sockets(cluster) -> dict[str, int]:
    """Every TCP port a process of ``cluster`` listens on -> the socket type that talks to
    it: DEALER for the ROUTER ports (coordinator's clients, hosts' data), PUSH for the rest
    (Plaque's control and data channels, ICI), all PULL."""
    with pw.connect(cluster.address) as c:
        hosts = c.cluster_status()["hosts"]
    routers = {cluster.address.split("?")[0], *(h["data"] for h in hosts.values())}
    ports = {p for proc in cluster.processes for p in listening_ports(proc.pid)}
    assert len(ports) == 3 + 4 * len(hosts), "a cluster process is not listening as expected"
    return {f"tcp://127.0.0.1:{p}": (zmq.DEALER if f"tcp://127.0.0.1:{p}" in routers
                                     else zmq.PUSH) for p in sorted(ports)}


def poisoned(marker, kind) -> list:
    """A request (DEALER) or Plaque message (PUSH) carrying a ``Mkdir(marker)``."""
    if kind == zmq.DEALER:
        return protocol.pack(("status", 1, Mkdir(marker)))
    return wire.encode(wire.Kind.USER, 0, Mkdir(marker))


def psum_everywhere(client):
    mesh = client.mesh((4,), ("d",))
    f = pw.shard_map(lambda v: pw.psum(v, "d") + 1.0, mesh, P(), P())
    return f(client.put(np.ones(()), mesh, P())).result(timeout=30)


@pytest.fixture(autouse=True)
def no_keys_in_environment(monkeypatch):
    """The defaults under test apply when ``$PLAQUE_KEYS`` names no keys."""
    monkeypatch.delenv(security.ENV, raising=False)


@pytest.fixture(scope="module")
def cluster():
    """The default local cluster: Unix sockets in a private directory."""
    old = os.environ.pop(security.ENV, None)  # module scope: monkeypatch is not there yet
    try:
        with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2) as c:
            yield c
    finally:
        if old is not None:
            os.environ[security.ENV] = old


@pytest.fixture(scope="module")
def tcp_cluster():
    """A local cluster told to listen on TCP: throw-away CURVE keys, named by its address."""
    old = os.environ.pop(security.ENV, None)
    c = None
    try:
        c = LocalCluster(1, 2, 2, bind=LOOPBACK)
        c.wait_ready(4)
        yield c
    finally:
        if c is not None:
            c.close()
        if old is not None:
            os.environ[security.ENV] = old


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)  # also closes a socket an assertion left open


# ---- addresses that name their keys --------------------------------------------------------

def test_an_address_may_name_its_key_directory():
    assert security.split_address("tcp://127.0.0.1:5555?keys=/tmp/k") == \
        ("tcp://127.0.0.1:5555", "/tmp/k")
    assert security.split_address("tcp://127.0.0.1:5555") == ("tcp://127.0.0.1:5555", None)
    assert security.split_address(security.with_keys("tcp://h:1", "/a b")) == \
        ("tcp://h:1", "/a b")


@pytest.mark.parametrize("address", ["127.0.0.1:5555", "tcp://h:1?keys=", "tcp://h:1?key=/k",
                                      "tcp://h:1?/k"])
def test_a_malformed_address_is_a_clear_one_line_error(address):
    with pytest.raises(ValueError, match=r"^malformed address .*\?keys=DIR$"):
        pw.connect(address)
    out = subprocess.run([sys.executable, "-m", "pathways", "status", address],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.splitlines()[-1].startswith(
        "pathways status: error: argument address: malformed address")


def test_an_address_naming_missing_keys_says_the_cluster_stopped(tmp_path):
    """A ``?keys=`` address whose directory is gone is a stopped cluster's: that is what
    connect, ``pathways status`` and ``pathways host`` say, not how to make keys."""
    address = f"tcp://127.0.0.1:1?keys={tmp_path / 'gone'}"
    with pytest.raises(pw.CoordinatorLost) as err:
        pw.connect(address)
    assert str(err.value).startswith("the cluster at tcp://127.0.0.1:1 has stopped: the key"
                                     f" directory its address names ({tmp_path / 'gone'})")
    assert "pathways keys" not in str(err.value)
    for command in (["status", address], ["host", "--coordinator", address]):
        out = subprocess.run([sys.executable, "-m", "pathways", *command],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and out.stderr.splitlines() == [f"pathways: {err.value}"]


def test_keys_of_ones_own_that_are_missing_say_how_to_make_them(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no CURVE key pair in .*'pathways keys DIR'"):
        pw.connect("tcp://127.0.0.1:1", keys=tmp_path)  # there, but empty
    with pytest.raises(FileNotFoundError, match=r"no key directory .*'pathways keys DIR'"):
        pw.connect(f"tcp://127.0.0.1:1?keys={tmp_path}", keys=tmp_path / "typo")


def test_connecting_where_nothing_listens_says_so_without_keys():
    with pytest.raises(pw.CoordinatorLost) as err:  # 1 s, not the default 5 s, to say so
        pw.connect("tcp://127.0.0.1:1", coordinator_timeout=1.0)
    assert str(err.value).startswith("no coordinator answered at tcp://127.0.0.1:1 within 1 s:"
                                     " nothing accepts connections there: the cluster has"
                                     " stopped, or the address is wrong")
    assert "keys" not in str(err.value)


def test_connecting_to_something_that_never_answers_says_so(ctx):
    silent = ctx.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    with pytest.raises(pw.CoordinatorLost, match=f"no coordinator answered at tcp://127.0.0.1:"
                                                 f"{port} within 1 s: something accepted the"
                                                 " connection but sent nothing back"):
        pw.connect(f"tcp://127.0.0.1:{port}", coordinator_timeout=1.0)


# ---- pw.local_cluster -----------------------------------------------------------------------

def unix_sockets(directory) -> list[str]:
    """The Unix sockets bound in ``directory``."""
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.startswith("plaque-"))


STRANGER = textwrap.dedent("""
    import os, socket, sys
    if sys.argv[1] != "-":  # become another user of this machine (nobody)
        os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))
    for path in sys.argv[2:]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            print("connected", path)
        except PermissionError:
            print("refused", path)
        finally:
            s.close()
""")


def test_the_default_cluster_listens_only_on_unix_sockets_in_a_private_directory(cluster):
    directory = cluster.socket_dir
    assert cluster.address.startswith(f"ipc://{directory}/") and cluster.keys is None
    info = os.stat(directory)
    assert info.st_mode & 0o777 == 0o700 and info.st_uid == os.getuid()
    assert len(unix_sockets(directory)) == 3 + 4 * 2  # coordinator 3, each host 4
    assert all(not listening_ports(p.pid) for p in cluster.processes)  # no TCP at all
    with pw.connect(cluster.address) as client:
        assert psum_everywhere(client) == 5.0


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second user needs root")
def test_another_user_cannot_connect_to_any_socket_of_the_default_cluster(cluster):
    paths = unix_sockets(cluster.socket_dir)
    out = subprocess.run([sys.executable, "-c", STRANGER, "65534", *paths], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split("\n")
    assert sorted(line for line in out if line) == [f"refused {p}" for p in paths]
    mine = subprocess.run([sys.executable, "-c", STRANGER, "-", paths[0]], capture_output=True,
                          text=True, timeout=60, check=True)
    assert mine.stdout.split() == ["connected", paths[0]]  # the same check lets its user in
    assert all(p.poll() is None for p in cluster.processes)


def test_a_stopped_default_clusters_address_says_it_stopped():
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=1) as c:
        address, directory = c.address, c.socket_dir
    assert not os.path.exists(directory)
    with pytest.raises(pw.CoordinatorLost, match=r"^the cluster at ipc://.* has stopped: its"
                                                 " socket is gone"):
        pw.connect(address)


def test_the_socket_directory_goes_when_the_cluster_stops_even_on_error():
    with pytest.raises(RuntimeError, match="boom"):
        with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=1) as c:
            directory = c.socket_dir
            assert os.path.isdir(directory)
            raise RuntimeError("boom")
    assert not os.path.exists(directory)
    assert all(p.poll() is not None for p in c.processes)


def test_a_tcp_cluster_names_private_keys_and_the_address_is_enough(tcp_cluster):
    endpoint, keys = security.split_address(tcp_cluster.address)
    assert endpoint.startswith("tcp://127.0.0.1:") and keys == tcp_cluster.keys
    assert tcp_cluster.socket_dir is None
    assert os.stat(keys).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(keys, "cluster.key_secret")).st_mode & 0o777 == 0o600
    with pw.connect(tcp_cluster.address) as client:
        assert psum_everywhere(client) == 5.0


def test_arrays_larger_than_a_chunk_cross_a_curve_cluster_intact(tcp_cluster):
    """Over CURVE, buffers over ``wire.CHUNK`` travel in frames of a MiB: a put, a transfer
    between hosts (a P("d") array read whole) and a fetch of 3 MiB shards come back exact."""
    with pw.connect(tcp_cluster.address) as client:
        mesh = client.mesh((4,), ("d",))
        value = np.random.default_rng(0).random(3 * wire.CHUNK, dtype=np.float32)  # 12 MiB
        x = client.put(value, mesh, P("d"))
        doubled = pw.shard_map(lambda v: v * np.float32(2), mesh, P("d"), P("d"))(x)
        total = pw.shard_map(lambda v: v.sum(keepdims=True), mesh, P(), P())(doubled)
        np.testing.assert_array_equal(doubled.result(timeout=60), value * 2)
        np.testing.assert_array_equal(total.result(timeout=60), (value * 2).sum(keepdims=True))


def test_no_socket_of_a_tcp_cluster_lets_a_stranger_in(tcp_cluster, ctx, tmp_path):
    marker = tmp_path / "ran"
    for address, kind in sockets(tcp_cluster).items():
        assert stranger(ctx, address, poisoned(marker, kind), kind) == "failed", address
    other = security.ephemeral()
    try:  # a CURVE client with another key pair fails too
        assert stranger(ctx, tcp_cluster.address.split("?")[0],
                        poisoned(marker, zmq.DEALER), keys=other) == "failed"
    finally:
        security.discard(other)
    assert not marker.exists()
    assert all(p.poll() is None for p in tcp_cluster.processes)


def test_a_keyed_cluster_refuses_a_client_without_its_keys_at_once(tcp_cluster):
    """The plain address of a keyed cluster: the coordinator refuses the handshake, and
    connect says that its keys are what is missing (without waiting for a timeout)."""
    endpoint = tcp_cluster.address.split("?")[0]
    with pytest.raises(pw.CoordinatorLost) as err:
        pw.connect(endpoint, coordinator_timeout=60.0)  # refused: fails long before 60 s
    assert str(err.value) == (
        f"no coordinator answered at {endpoint}: it requires the cluster's CURVE keys and none"
        " were given: connect with the address the cluster printed (tcp://HOST:PORT?keys=DIR),"
        " keys=DIR or $PLAQUE_KEYS")
    other = security.ephemeral()
    try:  # keys, but another cluster's: dropped, said at the timeout
        with pytest.raises(pw.CoordinatorLost, match=rf"no coordinator answered at {endpoint}"
                                                     rf" within 1 s: it refused the keys in"
                                                     rf" {other}: they are not this cluster's"):
            pw.connect(endpoint, keys=other, coordinator_timeout=1.0)
    finally:
        security.discard(other)


def test_a_stopped_tcp_clusters_address_says_it_stopped():
    c = LocalCluster(1, 1, 1, bind=LOOPBACK)
    try:
        c.wait_ready(1)
        address, keys = c.address, c.keys
    finally:
        c.close()
    assert not os.path.exists(keys)
    with pytest.raises(pw.CoordinatorLost, match=r"^the cluster at tcp://127\.0\.0\.1:\d+ has"
                                                 " stopped"):
        pw.connect(address)


def test_insecure_gives_a_plain_cluster_a_stranger_runs_code_in(ctx, tmp_path):
    with pytest.raises(ValueError, match="contradict"):
        with pw.local_cluster(keys=tmp_path, insecure=True):
            pass
    marker = tmp_path / "ran"
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=1,
                          insecure=True) as c:
        assert c.keys is None and c.socket_dir is None and c.address.startswith("tcp://")
        assert stranger(ctx, c.address, poisoned(marker, zmq.DEALER)) == "succeeded"
        wait_until(marker.exists, timeout=30, interval=0.05)  # what the default prevents
        keys = security.ephemeral()
        try:
            with pytest.raises(pw.CoordinatorLost, match=f"no coordinator answered at"
                                                         f" {c.address}: it refused the keys"
                                                         r" in .*: it runs without keys"):
                pw.connect(c.address, keys=keys, coordinator_timeout=60.0)
        finally:
            security.discard(keys)


# ---- pathways up ----------------------------------------------------------------------------

def test_pathways_up_prints_an_address_its_user_and_hand_started_hosts_use(procs):
    env = {k: v for k, v in os.environ.items() if k != security.ENV}
    up = subprocess.Popen([sys.executable, "-m", "pathways", "up", "--hosts-per-island", "1",
                           "--devices-per-host", "2"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env)
    procs.append(up)
    lines = read_until(up, "pathways cluster up at")
    address = lines[-1].split()[4]
    assert address.startswith("ipc://") and not any("warning" in line for line in lines)
    directory = os.path.dirname(address[len("ipc://"):])
    assert os.stat(directory).st_mode & 0o777 == 0o700
    status = subprocess.run([sys.executable, "-m", "pathways", "status", address], env=env,
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert status.count("device ") == 2
    host = subprocess.Popen([sys.executable, "-m", "pathways", "host", "--coordinator",
                             address, "--devices", "2"], env=env)
    procs.append(host)
    with pw.connect(address) as client:
        deadline = time.monotonic() + 30
        while len(client.devices()) < 4:
            assert time.monotonic() < deadline, "the host started by hand never joined"
            time.sleep(0.1)
        assert psum_everywhere(client) == 5.0
    assert not listening_ports(host.pid)  # it listens next to the coordinator's socket
    up.send_signal(signal.SIGINT)
    assert up.wait(30) == 0
    assert not os.path.exists(directory)


# ---- plaque.local_cluster -------------------------------------------------------------------

def test_plaque_local_cluster_is_private_by_default_and_keyed_over_tcp(ctx):
    with plaque.local_cluster(workers=2) as c:
        directory = c.socket_dir
        assert c.keys is None and c.address.startswith(f"ipc://{directory}/")
        assert os.stat(directory).st_mode & 0o777 == 0o700 and len(c.workers()) == 2
        assert len(unix_sockets(directory)) == 2 * 3  # control and data, coordinator and workers
        assert all(not listening_ports(p.pid) for p in c.processes)
        if os.geteuid() == 0:
            paths = unix_sockets(directory)
            out = subprocess.run([sys.executable, "-c", STRANGER, "65534", *paths],
                                 capture_output=True, text=True, timeout=60, check=True).stdout
            assert sorted(out.split("\n"))[1:] == [f"refused {p}" for p in paths]
    assert not os.path.exists(directory)
    with plaque.local_cluster(workers=2, transport="tcp") as c:
        keys = c.keys
        assert os.stat(keys).st_mode & 0o777 == 0o700 and len(c.workers()) == 2
        control = c.address.split("|")[0]
        assert stranger(ctx, control, [b"PQ"], zmq.PUSH) == "failed"
    assert not os.path.exists(keys)
    with plaque.local_cluster(workers=1, transport="tcp", insecure=True) as c:
        assert c.keys is None
        assert stranger(ctx, c.address.split("|")[0], [b"PQ"], zmq.PUSH) == "succeeded"


# ---- processes started by hand ----------------------------------------------------------------

HAND_STARTED = {
    "pathways coordinator": ["pathways", "coordinator"],
    "pathways host": ["pathways", "host", "--coordinator", "tcp://127.0.0.1:1"],
    "plaque worker": ["plaque", "worker", "--join", "tcp://127.0.0.1:1"],
}


@pytest.mark.parametrize("what", sorted(HAND_STARTED))
def test_a_process_started_by_hand_without_keys_refuses_to_listen_on_tcp(what):
    env = {k: v for k, v in os.environ.items() if k != security.ENV}
    out = subprocess.run([sys.executable, "-m", *HAND_STARTED[what]], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert line.startswith(f"{what}: will not listen on tcp://127.0.0.1 without keys")
    assert "'pathways keys DIR'" in line and "--insecure" in line


def test_a_coordinator_started_by_hand_listens_with_keys_in_a_private_directory_or_insecure(
        tmp_path, ctx):
    env = {k: v for k, v in os.environ.items() if k != security.ENV}
    private = tmp_path / "sockets"
    private.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    keys = security.ephemeral()
    marker = tmp_path / "ran"
    try:
        for argv, extra_env, warned in (
                (["--bind", f"ipc://{private}/"], {}, False),
                ([], {security.ENV: keys}, False),
                (["--insecure"], {}, True)):
            coord = subprocess.Popen([sys.executable, "-m", "pathways", "coordinator", *argv],
                                     env={**env, **extra_env}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            try:
                address = read_until(coord, "pathways coordinator at")[-1].split()[-1]
                if warned:  # plain tcp: what the refusal protects against
                    assert stranger(ctx, address, poisoned(marker, zmq.DEALER)) == "succeeded"
                    wait_until(marker.exists, timeout=30, interval=0.05)
            finally:
                coord.terminate()
                try:
                    err = coord.communicate(timeout=30)[1]
                except subprocess.TimeoutExpired:  # it must not outlive the test
                    coord.kill()
                    coord.communicate()
                    raise
            assert (security.INSECURE_WARNING in err) == warned, err
        out = subprocess.run([sys.executable, "-m", "pathways", "coordinator", "--bind",
                              f"ipc://{shared}/"], env=env, capture_output=True, text=True,
                             timeout=60)  # a directory other users may enter is not private
        assert out.returncode == 2 and "will not listen on ipc://" in out.stderr
    finally:
        security.discard(keys)


def test_a_client_sends_large_buffers_chunked_to_a_cluster_with_keys(tcp_cluster):
    """Its sockets to an encrypting cluster chunk messages (``plaque.wire.chunked``), as
    decided when each socket was made; a buffer over a chunk comes back whole."""
    with pw.connect(tcp_cluster.address) as client:
        mesh = client.mesh((1,), ("d",))
        big = np.arange(3 << 18, dtype=np.float64)  # 6 MiB: six chunks
        np.testing.assert_array_equal(client.put(big, mesh, P()).result(60), big)
        assert client.session.chunks(client.session.address)
        assert client.session.chunks(client.cluster.data_address(mesh.devices[0].id))
    with pw.local_cluster(islands=1, hosts_per_island=1, devices_per_host=1,
                          insecure=True) as plain, pw.connect(plain.address) as client:
        mesh = client.mesh((1,), ("d",))
        np.testing.assert_array_equal(client.put(big, mesh, P()).result(60), big)
        assert not client.session.chunks(client.cluster.data_address(mesh.devices[0].id))
