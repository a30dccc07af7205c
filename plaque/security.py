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

Without ``PLAQUE_KEYS`` nothing changes: plain TCP, which is why everything binds to loopback
unless told otherwise.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import zmq

ENV = "PLAQUE_KEYS"
NAME = "cluster"

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


def keys_dir() -> str | None:
    return os.environ.get(ENV) or None


def _keys(directory: str) -> tuple[bytes, bytes]:
    import zmq.auth

    with _lock:
        if directory not in _loaded:
            path = Path(directory) / f"{NAME}.key_secret"
            if not path.exists():
                raise FileNotFoundError(f"{ENV}={directory}: no {path.name} there; create keys"
                                        " with 'pathways keys DIR'")
            public, secret = zmq.auth.load_certificate(str(path))
            if secret is None:
                raise ValueError(f"{path} holds no secret key")
            _loaded[directory] = (public, secret)
        return _loaded[directory]


def server(sock: zmq.Socket) -> None:
    """Make a socket about to bind a CURVE server admitting only the cluster's key."""
    directory = keys_dir()
    if directory is None:
        return
    public, secret = _keys(directory)
    _authenticate(sock.context, directory)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


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
