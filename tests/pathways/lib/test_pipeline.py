"""Pipeline-parallel training (pathways.lib.pipeline) equals plain numpy training in one process,
for several stage and micro-batch counts, both schedules, and stages of several devices."""

import functools
import gc
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, store_bytes, wait_for_store_bytes

import pathways as pw
from pathways.lib.pipeline import Pipeline, Stage, program_order, stage_orders

LAYERS, WIDTH, BATCH, LR = 4, 8, 24, 0.1


# ---- a small MLP, written once per layer; params and residuals are nests of dicts ----------

def layer_forward(p, h, linear):
    z = h @ p["w"] + p["b"]
    return z if linear else np.tanh(z)


def layer_backward(p, h, out, dy, linear):
    dz = dy if linear else dy * (1.0 - out * out)
    return {"w": h.T @ dz, "b": dz.sum(axis=0)}, dz @ p["w"].T


def stage_forward(params, x, last):
    ins, outs = [], []
    for i, p in enumerate(params):
        ins.append(x)
        x = layer_forward(p, x, last and i == len(params) - 1)
        outs.append(x)
    return x, {"inputs": ins, "outputs": outs}


def stage_backward(params, saved, dy, last):
    grads = [None] * len(params)
    for i in reversed(range(len(params))):
        linear = last and i == len(params) - 1
        grads[i], dy = layer_backward(params[i], saved["inputs"][i], saved["outputs"][i], dy,
                                      linear)
    return grads, dy


def mse(y, target):
    d = y - target
    return np.mean(d * d), 2.0 * d / d.size


def init_layers(seed=0):
    rng = np.random.default_rng(seed)
    return [{"w": rng.normal(0, 1 / np.sqrt(WIDTH), (WIDTH, WIDTH)), "b": rng.normal(0, 0.1, WIDTH)}
            for _ in range(LAYERS)]


def make_stages(layers, stages):
    per = len(layers) // stages
    out = []
    for s in range(stages):
        last = s == stages - 1
        out.append(Stage([dict(p) for p in layers[s * per:(s + 1) * per]],
                         functools.partial(stage_forward, last=last),
                         functools.partial(stage_backward, last=last)))
    return out


def data(seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, WIDTH))
    return x, np.sin(x @ rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH))


def numpy_training(layers, x, target, microbatches, steps):
    """Plain numpy, whole network, no stages: losses and final layers of SGD with micro-batch
    gradient accumulation."""
    layers = [dict(p) for p in layers]
    losses = []
    for _ in range(steps):
        grads, step_losses = [None] * len(layers), []
        for xm, tm in zip(np.split(x, microbatches), np.split(target, microbatches)):
            hs = [xm]
            for i, p in enumerate(layers):
                hs.append(layer_forward(p, hs[-1], i == len(layers) - 1))
            loss, dy = mse(hs[-1], tm)
            step_losses.append(loss)
            for i in reversed(range(len(layers))):
                g, dy = layer_backward(layers[i], hs[i], hs[i + 1], dy, i == len(layers) - 1)
                grads[i] = g if grads[i] is None else {k: grads[i][k] + g[k] for k in g}
        losses.append(np.mean(step_losses))
        layers = [{k: p[k] - LR * grads[i][k] / microbatches for k in p}
                  for i, p in enumerate(layers)]
    return losses, layers


def train_pipelined(client, stages, microbatches, steps, **kwargs):
    layers = init_layers()
    x, target = data()
    pipe = Pipeline(client, make_stages(layers, stages), mse, microbatches, lr=LR, **kwargs)
    futures = [pipe.step(x, target) for _ in range(steps)]  # issued without waiting
    losses = [float(f.result(60)) for f in futures]
    got = [p for stage in pipe.params() for p in stage]
    want_losses, want = numpy_training(layers, x, target, microbatches, steps)
    return pipe, losses, got, want_losses, want


