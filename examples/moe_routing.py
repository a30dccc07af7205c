"""Train a small Mixture of Experts model whose tokens are routed, sparsely, to their experts.

The model: x[16] -> linear -> MoE layer -> MoE layer -> linear -> softmax over 4 classes.
Each MoE layer has 8 experts (2-layer ReLU MLPs) on 4 expert devices spread over 2 hosts;
tokens live on 4 other devices. Every training step is ONE Pathways program (forward,
backward and the SGD update, 15 computations); a token travels only to the devices of the
experts its router picked (top-2 with a capacity factor by default), and a device that gets
no tokens learns from progress tracking that its batch is complete.

The task has structure a mixture can learn: points come from 4 clusters, and each cluster has
its own rule for the label. The script prints the loss falling, the tokens each expert got,
and the share of token slots dropped for lack of capacity; ``--check`` also trains the same
steps with the in-process reference interpreter and compares the losses.

    python examples/moe_routing.py [--steps 300] [--top-k 2] [--capacity 1.25|none] [--islands 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pathways as pw
from pathways import P, moe

IN, D, F, E, CLASSES, CLUSTERS = 16, 32, 64, 8, 4, 4
IN_FLIGHT = 4  # steps submitted ahead of the one whose loss is read


def make_task(seed=0):
    """Cluster centres and each cluster's own label rule."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2.5, (CLUSTERS, IN))
    rules = rng.normal(0, 1, (CLUSTERS, IN, CLASSES))
    return centres, rules


def batch(task, rng, size):
    centres, rules = task
    c = rng.integers(0, CLUSTERS, size)
    x = centres[c] + rng.normal(0, 1, (size, IN))
    labels = np.einsum("bi,bik->bk", x - centres[c], rules[c]).argmax(axis=1)
    return x.astype(np.float32), labels.astype(np.int32)


class Model:
    """The step program for given token and expert meshes."""

    def __init__(self, tm, em, top_k, capacity_factor, lr, aux_weight=0.1, expert=None):
        self.layers = [moe.MoELayer(tm, em, E, top_k, capacity_factor, aux_weight,
                                    name=f"moe{i}", expert=expert) for i in range(2)]
        self.tm, self.em = tm, em
        ax = tm.axis_names[0]
        t, r = P(ax), P()

        def embed(x, w_in):
            return x @ w_in

        def head(h, labels, w_out):
            """Softmax cross-entropy: (dh, updated w_out, mean loss)."""
            logits = h @ w_out
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            n = np.float32(len(h) * tm.size)  # tokens in the whole batch
            loss = pw.psum(-np.log(p[np.arange(len(h)), labels] + 1e-9).sum(), ax) / n
            dlogits = p
            dlogits[np.arange(len(h)), labels] -= 1.0
            dlogits /= n
            dw = pw.psum(h.T @ dlogits, ax)
            return (dlogits @ w_out.T).astype(h.dtype), (w_out - lr * dw).astype(w_out.dtype), \
                np.full((1,), loss, np.float32)

        def embed_bwd(x, dh, w_in):
            return (w_in - lr * pw.psum(x.T @ dh, ax)).astype(w_in.dtype)

        self.embed = pw.shard_map(embed, tm, (t, r), t)
        self.head = pw.shard_map(head, tm, (t, t, r), (t, r, r))
        self.embed_bwd = pw.shard_map(embed_bwd, tm, (t, t, r), r)
        layers = self.layers

        @pw.program
        def step(x, labels, w_in, w_out, wr0, w10, w20, wr1, w11, w21):
            params = [(wr0, w10, w20), (wr1, w11, w21)]
            h = self.embed(x, w_in)
            saved, auxes, loads = [], [], []
            for layer, (wr, w1, w2) in zip(layers, params):
                h, s, aux, load = layer.forward(h, wr, w1, w2)
                saved.append(s)
                auxes.append(aux)
                loads.append(load)
            dh, w_out, loss = self.head(h, labels, w_out)
            new = []
            for layer, s, (wr, w1, w2) in reversed(list(zip(layers, saved, params))):
                dh, wr, w1, w2 = layer.backward(dh, s, wr, w1, w2, lr=lr)
                new = [wr, w1, w2] + new
            w_in = self.embed_bwd(x, dh, w_in)
            return (w_in, w_out, *new, loss, *auxes, *loads)

        self.step = step


def init(seed=1):
    rng = np.random.default_rng(seed)
    w_in = rng.normal(0, 1 / np.sqrt(IN), (IN, D)).astype(np.float32)
    w_out = rng.normal(0, 1 / np.sqrt(D), (D, CLASSES)).astype(np.float32)
    layers = [moe.init_params(rng, D, F, E) for _ in range(2)]
    return [w_in, w_out, *(a for layer in layers for a in layer)]


