"""Mixture of Experts: the routed call (pw.expert_map) and MoE layers (pw.moe), against a dense
single-process reference, on real host processes, including skewed and empty routings."""

import numpy as np
import pytest

import pathways as pw
from pathways import P, moe
from pathways.program.mesh import Mesh

T, D, F, E = 32, 6, 10, 8  # tokens, model dim, expert hidden dim, experts
AUX = 0.1


def grads_by_differences(x, wr, w1, w2, c, groups, k, cf, eps=1e-6):
    """d/d(x, wr, w1, w2) of sum(y * c) + AUX * aux for the dense reference (float64)."""
    def loss():
        y, aux, _ = moe.dense_moe(x, wr, w1, w2, groups, k, cf)
        return float((y * c).sum() + AUX * aux)

    out = []
    for arr in (x, wr, w1, w2):
        g = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + eps
            up = loss()
            arr[i] = old - eps
            down = loss()
            arr[i] = old
            g[i] = (up - down) / (2 * eps)
        out.append(g)
    return out


def layer_step(layer):
    @pw.program
    def step(x, wr, w1, w2, c):
        y, saved, aux, load = layer.forward(x, wr, w1, w2)
        dx, dwr, dw1, dw2 = layer.backward(c, saved, wr, w1, w2)
        return y, aux, load, dx, dwr, dw1, dw2

    return step


