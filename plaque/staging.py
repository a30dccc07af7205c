"""The driver's side of a run's sinks: a staging directory per sink, published together.

Before the run the driver makes a hidden staging directory next to each sink's target (named
for this process, ``plaque.leftovers``); the sink's shards write there. When the run succeeds
``commit`` checks every shard's file of every sink, then checks every target (it must not
exist unless the sink may overwrite it; no two sinks may share one), and only then renames:
each target to replace moves aside, each staging directory to its target. If a rename fails,
the ones done are undone in reverse (the output goes back to staging, what it replaced back
to its target), so a run publishes all its sinks or none; output with nowhere to go is kept
(and named in the error). The directories moved aside are removed last, once all is
published.
"""

from __future__ import annotations

import logging
import os
import shutil

from . import leftovers
from .errors import GraphError, SinkError
from .sinks import Sink

log = logging.getLogger("plaque.staging")

__all__ = ["StagedRun", "sink_nodes"]


def sink_nodes(graph) -> list:
    """The nodes of ``graph`` that are sinks."""
    return [n for n in graph.nodes if isinstance(n.factory, Sink)]


class StagedRun:
    """One run's sinks: staging directories made here, each renamed to its target when the
    run succeeds (``commit``) or removed (``abort``). ``sweep``: first clear what dead
    drivers left next to the targets (``leftovers.sweep``)."""

    def __init__(self, nodes, sweep: bool = False):
        self.staged: list[tuple] = []  # (node, spec, staging directory)
        _refuse_shared_targets(nodes)
        if sweep:
            for parent in dict.fromkeys(os.path.dirname(n.factory.path) for n in nodes):
                for what, path in leftovers.sweep(parent):
                    log.info("%s %s, left by a driver that is gone", what, path)
        try:
            for node in nodes:
                spec = node.factory
                parent, leaf = os.path.split(spec.path)
                os.makedirs(parent, exist_ok=True)
                staging = os.path.join(parent, leftovers.hidden_name(leaf.replace("{t}", "t"),
                                                                     "staging"))
                os.mkdir(staging, 0o755)
                self.staged.append((node, spec, staging))
        except OSError as exc:
            self.abort()
            raise SinkError(f"cannot make the staging directory of sink {node.name!r}: {exc}")\
                from exc

    def parts(self, parts):
        """The run's parts with each sink's staging directory as its shards' part."""
        parts = dict(parts or {})
        for node, _, staging in self.staged:
            if node.name in parts:
                raise GraphError(f"parts for {node.name!r}: it is a sink; its shards' parts"
                                 " are its staging directory")
            parts[node.name] = [staging] * node.shards
        return parts

    def commit(self, result) -> None:
        """Check every shard's file, then publish every sink or none; the reports in
        ``result`` then name the files at their targets."""
        t = result.timestamp
        try:
            checked = [self._check(node, staging, result) for node, _, staging in self.staged]
        except Exception:
            self.abort()  # incomplete output: nothing of it is published
            raise
        staged, self.staged = self.staged, []
        moves = [(node.name, staging, spec.target(t), spec.overwrite)
                 for node, spec, staging in staged]
        try:
            _publish_all(moves)
        except SinkError as exc:  # complete output that has nowhere to go: keep it
            kept = [_keep(staging) for _, _, staging in staged if os.path.isdir(staging)]
            raise SinkError(f"{exc}; the run's output is kept in {', '.join(kept)}") from exc
        for (_, _, target, _), reports in zip(moves, checked):
            for report in reports:
                report["file"] = os.path.join(target, report["file"])

    @staticmethod
    def _check(node, staging, result) -> list:
        shards = result.outputs.get(node.name, {})
        reports = [r for s in sorted(shards) for r in shards[s]]
        if sorted(r.get("shard") for r in reports) != list(range(node.shards)):
            raise SinkError(f"sink {node.name!r}: {len(reports)} of its {node.shards} shards"
                            " reported their files")
        for r in reports:
            path = os.path.join(staging, r["file"])
            try:
                size = os.path.getsize(path)
            except OSError:
                raise SinkError(f"sink {node.name!r}: {path} is not visible here; sinks need a"
                                " filesystem the driver and the workers share") from None
            if size != r["bytes"]:
                raise SinkError(f"sink {node.name!r}: {path} has {size} bytes, its shard wrote"
                                f" {r['bytes']}")
        _fsync_dir(staging)
        return reports

    def abort(self) -> None:
        """Remove what is still staged (call once no worker can write to it)."""
        for _, _, staging in self.staged:
            shutil.rmtree(staging, ignore_errors=True)
        self.staged = []


