"""The Pathways core end to end: real coordinator and host processes, checked against the
reference interpreter."""

import numpy as np

import pathways as pw
from pathways import P


def body(x):
    return pw.psum(x, "data") + 1.0


def test_the_issue_example(client):
    devices = client.devices()
    assert len(devices) == 8 and len({d.host for d in devices}) == 2
    assert len({d.id for d in devices}) == 8
    mesh = client.mesh((2, 4), ("data", "model"))
    step = pw.shard_map(body, mesh, in_specs=P("data"), out_specs=P("data"))
    x0 = np.arange(16.0).reshape(4, 4)
    x = client.put(x0, mesh, P("data"))
    y = step(x)
    assert y.shape == (4, 4) and y.dtype == np.float64
    np.testing.assert_allclose(y.result(timeout=30), pw.reference(step)(x0))

    @pw.program
    def chain(x):
        for _ in range(128):
            x = step(x)
        return x

    z = chain(x)
    np.testing.assert_allclose(z.result(timeout=60), pw.reference(chain)(x0))


def test_op_by_op_calls_chain_through_futures(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    step = pw.shard_map(body, mesh, P("data"), P("data"))
    x0 = np.ones((4, 8))
    x = client.put(x0, mesh, P("data"))
    ys = [x]
    for _ in range(20):
        ys.append(step(ys[-1]))
    want = x0
    for _ in range(20):
        want = pw.reference(step)(want)
    np.testing.assert_allclose(ys[-1].result(timeout=60), want)
