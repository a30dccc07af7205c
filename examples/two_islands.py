"""Data-parallel training across two islands, gradients exchanged over DCN (the paper's
Figure 12, in miniature).

A 2-layer MLP (tanh hidden layer, squared error) learns a random teacher network of the same
shape. Each step's batch is cut in two halves, one per slice of 4 emulated TPUs (a mesh with
axis "data"). A slice holds a replica of the parameters, one flat vector (``P()``), and its
half of the batch split over its devices (``P("data")``). One training step is one program:

    g0, loss0 = grad0(theta0, x0, y0)    # slice 0: per-device gradients, pmean over "data"
    g1, loss1 = grad1(theta1, x1, y1)    # slice 1: the same on its own devices
    theta0 = update0(theta0, g0, g1)     # g1 is moved to slice 0 ...
    theta1 = update1(theta1, g1, g0)     # ... and g0 to slice 1: over DCN between islands

As across real islands, each device keeps only its quarter of its slice's mean gradient
(``P("data")``: the pmean plus a slice is a reduce-scatter), so each quarter crosses DCN once,
device to device, in parallel; the update averages the two quarters and all-gathers them over
ICI. Both replicas add the same two numbers, so they stay equal bit for bit.

``--islands 2`` puts the slices on two islands (2 islands x 1 host x 4 devices); ``--islands 1``
on one island (1 island x 2 hosts x 4 devices). Nothing else changes: the runtime decides
which link each transfer takes. The result is checked against the same training computed in
this process with plain numpy (same initial parameters, same batches).

    python examples/two_islands.py [--islands 1|2] [--steps N]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

import pathways as pw
from pathways import P

# The two layouts: the local cluster's shape, and the island of each of the two slices.
CLUSTER = {1: dict(islands=1, hosts_per_island=2, devices_per_host=4),
           2: dict(islands=2, hosts_per_island=1, devices_per_host=4)}
SLICE_ISLANDS = {1: (0, 0), 2: (0, 1)}
DEVICES_PER_SLICE = 4


@dataclass(frozen=True)
class Config:
    steps: int = 40
    batch: int = 64  # global batch: half per slice, an eighth per device
    d_in: int = 8
    hidden: int = 32
    lr: float = 0.1
    seed: int = 0
    grad_cost: float | None = None  # modelled seconds of one gradient kernel (None: estimate)
    update_cost: float | None = None  # modelled seconds of one update kernel

    @property
    def params(self) -> int:
        """Length of the flat parameter vector: W1, b1, w2, b2."""
        return self.d_in * self.hidden + 2 * self.hidden + 1


@dataclass
class Result:
    theta0: np.ndarray  # final parameters of slice 0's replica
    theta1: np.ndarray  # ... and of slice 1's (equal, bit for bit)
    losses: np.ndarray  # mean squared error of each step's batch, before its update
    seconds: float  # wall time from the first step's call to the last parameters ready


# ---- the model: plain numpy, used by the device bodies and the reference alike --------------

def unpack(theta, d_in: int, hidden: int):
    k = d_in * hidden
    return (theta[:k].reshape(d_in, hidden), theta[k:k + hidden],
            theta[k + hidden:k + 2 * hidden], theta[-1])


def loss_and_grad(theta, x, y, d_in: int, hidden: int):
    """Mean squared error of the MLP on rows (x, y), and its gradient as one flat vector."""
    w1, b1, w2, b2 = unpack(theta, d_in, hidden)
    h = np.tanh(x @ w1 + b1)
    err = h @ w2 + b2 - y
    d_out = 2.0 * err / len(y)
    d_h = np.outer(d_out, w2) * (1.0 - h * h)
    grad = np.concatenate([(x.T @ d_h).ravel(), d_h.sum(0), h.T @ d_out, [d_out.sum()]])
    return np.mean(err * err), grad


def make_problem(cfg: Config):
    """(initial parameters, inputs (steps, batch, d_in), targets (steps, batch)): a fresh
    batch per step from a fixed random teacher MLP, plus a little noise."""
    rng = np.random.default_rng(cfg.seed)

    def random_mlp(out_scale):
        return np.concatenate([rng.normal(0, cfg.d_in ** -0.5, cfg.d_in * cfg.hidden),
                               rng.normal(0, 0.5, cfg.hidden),
                               rng.normal(0, out_scale * cfg.hidden ** -0.5, cfg.hidden), [0.0]])

    teacher, theta = random_mlp(2.0), random_mlp(0.1)
    w1, b1, w2, b2 = unpack(teacher, cfg.d_in, cfg.hidden)
    xs = np.empty((cfg.steps, cfg.batch, cfg.d_in))
    ys = np.empty((cfg.steps, cfg.batch))
    for s in range(cfg.steps):  # batch s is the same whatever the number of steps
        xs[s] = rng.normal(size=(cfg.batch, cfg.d_in))
        ys[s] = np.tanh(xs[s] @ w1 + b1) @ w2 + b2 + 0.01 * rng.normal(size=cfg.batch)
    return theta, xs, ys


def numpy_train(cfg: Config) -> Result:
    """The same training in this process: full-batch gradient, one replica."""
    theta, xs, ys = make_problem(cfg)
    losses = []
    for x, y in zip(xs, ys):
        loss, grad = loss_and_grad(theta, x, y, cfg.d_in, cfg.hidden)
        theta = theta - cfg.lr * grad
        losses.append(loss)
    return Result(theta, theta, np.array(losses), 0.0)


# ---- the same training on two slices --------------------------------------------------------

class DataParallel:
    """The training step as one program over two slices, on ``islands`` (island of each)."""

    def __init__(self, client, cfg: Config, islands: tuple[int, int]):
        self.client, self.cfg = client, cfg
        self.meshes = [client.mesh((DEVICES_PER_SLICE,), ("data",), island=i) for i in islands]
        d_in, hidden, lr, n = cfg.d_in, cfg.hidden, cfg.lr, DEVICES_PER_SLICE
        pad = -cfg.params % n  # zeros that make the gradient split evenly into quarters

        def grad(theta, x, y):  # this device's rows; the slice's mean over ICI; my quarter
            loss, g = loss_and_grad(theta, x, y, d_in, hidden)
            g = pw.pmean(np.concatenate([g, np.zeros(pad)]), "data")
            i, k = pw.axis_index("data"), len(g) // n
            return g[i * k:(i + 1) * k], pw.pmean(loss, "data")

        def update(theta, mine, other):  # `other`: the same quarter from the other slice
            mean = pw.all_gather((mine + other) / 2.0, "data", tiled=True)
            return theta - lr * mean[:len(theta)]

        grads = [pw.shard_map(grad, m, (P(), P("data"), P("data")), (P("data"), P()),
                              cost=cfg.grad_cost, name=f"grad{k}")
                 for k, m in enumerate(self.meshes)]
        updates = [pw.shard_map(update, m, (P(), P("data"), P("data")), P(),
                                cost=cfg.update_cost, name=f"update{k}")
                   for k, m in enumerate(self.meshes)]

        @pw.program
        def train_step(theta0, x0, y0, theta1, x1, y1):
            g0, loss0 = grads[0](theta0, x0, y0)
            g1, loss1 = grads[1](theta1, x1, y1)
            return updates[0](theta0, g0, g1), updates[1](theta1, g1, g0), loss0, loss1

        self.step = train_step

    def placement(self) -> list[str]:
        """Where each slice landed: its devices' islands and hosts."""
        return [f"slice {k}: devices {list(m.ids)}, island(s)"
                f" {sorted({d.island for d in m.devices.flat})},"
                f" host(s) {sorted({d.host for d in m.devices.flat})}"
                for k, m in enumerate(self.meshes)]

    def train(self, theta, xs, ys, timeout: float = 300.0) -> Result:
        """Run one step per batch, each call issued without waiting for the previous one."""
        c, (m0, m1) = self.client, self.meshes
        half = xs.shape[1] // 2
        theta0, theta1 = c.put(theta, m0, P()), c.put(theta, m1, P())
        losses = []
        t0 = time.perf_counter()
        for x, y in zip(xs, ys):
            theta0, theta1, loss0, loss1 = self.step(
                theta0, c.put(x[:half], m0, P("data")), c.put(y[:half], m0, P("data")),
                theta1, c.put(x[half:], m1, P("data")), c.put(y[half:], m1, P("data")))
            losses.append((loss0, loss1))
        theta0.block_until_ready(timeout)
        theta1.block_until_ready(timeout)
        seconds = time.perf_counter() - t0
        # Both halves have the same number of rows: the batch loss is the mean of the two.
        loss = np.array([(a.result(timeout) + b.result(timeout)) / 2.0 for a, b in losses])
        return Result(theta0.result(timeout), theta1.result(timeout), loss, seconds)


