"""Issue 31: a run's small results (up to ``SMALL_RESULT`` bytes) that the client fetched from
an earlier run of the same program reach it with the run's end, so ``result()`` of one costs
no request to a host; larger ones, and outputs never fetched, stay on the hosts until asked
for, and whatever comes this way equals the reference."""

import ml_dtypes
import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.lowering.lower import SMALL_RESULT


@pytest.fixture
def mesh(client):
    return client.mesh((2, 4), ("d", "m"))


def test_small_results_are_held_when_the_run_ends_and_equal_the_reference(client, mesh):
    """Sharded, replicated and partly replicated results, each assembled from one holder of
    each distinct part."""
    fn = pw.shard_map(lambda x: (x * 2, pw.psum(x, "d"), pw.psum(x.sum(), ("d", "m"))),
                      mesh, P("d", "m"), (P("d", "m"), P(None, "m"), P()))
    value = np.arange(64, dtype=np.float32).reshape(8, 8)
    x = client.put(value, mesh, P("d", "m"))
    for out in fn(x):
        out.block_until_ready()
        assert out.local_copy() is None  # not fetched before: nothing shipped
        out.result()
    outs = fn(x)
    for out in outs:
        out.block_until_ready()
        assert out.local_copy() is not None  # nothing to fetch
    for got, want in zip((o.result() for o in outs), pw.reference(fn)(value)):
        np.testing.assert_array_equal(got, want)


def test_a_small_bfloat16_result_comes_with_its_dtype(client, mesh):
    fn = pw.shard_map(lambda x: x + x, mesh, P("d"), P("d"))
    value = np.linspace(-2, 2, 16).astype(ml_dtypes.bfloat16)
    x = client.put(value, mesh, P("d"))
    fn(x).result()
    out = fn(x).block_until_ready()
    assert out.local_copy() is not None and out.local_copy().dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.result(), value + value)


def test_results_over_the_threshold_are_fetched_and_inputs_are_not_shipped(client, mesh):
    rows = SMALL_RESULT // (4 * 8) + 8  # just over the threshold, float32 [rows, 8]
    fn = pw.shard_map(lambda x: x + 1, mesh, P("d"), P("d"))
    value = np.ones((rows, 8), np.float32)
    x = client.put(value, mesh, P("d"))
    fn(x).result()
    out = fn(x).block_until_ready()
    assert out.local_copy() is None
    np.testing.assert_array_equal(out.result(), value + 1)

    @pw.program
    def passes(x, y):
        return x, fn(y)  # x is the program's input, returned as it is: the client's array

    x = client.put(np.zeros(8, np.float32), mesh, P("d"))
    y = client.put(np.zeros(8, np.float32), mesh, P("d"))
    passes(x, y)[1].result()
    same, small = passes(x, y)
    assert same is x
    assert small.block_until_ready().local_copy() is not None


def test_a_result_deleted_before_its_run_ends_stays_deleted(client, mesh):
    fn = pw.shard_map(lambda x: x * 3, mesh, P("d"), P("d"))
    x = client.put(np.ones(8, np.float32), mesh, P("d"))
    fn(x).result()
    out = fn(x)
    out.delete()
    x.block_until_ready()
    later = fn(x).block_until_ready()  # the cluster goes on; the deleted one holds nothing
    assert out.local_copy() is None and out.is_deleted()
    np.testing.assert_array_equal(later.result(), np.full(8, 3, np.float32))


def test_a_failed_run_ships_nothing_and_fails_its_results(client, mesh):
    def body(x):
        if float(x.flat[0]) != 0:  # zeros pass the client's abstract pass; ones fail
            raise ValueError("no ones here")
        return x

    fn = pw.shard_map(body, mesh, P("d"), P("d"))
    out = fn(client.put(np.ones(8, np.float32), mesh, P("d")))
    with pytest.raises(Exception, match="no ones here"):
        out.result(timeout=60)
    assert out.local_copy() is None


def test_only_the_outputs_fetched_before_are_shipped(client, mesh):
    """Of a program's two small outputs, the one the user fetched comes along from then on;
    the other, never read, stays on the hosts (no cost for values nobody reads)."""
    fn = pw.shard_map(lambda x: (x + 1, x - 1), mesh, P("d"), (P("d"), P("d")))
    x = client.put(np.zeros(8, np.float32), mesh, P("d"))
    first, _ = fn(x)
    first.result()
    for _ in range(2):
        plus, minus = fn(x)
        minus.block_until_ready()
        assert plus.local_copy() is not None and minus.local_copy() is None
        np.testing.assert_array_equal(plus.result(), np.ones(8, np.float32))  # read: wanted
    np.testing.assert_array_equal(minus.result(), np.full(8, -1, np.float32))


def test_an_output_that_came_along_unread_stops_coming(client, mesh):
    """A loop that fetched once (say, to check) and then only chains its outputs: the first
    value that comes along and goes unread stops the shipping; a fetch starts it again."""
    fn = pw.shard_map(lambda x: x + 1, mesh, P("d"), P("d"))
    x = client.put(np.zeros(8, np.float32), mesh, P("d"))
    fn(x).result()
    came = fn(x).block_until_ready()
    assert came.local_copy() is not None
    del came  # unread
    assert fn(x).block_until_ready().local_copy() is None
    fn(x).result()
    assert fn(x).block_until_ready().local_copy() is not None
