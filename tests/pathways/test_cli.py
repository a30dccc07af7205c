"""The command line as a user drives it: pathways up, host, status; plaque worker."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, read_until, wait_until

import pathways as pw
from pathways import P


def start(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def status(address):
    out = subprocess.run([sys.executable, "-m", "pathways", "status", address],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


def wait_for_devices(address, n: int, what: str, timeout: float = 60.0) -> None:
    """Until ``pathways status`` shows ``n`` devices; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while status(address).count("device ") < n:
        assert time.monotonic() < deadline, f"{what} never joined"
        time.sleep(0.2)


def test_up_host_status_and_clean_shutdown(procs):
    up = start("pathways", "up", "--islands", "2", "--hosts-per-island", "1",
               "--devices-per-host", "2", env=dict(os.environ))
    procs.append(up)
    line = read_until(up, "pathways cluster up at")[-1]
    address = line.split()[4]
    text = status(address)
    assert text.count("device ") == 4 and "island 0 host" in text and "island 1 host" in text
    extra = start("pathways", "host", "--coordinator", address, "--island", "1",
                  "--devices", "3")
    procs.append(extra)
    wait_for_devices(address, 7, "the added host", timeout=30)
    up.send_signal(signal.SIGINT)
    assert up.wait(30) == 0
    assert extra.wait(30) == 0  # the host notices its coordinator is gone and exits


def test_replace_a_host_as_the_readme_says(procs):
    """The README's recipe: ``pathways status`` names each host's pid; kill one, start
    ``pathways host`` against the coordinator, ``client.remap(mesh)``: the same step and
    array run again on the new host's devices."""
    up = start("pathways", "up", "--hosts-per-island", "2", "--devices-per-host", "2",
               env=dict(os.environ))
    procs.append(up)
    address = read_until(up, "pathways cluster up at")[-1].split()[4]
    hosts = re.findall(r"island (\d+) host (\d+) \(([^,]+), pid (\d+)\):", status(address))
    with pw.connect(address) as client:
        info = client.cluster_status()["hosts"]
        assert sorted(int(h) for _, h, _, _ in hosts) == sorted(info)
        for _, host, hostname, pid in hosts:  # the pid status shows is the host's own
            assert (hostname, int(pid)) == (info[int(host)]["hostname"], info[int(host)]["pid"])
        mesh = client.mesh((4,), ("d",))
        step = pw.shard_map(lambda v: pw.psum(v, "d") + 1.0, mesh, P("d"), P("d"))
        x = client.put(np.arange(4.0), mesh, P("d"))
        np.testing.assert_allclose(step(x).result(timeout=30), np.full(4, 7.0))
        island, victim, hostname, pid = hosts[0]
        os.kill(int(pid), signal.SIGKILL)  # "kill PID"
        with pytest.raises(pw.HostLost):
            for _ in range(200):  # until the coordinator has noticed
                step(x).result(timeout=30)
                time.sleep(0.05)
        procs.append(start("pathways", "host", "--coordinator", address, "--island", island,
                           "--devices", "2"))
        deadline = time.monotonic() + 60
        while len(client.devices()) < 4:
            assert time.monotonic() < deadline, "the new host never joined"
            time.sleep(0.1)
        mesh = client.remap(mesh)
        assert int(victim) not in {d.host for d in mesh.devices.flat}
        np.testing.assert_allclose(step(x).result(timeout=30), np.full(4, 7.0))
    shown = status(address)
    assert f"host {victim} ({hostname}, pid {pid}): lost" in shown, shown  # listed, as lost
    assert shown.count("device ") == 4
    up.send_signal(signal.SIGINT)
    assert up.wait(30) == 0


def test_status_lists_a_lost_host_marked_lost():
    with pw.local_cluster(hosts_per_island=2, devices_per_host=1,
                          heartbeat_timeout=2.0) as cluster:
        victim = cluster.processes[-1]
        with pw.connect(cluster.address) as client:
            hosts = client.cluster_status()["hosts"]
            (host,) = [h for h, info in hosts.items() if info["pid"] == victim.pid]
            victim.kill()
            victim.wait(30)
            wait_until(lambda: len(client.devices()) == 1, 30, 0.1)  # the coordinator knows
        shown = status(cluster.address)
    assert re.search(rf"island 0 host {host} \([^,]+, pid {victim.pid}\): lost", shown), shown
    assert shown.count("device ") == 1, shown  # the live host's one device


