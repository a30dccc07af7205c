"""A transformer block trained with JAX inside pw.shard_map: data parallel over "data", tensor
parallel (Megatron-style: attention heads and MLP columns split) over "model".

The body is plain JAX: jax.numpy, jax.lax.psum / pmean, and jax.value_and_grad of the loss
inside the body. Pathways traces it as jax.shard_map would, cuts it at its collectives, compiles
the pieces with XLA, and runs them on emulated TPUs; the loss is compared with plain JAX.

    .venv/bin/pip install -e '.[jax]'
    python examples/jax_transformer.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pathways as pw
from pathways import P
from pathways.plot import utilization

try:
    import jax
    import jax.numpy as jnp
except ImportError:  # the module still imports; main() says how to install the extra
    jax = jnp = None

D, HEADS, DH, FF = 32, 4, 8, 64  # model width, heads, head width, MLP width
SEQ, BATCH, LR = 8, 8, 0.05

# Parameter name -> partition spec: heads and MLP columns over "model", copies along "data".
SPECS = {"ln": P(), "wq": P(None, "model"), "wk": P(None, "model"), "wv": P(None, "model"),
         "wo": P("model", None), "w1": P(None, "model"), "w2": P("model", None)}
DATA_SPEC = P("data")


def init(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def dense(n, m):
        return (rng.standard_normal((n, m)) / np.sqrt(n)).astype(np.float32)

    return {"ln": np.ones(D, np.float32), "wq": dense(D, HEADS * DH),
            "wk": dense(D, HEADS * DH), "wv": dense(D, HEADS * DH),
            "wo": dense(HEADS * DH, D), "w1": dense(D, FF), "w2": dense(FF, D)}


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs [batch, seq, width] and targets (a fixed smooth function of the inputs)."""
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((BATCH, SEQ, D)).astype(np.float32)
    return x, np.tanh(np.roll(x, 1, axis=1)).astype(np.float32)


def block(p, x):
    """One pre-norm block on this device's batch rows and heads / MLP columns; the partial
    sums of the output projections are added across "model" with psum."""
    def norm(h):
        h = h - h.mean(-1, keepdims=True)
        return p["ln"] * h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + 1e-5)

    h = norm(x)
    b, s, _ = h.shape
    heads = p["wq"].shape[1] // DH  # this device's heads

    def split(w):
        return (h @ w).reshape(b, s, heads, DH).transpose(0, 2, 1, 3)

    q, k, v = split(p["wq"]), split(p["wk"]), split(p["wv"])
    att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(DH), axis=-1)
    o = (att @ v).transpose(0, 2, 1, 3).reshape(b, s, heads * DH)
    x = x + jax.lax.psum(o @ p["wo"], "model")
    h = jax.nn.gelu(norm(x) @ p["w1"])
    return x + jax.lax.psum(h @ p["w2"], "model")


def train_step(p, x, target):
    """Loss and SGD update on every device: the loss is averaged over "data"; JAX's
    transposition sums the replicated parameters' gradients over "data" itself."""
    def loss_fn(p):
        return jax.lax.pmean(jnp.mean((block(p, x) - target) ** 2), "data")

    loss, grads = jax.value_and_grad(loss_fn)(p)
    return jax.tree.map(lambda w, g: w - LR * g, p, grads), loss


def pathways_step(mesh):
    return pw.shard_map(train_step, mesh, in_specs=(SPECS, DATA_SPEC, DATA_SPEC),
                        out_specs=(SPECS, P()))


def jax_step(devices):
    """The same step under plain jax.shard_map on ``devices`` (8 CPU devices)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as JaxP

    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    specs = {k: JaxP(*s) for k, s in SPECS.items()}
    return jax.jit(jax.shard_map(train_step, mesh=mesh,
                                 in_specs=(specs, JaxP("data"), JaxP("data")),
                                 out_specs=(specs, JaxP())))


def jax_losses(steps: int) -> list[float]:
    """The same training under plain jax.shard_map in this process."""
    if len(jax.devices()) < 8:
        raise SystemExit("--check needs 8 JAX devices: run with"
                         " XLA_FLAGS=--xla_force_host_platform_device_count=8")
    step, params, losses = jax_step(jax.devices()[:8]), init(), []
    for i in range(steps):
        params, loss = step(params, *batch(i))
        losses.append(float(loss))
    return losses


def train(client, mesh, step, steps: int) -> list[float]:
    """Train ``steps`` steps of ``step`` on ``mesh`` from the initial parameters; the losses."""
    params = {k: client.put(v, mesh, SPECS[k]) for k, v in init().items()}
    losses = []
    for i in range(steps):
        x, t = batch(i)
        params, loss = step(params, client.put(x, mesh, DATA_SPEC),
                            client.put(t, mesh, DATA_SPEC))
        losses.append(float(loss.result()))
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--check", action="store_true",
                        help="also train with plain JAX and compare the losses (needs 8 CPU"
                             " devices: XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    args = parser.parse_args()
    if jax is None:
        raise SystemExit(pw.jax_body.INSTALL_HINT)
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=4) as cluster, \
            pw.connect(cluster.address) as client:
        mesh = client.mesh((2, 4), ("data", "model"))
        step = pathways_step(mesh)
        t0 = time.perf_counter()
        train(client, mesh, step, 1)  # trace and compile, on the client and the hosts
        print(f"traced, cut at collectives and compiled in {time.perf_counter() - t0:.1f} s")
        with client.trace() as tracing:
            t0 = time.perf_counter()
            losses = train(client, mesh, step, args.steps)
            seconds = time.perf_counter() - t0
        for i in range(0, len(losses), max(1, len(losses) // 5)):
            print(f"step {i:3d}  loss {losses[i]:.5f}")
        print(f"step {len(losses) - 1:3d}  loss {losses[-1]:.5f}")
        busy = utilization(tracing.trace)
        print(f"{args.steps} steps in {seconds:.2f} s on 8 emulated TPUs; device utilization"
              f" {np.mean(list(busy.values())):.1%} (busy / traced time; a device is busy for"
              " the longer of the modelled and the real kernel time)")
        if args.check:
            want = jax_losses(args.steps)
            gap = max(abs(a - b) / abs(b) for a, b in zip(losses, want))
            print(f"plain JAX (jax.shard_map on {len(jax.devices())} CPU devices): largest"
                  f" relative loss difference {gap:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
