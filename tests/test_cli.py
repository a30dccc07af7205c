"""The command line as a user drives it: pathways up, host, status; plaque worker."""

import os
import signal
import subprocess
import sys
import time

from conftest import read_until


def start(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def status(address):
    out = subprocess.run([sys.executable, "-m", "pathways", "status", address],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


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
    deadline = time.monotonic() + 30
    while status(address).count("device ") < 7:
        assert time.monotonic() < deadline, "the added host never showed up"
        time.sleep(0.2)
    up.send_signal(signal.SIGINT)
    assert up.wait(30) == 0
    assert extra.wait(30) == 0  # the host notices its coordinator is gone and exits
