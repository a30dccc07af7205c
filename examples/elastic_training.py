"""Elastic data-parallel training: checkpoints written by the hosts, a host killed mid-run,
and the loop carrying on from the last checkpoint on a remapped slice.

    python examples/elastic_training.py --steps 40 --every 10 --kill-host-at 25 --check

A linear model with momentum learns on a fixed sequence of batches (batch ``s`` is a function
of ``s`` alone, so any run replays the same data). Every ``--every`` steps the state is saved
(``client.save``: each host writes its shards; the save overlaps the next steps). With
``--kill-host-at S`` the example SIGKILLs one host of the slice at step S; the loop catches
``HostLost``, remaps the slice onto the spare host (``client.remap``), restores the last
committed checkpoint onto it (``client.load``) and goes on. ``--check`` then trains again
without interruption and shows the final losses are equal, bit for bit.

It starts its own cluster of 3 hosts x 2 emulated TPUs (a slice of 4 devices and a spare host);
with ``$PATHWAYS_ADDRESS`` set it uses that cluster and cannot kill a host itself.
"""

import argparse
import contextlib
import os
import signal
import tempfile

import numpy as np

import pathways as pw
from pathways import P

FEATURES, BATCH, LR, MOMENTUM = 8, 64, 0.05, 0.5
W_TRUE = np.linspace(-1.0, 1.0, FEATURES)


def batch(step: int):
    """The data of step ``step``: the same in every run (deterministic order)."""
    rng = np.random.default_rng(step)
    x = rng.normal(size=(BATCH, FEATURES))
    return x, x @ W_TRUE + 0.01 * rng.normal(size=BATCH)


def train_step(w, m, x, y):
    """One step on each device's part of the batch; gradients and loss averaged over "data"."""
    err = x @ w - y
    grad = pw.pmean(x.T @ err / len(y), "data")
    m = MOMENTUM * m + grad
    return w - LR * m, m, pw.pmean(np.mean(err * err), "data")


class Trainer:
    def __init__(self, client, mesh, ckpt_dir, every):
        self.client, self.mesh, self.ckpt_dir, self.every = client, mesh, ckpt_dir, every
        self.step_fn = pw.shard_map(train_step, mesh, (P(), P(), P("data"), P("data")),
                                    (P(), P(), P()))
        self.saves = {}  # step -> the future of its save

    def fresh(self):
        zeros = np.zeros(FEATURES)
        return {"w": self.client.put(zeros, self.mesh), "m": self.client.put(zeros, self.mesh)}

    def run(self, state, start, steps, kill_at=None, kill=None):
        """Steps ``start``..``steps``-1; returns the last loss (a float)."""
        loss, step = None, start
        while step < steps:
            if step % self.every == 0 and step not in self.saves:
                self.saves[step] = self.client.save(
                    os.path.join(self.ckpt_dir, f"step_{step:06d}"), state)
            if step == kill_at and kill is not None:
                kill()
                kill = None  # once: the replay after the restore passes this step again
            x, y = batch(step)
            w, m, loss = self.step_fn(state["w"], state["m"],
                                      self.client.put(x, self.mesh, P("data")),
                                      self.client.put(y, self.mesh, P("data")))
            state = {"w": w, "m": m}
            step += 1
            if step % self.every == 0 or step == steps:
                try:
                    print(f"step {step}: loss {float(loss.result(timeout=60)):.6f}")
                except pw.HostLost as err:
                    state, step = self.recover(err)
        return float(loss.result(timeout=60))

    def recover(self, err):
        """A host of the slice died: remap the slice and restore the last committed save."""
        print(f"HostLost: {str(err)[:100]}...")
        self.mesh = self.client.remap(self.mesh)
        print(f"remapped the slice onto devices {list(self.mesh.ids)}")
        committed = {}
        for step, saved in self.saves.items():
            try:
                committed[step] = saved.result(timeout=60)
            except pw.PathwaysError as exc:  # cut short by the same loss
                print(f"the save of step {step} did not commit ({type(exc).__name__})")
        self.saves = {s: f for s, f in self.saves.items() if s in committed}
        last = max(committed)
        print(f"restoring step {last} from {committed[last]}")
        return self.client.load(committed[last], self.mesh), last


def host_killer(cluster, client, mesh):
    """A function that SIGKILLs the process of one host of ``mesh``."""
    host = {d.id: d.host for d in client.devices()}[mesh.ids[-1]]
    victim = client.cluster_status()["hosts"][host]["pid"]
    lost = [d for d in mesh.ids if host == {d.id: d.host for d in client.devices()}[d]]

    def kill():
        print(f"killing host {host} (process {victim}, devices {lost} of the slice)")
        os.kill(victim, signal.SIGKILL)

    return kill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every K steps")
    parser.add_argument("--kill-host-at", type=int, default=None, metavar="STEP")
    parser.add_argument("--check", action="store_true",
                        help="train again without interruption and compare the final loss")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        address = os.environ.get("PATHWAYS_ADDRESS")
        cluster = None
        if not address:
            cluster = stack.enter_context(pw.local_cluster(
                islands=1, hosts_per_island=3, devices_per_host=2, heartbeat_timeout=2.0))
            address = cluster.address
        ckpt_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="elastic-"))
        client = stack.enter_context(pw.connect(address))
        mesh = client.mesh((4,), ("data",))
        trainer = Trainer(client, mesh, ckpt_dir, args.every)
        kill = None
        if args.kill_host_at is not None:
            if cluster is None:
                raise SystemExit("--kill-host-at needs the example's own cluster")
            kill = host_killer(cluster, client, mesh)
        final = trainer.run(trainer.fresh(), 0, args.steps, args.kill_host_at, kill)
        print(f"final loss {final!r}")
        if args.check:
            again = Trainer(client, trainer.mesh, os.path.join(ckpt_dir, "again"), args.every)
            want = again.run(again.fresh(), 0, args.steps)
            print(f"uninterrupted run's final loss {want!r}:"
                  f" {'equal' if want == final else 'DIFFERENT'}")
            if want != final:
                raise SystemExit(1)


if __name__ == "__main__":
    main()
