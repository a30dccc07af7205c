"""The Plaque operator that runs one shard of a compiled function on an emulated device.

Parallel dispatch (the default): when run t starts on a host, each kernel shard at once
enqueues its kernel on its device, at the sequence number the island scheduler fixed, with
its inputs as object-store futures; the kernel waits for them on the device, not on the host.
Sequential dispatch: a shard enqueues only when Plaque tells it that every producer shard is
done ("complete for t"). Either way the shard holds its Plaque capability until the kernel has
finished, so consumers and the coordinator learn completion through progress tracking.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass

import plaque

from . import cost as cost_model
from .collectives import LocalEnv
from .compiled import Aval, CompiledFunction
from .errors import RemoteError

log = logging.getLogger("pathways.kernel")

INPUT_TIMEOUT = 600.0  # a kernel waits this long for an input buffer before failing


@dataclass(frozen=True)
class KernelSpec:
    index: int  # equation index in its program
    fn: CompiledFunction
    inputs: tuple[int, ...]  # var ids
    outputs: tuple[int, ...]
    in_avals: tuple[Aval, ...]
    frees: tuple[int, ...]  # intermediate var ids whose last use is this equation


class KernelOp(plaque.Operator):
    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.caps: dict = {}

    def on_start(self, ctx, t):
        self.caps[t] = ctx.hold()
        if ctx.arg.mode != "sequential":
            self._enqueue(ctx, t)

    def on_complete(self, ctx, t):
        if ctx.arg.mode == "sequential":
            self._enqueue(ctx, t)

    def _enqueue(self, ctx, t):
        cap = self.caps.pop(t)
        host = ctx.services["host"]
        arg = ctx.arg
        device = self.spec.fn.mesh.devices[ctx.shard]
        seq = arg.seqs[self.spec.index][device]
        kernel = Kernel(self.spec, ctx.shard, device, arg, host, cap)
        host.enqueue(device, seq, kernel)


class Kernel:
    """One shard of one equation of one run, as its device executes it."""

    def __init__(self, spec: KernelSpec, shard: int, device: int, arg, host, cap):
        self.spec, self.shard, self.device_id, self.arg = spec, shard, device, arg
        self.host, self.cap = host, cap
        self.name = spec.fn.name
        self.labels = {"client": arg.client, "run": arg.run_id, "eqn": spec.index}
        self.owner = (arg.client, arg.run_id)
        self._outputs = None

    def key(self, var_id):
        return (self.arg.array_id(var_id), self.device_id)

    def execute(self, device) -> float:
        shards = [self.host.wait_buffer(self.key(v), INPUT_TIMEOUT) for v in self.spec.inputs]
        fn = self.spec.fn
        m = fn.mesh
        env = LocalEnv(m.shape, m.axis_names, self.shard, dict(enumerate(m.devices)),
                       (self.arg.client, self.arg.run_id, self.spec.index),
                       self.host.rendezvous, send=self.host.send_ici,
                       is_local=self.host.is_local, flush=self.host.flush_ici)
        env.device_spec = device.spec
        outs, seconds = fn.run_shard(env, shards)
        self._outputs = outs
        remote = getattr(env, "bytes_sent_remote", 0)
        return seconds + (cost_model.transfer_time(remote, cost_model.ICI) if remote else 0.0)

    def on_done(self):
        """The device has been occupied for the kernel's time: publish its outputs."""
        store = self.host.store
        for v, o in zip(self.spec.outputs, self._outputs):
            store.put(self.key(v), o, self.owner)
        for v in self.spec.frees:
            store.delete(self.key(v))
        self._outputs = None
        self.cap.post(lambda c: c.release())

    def on_error(self, exc):
        err = exc if isinstance(exc, RemoteError) else RemoteError(
            f"{self.name} failed on device {self.device_id}: {exc!r}\n"
            + "".join(traceback.format_exception(exc)))
        for v in self.spec.outputs:
            try:
                self.host.store.fail(self.key(v), err)
            except Exception:
                log.exception("could not poison output %s", self.key(v))
        gang = (self.arg.client, self.arg.run_id, self.spec.index)
        self.host.abort_gang(gang, self.spec.fn.mesh.devices, f"{self.name} failed on device"
                             f" {self.device_id}: {exc!r}")

        def fail(cap):
            raise err

        self.cap.post(fail)
