"""What a driver killed mid-run leaves behind, and clearing it.

A driver makes directories that only it removes: hidden ones next to its sinks' targets
(``staging``: a run's output being written; ``old``: a target being replaced, moved aside;
``trash``: a replaced target being removed; ``kept``: output that could not be published,
kept for the user) and, for a local cluster, a private directory of sockets (and one of
throw-away keys) in the temporary directory. Each name records the process that owns it:

    .counts-t.staging-4242@node7-1f3a9c0d2b4e    next to counts-{t}: pid 4242 on node7
    plaque-4242-k2j4x9/                          in $TMPDIR: pid 4242, this machine

``sweep`` (run by the first run of an installed graph with sinks, on each sink's parent) and
``plaque clean`` clear those whose owner ran on this host and is gone, and that this user
owns: staging and trash directories are removed; an old directory goes back to its target
when the target is missing (the owner died between moving it aside and publishing), and is
otherwise left and reported (it died mid-commit: whether the old or the new is wanted is the
user's call); kept output is never touched. A pid that is alive, whatever process holds it
now, keeps its directories: a leftover may outlive its time, never a live driver's work.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
import uuid

log = logging.getLogger("plaque.leftovers")

__all__ = ["clean", "hidden_name", "renamed", "socket_prefix", "sweep", "sweep_temp"]

KINDS = ("staging", "old", "trash", "kept")
_HIDDEN = re.compile(r"^\.(?P<leaf>.+)\.(?P<kind>staging|old|trash|kept)-(?P<pid>\d+)"
                     r"@(?P<host>.+)-(?P<tag>[0-9a-f]{12})$")
_TEMP = re.compile(r"^plaque-(?:keys-)?(?P<pid>\d+)-[a-z0-9_]+$")  # mkdtemp adds [a-z0-9_]


def hidden_name(leaf: str, kind: str) -> str:
    """A new hidden name for a ``kind`` directory of ``leaf``, owned by this process."""
    assert kind in KINDS
    return f".{leaf}.{kind}-{os.getpid()}@{socket.gethostname()}-{uuid.uuid4().hex[:12]}"


def renamed(path: str, kind: str, leaf: str | None = None) -> str:
    """``path`` (a hidden name of ours) as a ``kind`` directory (of ``leaf``, if given), in
    the same directory and with the same owner and tag."""
    parent, name = os.path.split(path)
    m = _HIDDEN.match(name)
    leaf = m["leaf"] if leaf is None else leaf
    return os.path.join(parent, f".{leaf}.{kind}-{m['pid']}@{m['host']}-{m['tag']}")


def socket_prefix(base: str) -> str:
    """The ``mkdtemp`` prefix of a private directory this process owns (``base`` is
    ``plaque-`` or ``plaque-keys-``)."""
    return f"{base}{os.getpid()}-"


def sweep(parent: str, act: bool = True) -> list[tuple[str, str]]:
    """Clear the hidden directories in ``parent`` of owners gone from this host; returns
    ``(what, path)`` for each: ``removed``, ``restored`` (the target it went back to) or
    ``left``. ``act=False`` only says what it would do."""
    done = []
    for entry in _entries(parent):
        m = _HIDDEN.match(entry.name)
        if m is None or m["kind"] == "kept" or not _ours_and_gone(entry, m):
            continue
        try:
            done.append(_clear(entry.path, m, act))
        except OSError as exc:  # another sweeper got there first, or we may not: go on
            log.warning("could not clear %s: %s", entry.path, exc)
    return done


def sweep_temp(directory: str | None = None, act: bool = True) -> list[tuple[str, str]]:
    """Remove the private socket and key directories in ``directory`` (the temporary
    directory) of processes gone; returns ``("removed", path)`` for each."""
    done = []
    for entry in _entries(directory or tempfile.gettempdir()):
        m = _TEMP.match(entry.name)
        if m is None or not _ours_and_gone(entry, m, local=True):
            continue
        if act:
            shutil.rmtree(entry.path, ignore_errors=True)
        done.append(("removed", entry.path))
    return done


def clean(targets, act: bool = True, temp: str | None = None) -> list[tuple[str, str]]:
    """What ``plaque clean`` does: ``sweep`` the parent of each of ``targets`` (sink paths),
    then ``sweep_temp`` of ``temp``."""
    parents = dict.fromkeys(os.path.dirname(os.path.abspath(os.fspath(t))) for t in targets)
    done = [d for parent in parents for d in sweep(parent, act)]
    return done + sweep_temp(temp, act)


def _clear(path: str, m, act: bool) -> tuple[str, str]:
    if m["kind"] in ("staging", "trash"):
        if act:
            shutil.rmtree(path)
        return "removed", path
    target = os.path.join(os.path.dirname(path), m["leaf"])  # kind "old": a moved target
    if os.path.lexists(target):
        return "left", path
    if act:
        os.rename(path, target)
    return "restored", target


def _entries(directory: str) -> list:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except OSError:  # no such directory yet: nothing left in it
        return []


def _ours_and_gone(entry, m, local: bool = False) -> bool:
    """Whether ``entry`` is a real directory of this user whose owner (``m``'s pid, on
    ``m``'s host unless ``local``) has exited."""
    try:
        if not entry.is_dir(follow_symlinks=False) or \
                entry.stat(follow_symlinks=False).st_uid != os.geteuid():
            return False
    except OSError:
        return False
    if not local and m["host"] != socket.gethostname():
        return False  # a pid of another machine says nothing here
    return not _alive(int(m["pid"]))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM), or a pid we cannot ask about
        return True
    return True
