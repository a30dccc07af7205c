"""``plaque`` command line: ``plaque worker --join ADDRESS`` starts a worker; ``plaque clean
[TARGET ...]`` removes what killed drivers left (``plaque.leftovers``)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import select
import signal
import socket
import sys

import uvloop

from . import leftovers, security
from .endpoint import serve_worker_core
from .worker import WorkerCore
from .zmq_transport import ZmqTransport


def die_with_parent() -> None:
    """Ask Linux to SIGKILL us when the parent dies, so local clusters never leak workers."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


async def serve_worker(join: str, bind: str, coordinator_timeout: float) -> str:
    transport = ZmqTransport(bind)
    core = WorkerCore(transport.address, join,
                      info={"pid": os.getpid(), "host": socket.gethostname()},
                      coordinator_timeout=coordinator_timeout)
    return await serve_worker_core(core, transport)


COLLECT_EVERY = 20_000  # net allocations between two young-generation collections (default 700)


def settle_collector() -> None:
    """Tune Python's cyclic collector for a long-running role process, once it has started:
    what lives now (modules, classes, the role's own state) is frozen, so no collection scans
    it again, and the young generation is collected every ``COLLECT_EVERY`` net allocations
    instead of every 700. A role keeps thousands of records it made on the hot path (a
    host's kernel records, a worker's recent runs), so at the default threshold a third of the
    objects made per call were scanned two or three times on their way to the oldest
    generation. Garbage in cycles is still collected, a little later."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(COLLECT_EVERY, middle, oldest)


# Seconds between two looks of a main thread that waits for a signal. A signal may be taken
# by any thread of the process, and Python runs its handler on the main thread only when that
# thread next runs: one blocked in a wait without an end (Event.wait(), signal.pause()) never
# does, so a SIGTERM taken by another thread was lost and the process ran on for good.
SIGNAL_POLL = 0.5


class SignalStop:
    """Set by the given signals, waited for by the main thread. Its handler takes no lock:
    Python runs a handler on the main thread between two bytecodes, possibly inside the wait
    that waits for it, and a ``threading.Event`` set there waits for the lock its own
    ``wait`` holds (the process hung for good on Ctrl-C). The handler writes a byte to a pipe
    the wait selects on instead."""

    def __init__(self, signals=(signal.SIGINT, signal.SIGTERM)):
        self.signal = None  # the first signal taken
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        for sig in signals:
            signal.signal(sig, self._take)

    def _take(self, signum, frame):
        if self.signal is None:
            self.signal = signum
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self.signal is not None

    def wait(self, timeout: float) -> bool:
        """Until a signal was taken (True) or ``timeout`` seconds passed (False)."""
        if self.signal is None:  # a signal from here on leaves the byte select sees
            select.select([self._read], [], [], timeout)
        return self.signal is not None


def wait_for_signal(stop: SignalStop) -> None:
    """On the main thread: return once ``stop`` took its signal, looking every
    ``SIGNAL_POLL`` seconds so that the handler runs whichever thread took the signal."""
    while not stop.wait(SIGNAL_POLL):
        pass


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each option's default, unless its help states it already (it
    said it twice: "(default: any free one) (default: 0)") or there is none to state (None,
    False: "(default: None)" says nothing)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default is None or action.default is False:
            return text
        return super()._get_help_string(action)


def address_arg(text: str) -> str:
    """argparse type of an address (``tcp://HOST:PORT``, optionally ``?keys=DIR``): a
    malformed one is a one-line usage error."""
    try:
        security.split_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_worker_options(parser) -> None:
    """The options of every process that joins a coordinator (plaque worker, pathways host)."""
    parser.add_argument("--bind", default=None,
                        help="where to listen: tcp://HOST (a free port is picked), ipc (a"
                             " temporary directory) or ipc://DIR/ (default: the directory of"
                             " the coordinator's socket if it is ipc://, else tcp://127.0.0.1)")
    parser.add_argument("--coordinator-timeout", type=float, default=10.0,
                        help="exit when the coordinator is silent this long (seconds)")
    parser.add_argument("--insecure", action="store_true",
                        help="listen on plain TCP without keys, which anyone who reaches the"
                             " port can run code through (refused without this flag)")


def bind_near(coordinator: str, bind: str | None) -> str:
    """Where a process joining ``coordinator`` listens: ``bind`` if given, else next to the
    coordinator's Unix socket (the private directory of a local cluster, which only its
    user can enter), else TCP on loopback."""
    if bind is not None:
        return bind
    endpoint = security.split_address(coordinator)[0]
    if endpoint.startswith("ipc://"):
        return f"{endpoint.rsplit('/', 1)[0]}/"
    return "tcp://127.0.0.1"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "clean":
        return clean(args)
    return worker(args)


def build_parser() -> argparse.ArgumentParser:
    fmt = HelpFormatter
    parser = argparse.ArgumentParser(prog="plaque", description=__doc__, formatter_class=fmt)
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="start a worker that joins a cluster", formatter_class=fmt)
    w.add_argument("--join", required=True, type=address_arg,
                   help="the cluster's address (printed by the driver), ?keys=DIR after it"
                        " to name its CURVE key directory (else $PLAQUE_KEYS)")
    add_worker_options(w)
    c = sub.add_parser("clean", formatter_class=fmt,
                       help="remove what drivers killed mid-run left: sinks' staging"
                            " directories next to TARGETs, local clusters' socket directories")
    c.add_argument("targets", nargs="*", metavar="TARGET",
                   help="a sink's path, as given to it: the directory it is in is searched")
    c.add_argument("--temp-dir", default=None,
                   help="where local clusters keep their sockets (default: the temporary"
                        " directory, $TMPDIR)")
    c.add_argument("-n", "--dry-run", action="store_true", help="only say what it would do")
    return parser


def clean(args) -> int:
    """``plaque clean``: clear the leftovers of processes gone from this host (never a live
    one's), a line per directory."""
    done = leftovers.clean(args.targets, act=not args.dry_run, temp=args.temp_dir)
    for what, path in done:
        print(f"{'would be ' if args.dry_run else ''}{what}: {path}")
    if not done:
        print("nothing left by a process that is gone")
    return 0


def worker(args) -> int:
    """``plaque worker``: serve as a worker of the cluster at ``--join`` until it ends."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format=f"%(asctime)s plaque-worker[{os.getpid()}] "
                        "%(levelname)s %(name)s: %(message)s")
    if os.environ.get("PLAQUE_DIE_WITH_PARENT"):
        die_with_parent()
    join = security.adopt(args.join)
    bind = bind_near(join, args.bind)
    try:
        security.refuse_plain(bind, args.insecure)
    except PermissionError as exc:
        print(f"plaque worker: {exc}", file=sys.stderr)
        return 2
    settle_collector()
    reason = uvloop.run(serve_worker(join, bind, args.coordinator_timeout))
    logging.getLogger("plaque.worker").info("exited: %s", reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