def test_a_host_added_by_hand_hashes_text_as_the_clusters_hosts(procs):
    """A kernel body's ``hash()`` of a str is the same on a host started by hand as on the
    hosts ``pathways up`` started (none of them given a PYTHONHASHSEED), and the coordinator
    has nothing to warn about."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    up = start("pathways", "up", "--hosts-per-island", "1", "--devices-per-host", "2", env=env)
    procs.append(up)
    address = read_until(up, "pathways cluster up at")[-1].split()[4]
    procs.append(start("pathways", "host", "--coordinator", address, "--devices", "2",
                       env=env))
    with pw.connect(address) as client:
        deadline = time.monotonic() + 60
        while len(client.devices()) < 4:
            assert time.monotonic() < deadline, "the host started by hand never joined"
            time.sleep(0.1)
        mesh = client.mesh((4,), ("d",))
        assert len({d.host for d in mesh.devices.flat}) == 2
        probe = pw.shard_map(lambda v: v * 0 + hash("pathways") % 10**6, mesh, P("d"), P("d"))
        hashes = probe(client.put(np.zeros(4), mesh, P("d"))).result(timeout=30)
    assert len(set(hashes)) == 1, hashes  # one value on every device of both hosts
    up.send_signal(signal.SIGINT)
    assert up.wait(30) == 0
    rest = up.stdout.read()
    assert "PYTHONHASHSEED" not in rest and "WARNING" not in rest, rest


def _collector(v):
    """A kernel body: this host's young-generation threshold and whether it froze anything."""
    import gc

    return v * 0 + gc.get_threshold()[0] + (gc.get_freeze_count() > 0)


def test_the_hosts_of_a_local_cluster_run_the_settled_collector():
    """Every host process ``local_cluster`` starts settles its collector
    (``plaque.cli.settle_collector``) before serving: at Python's default threshold a host
    holding its kept kernel records ran full collections of 100-200 ms every few seconds,
    each an idle gap on every device of the mesh (issue 47)."""
    from plaque.cli import COLLECT_EVERY

    with pw.local_cluster(hosts_per_island=2, devices_per_host=1) as cluster, \
            pw.connect(cluster.address) as client:
        mesh = client.mesh((2,), ("d",))
        probe = pw.shard_map(_collector, mesh, P("d"), P("d"))
        seen = probe(client.put(np.zeros(2), mesh, P("d"))).result(timeout=30)
    assert list(seen) == [COLLECT_EVERY + 1] * 2, seen


