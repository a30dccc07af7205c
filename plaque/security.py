"""CURVE authentication and encryption for every socket, when keys are configured.

The wire carries pickled functions, so a process reachable from another machine must only
talk to peers that hold the cluster's key. ``plaque keys DIR`` (or ``pathways keys DIR``)
writes one CURVE key pair, ``DIR/cluster.key`` (public) and ``DIR/cluster.key_secret``; give
the directory to every process of the cluster, coordinator, hosts, workers and clients, with
``PLAQUE_KEYS=DIR`` in their environment (``pw.local_cluster(keys=DIR)`` does it for the
processes it starts). Then:

- every bound socket is a CURVE server, and a ZAP handler on its context admits only clients
  whose public key is in DIR: a peer without the secret key never completes the handshake, so
  nothing it sends is ever delivered, let alone unpickled;
- every connecting socket is a CURVE client with the cluster's key pair.

Without ``PLAQUE_KEYS`` a socket is plain, which is why everything binds to loopback unless
told otherwise, and why a process started by hand refuses to listen on plain TCP (loopback
too: every local user reaches it) unless told ``--insecure`` (``refuse_plain``).

Local clusters (``pw.local_cluster``, ``pathways up``, ``plaque.local_cluster``) do not wait to
be told. By default they listen on ``ipc://`` sockets in a private temporary directory
(``private_socket_dir``, mode 0700), where the kernel refuses any other user's connect; no
CURVE, since the processes of one user on one machine gain nothing from encrypting what
file permissions already keep private. Where they must use TCP (a long ``$TMPDIR``, an
explicit TCP bind or port) they make a throw-away key pair (``ephemeral``) in such a
directory instead, give it to the processes they start and ``discard`` it when they stop;
the address then names the directory, ``tcp://127.0.0.1:5555?keys=/tmp/pathways-keys-x1y2``
(``split_address``), so a client of the same user needs nothing else to connect.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import zmq

ENV = "PLAQUE_KEYS"
NAME = "cluster"
QUERY = "keys="  # an address naming its key directory: ENDPOINT?keys=DIR

_lock = threading.Lock()
_loaded: dict[str, tuple[bytes, bytes]] = {}
_authenticators: dict[int, object] = {}  # id(context) -> ThreadAuthenticator


def generate(directory) -> Path:
    """Write a new cluster key pair into ``directory``; returns the secret key file."""
    import zmq.auth

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for old in (directory / f"{NAME}.key", directory / f"{NAME}.key_secret"):
        if old.exists():
            old.unlink()
    _, secret = zmq.auth.create_certificates(str(directory), NAME)
    os.chmod(secret, 0o600)
    return Path(secret)


def ephemeral(prefix: str = "plaque-keys-") -> str:
    """A new private temporary directory (mode 0700) holding a new cluster key pair (secret
    key 0600); the caller removes it with ``discard``.

    >>> directory = ephemeral("pathways-keys-")  # e.g. /tmp/pathways-keys-k2j4x9
    >>> discard(directory)
    """
    directory = tempfile.mkdtemp(prefix=prefix)
    try:
        os.chmod(directory, 0o700)  # mkdtemp's mode already, whatever the umask; made explicit
        generate(directory)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path, less its NUL)
SOCKET_NAME = len("/plaque-") + 12  # what ``bind_socket`` adds to a directory's path


def private_socket_dir(prefix: str = "plaque-") -> str | None:
    """A new private temporary directory (mode 0700) for a local cluster's ``ipc://`` sockets,
    which the caller removes with ``discard``; None if socket paths in it would be longer
    than the kernel takes (a long ``$TMPDIR``: the caller uses TCP with keys instead).

    Another user cannot enter the directory, so the kernel refuses their connect to any
    socket in it: on one machine that is what CURVE would give, without encrypting every
    byte between processes of the same user."""
    directory = tempfile.mkdtemp(prefix=prefix)
    os.chmod(directory, 0o700)  # mkdtemp's mode already, whatever the umask; made explicit
    if len(os.fsencode(directory)) + SOCKET_NAME > SOCKET_PATH_MAX:
        os.rmdir(directory)
        return None
    return directory


# set by an insecure local cluster for the processes it starts: it has warned (or was asked
# in code), so they do not each warn again
WARNED_ENV = "PLAQUE_INSECURE_WARNED"
INSECURE_WARNING = ("warning: --insecure: no CURVE keys, so any local user can run code in"
                    " this cluster")


def private_directory(path) -> bool:
    """Whether ``path`` is a directory this user owns and no other user may enter."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return os.path.isdir(path) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def private_ipc(bind: str) -> bool:
    """Whether ``bind`` is ``ipc://DIR/`` (or a socket path in DIR) for a private ``DIR``."""
    if not bind.startswith("ipc://"):
        return False
    path = bind[len("ipc://"):]
    return bool(path) and private_directory(path if bind.endswith("/")
                                            else os.path.dirname(path))


def refuse_plain(bind: str, insecure: bool) -> None:
    """Check that a process started by hand (``pathways coordinator``, ``pathways host``,
    ``plaque worker``) may listen at ``bind``: with keys (``$PLAQUE_KEYS``, or an address's
    ``?keys=DIR`` adopted into it), on ``inproc://``, on ``ipc://`` sockets in a private
    directory (one this user owns and no other may enter), or when told ``insecure``, which
    prints ``INSECURE_WARNING`` to stderr (unless ``$PLAQUE_INSECURE_WARNED`` says the
    cluster that started it has). Anything else raises ``PermissionError`` saying
    how to get keys: another user, or anyone who reaches the port, could run code in the
    cluster (loopback is no exception: every local user reaches it)."""
    if keys_dir() is not None or bind.startswith("inproc://"):
        return
    if private_ipc(bind):
        return
    if insecure:
        if not os.environ.get(WARNED_ENV):
            print(INSECURE_WARNING, file=sys.stderr, flush=True)
        return
    raise PermissionError(
        f"will not listen on {bind} without keys: anyone who reaches it could run"
        f" code in the cluster (on loopback, any local user). Make keys with 'pathways keys"
        f" DIR' and give them to every process ({ENV}=DIR, or an address ending in ?keys=DIR),"
        f" bind ipc://DIR/ in a directory only you can enter, or pass --insecure to accept"
        f" that")


