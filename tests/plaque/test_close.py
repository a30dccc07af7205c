"""Closing a cluster settles everything asked of it: a run or a call asked for while it
closes either runs or fails with ClusterClosed; none is left pending, none waits out its
timeout."""

from __future__ import annotations

import concurrent.futures as cf

from conftest import CloseBeforePosting

import plaque
from plaque.testing.operators import sparse_graph


def closing_while_asked(ask):
    """What ``ask(cluster, installed)`` gives when the cluster closes just before its job is
    posted; the close is waited for."""
    with plaque.local_cluster(workers=1, transport="inproc") as c:
        installed = c.install(sparse_graph())
        late = c._loop = CloseBeforePosting(c._loop, c.close)
        try:
            return ask(c, installed)
        finally:
            assert late.joined()


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