def run(islands: int, cfg: Config, verbose: bool = False) -> Result:
    """Start a local cluster of the given layout (1 or 2 islands) and train on it."""
    with pw.local_cluster(**CLUSTER[islands]) as cluster:
        with pw.connect(cluster.address) as client:
            dp = DataParallel(client, cfg, SLICE_ISLANDS[islands])
            if verbose:
                print("\n".join(dp.placement()))
            return dp.train(*make_problem(cfg))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--islands", type=int, choices=(1, 2), default=2)
    ap.add_argument("--steps", type=int, default=Config.steps)
    args = ap.parse_args(argv)
    cfg = Config(steps=args.steps)
    layout = CLUSTER[args.islands]
    print(f"{args.islands} island(s) x {layout['hosts_per_island']} host(s) x"
          f" {layout['devices_per_host']} devices; an MLP of {cfg.params} parameters,"
          f" batch {cfg.batch}, {cfg.steps} steps")
    got = run(args.islands, cfg, verbose=True)
    want = numpy_train(cfg)
    every = max(1, cfg.steps // 8)
    for s in sorted({*range(0, cfg.steps, every), cfg.steps - 1}):
        print(f"  step {s:4d}: loss {got.losses[s]:.5f}   (numpy: {want.losses[s]:.5f})")
    print(f"{cfg.steps} steps in {got.seconds:.2f} s ({cfg.steps / got.seconds:.1f} steps/s);"
          f" loss {got.losses[0]:.4f} -> {got.losses[-1]:.4f}")
    d_theta = max(np.max(np.abs(t - want.theta0)) for t in (got.theta0, got.theta1))
    d_loss = np.max(np.abs(got.losses - want.losses))
    print(f"difference from single-process numpy: parameters {d_theta:.2e}, losses"
          f" {d_loss:.2e}; replicas identical: {np.array_equal(got.theta0, got.theta1)}")
    ok = (np.allclose(got.theta0, want.theta0, rtol=1e-9, atol=1e-12)
          and np.allclose(got.losses, want.losses, rtol=1e-9, atol=1e-12)
          and np.array_equal(got.theta0, got.theta1))
    print("equal to the numpy training" if ok else "MISMATCH with the numpy training")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