def discard(directory: str) -> None:
    """Remove a directory from ``ephemeral`` and forget its keys (no error if it is gone)."""
    shutil.rmtree(directory, ignore_errors=True)
    with _lock:
        _loaded.pop(str(directory), None)


def keys_dir() -> str | None:
    return os.environ.get(ENV) or None


def split_address(address: str) -> tuple[str, str | None]:
    """An address's endpoint and the key directory it names (``None`` if it names none).

    >>> split_address("tcp://127.0.0.1:5555?keys=/tmp/pathways-keys-x1y2")
    ('tcp://127.0.0.1:5555', '/tmp/pathways-keys-x1y2')
    >>> split_address("tcp://127.0.0.1:5555")
    ('tcp://127.0.0.1:5555', None)

    Everything after ``?keys=`` is the directory, verbatim (no %-decoding). Raises
    ``ValueError`` for an address that is not ``SCHEME://...``, optionally followed by
    ``?keys=DIR``.
    """
    endpoint, sep, query = str(address).partition("?")
    directory = query[len(QUERY):] if query.startswith(QUERY) else ""
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme == "tcp":
        bad = not host or not port.isdigit() or not 0 < int(port) < 65536
    else:
        bad = scheme not in ("ipc", "inproc") or not rest
    if bad or (sep and not directory):
        raise ValueError(f"malformed address {address!r}: expected tcp://HOST:PORT (a port in"
                         f" 1-65535), ipc://PATH or inproc://NAME, optionally followed by"
                         f" ?{QUERY}DIR")
    return endpoint, directory or None


def adopt(address: str) -> str:
    """A process started with ``address``: its endpoint; the key directory it names, if any,
    becomes this process's ``$PLAQUE_KEYS`` (every socket it makes then uses it)."""
    endpoint, directory = split_address(address)
    if directory is not None:
        os.environ[ENV] = directory
    return endpoint


def with_keys(address: str, directory) -> str:
    """``address`` naming the key directory ``directory`` (see ``split_address``)."""
    return f"{address}?{QUERY}{directory}"


def check(directory) -> None:
    """Raise a clear error now if ``directory`` holds no usable key pair (else a client would
    only time out)."""
    _keys(directory)


def _keys(directory) -> tuple[bytes, bytes]:
    import zmq.auth

    directory = str(directory)
    with _lock:
        if directory not in _loaded:
            path = Path(directory) / f"{NAME}.key_secret"
            if not Path(directory).exists():  # a stopped local cluster's, most likely
                raise FileNotFoundError(f"no key directory {directory}: a local cluster's"
                                        " keys go when it stops (is it running?); keys of"
                                        " your own are made with 'pathways keys DIR'")
            if not path.exists():
                raise FileNotFoundError(f"no CURVE key pair in {directory} (no {path.name}):"
                                        " create keys with 'pathways keys DIR'")
            public, secret = zmq.auth.load_certificate(str(path))
            if secret is None:
                raise ValueError(f"{path} holds no secret key")
            _loaded[directory] = (public, secret)
        return _loaded[directory]


def server(sock: zmq.Socket, directory: str | None = None) -> None:
    """Make a socket about to bind a CURVE server admitting only the cluster's key (keys from
    ``directory``, else ``$PLAQUE_KEYS``; neither: leave the socket plain)."""
    directory = directory or keys_dir()
    if directory is None:
        return
    public, secret = _keys(directory)
    _authenticate(sock.context, directory)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def encrypts(where: str, directory: str | None = None) -> bool:
    """Whether a socket at ``where`` uses CURVE: keys in ``directory`` or ``$PLAQUE_KEYS``,
    and an endpoint outside this process. Such a socket sends large buffers in frames of a
    MiB (``plaque.wire.chunked``)."""
    return not in_process(where) and (directory or keys_dir()) is not None


def in_process(address: str) -> bool:
    """Whether ``address`` is a ZeroMQ ``inproc://`` endpoint: reachable only by sockets of
    this process and its context, so it needs (and gets) no CURVE."""
    return address.startswith("inproc://")


def connect(sock: zmq.Socket, address: str, directory: str | None = None) -> None:
    """Connect ``sock`` to ``address`` as a CURVE client of the cluster (``client``), or
    plainly to an in-process endpoint."""
    if not in_process(address):
        client(sock, directory)
    sock.connect(address)


def client(sock: zmq.Socket, directory: str | None = None) -> None:
    """Make a socket about to connect a CURVE client of the cluster (keys from ``directory``,
    else ``$PLAQUE_KEYS``)."""
    directory = directory or keys_dir()
    if directory is None:
        return
    public, secret = _keys(directory)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = public


def _authenticate(ctx: zmq.Context, directory: str) -> None:
    from zmq.auth.thread import ThreadAuthenticator

    with _lock:
        if id(ctx) in _authenticators:
            return
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain="*", location=directory)
        _authenticators[id(ctx)] = auth


def release(ctx: zmq.Context) -> None:
    """Stop the context's authenticator (before ``ctx.term()``, which would wait for it)."""
    with _lock:
        auth = _authenticators.pop(id(ctx), None)
    if auth is not None:
        auth.stop()