def run_cli(*args, timeout):
    """(exit code, stdout + stderr) of ``python -m pathways ARGS``; ``timeout`` is the hang
    guard (a command slower than that fails the test with TimeoutExpired)."""
    out = subprocess.run([sys.executable, "-m", "pathways", *args], capture_output=True,
                         text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


def test_an_unreachable_coordinator_is_one_line_within_seconds():
    code, text = run_cli("status", "tcp://127.0.0.1:1", timeout=20)  # it waits 3 s, not 30
    assert code != 0, code
    assert "within 3 s" in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1, text
    assert "no coordinator answered at tcp://127.0.0.1:1" in text


def test_every_help_states_a_default_once_and_addresses_as_printed():
    # "--port PORT  the HTTP port (default: any free one) (default: 0)"; the address was
    # documented as tcp://HOST:PORT alone, while a local cluster's is ipc://PATH
    import argparse

    import plaque.cli
    from pathways.cli import parser

    def actions(p):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    yield from actions(sub)
            elif a.help and a.help != argparse.SUPPRESS:
                yield p, a

    checked = 0
    for top in (parser(), plaque.cli.build_parser()):
        for p, a in actions(top):
            text = p._get_formatter()._get_help_string(a)  # the help, and the default added
            said = "default" in a.help.lower()  # by the help itself
            assert not (said and "%(default)s" in text), (p.prog, a.option_strings, text)
            checked += 1
    assert checked > 50
    dash = [a for p, a in actions(parser()) if p.prog == "pathways dashboard"]
    address = next(a for a in dash if a.dest == "address").help
    assert "ipc://PATH" in address and "tcp://HOST:PORT" in address and "?keys=DIR" in address
    port = next(a for a in dash if a.dest == "port")
    assert port.default == 0 and "(default: 0)" not in port.help


def test_a_malformed_address_is_one_line_at_once(capsys):
    from pathways.cli import parser

    bads = ("127.0.0.1:5555", "tcp://127.0.0.1", "tcp://localhost:99999", "http://h:1")
    commands = (("status",), ("trace",), ("host", "--coordinator"))
    for bad in bads:  # every address on every command, as its parser takes it
        for command in commands:
            with pytest.raises(SystemExit) as exited:
                parser().parse_args([*command, bad])
            assert exited.value.code == 2, (command, bad)
            last = capsys.readouterr().err.strip().splitlines()[-1]
            assert "error: argument" in last and "malformed address" in last, (command, bad)
    # and each command as a user runs it, a bad address each (a process takes 0.7 s to start:
    # all twelve as processes took 8 s)
    for command, bad in zip(commands, bads):
        code, text = run_cli(*command, bad, timeout=20)
        assert code == 2, (command, code)
        last = text.strip().splitlines()[-1]  # argparse: its usage, then one error line
        assert "error: argument" in last and "malformed address" in last, (command, text)
        assert "Traceback" not in text and "ZMQError" not in text


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_ctrl_c_on_up_stops_everything_quietly(procs, sigint):
    # A terminal's Ctrl-C reaches the whole foreground process group, as killpg does here.
    # Started with SIGINT ignored (a non-interactive shell's background job, as a CI runner may
    # start the tests), up took no KeyboardInterrupt, saw its coordinator stop and exited 1
    argv = [sys.executable, "-m", "pathways", "up", "--hosts-per-island", "2",
            "--devices-per-host", "2"]
    if sigint == "ignored":  # by a shell (preexec_fn would fork this multithreaded process)
        argv = ["sh", "-c", "trap '' INT; exec \"$0\" \"$@\"", *argv]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    procs.append(up)
    read_until(up, "pathways cluster up at")
    time.sleep(1.0)  # heartbeats flowing
    os.killpg(up.pid, signal.SIGINT)
    assert up.wait(30) == 0
    rest = up.stdout.read()
    assert "lost" not in rest and "WARNING" not in rest and "Traceback" not in rest, rest


def test_a_signal_stop_wakes_its_wait_whichever_thread_takes_the_signal():
    # pathways up (and the coordinator) hung for good on Ctrl-C now and then: the handler set a
    # threading.Event while the main thread, inside that Event's wait, held its lock
    from plaque.cli import SIGNAL_POLL, SignalStop

    before = signal.getsignal(signal.SIGUSR1)
    try:
        on_main = SignalStop((signal.SIGUSR1,))
        assert not on_main.wait(0.01)
        threading.Timer(0.05, signal.pthread_kill,
                        (threading.main_thread().ident, signal.SIGUSR1)).start()
        assert on_main.wait(60) and on_main.signal == signal.SIGUSR1
        elsewhere = SignalStop((signal.SIGUSR1,))  # the handler runs at the main thread's next look
        taker = threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(),
                                                                    signal.SIGUSR1))
        taker.start()
        taker.join()
        assert any(elsewhere.wait(SIGNAL_POLL) for _ in range(100))
        assert elsewhere.signal == signal.SIGUSR1
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_coordinator_with_keys_prints_an_address_that_names_them(procs, tmp_path):
    # it printed tcp://HOST:PORT alone, while a client without keys was told to connect "with
    # the address the cluster printed (tcp://HOST:PORT?keys=DIR)"
    from plaque import security

    keys = str(tmp_path / "keys")
    security.generate(keys)
    coord = start("pathways", "coordinator", env={**os.environ, security.ENV: keys})
    procs.append(coord)
    address = read_until(coord, "pathways coordinator at", timeout=60)[-1].split()[-1]
    assert security.split_address(address)[1] == keys, address
    env = {k: v for k, v in os.environ.items() if k != security.ENV}
    out = subprocess.run([sys.executable, "-m", "pathways", "status", address], env=env,
                         capture_output=True, text=True, timeout=60)  # as printed, no $PLAQUE_KEYS
    assert out.returncode == 0 and "policy" in out.stdout, out


_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)  # Linux's syscall number


@pytest.mark.skipif(_TGKILL is None or not sys.platform.startswith("linux"),
                    reason="sends a signal to one thread with Linux's tgkill")
def test_a_coordinator_stops_on_sigterm_whichever_thread_takes_it(procs, tmp_path):
    # A process-wide SIGTERM goes to any thread that does not block it; Python runs the handler
    # on the main thread, which waited without an end: taken by another thread, it was lost
    import ctypes

    private = tmp_path / "sockets"
    private.mkdir(mode=0o700)
    coord = start("pathways", "coordinator", "--bind", f"ipc://{private}/")
    procs.append(coord)
    read_until(coord, "pathways coordinator at", timeout=60)
    others = [t for t in _threads(coord.pid) if t != coord.pid and _takes_sigterm(coord.pid, t)]
    assert others  # the coordinator serves on threads of its own (ZeroMQ's block signals)
    libc = ctypes.CDLL(None, use_errno=True)
    # to the first of them still there (a short-lived thread may have ended since)
    assert any(libc.syscall(_TGKILL, coord.pid, t, signal.SIGTERM) == 0 for t in others)
    assert coord.wait(timeout=30) == 0


def _threads(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def _takes_sigterm(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of ``pid`` does not block SIGTERM (its status's SigBlk mask)."""
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return not int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1))
    return False


def test_every_option_says_what_it_does_and_its_default():
    import argparse

    from pathways.cli import parser

    def commands(p, name):  # every (sub)command parser that takes options, depth first
        nested = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not nested:
            yield name, p
        for action in nested:
            for sub_name, sub in action.choices.items():
                yield from commands(sub, f"{name} {sub_name}")

    found = dict(commands(parser(), "pathways"))
    assert {"pathways up", "pathways k8s render", "pathways status"} <= set(found)
    for name, sub in found.items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name}: {action.option_strings or action.dest}"
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                said = formatter._get_help_string(action)  # by the help, or added once
                assert "default" in said.lower(), f"{name}: {action.option_strings}"


