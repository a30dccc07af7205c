"""What a driver killed mid-run leaves (its sinks' staging directories, its local cluster's
private socket directory) is removed by the next run to the same target or by ``plaque
clean``, and nothing of a live process ever is (issue 45 item 15)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest
from conftest import ROOT, read_until

import plaque
from plaque import Graph, JsonlSink, Operator
from plaque.cli import main as plaque_main

HOST = socket.gethostname()

DRIVER = """
import sys, time
import plaque

class Hold(plaque.Operator):
    def on_start(self, ctx, t):
        ctx.hold()

g = plaque.Graph("held")
src = g.node("src", Hold, shards=1)
g.edge(src, g.node("out", plaque.JsonlSink(sys.argv[1]), shards=1), plaque.ONE_TO_ONE)
with plaque.local_cluster(workers=1) as cluster:
    cluster.install(g).run()
    print("running", cluster.socket_dir, flush=True)
    time.sleep(600)
"""


@pytest.fixture
def short_temp():
    """A temporary directory with a short path (a Unix socket's path has 107 bytes)."""
    path = tempfile.mkdtemp(prefix="pl-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(30)
    return p.pid


def hidden(parent, leaf: str, kind: str, pid: int, host: str = HOST, tag="0123456789ab"):
    path = os.path.join(parent, f".{leaf}.{kind}-{pid}@{host}-{tag}")
    os.mkdir(path)
    with open(os.path.join(path, "part-00000.jsonl"), "w") as fh:
        fh.write("[1]\n")
    return path


def test_plaque_clean_removes_a_killed_drivers_staging_and_sockets(tmp_path, short_temp, procs,
                                                                   capsys):
    target = tmp_path / "out"
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    env = dict(os.environ, TMPDIR=short_temp, PYTHONPATH=str(ROOT))
    driver = subprocess.Popen([sys.executable, str(script), str(target)], env=env,
                              stdout=subprocess.PIPE, text=True)
    procs.append(driver)
    socket_dir = read_until(driver, "running")[-1].split()[1]
    assert os.path.dirname(socket_dir) == short_temp
    assert os.path.basename(socket_dir).startswith(f"plaque-{driver.pid}-")
    (staging,) = [n for n in os.listdir(tmp_path) if n.startswith(".")]
    assert staging.startswith(f".out.staging-{driver.pid}@{HOST}-")
    assert plaque_main(["clean", str(target), "--temp-dir", short_temp]) == 0
    assert "nothing left" in capsys.readouterr().out  # the driver is alive: all of it stays
    assert os.path.isdir(tmp_path / staging) and os.path.isdir(socket_dir)
    driver.send_signal(signal.SIGKILL)
    driver.wait(30)
    assert os.path.isdir(tmp_path / staging) and os.path.isdir(socket_dir)  # left behind
    assert plaque_main(["clean", "-n", str(target), "--temp-dir", short_temp]) == 0
    assert os.path.isdir(tmp_path / staging) and os.path.isdir(socket_dir)
    assert plaque_main(["clean", str(target), "--temp-dir", short_temp]) == 0
    out = capsys.readouterr().out
    assert f"would be removed: {tmp_path / staging}\n" in out
    assert f"removed: {tmp_path / staging}\n" in out and f"removed: {socket_dir}\n" in out
    assert os.listdir(tmp_path) == ["driver.py"] and os.listdir(short_temp) == []


class Words(Operator):
    def on_start(self, ctx, t):
        ctx.emit_batch(["a", "b"])


def test_the_next_run_to_a_target_clears_what_dead_drivers_left_there(tmp_path):
    dead, alive = dead_pid(), os.getpid()
    stale = hidden(tmp_path, "out", "staging", dead)
    trash = hidden(tmp_path, "older", "trash", dead)
    moved = hidden(tmp_path, "prev", "old", dead)  # its target is gone: it goes back
    (tmp_path / "both").mkdir()
    both = hidden(tmp_path, "both", "old", dead)  # its target exists: the user's call
    kept = hidden(tmp_path, "out", "kept", dead)
    mine = hidden(tmp_path, "out", "staging", alive)
    elsewhere = hidden(tmp_path, "out", "staging", dead, host=f"not-{HOST}")
    g = Graph("next")
    src = g.node("src", Words, shards=1)
    g.edge(src, g.node("out", JsonlSink(tmp_path / "out"), shards=1), plaque.ONE_TO_ONE)
    with plaque.local_cluster(workers=1, transport="inproc") as c:
        c.install(g).run().result(30)
    assert os.listdir(tmp_path / "out") == ["part-00000.jsonl"]
    for gone in (stale, trash, moved):
        assert not os.path.exists(gone)
    assert os.listdir(tmp_path / "prev") == ["part-00000.jsonl"]
    for stays in (both, kept, mine, elsewhere):
        assert os.listdir(stays) == ["part-00000.jsonl"]


def test_plaque_clean_leaves_live_and_foreign_temporary_directories(short_temp, capsys):
    dead = dead_pid()
    for name in (f"plaque-{dead}-x1", f"plaque-keys-{dead}-y2", f"plaque-{os.getpid()}-z3",
                 "plaque-k2j4x9", f"pathways-{dead}-q"):
        os.mkdir(os.path.join(short_temp, name))
    open(os.path.join(short_temp, f"plaque-{dead}-file"), "w").close()
    os.symlink(short_temp, os.path.join(short_temp, f"plaque-{dead}-link"))
    assert plaque_main(["clean", "--temp-dir", short_temp]) == 0
    assert sorted(os.listdir(short_temp)) == sorted(
        [f"plaque-{os.getpid()}-z3", "plaque-k2j4x9", f"pathways-{dead}-q",
         f"plaque-{dead}-file", f"plaque-{dead}-link"])
    out = capsys.readouterr().out
    assert out.count("removed: ") == 2 and f"plaque-{dead}-x1" in out
