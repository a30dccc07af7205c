"""``pathways`` command line: ``up``, ``coordinator``, ``host``, ``status``, ``trace``,
``plot``, ``keys``, ``k8s render``, ``slurm`` and ``simulate``."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import time
from pathlib import Path

import uvloop

from plaque.cli import (SIGNAL_POLL, HelpFormatter, SignalStop, add_worker_options, address_arg,
                        bind_near, settle_collector, wait_for_signal)

from .errors import PathwaysError
from .program.cost import BACKENDS

CONNECT_TIMEOUT = 3.0  # seconds a command waits for the coordinator's first answer
ADDRESS_HELP = ("the cluster's address as pathways up (or the coordinator) printed it:"
                " ipc://PATH or tcp://HOST:PORT, with ?keys=DIR when it has keys")


def _coordinator(args) -> int:
    _die_with_parent()
    from .control.coordinator import Coordinator

    if not _may_listen(args.bind, args.insecure, "pathways coordinator"):
        return 2
    coord = Coordinator(args.bind, heartbeat_timeout=args.heartbeat_timeout,
                        policy=args.policy, window=args.window,
                        client_timeout=args.client_timeout, port=args.port)
    settle_collector()
    stop = SignalStop()  # before it says it is up: a SIGTERM sent as soon as it does stops it
    print(f"pathways coordinator at {_with_its_keys(coord.address)}", flush=True)
    wait_for_signal(stop)
    coord.close()
    return 0


def _with_its_keys(address: str) -> str:
    """The address to print: naming the key directory its sockets use (``$PLAQUE_KEYS``), as
    the error of a client without keys asks for, so that it can be used as printed."""
    from plaque.security import encrypts, keys_dir, with_keys

    return with_keys(address, keys_dir()) if encrypts(address) else address


def _die_with_parent() -> None:
    """A process a local cluster started (``$PLAQUE_DIE_WITH_PARENT``) is SIGKILLed when the
    process that started it dies, whatever killed it (Linux's ``PR_SET_PDEATHSIG``; elsewhere
    nothing), and ends at once if that process (``$PATHWAYS_PARENT_PID``) died before the
    request was made."""
    if not os.environ.get("PLAQUE_DIE_WITH_PARENT"):
        return
    from plaque.cli import die_with_parent

    from .cluster import PARENT_ENV

    die_with_parent()
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit() and int(parent) != os.getppid():
        os._exit(1)  # orphaned already: nobody is left to stop us


def _may_listen(bind: str, insecure: bool, what: str) -> bool:
    """``plaque.security.refuse_plain``: False (after saying why, in one line) if ``what``
    must not listen at ``bind`` as it is."""
    from plaque.security import refuse_plain

    try:
        refuse_plain(bind, insecure)
    except PermissionError as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return False
    return True


def _same_hash_seed(argv: list[str]) -> None:
    """Run this ``pathways host`` with the cluster's ``PYTHONHASHSEED`` (the caller's, else the
    one every Pathways cluster gives its hosts): Python fixes its string hash at start, and a
    host that hashes text otherwise runs a kernel body using ``hash()`` of a str (or the order
    of a set of them) differently from its peers. Re-executes this command if unset."""
    if os.environ.get("PYTHONHASHSEED") is None:
        from .cluster import HASH_SEED

        os.environ["PYTHONHASHSEED"] = HASH_SEED
        os.execv(sys.executable, [sys.executable, "-m", "pathways", *argv])


def _host(args) -> int:
    from plaque.security import adopt

    from .client.session import refuse_stopped
    from .host.process import serve_host

    refuse_stopped(args.coordinator)
    coordinator = adopt(args.coordinator)
    bind = bind_near(coordinator, args.bind)
    if not _may_listen(bind, args.insecure, "pathways host"):
        return 2
    _die_with_parent()
    from .program.cost import DeviceSpec

    spec = DeviceSpec(hbm_bytes=int(args.hbm_gib * 2**30))
    settle_collector()
    try:
        reason = uvloop.run(serve_host(coordinator, args.island, args.devices, bind,
                                       spec=spec, coordinator_timeout=args.coordinator_timeout,
                                       kernel_limit=args.kernel_limit or None,
                                       backend=args.backend))
    except PathwaysError as exc:  # e.g. --devices that --backend jax does not have
        print(f"pathways host: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("pathways.host.process").info("exited: %s", reason)
    return 0


def _up(args) -> int:
    from .cluster import LocalCluster

    cluster = LocalCluster(args.islands, args.hosts_per_island, args.devices_per_host,
                           verbose=args.verbose, policy=args.policy, window=args.window,
                           insecure=args.insecure, hosts=not args.dashboard)
    dashboard = ended = None
    try:
        if args.dashboard:  # before the hosts start, whose start-up would slow it down: the
            from .dashboard import Dashboard  # page is there at once and shows them join

            dashboard = Dashboard(cluster.address, port=args.dashboard_port)
            print(f"dashboard: open {dashboard.url}", flush=True)
            cluster.start_hosts()
        cluster.wait_ready(args.islands * args.hosts_per_island * args.devices_per_host)
        stop = _stop_on_signals()
        print(f"pathways cluster up at {cluster.address}  (Ctrl-C to stop)", flush=True)
        _print_keys(cluster)
        ended = _wait_for_stop(stop, cluster.coordinator_exit)  # a closed terminal too: keys go
        if ended is not None:  # said before the hosts are stopped, which takes a while
            print(f"pathways up: the coordinator {ended}; stopping the cluster",
                  file=sys.stderr, flush=True)
    finally:
        if dashboard is not None:
            dashboard.close()
        cluster.close()
    return 0 if ended is None else 1


def _stop_on_signals() -> SignalStop:
    """What Ctrl-C (SIGINT), SIGTERM or SIGHUP (a closed terminal) sets; made before a
    command says it is up, so that a signal sent as soon as it says so stops it cleanly. SIGINT
    is ours even when the command was started with it ignored (a shell's background job), as
    the coordinator's is: else a Ctrl-C sent to the group stopped the coordinator alone, and
    this command reported that as the coordinator's end."""
    return SignalStop((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def _wait_for_stop(stop: SignalStop, ended=None, every: float = 0.5):
    """Block until ``stop`` (``_stop_on_signals``: Ctrl-C among them): None; or until
    ``ended()``, asked every ``every`` seconds, says how what we serve ended: that."""
    while not stop.wait(min(every, SIGNAL_POLL)):
        how = ended() if ended is not None else None
        if how is not None:  # unless the same signal stopped both: its handler runs here
            return None if stop.is_set() else how  # (on this thread) after the wait
    return None


def _print_keys(cluster) -> None:
    """Say how clients get in: with the address as printed, or the keys in the environment."""
    from plaque.security import ENV, INSECURE_WARNING, split_address

    named = split_address(cluster.address)[1]
    if named is not None:
        print(f"export {ENV}={named}  # the cluster's CURVE keys, for clients given the"
              " plain address; removed when the cluster stops", flush=True)
    elif cluster.insecure:
        print(INSECURE_WARNING, flush=True)


def _client(address: str):
    """A client of ``address``; a key directory that is not there is a one-line error (a
    stopped cluster's address says the cluster stopped)."""
    from .client.client import Client
    from .client.session import refuse_stopped

    refuse_stopped(address)
    try:
        return Client(address, connect_timeout=CONNECT_TIMEOUT)
    except FileNotFoundError as exc:
        raise SystemExit(f"pathways: {exc}") from None


def _status(args) -> int:
    with _client(args.address) as c:
        before = None
        while True:
            before = _show_status(c, before, clear=args.watch is not None)
            if args.watch is None:
                return 0
            try:
                time.sleep(args.watch)
            except KeyboardInterrupt:
                return 0


def _show_status(c, before, clear=False):
    """Print the cluster once; busy % is over the time since ``before`` (else since start).
    Hosts lost so far are listed too, marked lost."""
    st = c.cluster_status()
    by_host: dict = {}
    for d in st["devices"]:
        by_host.setdefault((d["island"], d["host"]), []).append(d)
    for host, hello in st["lost_hosts"].items():
        by_host[(hello.get("island", -1), host)] = None
    now = {}
    clients = {cid: info for cid, info in st["clients"].items() if cid != c.id}  # not us
    lines = [f"policy {st['policy']}; clients connected: {len(clients)}"]
    for cid, info in clients.items():
        lines.append(f"  client {cid}: weight {info['weight']:g}, priority {info['priority']},"
                     f" runs running {info['running']}, gangs queued {info['queued']}")
    statuses = c.host_status()
    for (island, host), devs in sorted(by_host.items()):
        hello = st["hosts"].get(host) or st["lost_hosts"][host]
        title = (f"island {island} host {host} ({hello.get('hostname', '?')}, pid"
                 f" {hello.get('pid', '?')}):")
        if devs is None:
            lines.append(f"{title} lost, with its devices {hello.get('device_ids', '?')}")
            continue
        lines.append(title)
        lines += _device_lines(devs, statuses[host], before, now)
    if clear:
        print("\033[2J\033[H", end="")
    print("\n".join(lines), flush=True)
    return now


def _device_lines(devs, hs, before, now) -> list[str]:
    """One line per device of a live host whose status is ``hs``; notes each device's busy
    seconds and the host's uptime in ``now``, for the next refresh."""
    lines = []
    for d in devs:
        info = hs["devices"].get(d["id"], {})
        used, cap = info.get("hbm_used", 0), info.get("hbm_capacity", 1)
        busy, t = info.get("busy_seconds", 0.0), hs.get("uptime", 1.0)
        now[d["id"]] = (busy, t)
        b0, t0 = (before or {}).get(d["id"], (0.0, 0.0))
        pct = 100 * (busy - b0) / max(t - t0, 1e-9)
        lines.append(f"  device {d['id']:3d} {d['kind']}: HBM {used / 2**20:9.1f} MiB"
                     f" / {cap / 2**30:.0f} GiB, busy {pct:5.1f}%"
                     f" {'since last refresh' if before else 'since start'}")
    return lines


def _dashboard(args) -> int:
    from .dashboard import Dashboard

    client = _client(args.address)
    try:
        with Dashboard(args.address, args.port, args.bind, args.hz, args.window,
                       client=client) as dash:
            if not ipaddress.ip_address(dash.server.server_address[0]).is_loopback:
                print(f"dashboard: warning: serving plain HTTP on {args.bind}: its URL's token"
                      " and the page (the cluster's names, errors and tracebacks) cross the"
                      " network unencrypted; prefer the default and ssh -L", file=sys.stderr,
                      flush=True)
            stop = _stop_on_signals()
            print(f"dashboard of {args.address}: open {dash.url}", flush=True)
            _wait_for_stop(stop)
    finally:
        client.close()
    return 0


def _trace(args) -> int:
    from .client.trace import chrome_trace, collect, marks, write

    with _client(args.address) as c:
        print(f"recording every device's timeline for {args.seconds:g} s ...", flush=True)
        since = marks(c)
        begin = time.perf_counter()
        time.sleep(args.seconds)
        trace = chrome_trace(collect(c, since), begin)
    write(args.output, trace)
    n = sum(1 for e in trace["traceEvents"] if e.get("ph") == "X")
    print(f"wrote {args.output}: {n} events over {args.seconds:g} s (open in"
          " https://ui.perfetto.dev)")
    return 0


def _plot(args) -> int:
    from .plot import plot

    print(f"drawing {args.trace} (loading matplotlib, then one row per device) ...", flush=True)
    util = plot(args.trace, args.output)
    print(f"wrote {args.output}")
    for row, u in util.items():
        print(f"  {row}: {u:.1%} busy")
    return 0


def _k8s(args) -> int:
    from .k8s import Spec, render, to_yaml

    try:
        spec = Spec(args.hosts, args.islands, args.devices_per_host, args.image,
                    args.namespace, args.name, args.port)
    except ValueError as exc:
        raise SystemExit(f"pathways k8s render: {exc}") from None
    text = to_yaml(render(spec, args.embed_keys))
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    Path(args.output).write_text(text)
    keys = "" if args.embed_keys else (f"; first: pathways keys DIR && kubectl create secret"
                                       f" generic {spec.name}-keys --from-file=DIR"
                                       f" -n {spec.namespace}")
    print(f"wrote {args.output} ({spec.hosts} hosts); clients connect to {spec.address}"
          f"{keys}", file=sys.stderr)
    return 0


def _slurm(args) -> int:
    from .slurm import run

    try:
        return run(args)
    except ValueError as exc:  # a shape the allocation cannot take
        raise SystemExit(f"pathways slurm: {exc}") from None


def _keys(args) -> int:
    from plaque.security import ENV, generate

    secret = generate(args.directory)
    print(f"wrote {secret} and its public key; give the directory to every coordinator,"
          f" host and client: {ENV}={args.directory} (pw.connect(..., keys=DIR))")
    return 0


def _simulate(args) -> int:
    """Run a script with every ``pw.local_cluster`` it starts simulated (``pathways.simulated``)."""
    import runpy

    from . import cluster
    from .simulated.faults import parse_faults

    try:
        plan = parse_faults(args.faults)
    except ValueError as exc:
        raise PathwaysError(f"--faults: {exc}") from None
    if not os.path.isfile(args.script):
        raise PathwaysError(f"no script at {args.script}")
    cluster.simulation_defaults = {
        "seed": args.seed, "cpu": None if args.cpu == "none" else args.cpu, "cost": args.cost,
        "latency": args.latency, "faults": plan}
    sys.argv = [args.script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        cluster.simulation_defaults = None
    return 0


def parser() -> argparse.ArgumentParser:
    """The ``pathways`` command line: every option with its help and default."""
    fmt = HelpFormatter
    ap = argparse.ArgumentParser(prog="pathways", formatter_class=fmt,
                                 description="Run and inspect Pathways clusters.")
    ap.add_argument("-v", "--verbose", action="count", default=0,
                    help="more logging (-v info, -vv debug); errors with their traceback")
    sub = ap.add_subparsers(dest="command", required=True)

    def command(name, text):
        return sub.add_parser(name, help=text, description=text, formatter_class=fmt)

    def policy_and_window(p):
        p.add_argument("--policy", choices=("fifo", "share", "priority"), default="fifo",
                       help="how each island's scheduler orders clients' gangs: fifo, share"
                            " (device time by the weights clients give to pw.connect) or"
                            " priority (strict, by pw.connect(priority=...))")
        p.add_argument("--window", type=int, default=8,
                       help="share/priority: programs admitted at once per island")

    up = command("up", "start a local cluster (coordinator and hosts) and keep it running")
    up.add_argument("--islands", type=int, default=1, help="islands of devices")
    up.add_argument("--hosts-per-island", type=int, default=2, help="host processes per island")
    up.add_argument("--devices-per-host", type=int, default=4,
                    help="emulated TPUs per host")
    policy_and_window(up)
    up.add_argument("--insecure", action="store_true",
                    help="no CURVE keys: any local user can reach the cluster (otherwise a"
                         " throw-away key pair in a private temporary directory, named by the"
                         " printed address and removed on exit)")
    up.add_argument("--dashboard", action="store_true",
                    help="also serve the live dashboard (pathways dashboard) and print its URL")
    up.add_argument("--dashboard-port", type=int, default=0,
                    help="the dashboard's HTTP port on 127.0.0.1 (default: any free one)")
    co = command("coordinator", "run a coordinator (resource manager, schedulers)")
    co.add_argument("--bind", default="tcp://127.0.0.1",
                    help="where to listen: tcp://HOST (a free port is picked) or ipc")
    co.add_argument("--port", type=int, default=0,
                    help="the port clients and hosts dial first (0: a free one); the others"
                         " are always free ones, found through it")
    co.add_argument("--heartbeat-timeout", type=float, default=3.0,
                    help="seconds of silence after which a host is declared lost")
    policy_and_window(co)
    co.add_argument("--client-timeout", type=float, default=5.0,
                    help="a client silent this long is gone: its buffers and runs are freed")
    co.add_argument("--insecure", action="store_true",
                    help="listen on plain TCP without keys, which anyone who reaches the port"
                         " can run code through (refused without this flag)")
    ho = command("host", "run a host (emulated devices) that joins a coordinator")
    ho.add_argument("--coordinator", required=True, type=address_arg,
                    help=f"the coordinator's address: {ADDRESS_HELP}")
    ho.add_argument("--island", type=int, default=0, help="the island this host's devices join")
    ho.add_argument("--devices", type=int, default=4, help="emulated TPUs on this host")
    ho.add_argument("--hbm-gib", type=float, default=16.0, help="HBM per emulated device, GiB")
    ho.add_argument("--backend", choices=BACKENDS, default="emulated",
                    help="emulated: modelled TPUs (the default); jax: this process's own JAX"
                         " devices (GPUs or TPUs where there are, else --devices XLA CPU"
                         " devices), whose kernels take their real time")
    ho.add_argument("--kernel-limit", type=float, default=30.0, metavar="SECONDS",
                    help="a kernel body running longer is stopped and its call fails with"
                         " KernelTimeout (0: no limit; shard_map(limit=) sets one function's)")
    add_worker_options(ho)
    st = command("status", "show islands, hosts (machine and pid), devices and clients")
    st.add_argument("address", type=address_arg, help=ADDRESS_HELP)
    st.add_argument("--watch", type=float, nargs="?", const=1.0, default=None,
                    metavar="SECONDS", help="refresh every SECONDS (1 if given alone) until"
                                            " Ctrl-C")
    da = command("dashboard", "serve a live page of the cluster (devices, timelines, hosts,"
                              " clients) on 127.0.0.1")
    da.add_argument("address", type=address_arg, help=ADDRESS_HELP)
    da.add_argument("--port", type=int, default=0, help="the HTTP port (default: any free one)")
    da.add_argument("--bind", default="127.0.0.1",
                    help="the HTTP interface (default 127.0.0.1: this machine only)")
    da.add_argument("--hz", type=float, default=4.0, help="updates per second (default 4)")
    da.add_argument("--window", type=float, default=10.0,
                    help="seconds of kernels shown per device (default 10)")
    ke = command("keys", "create the CURVE key pair a secured cluster needs")
    ke.add_argument("directory", help="where to write the key pair (created if missing)")
    tr = command("trace", "record every device's timeline as Chrome trace JSON")
    tr.add_argument("address", type=address_arg, help=ADDRESS_HELP)
    tr.add_argument("--seconds", type=float, default=5.0, help="how long to record")
    tr.add_argument("-o", "--output", default="trace.json", help="the JSON file to write")
    k8 = command("k8s", "Kubernetes manifests for a cluster")
    k8s_sub = k8.add_subparsers(dest="k8s_command", required=True)
    rn = k8s_sub.add_parser("render", formatter_class=fmt,
                            help="write a coordinator StatefulSet, a hosts Indexed Job, a"
                                 " headless Service and the address ConfigMap",
                            description="Write the manifests of a Pathways cluster on"
                                        " Kubernetes (deploy/kubernetes/README.md).")
    rn.add_argument("--hosts", type=int, required=True, help="host pods")
    rn.add_argument("--islands", type=int, default=1, help="islands (hosts split evenly)")
    rn.add_argument("--devices-per-host", type=int, default=4, help="emulated TPUs per host")
    rn.add_argument("--image", default="pathways-open:latest",
                    help="a container image with this package installed"
                         " (deploy/kubernetes/Dockerfile)")
    rn.add_argument("--namespace", default="default", help="the namespace of every object")
    rn.add_argument("--name", default="pathways", help="the prefix of every object's name")
    rn.add_argument("--port", type=int, default=5555, help="the coordinator's client port")
    rn.add_argument("--embed-keys", metavar="DIR", default=None,
                    help="put this key pair (pathways keys DIR) into a rendered Secret;"
                         " otherwise create NAME-keys yourself with kubectl")
    rn.add_argument("-o", "--output", default="-", help="the YAML file to write (-: stdout)")
    sl = command("slurm", "inside a Slurm job: the coordinator on this node, hosts on every"
                          " node of the allocation, then COMMAND with $PATHWAYS_ADDRESS set;"
                          " all stopped when it exits or the job ends")
    sl.add_argument("--devices-per-host", type=int, default=4, help="emulated TPUs per host")
    sl.add_argument("--hosts-per-node", type=int, default=1, help="host processes per node")
    sl.add_argument("--islands", type=int, default=1,
                    help="islands: consecutive groups of nodes (of host ranks)")
    policy_and_window(sl)
    sl.add_argument("--port", type=int, default=0,
                    help="the coordinator's client port (0: a free one)")
    sl.add_argument("--keys-dir", default=None,
                    help="where to make the job's CURVE key pair, on a file system every node"
                         " sees; removed at the end (default: ~/.pathways/slurm-JOBID)")
    sl.add_argument("--insecure", action="store_true",
                    help="no CURVE keys: anyone who reaches the nodes can run code")
    sl.add_argument("--address-file", default=None, metavar="FILE",
                    help="also write the address here, for clients outside the job")
    sl.add_argument("--timeout", type=float, default=120.0,
                    help="seconds for every host to join before giving up")
    sl.add_argument("run", nargs=argparse.REMAINDER, metavar="COMMAND",
                    help="what to run against the cluster (after --); its exit status is"
                         " this command's; none: serve until the job ends or Ctrl-C")
    si = command("simulate", "run a Python script with every pw.local_cluster it starts"
                             " simulated: the real roles in virtual time in this process, each"
                             " with its own virtual CPU, replayed from a seed")
    si.add_argument("--seed", type=int, default=0, help="draws every chance (message faults)")
    si.add_argument("--cpu", choices=("measured", "fixed", "none"), default="measured",
                    help="what a handler costs its role: the thread CPU it used, --cost"
                         " each (bit-for-bit replay), or nothing")
    si.add_argument("--cost", type=float, default=2e-5, metavar="SECONDS",
                    help="a handler's cost with --cpu fixed")
    si.add_argument("--latency", type=float, default=50e-6, metavar="SECONDS",
                    help="each control or client message's network latency")
    si.add_argument("--faults", default="", metavar="PLAN",
                    help="comma-separated: kill:host-N@T, freeze:ROLE@T+S, drop:P, delay:P:MAX"
                         " (times in virtual seconds after the cluster is up)")
    si.add_argument("script", help="the Python script to run")
    si.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    pl = command("plot", "draw a trace as a PNG timeline (needs the [plot] extra)")
    pl.add_argument("trace", help="a trace JSON from pathways trace or client.trace")
    pl.add_argument("-o", "--output", default="timeline.png", help="the PNG file to write")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.command == "host":
        _same_hash_seed(sys.argv[1:] if argv is None else list(argv))
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    role = f"host island={args.island}" if args.command == "host" else args.command
    logging.basicConfig(level=level, format=f"%(asctime)s pathways-{role}"
                        f" pid={os.getpid()} %(levelname)s %(name)s: %(message)s")
    handler = {"up": _up, "coordinator": _coordinator, "host": _host, "status": _status,
               "trace": _trace, "plot": _plot, "keys": _keys, "k8s": _k8s,
               "slurm": _slurm, "simulate": _simulate, "dashboard": _dashboard}
    try:
        return handler[args.command](args)
    except PathwaysError as exc:  # one line; the traceback with -v
        if args.verbose:
            raise
        print(f"pathways: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