def assert_same_layers(got, want, rtol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == ["b", "w"]
        for k in w:
            np.testing.assert_allclose(g[k], w[k], rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("microbatches", [1, 3])
def test_pipelined_training_matches_numpy(client, stages, microbatches):
    pipe, losses, got, want_losses, want = train_pipelined(client, stages, microbatches, 6)
    assert len({m.ids for m in pipe.meshes}) == stages  # one slice per stage
    np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
    assert_same_layers(got, want, rtol=1e-9)
    assert losses[-1] < 0.9 * losses[0]


def test_1f1b_on_stages_of_two_devices_matches_numpy(client):
    pipe, losses, got, want_losses, want = train_pipelined(
        client, 2, 3, 6, devices_per_stage=2, schedule="1f1b")
    assert [m.axis_sizes for m in pipe.meshes] == [(2,), (2,)]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
    assert_same_layers(got, want, rtol=1e-9)
    assert losses[-1] < 0.9 * losses[0]


def test_stages_on_two_islands_match_numpy():
    with pw.local_cluster(islands=2, hosts_per_island=1, devices_per_host=2,
                          processes=False) as cluster:
        with pw.connect(cluster.address) as client:
            pipe, losses, got, want_losses, want = train_pipelined(client, 2, 3, 4,
                                                                   island=[0, 1])
            islands = {d.id: d.island for d in client.devices()}
            assert [islands[m.ids[0]] for m in pipe.meshes] == [0, 1]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
    assert_same_layers(got, want, rtol=1e-9)


def test_steps_leave_no_buffers_behind(client):
    before = store_bytes(client)
    pipe, losses, *_ = train_pipelined(client, 4, 3, 3)
    assert store_bytes(client) > before  # the params live on the hosts
    del pipe
    gc.collect()
    # micro-batches, activations, residuals, gradients and old params are all freed
    assert wait_for_store_bytes(client, before) == before


def test_one_step_is_one_program_in_schedule_order(client):
    pipe = Pipeline(client, make_stages(init_layers(), 2), mse, 3, lr=LR)
    names = [e.fn.name for e in pipe.traced(*data()).eqns]
    forwards = [n for n in names if n.endswith("forward")]
    assert forwards == ["stage0_forward", "stage1_forward"] * 3
    assert names.count("stage0_backward") == names.count("stage1_backward") == 3
    assert names[-3:] == ["stage0_update", "stage1_update", "mean_loss"]
    with pytest.raises(ValueError, match="divisible"):
        pipe.step(np.zeros((BATCH + 1, WIDTH)), np.zeros((BATCH + 1, WIDTH)))
    with pytest.raises(ValueError, match="schedule"):
        Pipeline(client, make_stages(init_layers(), 2), mse, 3, schedule="zigzag")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, microbatches", [(1, 1), (2, 5), (4, 2), (4, 8)])
def test_schedules_respect_dependencies_and_stage_order(schedule, stages, microbatches):
    orders = stage_orders(schedule, stages, microbatches)
    order = program_order(orders)
    assert len(order) == len(set(order)) == 2 * stages * microbatches
    seen = set()
    for kind, s, m in order:
        if kind == "F":
            assert s == 0 or ("F", s - 1, m) in seen
        else:
            assert ("F", s, m) in seen and (s == stages - 1 or ("B", s + 1, m) in seen)
        seen.add((kind, s, m))
    for s in range(stages):
        assert [(k, m) for k, t, m in order if t == s] == orders[s]
        if schedule == "1f1b":  # residuals held at once by stage s
            live = peak = 0
            for kind, _ in orders[s]:
                live += 1 if kind == "F" else -1
                peak = max(peak, live)
            assert peak <= min(stages - s, microbatches)


def test_pipeline_example_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pipeline_mlp.py"), "--steps", "4",
         "--stages", "2", "--microbatches", "2"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    assert "pipelined training matches the single-process numpy reference" in out
    assert out.count("step ") >= 2