def problem(seed, dtype=np.float64, skew=None):
    """Inputs of one layer; ``skew``: 'one' sends every first choice to expert 5, 'some'
    leaves experts 2.. without any token."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, D))
    wr, w1, w2 = moe.init_params(rng, D, F, E, np.float64)
    if skew is not None:
        x[:, 0] = 1.0  # a constant feature the router can key on
        if skew == "one":
            wr[0, 5] = 25.0
        else:
            wr[0, 2:] = -25.0
    c = rng.normal(size=(T, D))
    return [a.astype(dtype) for a in (x, wr, w1, w2, c)]


# ---- routing arithmetic (no cluster) -----------------------------------------------------

def test_capacity_drops_later_tokens_and_second_choices_first():
    probs_logits = np.array([[5.0, 4, 0, 0]] * 4)  # every token: expert 0, then expert 1
    x, wr = np.eye(4), probs_logits
    route, gates, _, choices = moe.route_group(x, wr, top_k=2, capacity_factor=1.0)
    assert moe.capacity(4, 4, 2, 1.0) == 2
    # expert 0 takes tokens 0 and 1 as first choices; expert 1 likewise as second choices
    np.testing.assert_array_equal(route, [[0, 1], [0, 1], [-1, -1], [-1, -1]])
    np.testing.assert_array_equal(choices, [[0, 1]] * 4)
    np.testing.assert_allclose(gates.sum(axis=1), 1.0)  # GShard top-2 gates are normalized
    dropless, *_ = moe.route_group(x, wr, top_k=2, capacity_factor=None)
    np.testing.assert_array_equal(dropless, [[0, 1]] * 4)


def test_router_softmax_is_fp32_even_for_low_precision_inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4)).astype(np.float16)
    probs = moe.router_probs(x, rng.normal(size=(4, 3)).astype(np.float16))
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)


def test_aux_loss_is_one_for_a_perfectly_balanced_uniform_router():
    probs = np.full((8, 4), 0.25)
    choices = np.array([[0], [1], [2], [3]] * 2)
    assert moe.aux_loss(probs, choices)[0] == pytest.approx(1.0)


@pytest.mark.parametrize("k,cf,skew", [(1, 1.25, None), (2, 1.0, None), (2, None, None),
                                       (1, None, "one"), (2, 1.25, "one"), (1, 2.0, "some")])
def test_the_program_reference_equals_the_dense_layer_and_its_derivatives(k, cf, skew):
    tm, em = Mesh.abstract((4,), ("data",)), Mesh.abstract((4,), ("expert",))
    layer = moe.MoELayer(tm, em, E, top_k=k, capacity_factor=cf, aux_weight=AUX)
    x, wr, w1, w2, c = problem(1, skew=skew)
    y, aux, load, *grads = pw.reference(layer_step(layer))(x, wr, w1, w2, c)
    want_y, want_aux, want_load = moe.dense_moe(x, wr, w1, w2, 4, k, cf)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    assert aux.mean() == pytest.approx(want_aux, rel=1e-6)
    np.testing.assert_array_equal(load.sum(axis=0), want_load)
    if skew == "one":  # every token's first choice is expert 5: it fills up, the rest drop
        n = T // 4
        cap = moe.capacity(n, E, k, cf) or n
        np.testing.assert_array_equal(load[:, 5], min(n, cap))
        first_drops = 4 * (n - min(n, cap))  # second choices may overflow elsewhere too
        if k == 1:
            assert load[:, :E].sum() == load[:, 5].sum()  # no other expert got anything
            assert load[:, E].sum() == first_drops
        else:
            assert load[:, E].sum() >= first_drops
    for got, want in zip(grads, grads_by_differences(x, wr, w1, w2, c, 4, k, cf)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_expert_map_checks_its_arguments_at_trace_time():
    tm, em = Mesh.abstract((4,), ("data",)), Mesh.abstract((4,), ("expert",))
    with pytest.raises(pw.ShardingError, match="6 experts cannot be spread evenly over 4"):
        pw.expert_map(moe.ffn, tm, em, num_experts=6)
    f = pw.expert_map(moe.ffn, tm, em, num_experts=8)
    x, w1, w2 = np.zeros((8, 3)), np.zeros((8, 3, 5)), np.zeros((8, 5, 3))
    with pytest.raises(pw.ProgramError, match="route must be an int array"):
        pw.reference(f)(np.zeros((8, 1)), x, w1, w2)
    with pytest.raises(pw.ShardingError, match="leading dimension of 8 experts"):
        pw.reference(f)(np.zeros((8, 1), np.int32), x, w1[:4], w2)
    with pytest.raises(pw.ProgramError, match=r"outside \[-1, 8\)"):
        pw.reference(f)(np.full((8, 1), 9, np.int32), x, w1, w2)


# ---- distributed, on the session's cluster (2 hosts x 4 devices) -------------------------

def put_problem(client, tm, em, arrays):
    x, wr, w1, w2, c = arrays
    return (client.put(x, tm, P("data")), client.put(wr, tm, P()),
            client.put(w1, em, P("expert")), client.put(w2, em, P("expert")),
            client.put(c, tm, P("data")))


@pytest.fixture(params=["parallel", "sequential"])
def any_client(request, pw_cluster):
    with pw.connect(pw_cluster.address, dispatch=request.param) as c:
        yield c


def meshes(client):
    """Tokens on 4 devices, experts on the other 4; both span the two hosts."""
    tm = client.mesh((4,), ("data",), hosts=2)
    em = client.mesh((4,), ("expert",), hosts=2)
    hosts = {d.id: d.host for d in client.devices()}
    assert len({hosts[d] for d in em.ids}) == 2
    return tm, em


@pytest.mark.parametrize("k,cf,skew", [(1, 1.25, None), (2, None, None), (2, 1.0, "one"),
                                       (1, None, "some")])
def test_distributed_layer_equals_the_dense_reference(any_client, k, cf, skew):
    tm, em = meshes(any_client)
    layer = moe.MoELayer(tm, em, E, top_k=k, capacity_factor=cf, aux_weight=AUX)
    step = layer_step(layer)
    arrays = problem(2, skew=skew)
    got = [o.result(timeout=60) for o in step(*put_problem(any_client, tm, em, arrays))]
    want = pw.reference(step)(*arrays)
    y, aux, load = moe.dense_moe(*arrays[:4], 4, k, cf)
    np.testing.assert_allclose(got[0], y, rtol=1e-12, atol=1e-12)
    assert got[1].mean() == pytest.approx(aux, rel=1e-6)
    np.testing.assert_array_equal(got[2].sum(axis=0), load)
    for g, w in zip(got[3:], want[3:]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    if skew == "some":
        assert load[2:E].sum() == 0  # six experts, on three devices, got nothing


def test_distributed_gradients_equal_differences_of_the_dense_layer(client):
    tm, em = meshes(client)
    layer = moe.MoELayer(tm, em, E, top_k=2, capacity_factor=1.25, aux_weight=AUX)
    arrays = problem(3)
    got = [o.result(timeout=60) for o in layer_step(layer)(*put_problem(client, tm, em,
                                                                        arrays))]
    for g, w in zip(got[3:], grads_by_differences(*arrays, 4, 2, 1.25)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_float32_layer_with_more_experts_than_devices(client):
    tm = client.mesh((8,), ("data",))
    em = client.mesh((2,), ("expert",), hosts=2)  # 4 experts per device, one per host
    layer = moe.MoELayer(tm, em, E, top_k=2, capacity_factor=1.5)
    arrays = problem(4, np.float32)
    got = layer_step(layer)(*put_problem(client, tm, em, arrays))
    y = got[0].result(timeout=60)
    assert y.dtype == np.float32
    want, _, _ = moe.dense_moe(*arrays[:4], 8, 2, 1.5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_an_expert_device_that_gets_no_tokens_still_runs_on_an_empty_batch(client):
    tm, em = meshes(client)
    # every token to expert 0 (device 0 of the expert mesh); the body counts its rows
    count = pw.expert_map(lambda x: (x * 2, np.array([len(x)], np.int64)), tm, em,
                          num_experts=4, name="count")
    route = np.zeros((T, 1), np.int32)
    x = np.arange(T * 2, dtype=np.float64).reshape(T, 2)
    rows, counts = count(client.put(route, tm, P("data")), client.put(x, tm, P("data")))
    np.testing.assert_array_equal(counts.result(timeout=60).ravel(), [T, 0, 0, 0])
    np.testing.assert_array_equal(rows.result(timeout=60)[:, 0], x * 2)


def test_dropped_slots_come_back_as_zeros_and_are_never_sent(client):
    tm, em = meshes(client)
    ident = pw.expert_map(lambda x: x + 1, tm, em, num_experts=4, name="ident")
    route = np.full((T, 2), -1, np.int32)
    route[::4, 1] = 3
    x = np.ones((T, 3))
    got = ident(client.put(route, tm, P("data")), client.put(x, tm, P("data"))).result(60)
    want = np.zeros((T, 2, 3))
    want[::4, 1] = 2.0
    np.testing.assert_array_equal(got, want)


def test_bad_routes_and_failing_experts_fail_the_run_clearly_and_the_cluster_goes_on(client):
    tm, em = meshes(client)
    f = pw.expert_map(lambda x: x, tm, em, num_experts=4, name="ident")
    x = client.put(np.ones((T, 2)), tm, P("data"))
    bad = client.put(np.full((T, 1), 7, np.int32), tm, P("data"))
    with pytest.raises(pw.RemoteError, match=r"ident.*outside \[-1, 4\)"):
        f(bad, x).result(timeout=60)

    def broken(x):
        if len(x) > 1:  # shapes are found on one row, at trace time
            raise ValueError("expert exploded")
        return x

    g = pw.expert_map(broken, tm, em, num_experts=4, name="broken")
    route = client.put(np.zeros((T, 1), np.int32), tm, P("data"))
    with pytest.raises(pw.RemoteError, match="expert exploded"):
        g(route, x).result(timeout=60)
    ok = f(route, x).result(timeout=60)
    np.testing.assert_array_equal(ok[:, 0], np.ones((T, 2)))


def test_a_training_step_updates_experts_and_router(client):
    tm, em = meshes(client)
    layer = moe.MoELayer(tm, em, E, top_k=1, capacity_factor=None, aux_weight=AUX)
    lr = 0.1

    @pw.program
    def train(x, wr, w1, w2, c):
        y, saved, aux, load = layer.forward(x, wr, w1, w2)
        dx, new_wr, new_w1, new_w2 = layer.backward(c, saved, wr, w1, w2, lr=lr)
        return new_w1, new_w2, new_wr

    arrays = problem(5)
    new_w1, new_w2, new_wr = [o.result(timeout=60) for o in
                              train(*put_problem(client, tm, em, arrays))]
    _, _, _, _, want_dwr, dw1, dw2 = pw.reference(layer_step(layer))(*arrays)
    np.testing.assert_allclose(new_w1, arrays[2] - lr * dw1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(new_w2, arrays[3] - lr * dw2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(new_wr, arrays[1] - lr * want_dwr, rtol=1e-12, atol=1e-12)
