"""``pathways slurm``: the job layout (ranks, islands, binds) and its errors everywhere, and
that the README's recipe resolves from a shell without the virtual environment on ``PATH``
(as a batch job's shell is on a real cluster); then, where a Slurm cluster answers (CI
installs one, ``.ci/slurm-up``), real jobs, submitted from such a shell: the README's
``sbatch`` recipe runs the quickstart against a 2-host cluster and exits cleanly, and a
serving job is reached from outside through its address file and torn down by ``scancel``.
Every job is cancelled if the test fails or times out, and no process of it may remain."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT

import pathways as pw
from pathways.errors import PathwaysError
from pathways.slurm import ADDRESS_ENV, Allocation, Layout, command_env


def test_allocation_needs_a_slurm_job():
    with pytest.raises(PathwaysError, match="inside a Slurm job"):
        Allocation.from_env({})
    assert Allocation.from_env({"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "3"}) == \
        Allocation("42", 3)
    assert Allocation.from_env({"SLURM_JOB_ID": "7"}).nodes == 1


def test_layout_refuses_unequal_islands():
    with pytest.raises(ValueError, match="3 hosts do not split into 2"):
        Layout(nodes=3, islands=2)
    with pytest.raises(ValueError, match="positive"):
        Layout(nodes=1, hosts_per_node=0)
    with pytest.raises(ValueError, match="positive"):
        Layout(nodes=0)


@pytest.mark.parametrize("nodes, per_node, islands", [(1, 2, 1), (2, 2, 2), (4, 1, 2),
                                                      (3, 2, 3)])
def test_each_rank_joins_its_island(nodes, per_node, islands):
    """The step's shell line, run by a real shell per rank, gives rank r island
    r // hosts_per_island: consecutive ranks (one node's) share an island."""
    layout = Layout(nodes, per_node, islands)
    argv = layout.srun(["echo", "host"])
    assert argv[:2] == ["srun", "--quiet"]
    assert f"--ntasks={nodes * per_node}" in argv and f"--ntasks-per-node={per_node}" in argv
    assert layout.bind == (None if nodes == 1 else "tcp://0.0.0.0")  # None: private ipc
    shell = argv[argv.index("sh"):]
    for rank in range(layout.hosts):
        out = subprocess.run(shell, env={"SLURM_PROCID": str(rank), "PATH": os.environ["PATH"]},
                             capture_output=True, text=True, check=True, timeout=10).stdout
        assert out.split() == ["host", "--island", str(rank // (layout.hosts // islands))]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pathways", "slurm", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env or {k: v for k, v in os.environ.items()
                                      if not k.startswith("SLURM_")})


def test_outside_a_job_is_one_line():
    out = _cli("--", "true")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "pathways: pathways slurm runs inside a Slurm job (sbatch or salloc): SLURM_JOB_ID is"
        " not set"]


def test_bad_islands_is_one_line():
    env = {**os.environ, "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1"}
    out = _cli("--islands", "2", env=env)
    assert out.returncode == 1
    assert len(out.stderr.strip().splitlines()) == 1 and "do not split into 2" in out.stderr


def test_connect_without_an_address_reads_the_environment(monkeypatch):
    monkeypatch.delenv("PATHWAYS_ADDRESS", raising=False)
    with pytest.raises(ValueError, match=r"\$PATHWAYS_ADDRESS"):
        pw.connect()
    monkeypatch.setenv("PATHWAYS_ADDRESS", "tcp://127.0.0.1")  # read, then checked
    with pytest.raises(ValueError, match="port"):
        pw.connect()


def _without_venv(environ) -> dict:
    """``environ`` as a batch job's shell has it: no virtual environment activated (neither
    this Python's directory nor ``$VIRTUAL_ENV`` on ``PATH``), no Slurm job."""
    venv = {str(Path(sys.executable).parent), str(Path(sys.prefix) / "bin")}
    path = [d for d in environ.get("PATH", os.defpath).split(os.pathsep) if d not in venv]
    env = {k: v for k, v in environ.items()
           if k != "VIRTUAL_ENV" and not k.startswith("SLURM_")}
    return {**env, "PATH": os.pathsep.join(path)}


def _readme_recipe() -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- slurm -->", 1)[1]
    return next(line for line in block.splitlines() if line.startswith("sbatch "))


def _readme_job_script() -> str:
    """What the README's recipe has the job's shell run: its ``--wrap`` line."""
    words = shlex.split(_readme_recipe())
    return words[words.index("--wrap") + 1]