def _refuse_shared_targets(nodes) -> None:
    """SinkError if two sinks would publish to one target (the second would replace or be
    refused by the first's output)."""
    seen: dict = {}
    for node in nodes:
        other = seen.setdefault(node.factory.path, node.name)
        if other != node.name:
            raise SinkError(f"sinks {other!r} and {node.name!r} both publish to"
                            f" {node.factory.path}: give each a path of its own")


def _publish_all(moves) -> None:
    """Rename each ``(name, staging, target, overwrite)`` staging directory to its target,
    all or none (SinkError, with the renames done undone)."""
    for name, _, target, overwrite in moves:
        if os.path.lexists(target) and not overwrite:
            raise SinkError(f"sink {name!r}: {target} already exists; give overwrite=True or"
                            " a path with {t} in it")
    done: list[tuple] = []  # (staging, target, where its old target went, or None)
    try:
        for name, staging, target, _ in moves:
            done.append(_publish(name, staging, target))
    except SinkError as exc:
        stuck = _undo(done)
        if stuck:
            raise SinkError(f"{exc}; undoing the renames before it failed: {stuck}") from exc
        raise
    for parent in dict.fromkeys(os.path.dirname(target) for _, _, target, _ in moves):
        _fsync_dir(parent)
    for _, _, aside in done:  # free last: every target holds the new output now
        if aside is not None:
            _free(aside)


def _publish(name: str, staging: str, target: str) -> tuple:
    """Rename ``staging`` to ``target``, an existing target moved aside first (and back if
    the rename fails); returns ``(staging, target, aside or None)``."""
    aside = None
    if os.path.lexists(target):
        aside = leftovers.renamed(staging, "old", os.path.basename(target))
        try:
            os.rename(target, aside)
        except OSError as exc:
            raise SinkError(f"sink {name!r}: cannot move {target} aside: {exc}") from exc
    try:
        os.rename(staging, target)  # refuses a non-empty directory made meanwhile
    except OSError as exc:
        lost = "" if aside is None or _put_back(aside, target) else \
            f" (what it replaced is kept in {aside})"
        raise SinkError(f"sink {name!r}: cannot rename its output to {target}: {exc}{lost}")\
            from exc
    return staging, target, aside


def _put_back(aside: str, target: str) -> bool:
    try:
        os.rename(aside, target)
    except OSError:
        return False
    return True


def _undo(done: list) -> str:
    """Undo ``_publish``'s renames, last first; what could not be undone, or ''."""
    stuck = []
    for staging, target, aside in reversed(done):
        try:
            os.rename(target, staging)
            if aside is not None:
                os.rename(aside, target)
        except OSError as exc:
            stuck.append(str(exc))
    return "; ".join(stuck)


def _keep(staging: str) -> str:
    """Rename ``staging`` so that no sweep removes it; its new path (or the old one if
    that fails)."""
    kept = leftovers.renamed(staging, "kept")
    try:
        os.rename(staging, kept)
    except OSError:
        return staging
    return kept


def _free(aside: str) -> None:
    """Remove a replaced target: renamed to trash first, so that a sweep finishes the job
    if this process dies midway."""
    trash = leftovers.renamed(aside, "trash")
    try:
        os.rename(aside, trash)
    except OSError:
        trash = aside
    if os.path.isdir(trash) and not os.path.islink(trash):
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.unlink(trash)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
