"""Pathways core mechanisms on the session's local cluster (coordinator + 2 hosts), every
result checked against the reference interpreter."""

import asyncio
import dataclasses
import pickle
import threading

import numpy as np
import pytest
from conftest import store_bytes, wait_for_store_bytes

import pathways as pw
from pathways import P, protocol
from pathways.testing.fixtures import in_process_only


def test_collectives_across_hosts_match_the_reference(client):
    mesh = client.mesh((2, 4), ("data", "model"))

    def body(x):
        g = pw.all_gather(x, "data", axis=0, tiled=True)  # crosses hosts
        p = pw.ppermute(x, "model", [(i, (i + 1) % 4) for i in range(4)])
        a = pw.all_to_all(x, "model", split_axis=0, concat_axis=1, tiled=True)
        m = pw.pmean(x, ("data", "model"))
        i = pw.axis_index("data") * 10 + pw.axis_index("model")
        return g.sum(axis=0, keepdims=True) + p.sum() + a.sum() + m + i

    f = pw.shard_map(body, mesh, P("data", "model"), P("data", "model"))
    x0 = np.arange(64.0).reshape(8, 8)
    y = f(client.put(x0, mesh, P("data", "model")))
    np.testing.assert_allclose(y.result(30), pw.reference(f)(x0))


