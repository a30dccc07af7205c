"""``pathways slurm``: a Pathways cluster inside a Slurm allocation, torn down with the job.

Run once per job, in its batch script (or under ``salloc``), so on the allocation's first
node; name it by its path, as a job's shell has no virtual environment activated::

    sbatch --nodes=2 --wrap ".venv/bin/pathways slurm -- python train.py"

It makes a CURVE key pair for the job (in a private directory every node must see, by default
under ``$HOME``; removed at the end), starts the coordinator on this node and, in one job step
(``srun``), ``--hosts-per-node`` hosts on every node of the allocation. Host ranks are split
into ``--islands`` contiguous groups, so islands are groups of nodes. Once every host has joined
it prints the address and runs the command with ``$PATHWAYS_ADDRESS`` set (``pw.connect()``
reads it) and this Python's environment activated (``python`` there is this Python, the one
with Pathways), then stops hosts and coordinator and exits with the command's status; without
a command it serves until the job ends (Slurm's SIGTERM) or Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from plaque import security
from plaque.cli import SignalStop, wait_for_signal

from .cluster import LocalCluster, hosts_per_island, stop_processes
from .errors import PathwaysError

ADDRESS_ENV = "PATHWAYS_ADDRESS"  # what pw.connect() reads when given no address
HOSTS_GRACE = 10.0  # seconds the hosts have to leave after the coordinator stopped them


@dataclass(frozen=True)
class Allocation:
    """The Slurm job this process runs in: its id and how many nodes it holds."""

    job_id: str
    nodes: int

    @classmethod
    def from_env(cls, environ) -> Allocation:
        job = environ.get("SLURM_JOB_ID")
        if not job:
            raise PathwaysError("pathways slurm runs inside a Slurm job (sbatch or salloc):"
                                " SLURM_JOB_ID is not set")
        return cls(job, int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
                            or 1))


@dataclass(frozen=True)
class Layout:
    """Hosts of a job: ``hosts_per_node`` on each of ``nodes``, in ``islands`` equal groups of
    consecutive ranks (``srun``'s block distribution puts consecutive ranks on one node)."""

    nodes: int
    hosts_per_node: int = 1
    islands: int = 1

    def __post_init__(self):  # ValueError, as for any bad shape
        if self.hosts_per_node < 1:
            raise ValueError(f"hosts per node must be positive, got {self.hosts_per_node}")
        hosts_per_island(self.hosts, self.islands)

    @property
    def hosts(self) -> int:
        return self.nodes * self.hosts_per_node

    @property
    def hosts_per_island(self) -> int:
        return hosts_per_island(self.hosts, self.islands)

    @property
    def bind(self) -> str | None:
        """None when the job has one node (a local cluster's default: Unix sockets in a
        private directory, no keys); else every interface, each process announcing its
        node's name, with the job's CURVE keys."""
        return None if self.nodes == 1 else "tcp://0.0.0.0"

    def srun(self, host_argv: list[str]) -> list[str]:
        """One job step running a host per rank; rank r joins island r // hosts_per_island.
        ``--overlap``: the step shares CPUs with the batch script (where the coordinator
        and the command run)."""
        island = f"$((SLURM_PROCID / {self.hosts_per_island}))"
        return ["srun", "--quiet", "--overlap", f"--nodes={self.nodes}",
                f"--ntasks={self.hosts}", f"--ntasks-per-node={self.hosts_per_node}",
                "sh", "-c", f"exec {shlex.join(host_argv)} --island {island}"]


class SlurmCluster(LocalCluster):
    """The coordinator here, the hosts in one ``srun`` step over the allocation."""

    def __init__(self, job: Allocation, layout: Layout, devices_per_host: int = 4,
                 keys_dir: str | None = None, **options):
        self.job, self.layout = job, layout
        self._keys_at = Path(keys_dir or Path.home() / ".pathways" / f"slurm-{job.job_id}")
        super().__init__(layout.islands, layout.hosts_per_island, devices_per_host,
                         bind=layout.bind, **options)

    def _new_keys(self) -> str:
        """The job's key pair, in a fresh private directory every node of the job can read
        (the hosts on other nodes load it from there)."""
        where = self._keys_at
        if where.exists():
            raise PathwaysError(f"{where} already exists: another run of this job? Remove it"
                                " or give --keys-dir")
        where.parent.mkdir(parents=True, exist_ok=True)
        where.mkdir(mode=0o700)
        try:
            security.generate(where)
        except BaseException:
            security.discard(str(where))
            raise
        return str(where)

    def _start_hosts(self) -> None:
        step = subprocess.Popen(self.layout.srun(self._host_argv(self.devices_per_host)),
                                env=self._env, start_new_session=True)
        self.processes.append(step)

    def close(self) -> None:
        """Stop the coordinator first: it tells every host to stop, so the hosts exit
        cleanly and the step ends by itself (a signalled ``srun`` cancels its step and
        reports the tasks killed); whatever is still running after a grace is stopped."""
        first, rest = self.processes[:1], self.processes[1:]
        stop_processes(first)
        for step in rest:
            try:
                step.wait(HOSTS_GRACE)
            except subprocess.TimeoutExpired:
                pass
        self.processes = rest
        super().close()


def run(args, environ=os.environ) -> int:
    """``pathways slurm``: start the job's cluster, run ``args.command`` (or serve), stop."""
    job = Allocation.from_env(environ)
    layout = Layout(job.nodes, args.hosts_per_node, args.islands)
    address_file = Path(args.address_file) if args.address_file else None
    signal.signal(signal.SIGTERM, _terminated)
    cluster = None
    try:
        cluster = SlurmCluster(job, layout, args.devices_per_host, args.keys_dir,
                               verbose=args.verbose, policy=args.policy, window=args.window,
                               insecure=args.insecure, port=args.port)
        cluster.wait_ready(layout.hosts * args.devices_per_host, args.timeout)
        print(f"pathways slurm: cluster up at {cluster.address}: {layout.hosts} hosts x"
              f" {args.devices_per_host} devices on {layout.nodes} node(s), {layout.islands}"
              f" island(s), job {job.job_id}", flush=True)
        if address_file is not None:
            address_file.write_text(cluster.address + "\n")
        command = args.run[1:] if args.run[:1] == ["--"] else args.run
        if not command:  # until Slurm's SIGTERM at the job's end, or Ctrl-C
            stop = SignalStop((signal.SIGINT, signal.SIGTERM))
            wait_for_signal(stop)
            return 128 + stop.signal
        return _run_command(command, command_env(environ, cluster.address))
    except KeyboardInterrupt:
        return 130
    except Terminated:
        return 128 + signal.SIGTERM
    finally:
        if cluster is not None:
            cluster.close()
        if address_file is not None:
            address_file.unlink(missing_ok=True)


def command_env(environ, address: str) -> dict:
    """The command's environment: ``$PATHWAYS_ADDRESS`` set, and the directory of the Python
    running this first on ``PATH``, as activating its virtual environment would put it
    (``$VIRTUAL_ENV`` too, when it is one): a batch job's shell activated nothing, yet
    ``python train.py`` must run with the Python that has Pathways."""
    here = os.path.dirname(sys.executable)
    rest = [d for d in environ.get("PATH", os.defpath).split(os.pathsep) if d and d != here]
    env = {**environ, ADDRESS_ENV: address, "PATH": os.pathsep.join([here, *rest])}
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    return env


def _run_command(command: list[str], env: dict) -> int:
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise PathwaysError(f"cannot run {shlex.join(command)}: {exc}") from None
    try:
        return child.wait()
    finally:
        stop_processes([child])


class Terminated(BaseException):
    """SIGTERM arrived: Slurm ends a job so (time limit, scancel)."""


def _terminated(*_):
    """Unwind on SIGTERM, so everything this process started is stopped and the job's keys
    are removed."""
    raise Terminated
