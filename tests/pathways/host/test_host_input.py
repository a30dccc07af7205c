"""Input processing on the hosts (the paper's Appendix C): client.generate runs a function on
each device's host to make its shard; the result feeds programs like any array."""

import numpy as np
import pytest

import pathways as pw
from pathways import P


def rows(index):
    """Rows i of the global array hold i * 10 + column: each host computes its own part."""
    r, c = index
    return (np.arange(r.start, r.stop)[:, None] * 10.0 + np.arange(c.start, c.stop)[None, :])


def test_generated_shards_equal_the_function_of_their_slices(client):
    mesh = client.mesh((4, 2), ("data", "model"))
    x = client.generate(rows, (16, 6), np.float64, mesh, P("data", "model"))
    want = np.arange(16)[:, None] * 10.0 + np.arange(6)[None, :]
    np.testing.assert_array_equal(x.result(timeout=30), want)
    total = pw.shard_map(lambda v: pw.psum(v.sum(keepdims=True), ("data", "model")), mesh,
                         P("data", "model"), P())
    assert total(x).result(timeout=30)[0] == want.sum()


def test_a_generated_input_is_made_on_every_replica(client):
    mesh = client.mesh((4,), ("data",))
    x = client.generate(lambda idx: np.full(3, 7, np.int32), (3,), np.int32, mesh, P())
    np.testing.assert_array_equal(x.result(timeout=30), np.full(3, 7))


def test_a_wrong_shape_or_a_failing_function_is_a_clear_error(client):
    mesh = client.mesh((2,), ("data",))
    bad = client.generate(lambda idx: np.zeros(5), (8,), np.float64, mesh, P("data"))
    with pytest.raises(pw.ProgramError, match=r"returned float64\[5\].*expected float64\[4\]"):
        bad.result(timeout=30)

    def broken(idx):
        raise OSError("no such dataset")

    failing = client.generate(broken, (8,), np.float64, mesh, P("data"))
    with pytest.raises(pw.RemoteError, match="no such dataset"):
        failing.result(timeout=30)
    with pytest.raises(pw.ProgramError, match="needs a function"):
        client.generate(42, (8,), np.float64, mesh, P("data"))