def test_programs_print_one_equation_per_call_whatever_the_shards(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    inc = pw.shard_map(lambda x: x + 1, mesh, P("data"), P("data"), name="inc")

    @pw.program
    def three(x):
        return inc(inc(inc(x)))

    x = client.put(np.zeros((4, 2), np.float32), mesh, P("data"))
    z = three(x)
    text = str(three.trace([pw.compiled.Aval((4, 2), np.dtype(np.float32))]))
    assert text.count("= inc[data=2,model=4]") == 3, text
    np.testing.assert_array_equal(z.result(30), np.full((4, 2), 3, np.float32))


def test_bad_specs_and_shapes_fail_at_call_time(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    with pytest.raises(pw.ShardingError, match="names mesh axis 'batch'"):
        pw.shard_map(lambda v: v, mesh, P("batch"), P("batch"))(
            client.put(np.zeros((4, 4)), mesh, P("data")))
    y = client.put(np.zeros((3, 4)), mesh, P())
    with pytest.raises(pw.ShardingError, match="size 3, which is not divisible by 2"):
        pw.shard_map(lambda v: v, mesh, P("data"), P("data"))(y)
    with pytest.raises(pw.ShardingError, match="unknown mesh axis 'experts'"):
        pw.shard_map(lambda v: pw.psum(v, "experts"), mesh, P("data"), P("data"))(
            client.put(np.zeros((4, 4)), mesh, P("data")))
    with pytest.raises(pw.ResourceError, match="16"):
        client.mesh((4, 4), ("a", "b"))  # 16 devices on an 8-device cluster


def test_put_rejects_a_spec_that_does_not_divide(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    with pytest.raises(pw.ShardingError):
        client.put(np.zeros((6, 4)), mesh, P("model"))


def failing(x):
    if pw.axis_index("data") == 1:
        raise ValueError("bad shard on purpose")
    return pw.psum(x, "data")


def test_body_exception_fails_futures_with_remote_traceback_and_cluster_goes_on(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    f = pw.shard_map(failing, mesh, P("data"), P("data"))
    ok = pw.shard_map(lambda v: pw.psum(v, "data") * 2, mesh, P("data"), P("data"))
    x = client.put(np.ones((4, 4)), mesh, P("data"))
    y = f(x)
    z = ok(y)  # depends on the failed call: fails too, instead of hanging
    with pytest.raises(pw.RemoteError, match="bad shard on purpose"):
        y.result(timeout=30)
    err = y.exception(timeout=0)
    assert isinstance(err, pw.RemoteError)
    assert "Traceback" in str(err)
    # where it failed, as fields: the function, one of the mesh's devices, its host
    assert err.function == f.name and err.device in mesh.ids
    assert err.host and "bad shard on purpose" in err.traceback
    assert err.exc_type == ("builtins", "ValueError") and isinstance(err, ValueError)
    with pytest.raises(pw.RemoteError):
        z.result(timeout=30)
    np.testing.assert_allclose(ok(x).result(timeout=30), np.full((4, 4), 4.0))


def test_futures_follow_concurrent_futures_and_asyncio(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    f = pw.shard_map(lambda v: v * 3, mesh, P("data"), P("data"))
    x = client.put(np.ones((2, 4)), mesh, P("data"))
    y = f(x)
    assert (y.shape, y.dtype, y.mesh, tuple(y.spec)) == ((2, 4), np.float64, mesh,
                                                         ("data", None))
    seen = threading.Event()
    y.add_done_callback(lambda arr: seen.set())
    assert seen.wait(30) and y.done() and y.exception() is None

    async def main():
        return await f(x)

    np.testing.assert_array_equal(asyncio.run(main()), np.full((2, 4), 3.0))


def test_dropping_the_last_reference_frees_the_shards(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    before = store_bytes(client)
    x = client.put(np.ones((64, 64)), mesh, P("data"))
    f = pw.shard_map(lambda v: v + 1, mesh, P("data"), P("data"))
    y = f(x)
    y.result(30)
    assert store_bytes(client) >= before + 2 * 64 * 64 * 8
    del x, y
    import gc

    gc.collect()
    assert wait_for_store_bytes(client, before) == before


def test_closing_a_client_frees_everything_it_owned(pw_cluster):
    with pw.connect(pw_cluster.address) as probe:
        before = store_bytes(probe)
        c = pw.connect(pw_cluster.address)
        mesh = c.mesh((2, 4), ("data", "model"))
        keep = [c.put(np.ones((32, 32)), mesh, P("data")) for _ in range(3)]
        assert keep[0].result(10).sum() == 32 * 32
        c.close()
        assert wait_for_store_bytes(probe, before) == before
        with pytest.raises(pw.ClientClosed):
            c.put(np.ones(4), mesh, P())


def test_sequential_dispatch_gives_the_same_results(pw_cluster):
    with pw.connect(pw_cluster.address, dispatch="sequential") as c:
        mesh = c.mesh((2, 4), ("data", "model"))
        step = pw.shard_map(lambda v: pw.psum(v, "data") + 1.0, mesh, P("data"), P("data"))

        @pw.program
        def chain(v):
            for _ in range(8):
                v = step(v)
            return v

        x0 = np.arange(8.0).reshape(2, 4)
        np.testing.assert_allclose(chain(c.put(x0, mesh, P("data"))).result(30),
                                   pw.reference(chain)(x0))


def test_concurrent_clients_on_overlapping_slices_all_finish_correctly(pw_cluster, threads):
    """Several clients run collective programs at once on slices sharing devices: the island
    scheduler puts their gangs in one order on every device, so none deadlocks."""
    errors, results = [], {}

    def run(k):
        try:
            with pw.connect(pw_cluster.address) as c:
                shape = [(2, 4), (2, 2), (4, 2)][k % 3]
                mesh = c.mesh(shape, ("data", "model"))
                step = pw.shard_map(lambda v: pw.psum(v, "data") * 0.5 + pw.pmean(v, "model"),
                                    mesh, P("data", "model"), P("data", "model"))

                @pw.program
                def chain(v):
                    for _ in range(10):
                        v = step(v)
                    return v

                x0 = np.arange(float(shape[0] * shape[1] * 4)).reshape(shape[0] * 2,
                                                                         shape[1] * 2) + k
                outs = [chain(c.put(x0, mesh, P("data", "model"))) for _ in range(3)]
                want = pw.reference(chain)(x0)
                results[k] = all(np.allclose(o.result(60), want) for o in outs)
        except Exception as exc:  # reported below
            errors.append(exc)

    for t in [threads(run, k) for k in range(4)]:
        t.join(100)
        assert not t.is_alive(), "a client hung"
    assert not errors, errors
    assert results == {k: True for k in range(4)}


def device_busy(client) -> dict:
    addresses = sorted(client.cluster.data_addresses())
    out = {}
    for a in addresses:
        status = client.session.request(a, protocol.Status(None)).result(10)
        for d, info in status["devices"].items():
            out[d] = info["busy_seconds"]
    return out


@in_process_only  # a real device takes its real time, not the model's
def test_modelled_cost_occupies_the_devices(client):
    """A kernel holds its device for at least its modelled time: busy time accounts for it."""
    mesh = client.mesh((2, 2), ("data", "model"))
    slow = pw.shard_map(lambda v: v + 1, mesh, P("data"), P("data"), cost=0.02)
    before = device_busy(client)
    x = client.put(np.zeros((2, 2)), mesh, P("data"))
    for _ in range(5):
        x = slow(x)
    np.testing.assert_array_equal(x.result(30), np.full((2, 2), 5.0))
    after = device_busy(client)
    for d in mesh.ids:
        assert after[d] - before[d] >= 5 * 0.02 - 1e-6  # float sums of the durations
    # A cost function gets each device's input shard shapes (it runs on the hosts): a wrong
    # shape makes it return a negative cost, which fails the run.
    by_shape = pw.shard_map(lambda v: v * 2, mesh, P("data"), P("data"),
                            cost=lambda in_shapes: 0.001 if list(in_shapes) == [(2, 2)] else -1)
    assert by_shape(client.put(np.ones((4, 2)), mesh, P("data"))).result(30).sum() == 16
    refused = pw.shard_map(lambda v: v * 2, mesh, P("data"), P("data"), cost=lambda s: -1.0)
    with pytest.raises(pw.RemoteError):  # so the function really is consulted
        refused(client.put(np.ones((4, 2)), mesh, P("data"))).result(30)


def test_helpers_reached_through_closures_and_partials_are_shipped(client):
    import functools

    import helper_module_for_ship as helper

    mesh = client.mesh((2,), ("d",))
    via_lambda = pw.shard_map(lambda v: helper.triple(v) + 1, mesh, P("d"), P("d"))
    via_partial = pw.shard_map(functools.partial(np.multiply, 2.0), mesh, P("d"), P("d"))
    x = client.put(np.arange(4.0), mesh, P("d"))
    np.testing.assert_array_equal(via_lambda(x).result(30), np.arange(4.0) * 3 + 1)
    np.testing.assert_array_equal(via_partial(x).result(30), np.arange(4.0) * 2)


def test_an_array_answers_as_a_jax_array_does(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    x0 = np.arange(32.0).reshape(8, 4)
    x = client.put(x0, mesh, P("data"))
    assert (x.shape, x.ndim, x.size, len(x), x.dtype) == ((8, 4), 2, 32, 8, np.float64)
    assert x.sharding.mesh is mesh and x.sharding.spec == P("data", None)  # normalized
    np.testing.assert_array_equal(np.asarray(x), x0)
    assert np.asarray(x, dtype=np.float32).dtype == np.float32
    y = pw.shard_map(lambda b: b * 2, mesh, P("data"), P("data"))(x)
    assert y.block_until_ready() is y
    for misuse in (lambda: x + 1, lambda: 1 - x, lambda: x[0], lambda: x @ x, lambda: -x,
                   lambda: x < 2):
        with pytest.raises(pw.ProgramError, match="inside a shard_map body|in a shard_map body"):
            misuse()
    assert x in [y, x] and x != y  # identity comparisons still work


def test_a_mesh_answers_as_a_jax_mesh_does(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    assert mesh.shape == {"data": 2, "model": 4} and list(mesh.shape) == ["data", "model"]
    assert mesh.axis_sizes == (2, 4) and mesh.size == 8
    devices = mesh.devices
    assert devices.shape == (2, 4) and devices.dtype == object
    known = {d.id: d for d in client.devices()}
    assert [known[d.id] for d in devices.flat] == list(devices.flat)  # id, island, host, kind
    assert [d.id for d in devices.flat] == list(mesh.ids) == mesh.device_ids.ravel().tolist()
    assert devices[1, 0].id == mesh.ids[4]  # row-major, as the flat positions
    assert mesh.devices[0, 0].kind is not None and mesh.devices[0, 0].host in {
        d.host for d in client.devices()}
    assert pickle.loads(pickle.dumps(mesh)) == mesh  # no client travels; ids, sizes do


def test_a_kernel_s_standard_exception_is_raised_as_its_own_class(client):
    mesh = client.mesh((2, 4), ("data", "model"))

    def picky(b):
        if b.sum() > 0:  # zeros in the abstract pass: only the devices raise
            raise ValueError("too big to handle")
        return b

    f = pw.shard_map(picky, mesh, P("data"), P("data"))
    y = f(client.put(np.ones((8, 4)), mesh, P("data")))
    with pytest.raises(ValueError, match="too big to handle") as info:
        y.result(60)
    err = info.value
    assert isinstance(err, pw.RemoteError) and isinstance(err, pw.PathwaysError)
    text = str(err)
    assert text.startswith("picky failed on device ") and "pid" in text
    assert "ValueError: too big to handle" in text
    assert "\n--- remote traceback ---\n" in text and 'in picky\n' in text  # lines, no repr
    with pytest.raises(ZeroDivisionError):  # a Python int division, not numpy's warning
        pw.shard_map(lambda b: b * (int(b.sum()) // 0) if b.sum() > 0 else b, mesh, P("data"),
                     P("data"))(client.put(np.ones((8,), np.int64), mesh, P("data"))).result(60)


def test_nested_programs_are_inlined_as_nested_jit_is(client):
    mesh = client.mesh((2, 4), ("data", "model"))
    step = pw.shard_map(lambda b: pw.psum(b, "data") * 0.5 + 1.0, mesh, P("data"), P("data"))

    @pw.program
    def twice(x):
        return step(step(x))

    @pw.program
    def outer(x):
        y = twice(x)
        return twice(y), y

    x0 = np.arange(32.0).reshape(8, 4)
    program = outer.trace([pw.compiled.Aval((8, 4), np.dtype(np.float64))])
    assert len(program.eqns) == 4  # one program: the inner calls' equations, inlined
    z, y = outer(client.put(x0, mesh, P("data")))
    want_z, want_y = pw.reference(outer)(x0)
    np.testing.assert_array_equal(z.result(60), want_z)
    np.testing.assert_array_equal(y.result(60), want_y)
    np.testing.assert_array_equal(want_y, pw.reference(twice)(x0))


def test_functions_and_programs_of_no_arguments_run_on_their_mesh(client):
    mesh = client.mesh((4,), ("d",))
    ones = pw.shard_map(lambda: np.ones(2), mesh, (), P("d"))  # JAX's shard_map takes none too
    np.testing.assert_array_equal(ones().result(60), np.ones(8))

    @pw.program
    def made():
        return ones()

    np.testing.assert_array_equal(made().result(60), np.ones(8))
    np.testing.assert_array_equal(pw.reference(made)(), np.ones(8))
    with pytest.raises(pw.ProgramError, match="calls no function on a mesh"):
        pw.program(lambda: ())()


@dataclasses.dataclass
class Layer:
    w: object
    b: object


def test_pytrees_as_arguments_specs_and_results(client):
    mesh = client.mesh((2, 4), ("data", "model"))

    def sgd(params, batch):
        layer, scale = params["layer"], params["scale"]
        y = batch @ layer.w + layer.b
        grad = pw.psum(batch.T @ y, "data")
        return {"layer": Layer(layer.w - scale * grad, layer.b)}, (y, [pw.psum(y.sum(), "data")])

    step = pw.shard_map(sgd, mesh, in_specs=(P(), P("data")),
                        out_specs=({"layer": P()}, (P("data"), [P()])))
    rng = np.random.default_rng(0)
    w0, b0, x0 = rng.normal(size=(4, 3)), rng.normal(size=(3,)), rng.normal(size=(8, 4))
    params = {"layer": Layer(client.put(w0, mesh), client.put(b0, mesh)),
              "scale": client.put(np.float64(0.1), mesh)}
    new, (y, [total]) = step(params, client.put(x0, mesh, P("data")))
    assert isinstance(new["layer"], Layer) and isinstance(new["layer"].w, pw.Array)
    want_y = x0 @ w0 + b0
    np.testing.assert_allclose(y.result(60), want_y)
    np.testing.assert_allclose(total.result(60), want_y.sum())
    np.testing.assert_allclose(new["layer"].w.result(60), w0 - 0.1 * x0.T @ want_y)
    ref_new, (ref_y, [ref_total]) = pw.reference(step)(
        {"layer": Layer(w0, b0), "scale": np.float64(0.1)}, x0)
    np.testing.assert_array_equal(ref_new["layer"].w, new["layer"].w.result(60))
    np.testing.assert_array_equal(ref_y, y.result(60))

    @pw.program
    def two_steps(params, batch):
        new, _ = step(params, batch)
        new = {"layer": new["layer"], "scale": params["scale"]}
        return step(new, batch)[0]["layer"].w

    w2 = two_steps(params, client.put(x0, mesh, P("data")))
    np.testing.assert_allclose(w2.result(60), pw.reference(two_steps)(
        {"layer": Layer(w0, b0), "scale": np.float64(0.1)}, x0))
    with pytest.raises(pw.ProgramError, match="in_specs has a dict of keys .w. where argument 0"):
        pw.shard_map(sgd, mesh, in_specs=({"w": P()}, P("data")), out_specs=P())(
            params, client.put(x0, mesh, P("data")))


def test_a_none_in_a_tree_is_a_subtree_without_arrays_as_in_jax(client):
    """``{"w": w, "b": None}``: None holds no array (JAX's trees), in what ``put`` returns,
    as an argument and a result (called, in a program, under the reference), and under a
    spec of its own; a spec tree's None is the spec of a static argument."""
    mesh = client.mesh((2,), ("d",))
    w = np.arange(6.0).reshape(2, 3)
    params = client.put({"w": w, "b": None}, mesh, P("d"))
    assert params["b"] is None and isinstance(params["w"], pw.Array)
    double = pw.shard_map(lambda p: {"y": p["w"] * 2, "b": p["b"]}, mesh, P("d"), P("d"))
    for out in (double(params), pw.program(lambda p: double(p))(params)):
        assert out["b"] is None
        np.testing.assert_array_equal(out["y"].result(60), w * 2)
    assert pw.reference(double)({"w": w, "b": None})["b"] is None
    by_key = pw.shard_map(lambda p: p["w"] + 1, mesh, ({"w": P("d"), "b": None},), P("d"))
    np.testing.assert_array_equal(by_key(params).result(60), w + 1)
    scaled = pw.shard_map(lambda p, s: p["w"] * s, mesh, (P("d"), None), P("d"))
    np.testing.assert_array_equal(scaled(params, 3.0).result(60), w * 3)
    with pytest.raises(pw.ProgramError, match=r"where argument 0\['b'\] is None"):
        pw.shard_map(lambda p: p["w"], mesh, ({"w": P("d"), "b": (P(), P())},), P("d"))(params)


def test_a_mesh_may_ask_for_how_many_hosts_it_spans(client):
    host = {d.id: d.host for d in client.devices()}
    one, two = client.mesh((4,), ("d",), hosts=1), client.mesh((4,), ("d",), hosts=2)
    assert len({host[d] for d in one.ids}) == 1 and len({host[d] for d in two.ids}) == 2
    f = pw.shard_map(lambda v: pw.psum(v, "d"), two, P("d"), P())  # across the two hosts
    assert float(f(client.put(np.arange(4.0), two, P("d"))).result()[0]) == 6.0
    with pytest.raises(pw.ResourceError, match="divides 4"):
        client.mesh((4,), ("d",), hosts=3)
    with pytest.raises(pw.ResourceError, match="on '2' hosts"):
        client.mesh((4,), ("d",), hosts="2")