def test_install_hints_match_the_readme():

    root = ROOT
    hint = ".venv/bin/pip install -e '.[plot]'"
    assert hint in (root / "README.md").read_text()
    assert hint in (root / "pathways" / "plot.py").read_text()
    ignored = (root / ".gitignore").read_text().split()
    assert {"tour.json", "tour.png", "trace.json", "timeline.png"} <= set(ignored)


def test_up_insecure_warns_once_and_a_host_joins_it_only_when_told_insecure(procs):
    """``pathways up --insecure``: one warning, not one per process it starts; a host started
    by hand for its plain address refuses without ``--insecure`` and joins with it."""
    env = {k: v for k, v in os.environ.items() if k != "PLAQUE_KEYS"}
    up = start("pathways", "up", "--insecure", "--hosts-per-island", "2",
               "--devices-per-host", "1", env=env)
    procs.append(up)
    lines = read_until(up, "pathways cluster up at")
    address = lines[-1].split()[4]
    lines += read_until(up, "warning: --insecure")
    assert sum("warning" in line for line in lines) == 1, lines
    refused = subprocess.run([sys.executable, "-m", "pathways", "host", "--coordinator",
                              address, "--devices", "1"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "--insecure" in refused.stderr
    procs.append(start("pathways", "host", "--coordinator", address, "--devices", "1",
                       "--insecure", env=env))
    wait_for_devices(address, 3, "the host told --insecure")
    up.send_signal(signal.SIGINT)
    assert up.wait(30) == 0


# ---- pathways up supervises what it started ---------------------------------------------


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (Linux's /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        stat = _stat(entry) if entry.isdigit() else None
        if stat is not None and int(stat[1]) == pid:
            found.append(int(entry))
    return found


def _stat(pid) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, ...), None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def running(pid: int) -> bool:
    """Still running: neither gone nor a zombie that nobody reaped yet."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kill_leftovers(pids) -> None:
    """SIGKILL those of ``pids`` still running a pathways command (a failed test's orphans)."""
    for pid in pids:
        if running(pid) and "pathways" in command_of(pid):
            os.kill(pid, signal.SIGKILL)


def test_up_exits_saying_so_when_its_coordinator_dies(procs, tmp_path):
    err = tmp_path / "stderr"
    with open(err, "w") as sink:
        up = subprocess.Popen([sys.executable, "-m", "pathways", "up", "--hosts-per-island",
                               "1", "--devices-per-host", "1"], stdout=subprocess.PIPE,
                              stderr=sink, text=True)
    procs.append(up)
    read_until(up, "pathways cluster up at")
    started = children(up.pid)
    try:
        (coordinator,) = [p for p in started if " coordinator " in command_of(p)]
        os.kill(coordinator, signal.SIGKILL)
        assert up.wait(30) == 1  # it served on, silent, until Ctrl-C (rc 0)
        assert "pathways up: the coordinator was killed by SIGKILL" in err.read_text()
        wait_until(lambda: not any(running(p) for p in started), 30, 0.1)  # the host too
    finally:
        kill_leftovers(started)


def test_killing_up_takes_its_coordinator_and_hosts_with_it(procs):
    up = start("pathways", "up", "--hosts-per-island", "2", "--devices-per-host", "1")
    procs.append(up)
    read_until(up, "pathways cluster up at")
    started = children(up.pid)
    try:
        assert len(started) == 3, [command_of(p) for p in started]  # coordinator, 2 hosts
        up.kill()
        up.wait(30)
        wait_until(lambda: not any(running(p) for p in started), 30, 0.1)  # no orphan
    finally:
        kill_leftovers(started)


def test_a_cluster_process_whose_starter_died_before_it_asked_ends_at_once(tmp_path):
    """Linux kills a child when its parent dies only if it asked while the parent lived; one
    that finds itself orphaned already (its parent is not the pid it was given) ends."""
    tmp_path.chmod(0o700)  # a directory the coordinator may listen in
    env = dict(os.environ, PLAQUE_DIE_WITH_PARENT="1", PATHWAYS_PARENT_PID=str(2**22 + 1))
    out = subprocess.run([sys.executable, "-m", "pathways", "coordinator", "--bind",
                          f"ipc://{tmp_path}/"], env=env, capture_output=True, text=True,
                         timeout=30)  # a coordinator that serves on fails the test here
    assert out.returncode == 1 and "pathways coordinator at" not in out.stdout, out
