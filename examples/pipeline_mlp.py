"""Pipeline-parallel training of a numpy MLP on emulated TPUs, checked against plain numpy.

Eight dense layers (tanh, the last one linear) are grouped into S stages, each on its own
slice; every step is ONE Pathways program running a GPipe schedule over M micro-batches. The
same model is then trained in this process with plain numpy (same init, same batches, same
micro-batching and gradient accumulation) and the two runs are compared.

    python examples/pipeline_mlp.py [--steps 30] [--stages 4] [--microbatches 4]
"""

import argparse
import functools
import sys
import time

import numpy as np

import pathways as pw
from pathways.lib.pipeline import Pipeline, Stage

LAYERS, IN, WIDTH, OUT, BATCH = 8, 16, 32, 4, 64


def dense_forward(params, x, linear_last):
    """A run of dense layers on one device's rows; keeps each layer's input and output."""
    h, saved = x, []
    for i in range(0, len(params), 2):
        z = h @ params[i] + params[i + 1]
        out = z if linear_last and i == len(params) - 2 else np.tanh(z)
        saved.append((h, out))
        h = out
    return h, tuple(saved)


def dense_backward(params, saved, dy, linear_last):
    """Gradients of the layers' params and of their input, from the saved activations."""
    grads = [None] * len(params)
    for i in reversed(range(0, len(params), 2)):
        h, out = saved[i // 2]
        dz = dy if linear_last and i == len(params) - 2 else dy * (1.0 - out * out)
        grads[i], grads[i + 1] = h.T @ dz, dz.sum(axis=0)
        dy = dz @ params[i].T
    return tuple(grads), dy


def mse(y, target):
    d = y - target
    return np.mean(d * d), 2.0 * d / d.size


def init_stages(stages: int, seed: int = 0) -> list[Stage]:
    rng = np.random.default_rng(seed)
    dims = [IN] + [WIDTH] * (LAYERS - 1) + [OUT]
    layers = [(rng.normal(0.0, 1.0 / np.sqrt(a), (a, b)), np.zeros(b))
              for a, b in zip(dims, dims[1:])]
    per = LAYERS // stages
    out = []
    for s in range(stages):
        params = tuple(p for layer in layers[s * per:(s + 1) * per] for p in layer)
        last = s == stages - 1
        out.append(Stage(params, functools.partial(dense_forward, linear_last=last),
                         functools.partial(dense_backward, linear_last=last)))
    return out


def jax_stages(stages: list[Stage]) -> list[Stage]:
    """The same stages written in JAX: only the forward; the backward is jax.vjp of it."""
    import jax.numpy as jnp

    def dense(linear_last):
        def forward(params, x):
            h = x
            for i in range(0, len(params), 2):
                z = h @ params[i] + params[i + 1]
                h = z if linear_last and i == len(params) - 2 else jnp.tanh(z)
            return h
        return forward

    last = len(stages) - 1
    return [Stage.from_jax(s.init, dense(i == last)) for i, s in enumerate(stages)]


def batches(steps: int, seed: int = 1):
    """A synthetic regression task with structure to learn: a random two-layer teacher."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(IN, 8)) / np.sqrt(IN), rng.normal(size=(8, OUT))
    for _ in range(steps):
        x = rng.normal(size=(BATCH, IN))
        yield x, 0.5 * np.sin(2.0 * x @ a) @ b


def numpy_step(stages, params, x, target, microbatches, lr):
    """One SGD step in this process: the same micro-batches and gradient accumulation."""
    losses, grads = [], [None] * len(stages)
    for xm, tm in zip(np.split(x, microbatches), np.split(target, microbatches)):
        saved, h = [], xm
        for stage, p in zip(stages, params):
            h, res = stage.forward(p, h)
            saved.append(res)
        loss, dy = mse(h, tm)
        losses.append(loss)
        for s in reversed(range(len(stages))):
            g, dy = stages[s].backward(params[s], saved[s], dy)
            grads[s] = g if grads[s] is None else tuple(a + b for a, b in zip(grads[s], g))
    new = [tuple(p - lr * (g / microbatches) for p, g in zip(ps, gs))
           for ps, gs in zip(params, grads)]
    return sum(losses) / len(losses), new


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--stages", type=int, default=4, choices=[1, 2, 4, 8])
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b"])
    ap.add_argument("--devices-per-stage", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--jax", action="store_true",
                    help="stages written in JAX, backward by jax.vjp (needs the [jax] extra;"
                         " float32 inside, so compared within 1e-4)")
    args = ap.parse_args()
    stages = init_stages(args.stages)
    run_stages = jax_stages(stages) if args.jax else stages

    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=4) as cluster:
        with pw.connect(cluster.address) as client:
            pipe = Pipeline(client, run_stages, mse, args.microbatches, lr=args.lr,
                            devices_per_stage=args.devices_per_stage, schedule=args.schedule)
            for s, mesh in enumerate(pipe.meshes):
                print(f"stage {s}: {LAYERS // args.stages} layers on devices {list(mesh.ids)}")
            x0, t0 = next(batches(1))
            prog = pipe.traced(x0, t0)
            print(f"one step is one program of {len(prog.eqns)} compiled calls"
                  f" ({len(prog.inputs)} inputs: micro-batches, targets, params):")
            print("\n".join(f"  {e}" for e in prog.eqns[:5]) + "\n  ...")
            t_start = time.perf_counter()
            futures = [pipe.step(x, t) for x, t in batches(args.steps)]  # none waits
            losses = []
            for i, f in enumerate(futures):
                losses.append(float(f.result(60)))
                if i % 5 == 0 or i == args.steps - 1:
                    print(f"step {i:3d}  loss {losses[-1]:.6f}")
            final = pipe.params()
            print(f"{args.steps} pipelined steps in {time.perf_counter() - t_start:.2f} s")

    params = [s.init for s in stages]
    ref_losses = []
    for x, t in batches(args.steps):
        loss, params = numpy_step(stages, params, x, t, args.microbatches, args.lr)
        ref_losses.append(loss)
    loss_diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses))
    param_diff = max(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12)
                     for got, want in zip(final, params) for a, b in zip(got, want))
    print(f"single-process numpy: loss {ref_losses[0]:.6f} -> {ref_losses[-1]:.6f}")
    print(f"max relative difference: losses {loss_diff:.2e}, params {param_diff:.2e}")
    tolerance = 1e-4 if args.jax else 1e-6
    if loss_diff < tolerance and param_diff < tolerance:
        print("pipelined training matches the single-process numpy reference")
        return 0
    print("MISMATCH between pipelined and single-process training")
    return 1


if __name__ == "__main__":
    sys.exit(main())