def test_the_readme_recipe_resolves_without_the_venv_on_path():
    """The job's line, run by a shell whose PATH lacks the venv (a real cluster's batch
    shell), reaches ``pathways slurm`` (which, outside a job, says so) instead of ``pathways:
    not found``; and the command it runs finds a ``python`` that has Pathways."""
    env = _without_venv(os.environ)
    out = subprocess.run(["sh", "-c", _readme_job_script()], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr.strip()) == (1, "pathways: pathways slurm runs inside a"
                                                      " Slurm job (sbatch or salloc):"
                                                      " SLURM_JOB_ID is not set"), out.stderr
    command = shlex.split(_readme_job_script().split(" -- ", 1)[1])
    job = command_env(env, "tcp://127.0.0.1:1")
    assert job[ADDRESS_ENV] == "tcp://127.0.0.1:1"
    python = shutil.which(command[0], path=job["PATH"])
    assert python is not None, job["PATH"]
    found = subprocess.run([python, "-c", "import pathways; print(pathways.__file__)"],
                           env=job, capture_output=True, text=True, timeout=60)
    assert found.returncode == 0 and found.stdout.startswith(str(ROOT)), found.stderr
    assert (ROOT / command[1]).exists()


# ---- real jobs --------------------------------------------------------------------------------

def _slurm_missing() -> str | None:
    if shutil.which("sbatch") is None:
        return ("Slurm is not installed (no sbatch on PATH); CI installs a one-node cluster"
                " with .ci/slurm-up")
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                             timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s"
    states = set(out.stdout.split())
    if out.returncode or not states & {"idle", "mix", "alloc"}:
        return f"no Slurm node is up (sinfo: {(out.stdout + out.stderr).strip()!r})"
    return None


# the real jobs share one Slurm cluster (CI's has one node): under pytest-xdist they run one
# after the other on one worker (--dist loadgroup), as they do in a serial run
real_job = pytest.mark.xdist_group("slurm")


@pytest.fixture(scope="module")
def slurm():
    reason = _slurm_missing()
    if reason is not None:
        if os.environ.get("PATHWAYS_REQUIRE_SLURM"):  # set by .ci/run once Slurm is up
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def job_env(slurm):
    """The environment sbatch exports to the job: a shell's without the venv activated, as a
    user who followed the README has it (and a real cluster's batch shell); and a job name to
    cancel by whatever happens."""
    name = f"pathways-test-{uuid.uuid4().hex[:8]}"
    yield name, _without_venv(os.environ)
    subprocess.run(["scancel", "--name", name], timeout=30)


def _no_process_of(job_id: str, sockets: str | None = None) -> None:
    """Nothing of the job is left: no process naming its key directory or, for a job of one
    node, its ``sockets`` directory (the hosts' command lines name it in the coordinator's
    address), and the directory is gone."""
    where = Path(sockets) if sockets else Path.home() / ".pathways" / f"slurm-{job_id}"
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-f", str(where)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, f"processes of job {job_id} still running"
        time.sleep(0.2)
    while where.exists():  # removed last, once the processes are gone
        assert time.monotonic() < deadline, f"{where} outlived job {job_id}"
        time.sleep(0.2)


@real_job
def test_readme_recipe_runs_the_quickstart(job_env, tmp_path):
    name, env = job_env
    output = tmp_path / "job.out"
    words = shlex.split(_readme_recipe())
    argv = [words[0], "--wait", f"--output={output}", f"--job-name={name}", "--time=5",
            *words[1:]]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    log = output.read_text() if output.exists() else ""
    assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{log}"
    job_id = re.search(r"Submitted batch job (\d+)", done.stdout).group(1)
    up = re.search(r"pathways slurm: cluster up at ipc://(\S+)/plaque-\w+: 2 hosts x 4"
                   r" devices on 1 node\(s\), 1 island\(s\)", log)  # one node: private sockets
    assert up, log
    assert "equal to the reference interpreter" in log
    assert "error" not in log.lower(), log  # a clean shutdown: no step cancelled or killed
    assert not (Path.home() / ".pathways" / f"slurm-{job_id}").exists()  # no keys made
    _no_process_of(job_id, up.group(1))


@real_job
def test_a_serving_job_is_reached_from_outside_and_cancelled(job_env, tmp_path):
    name, env = job_env
    address_file, output = tmp_path / "address", tmp_path / "job.out"
    job_id = subprocess.run(
        ["sbatch", "--parsable", f"--job-name={name}", "--time=5", "--ntasks=2",
         f"--output={output}", "--wrap",
         f"{shlex.quote(sys.executable)} -m pathways slurm --hosts-per-node 2"
         f" --devices-per-host 2 --islands 2 --address-file {address_file}"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while not address_file.exists() or not address_file.read_text().endswith("\n"):
        assert time.monotonic() < deadline, output.read_text() if output.exists() else ""
        time.sleep(0.2)
    address = address_file.read_text().strip()
    assert address.startswith("ipc://")  # one node: its private sockets, this user reaches
    with pw.connect(address) as client:
        devices = client.devices()
    assert sorted(d.island for d in devices) == [0, 0, 1, 1]  # rank r in island r // 1
    assert len({(d.island, d.host) for d in devices}) == 2  # two hosts, one per island
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    _no_process_of(job_id, address[len("ipc://"):].rsplit("/", 1)[0])
    deadline = time.monotonic() + 30
    while address_file.exists():
        assert time.monotonic() < deadline, "the address file outlived the job"
        time.sleep(0.2)

