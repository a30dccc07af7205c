"""Closing a cluster settles everything asked of it: a run or a call asked for while it
closes either runs or fails with ClusterClosed; none is left pending, none waits out its
timeout."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import plaque
from plaque.testing.operators import sparse_graph


class CloseBeforePosting:
    """The cluster's own loop, except that the first job the asking thread posts is held
    back while ``close()`` runs on another thread (for at most a second): the interleaving
    where a request found the cluster open and the close came before its job was posted."""

    def __init__(self, cluster):
        self.loop, self.cluster = cluster._loop, cluster
        self.asker = threading.current_thread()
        self.closer: threading.Thread | None = None

    def call_soon_threadsafe(self, callback, *args):
        if self.closer is None and threading.current_thread() is self.asker:
            self.closer = threading.Thread(target=self.cluster.close)
            self.closer.start()
            self.closer.join(1.0)  # done, unless close waits for this post to be queued
        return self.loop.call_soon_threadsafe(callback, *args)

    def __getattr__(self, name):
        return getattr(self.loop, name)


def closing_while_asked(ask):
    """What ``ask(cluster, installed)`` gives when the cluster closes just before its job is
    posted; the close is waited for."""
    with plaque.local_cluster(workers=1, transport="inproc") as c:
        installed = c.install(sparse_graph())
        late = c._loop = CloseBeforePosting(c)
        try:
            return ask(c, installed)
        finally:
            late.closer.join(30)
            assert not late.closer.is_alive()


def test_a_run_asked_for_while_the_cluster_closes_settles():
    fut = closing_while_asked(lambda c, installed: installed.run(3))
    try:
        error = fut.exception(timeout=10)
    except cf.TimeoutError:
        raise AssertionError("the run never settled") from None
    assert error is None or isinstance(error, plaque.ClusterClosed), error


def test_a_call_made_while_the_cluster_closes_is_answered():
    got = closing_while_asked(lambda c, installed: c.progress(timeout=10))
    assert isinstance(got, dict)


def test_after_the_close_runs_and_calls_are_refused_at_once():
    with plaque.local_cluster(workers=1, transport="inproc") as c:
        installed = c.install(sparse_graph())
    assert isinstance(installed.run(1).exception(timeout=0), plaque.ClusterClosed)
    try:
        c.progress(timeout=0.1)
    except plaque.ClusterClosed:
        pass
    else:
        raise AssertionError("progress() on a closed cluster did not raise ClusterClosed")
