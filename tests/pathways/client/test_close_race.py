"""A client closed while another thread is asking something of it: what was asked either
gets its answer or fails with ClientClosed, never hangs nor meets a closed event loop."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

import pathways as pw
from pathways import protocol
from pathways.errors import ClientClosed


class CloseBeforePosting:
    """The session's own loop, except that the first job the asking thread posts is held
    back while ``client.close()`` runs on another thread (for at most a second): a request
    that found the client open, and the close that came before its job was posted."""

    def __init__(self, client):
        self.loop, self.client = client.session.loop, client
        self.asker = threading.current_thread()
        self.closer: threading.Thread | None = None

    def call_soon_threadsafe(self, callback, *args):
        if self.closer is None and threading.current_thread() is self.asker:
            self.closer = threading.Thread(target=self.client.close)
            self.closer.start()
            self.closer.join(1.0)  # done, unless close waits for this post to be queued
        return self.loop.call_soon_threadsafe(callback, *args)

    def __getattr__(self, name):
        return getattr(self.loop, name)


def test_a_request_made_while_the_client_closes_settles(pw_cluster):
    client = pw.connect(pw_cluster.address)
    session = client.session
    session.loop = late = CloseBeforePosting(client)
    try:
        fut = session.request(session.address, protocol.Status(None))
    finally:
        late.closer.join(30)
    assert not late.closer.is_alive() and client.closed
    try:
        error = fut.exception(timeout=10)
    except cf.TimeoutError:
        raise AssertionError("the request never settled") from None
    assert error is None or isinstance(error, ClientClosed), error  # answered, or refused
    with pytest.raises(ClientClosed):  # and after the close, at once
        session.request(session.address, protocol.Status(None))
