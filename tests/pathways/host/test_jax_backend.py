"""Hosts whose devices are their own JAX devices (issue 47, item 3: ``pathways host --backend
jax``, ``pw.local_cluster(backend="jax")``): here XLA CPU devices, GPUs or TPUs where a
machine has them. Kernels take their real time, not a modelled one."""

import os
import subprocess
import sys

import numpy as np
import pytest

import pathways as pw
from pathways import P

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture(scope="module")
def jax_cluster():
    with pw.local_cluster(hosts_per_island=2, devices_per_host=2, backend="jax") as cluster:
        yield cluster


def test_jax_and_numpy_bodies_run_on_the_hosts_own_devices(jax_cluster, tmp_path):
    with pw.connect(jax_cluster.address) as client:
        devices = client.devices()
        assert [d.kind for d in devices] == ["cpu"] * 4  # JAX's kind, not "tpu-emu"
        mesh = client.mesh((4,), ("d",))
        x = np.arange(8, dtype=np.float32)
        xs = client.put(x, mesh, P("d"))
        total = pw.shard_map(lambda v: jax.lax.psum(jnp.tanh(v), "d"), mesh, P("d"), P())
        np.testing.assert_array_equal(total(xs).result(timeout=60),
                                      np.asarray(pw.reference(total)(x)))
        double = pw.shard_map(lambda v: v * 2, mesh, P("d"), P("d"))
        np.testing.assert_array_equal(double(xs).result(timeout=60), x * 2)
        # a modelled hour: a real device takes the time it takes, not the model's
        slow = pw.shard_map(lambda v: v + 1, mesh, P("d"), P("d"), cost=3600.0)
        with client.trace(tmp_path / "t.json") as tr:
            np.testing.assert_array_equal(slow(xs).result(timeout=60), x + 1)
    kernels = [e for e in tr.trace["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == 4
    assert all(e["dur"] < 3600e6 for e in kernels)  # µs: not the hour the model says


def test_a_host_refuses_devices_jax_does_not_have(monkeypatch):
    """On CPU a host makes as many XLA devices as it is told; a GPU or TPU machine has the
    ones it has. Its JAX's device list is replaced here, as no such machine is at hand."""
    from pathways.errors import PathwaysError
    from pathways.host.process import jax_devices
    from pathways.program.cost import DeviceSpec

    two = jax.local_devices()[:1] * 2
    monkeypatch.setattr(jax, "local_devices", lambda: two)
    with pytest.raises(PathwaysError, match="--devices 3, but JAX has 2 local cpu device"):
        jax_devices(3, DeviceSpec())
    got, spec = jax_devices(2, DeviceSpec(hbm_bytes=123))
    assert got == two and spec.real and spec.kind == "cpu" and spec.hbm_bytes == 123


def test_a_host_process_gets_as_many_xla_cpu_devices_as_it_asks_for():
    """The flags a host gives XLA all take effect, its device count over one it inherited
    (a malformed flag before the count once made XLA ignore it: the host had one device)."""
    code = ("from pathways.program import jax_body; jax_body.on_host(cpu_devices=3);"
            " import jax; print(len(jax.local_devices()))")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.stdout.split()[-1] == "3", out.stderr


@pytest.mark.parametrize("options, message", [
    ({"backend": "gpu"}, "backend must be"),
    ({"backend": "jax", "processes": False}, "runs hosts as processes"),
    ({"backend": "jax", "simulate": True}, "modelled"),
])
def test_bad_backends_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        with pw.local_cluster(hosts_per_island=1, devices_per_host=1, **options):
            pass


def test_buffers_stay_on_their_jax_devices_between_kernels():
    """A batched segment on a host's JAX devices takes each device's block where it lies and
    leaves each result block on its device (issue 47, item 2): no copy through the host's
    memory, which a GPU would pay for twice per kernel. 0-d results, which cannot be blocks,
    come back as numpy; a block that came from the host is put on its device first."""
    from pathways.program.jax_batch import HostBatch, _call

    devices = tuple(jax.local_devices()[:2])
    batch = HostBatch((2,), ("d",), (2,), devices)
    closed = jax.make_jaxpr(lambda x: (x * 2.0, jnp.sum(x)))(np.zeros(3, np.float32))
    jaxpr = closed.jaxpr
    segment = batch.segment(jaxpr.eqns, jaxpr.invars, jaxpr.outvars, set(), "f")
    blocks = [jax.device_put(np.arange(3, dtype=np.float32), devices[0]),
              np.arange(3, dtype=np.float32) + 10]  # one on its device, one from the host
    coords = np.array([[0], [1]], np.int32)
    results = _call(segment, coords, [[b] for b in blocks])
    for i, (doubled, total) in enumerate(results):
        assert isinstance(doubled, jax.Array) and doubled.devices() == {devices[i]}
        np.testing.assert_array_equal(np.asarray(doubled), np.asarray(blocks[i]) * 2)
        assert isinstance(total, np.ndarray) and total.shape == ()
        assert total == np.asarray(blocks[i]).sum()


def test_a_buffer_from_outside_goes_on_its_device_unless_jax_would_change_it():
    from pathways.host.host import on_device

    device = jax.local_devices()[1]
    kept = on_device(np.ones(4, np.float32), device)
    assert isinstance(kept, jax.Array) and kept.devices() == {device}
    assert on_device(np.ones(4, np.float32), None).__class__ is np.ndarray  # emulated
    for value in (np.ones(4, np.float64), np.array(["a", "b"]), np.array([None])):
        assert on_device(value, device) is value  # float64 (x64 off), strings, objects