def jax_expert():
    """The experts written in JAX (their backward is then jax.vjp of this)."""
    import jax

    def expert(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2

    return expert


def train(client, args, log=print):
    """Train on the cluster; returns (losses, tokens per expert per layer, drop fractions)."""
    if args.islands == 2:
        tm = client.mesh((4,), ("data",), island=0)
        em = client.mesh((4,), ("expert",), island=1)
    else:
        tm = client.mesh((4,), ("data",))
        em = client.mesh((4,), ("expert",))
    model = Model(tm, em, args.top_k, args.capacity, args.lr, args.aux_weight,
                  expert=jax_expert() if args.jax else None)
    experts = list(em.devices.flat)  # device objects, as jax.sharding.Mesh.devices
    log(f"tokens on devices {list(tm.ids)}, 8 experts per layer on devices"
        f" {list(em.ids)} (hosts {sorted({d.host for d in experts})},"
        f" island(s) {sorted({d.island for d in experts})})")
    log(f"routing: top-{args.top_k}, capacity factor {args.capacity or 'none (dropless)'}")
    params = [client.put(p, em if p.ndim == 3 else tm, P("expert") if p.ndim == 3 else P())
              for p in init(args.seed)]
    rng = np.random.default_rng(args.seed + 100)
    task = make_task(args.seed)
    pending, losses, loads = [], [], []
    started = time.perf_counter()
    for i in range(args.steps):
        x, labels = batch(task, rng, args.batch)
        out = model.step(client.put(x, tm, P("data")), client.put(labels, tm, P("data")),
                         *params)
        params = list(out[:8])  # the next step starts before this one is done
        pending.append(out[8:])
        last = i == args.steps - 1
        while pending and (len(pending) > IN_FLIGHT or last):  # keep a few steps in flight
            loss, aux0, aux1, load0, load1 = [a.result(timeout=120) for a in pending.pop(0)]
            losses.append(float(loss[0]))
            loads.append((load0.sum(axis=0), load1.sum(axis=0)))
            n = len(losses)
            if n % args.every == 0 or n == args.steps:
                log(f"step {n:4d}  loss {np.mean(losses[-args.every:]):.4f}"
                    f"  aux {aux0.mean():.3f}/{aux1.mean():.3f}"
                    f"  tokens/expert (layer 0) {load0.sum(axis=0)[:E].tolist()}"
                    f"  dropped {load0.sum(axis=0)[E] / load0.sum():.1%}")
    seconds = time.perf_counter() - started
    per_layer = [np.sum([ld[j] for ld in loads[-args.every:]], axis=0) for j in range(2)]
    drops = [float(p[E] / p.sum()) for p in per_layer]
    log(f"\n{args.steps} steps in {seconds:.1f} s ({args.steps / seconds:.1f} steps/s,"
        f" {args.steps * args.batch / seconds:,.0f} tokens/s)")
    for j, p in enumerate(per_layer):
        log(f"layer {j}: tokens per expert over the last {args.every} steps {p[:E].tolist()},"
            f" dropped {drops[j]:.1%}")
    log(f"loss: first {args.every} steps {np.mean(losses[:args.every]):.4f} -> last"
        f" {args.every} steps {np.mean(losses[-args.every:]):.4f}")
    return np.array(losses), per_layer, drops, (model, params)


def reference_losses(model, args, steps):
    """The same training in this process with the reference interpreter."""
    params = init(args.seed)
    rng = np.random.default_rng(args.seed + 100)
    task = make_task(args.seed)
    ref = pw.reference(model.step)
    losses = []
    for _ in range(steps):
        x, labels = batch(task, rng, args.batch)
        out = ref(x, labels, *params)
        params = list(out[:8])
        losses.append(float(out[8][0]))
    return np.array(losses)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256, help="tokens per step")
    ap.add_argument("--top-k", type=int, default=2, choices=(1, 2))
    ap.add_argument("--capacity", type=lambda s: None if s == "none" else float(s),
                    default=1.25, help="capacity factor, or 'none' for dropless")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--aux-weight", type=float, default=0.1,
                    help="weight of the load-balancing loss (0 turns balancing off)")
    ap.add_argument("--islands", type=int, default=1, choices=(1, 2),
                    help="2: tokens on island 0, experts on island 1 (DCN between them)")
    ap.add_argument("--every", type=int, default=25, help="print every N steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", type=int, default=0, metavar="N",
                    help="also train N steps in-process and compare the losses")
    ap.add_argument("--jax", action="store_true",
                    help="experts written in JAX, their backward by jax.vjp (the [jax] extra);"
                         " --check still compares with the numpy experts")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    hosts = 2 if args.islands == 1 else 1
    with pw.local_cluster(islands=args.islands, hosts_per_island=hosts,
                          devices_per_host=8 // (hosts * args.islands)) as cluster:
        with pw.connect(cluster.address) as client:
            losses, _, _, (model, _) = train(client, args)
    if args.check:
        if args.jax:  # the reference: the same model with the hand-written numpy experts
            model = Model(model.tm, model.em, args.top_k, args.capacity, args.lr,
                          args.aux_weight)
        ref = reference_losses(model, args, args.check)
        diff = np.abs(ref - losses[:args.check]).max()
        print(f"the first {args.check} losses equal the in-process reference"
              f" (max difference {diff:.2e})" if diff < 1e-4 else
              f"MISMATCH with the in-process reference: max difference {diff:.2e}")
    return losses


if __name__ == "__main__":
    main()
