"""A client closed while another thread is asking something of it: what was asked either
gets its answer or fails with ClientClosed, never hangs nor meets a closed event loop."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
from conftest import CloseBeforePosting

import pathways as pw
from pathways import protocol
from pathways.errors import ClientClosed


def test_a_request_made_while_the_client_closes_settles(pw_cluster):
    client = pw.connect(pw_cluster.address)
    session = client.session
    session.loop = late = CloseBeforePosting(session.loop, client.close)
    try:
        fut = session.request(session.address, protocol.Status(None))
    finally:
        assert late.joined()
    assert client.closed
    try:
        error = fut.exception(timeout=10)
    except cf.TimeoutError:
        raise AssertionError("the request never settled") from None
    assert error is None or isinstance(error, ClientClosed), error  # answered, or refused
    with pytest.raises(ClientClosed):  # and after the close, at once
        session.request(session.address, protocol.Status(None))
