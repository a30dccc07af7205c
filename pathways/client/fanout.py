"""Gathering the answers of one request sent to many hosts (a shard each).

``all_done`` is for a result that is only whole when every host succeeded (an array made on the
hosts): it fails at the first error. ``when_all`` waits for every answer, failed or not, for
work that must clean up after the last one (a checkpoint's directory).
"""

from __future__ import annotations

import concurrent.futures as cf

__all__ = ["all_done", "when_all"]


def all_done(futures, new_future=cf.Future) -> cf.Future:
    """A future (made by ``new_future``) that gets None once every one of ``futures``
    succeeded, or the first error."""
    out: cf.Future = new_future()
    left = [len(futures)]

    def one(f):
        if out.done():
            return
        if f.exception() is not None:
            out.set_exception(f.exception())
            return
        left[0] -= 1
        if not left[0]:
            out.set_result(None)

    if not futures:
        out.set_result(None)
    for f in futures:
        f.add_done_callback(one)
    return out


def when_all(futures, then) -> None:
    """``then(error)`` once every future has settled: the first failure's error, or None.
    Waiting for all (not the first failure) keeps a late write out of a removed directory."""
    left, errors = [len(futures)], []

    def one(f):
        if f.exception() is not None:
            errors.append(f.exception())
        left[0] -= 1
        if not left[0]:
            then(errors[0] if errors else None)

    if not futures:
        then(None)
    for f in futures:
        f.add_done_callback(one)
