"""The operators of a routed call (``pw.expert_map``), on the hosts: route, experts, gather.

``pathways.program.routing`` says what a routed call means and how it is lowered to three
Plaque nodes; here each runs: the route node sends each expert device only the rows routed to
it, the expert node runs the experts once every row has arrived (sequential dispatch: how many
rows come is only known at run time), the gather node returns the rows to the slots' homes.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from ..dtypes import shippable, unwrap
from ..errors import RemoteError
from ..lowering.specs import ROUTED_PORT, RouteSpec
from ..program.routing import check_route, slot_rows
from .device import DeviceWork, Finish
from .kernel import (
    Assembler,
    DispatchedOp,
    Failed,
    input_key,
    kernel_error,
    link_time,
    poison,
    releases,
)
from .services import HostServices

log = logging.getLogger("pathways.host.routing")


class Rows(NamedTuple):
    """Route -> expert device: the rows of token shard ``src`` routed to the experts there,
    their global ``slots``, each row's expert on that device (``local``) and the link."""

    src: int
    slots: np.ndarray
    local: np.ndarray
    rows: list
    link: str


class RowsBack(NamedTuple):
    """Expert -> token device: the expert outputs of that shard's ``slots``, and the link."""

    slots: np.ndarray
    rows: list
    link: str


class RouteOp(DispatchedOp):
    """On each token device: once the route and token buffers are ready, send every expert
    device exactly the rows routed to it (none at all to the others)."""

    def __init__(self, spec: RouteSpec, host: HostServices):
        super().__init__(host)
        self.spec = spec
        self.assembler = Assembler(spec.index, spec.incoming, spec.fn.token_mesh.ids, host)

    def on_input(self, ctx, t, port, piece):
        self.assembler.on_piece(ctx, t, port, piece)

    def dispatch(self, ctx, t, cap):
        host, arg, shard = self.host, ctx.arg, ctx.shard
        device = self.spec.fn.token_mesh.ids[shard]
        keys = [input_key(self.spec, arg, i, device) for i in range(1 + self.spec.fn.token_args)]
        left = [len(keys)]

        def ready(_key):
            left[0] -= 1
            if not left[0]:
                cap.post(lambda c: self._send(c, host, arg, shard, device, keys))

        for key in keys:
            host.store.add_done_callback(key, ready)

    def _send(self, cap, host, arg, shard, device, keys):
        fn, spec = self.spec.fn, self.spec
        try:
            route, *tokens = [np.asarray(host.store.get(k, 0)) for k in keys]  # (or JAX's)
            check_route(route, fn.num_experts, fn.name)
        except Exception as exc:  # the experts must fail, not compute on partial input
            for dst in range(fn.mesh.size):
                cap.emit(Failed(f"{fn.name}: routing on device {device} failed: {exc!r}"),
                         ROUTED_PORT, shard=dst)
        else:
            k = route.shape[1]
            flat = route.reshape(-1)
            order = np.flatnonzero(flat >= 0)  # slot order is token-major
            experts = flat[order]
            where = experts // fn.per_device
            for dst in np.unique(where).tolist():
                sel = order[where == dst]
                rows = [slot_rows(a, sel, k, i in fn.slot_args) for i, a in enumerate(tokens)]
                rows = [shippable(np.ascontiguousarray(r)) for r in rows]
                local = (experts[where == dst] % fn.per_device).astype(np.int32)
                cap.emit(Rows(shard, sel.astype(np.int32), local, rows, spec.links[shard][dst]),
                         ROUTED_PORT, shard=dst)
        host.store.release_uses([(input_key(spec, arg, i, device), n)
                                 for i, n in releases(spec, range(1 + fn.token_args))])
        cap.release()


class ExpertOp(DispatchedOp):
    """On each expert device: collect the rows routed here until progress tracking says no
    more can come, then run this device's experts at its place in the device's order."""

    sequential = True  # how many rows arrive is known only once the route shards are done

    def __init__(self, spec: RouteSpec, host: HostServices):
        super().__init__(host)
        self.spec = spec
        self.rows: dict = {}  # t -> [pieces], or an error message
        self.assembler = Assembler(spec.index, spec.incoming, spec.fn.mesh.ids, host)

    def on_input(self, ctx, t, port, piece):
        if port != len(self.spec.inputs):
            self.assembler.on_piece(ctx, t, port, piece)
            return
        got = self.rows.setdefault(t, [])
        if type(piece) is Failed:
            self.rows[t] = piece.reason if isinstance(got, list) else got
        elif isinstance(got, list):
            src, slots, local, rows, link = piece
            rows = [unwrap(r) for r in rows]
            nbytes = sum(r.nbytes for r in rows)  # modelled arrival: now + link time
            now = self.host.clock.time()
            got.append((src, slots, local, rows, now + link_time(link, nbytes, self.host), now))

    def dispatch(self, ctx, t, cap):
        host, arg = self.host, ctx.arg
        device = self.spec.fn.mesh.ids[ctx.shard]
        seq = arg.seqs[self.spec.index][device]
        received = self.rows.pop(t, [])
        if isinstance(received, list) and received:
            host.record_transfer(device, f"{self.spec.fn.name} rows in", {
                "client": arg.client, "run": arg.run_id, "eqn": self.spec.index,
                "bytes": sum(r.nbytes for p in received for r in p[3]),
                "rows": sum(len(p[1]) for p in received)},
                min(p[5] for p in received), max(p[4] for p in received))
        host.enqueue([(device, seq, ExpertKernel(self.spec, ctx.shard, device, arg, host,
                                                 cap, received))])


class ExpertKernel(DeviceWork):
    """One expert device's share of a routed call, as the device executes it."""

    def __init__(self, spec: RouteSpec, shard, device, arg, host, cap, received):
        self.spec, self.shard, self.device_id, self.arg = spec, shard, device, arg
        self.host, self.cap, self.received = host, cap, received
        self.name = spec.fn.name
        self.labels = {"client": arg.client, "run": arg.run_id, "eqn": spec.index}
        self._params = None
        self._results = None

    def _param_indices(self):
        return range(1 + self.spec.fn.token_args, len(self.spec.inputs))

    def input_keys(self):
        return [input_key(self.spec, self.arg, i, self.device_id)
                for i in self._param_indices()]

    @property
    def not_before(self) -> float:
        """The modelled arrival of the last rows routed here."""
        if isinstance(self.received, str):
            return 0.0
        return max((p[4] for p in self.received), default=0.0)

    def execute(self, device) -> float:
        if isinstance(self.received, str):
            raise RemoteError(self.received)
        self._params = [np.asarray(v) for v in self.host.store.get_all(self.input_keys())]
        fn = self.spec.fn
        row_avals = self.spec.row_avals
        pieces = sorted(self.received, key=lambda p: p[0])  # source order = global slot order
        if pieces:
            local = np.concatenate([p[2] for p in pieces])
            rows = [np.concatenate([p[3][i] for p in pieces]) for i in range(len(row_avals))]
            sources = np.concatenate([np.full(len(p[1]), p[0], np.int32) for p in pieces])
            slots = np.concatenate([p[1] for p in pieces])
        else:
            local = np.zeros(0, np.int32)
            rows = [np.zeros((0, *a.shape), a.dtype) for a in row_avals]
            sources = slots = np.zeros(0, np.int32)
        params, self._params = self._params, None
        row_outs = [np.zeros((len(local), *a.shape[2:]), a.dtype)
                    for a in self.spec.out_avals[:fn.row_outputs]]
        expert_outs = [np.zeros((fn.per_device, *a.shape[1:]), a.dtype)
                       for a in self.spec.out_avals[fn.row_outputs:]]
        seconds = 0.0
        for e in range(fn.per_device):
            mine = np.flatnonzero(local == e)
            these = [r[mine] for r in rows]
            one = [p[e] for p in params]
            outs, extra = fn.call_expert(these, one, self.spec.out_avals,
                                         f"on device {self.device_id}")
            for o, r in zip(row_outs, outs):
                o[mine] = r
            for o, r in zip(expert_outs, extra):
                o[e] = r
            seconds += fn.cost_of((*these, *one), (*outs, *extra), device.spec)
        self._results = (sources, slots, row_outs, expert_outs)
        return seconds

    def output_bytes(self) -> int:
        return sum(o.nbytes for o in self._results[3])  # what stays in HBM: expert outputs

    def on_done(self, finish: Finish):
        sources, slots, row_outs, expert_outs = self._results
        self._results = None
        owner = (self.arg.client, self.arg.run_id)
        fn, spec = self.spec.fn, self.spec
        for v, o in zip(spec.outputs[fn.row_outputs:], expert_outs):
            self.host.store.put((self.arg.array_id(v), self.device_id), o, owner,
                                arrival=finish.end, grant=finish.grant)
        self._release_params()
        replies = []
        for src in np.unique(sources).tolist():
            sel = sources == src
            link = spec.links[src][self.shard]
            replies.append((src, RowsBack(slots[sel], [shippable(np.ascontiguousarray(o[sel]))
                                                       for o in row_outs], link)))

        def send(cap):
            for src, msg in replies:
                cap.emit(msg, ROUTED_PORT, shard=src)
            cap.release()

        self.cap.post(send)

    def _release_params(self):
        spec = self.spec
        self.host.store.release_uses([(input_key(spec, self.arg, i, self.device_id), n)
                                      for i, n in releases(spec, self._param_indices())])

    def on_error(self, exc):
        err = kernel_error(self.name, self.device_id, exc)
        fn = self.spec.fn
        poison(self.host, [(self.arg.array_id(v), self.device_id)
                           for v in self.spec.outputs[fn.row_outputs:]], err,
               (self.arg.client, self.arg.run_id))
        self._release_params()

        def fail(cap):
            for src in range(fn.token_mesh.size):  # every home shard must fail, not wait
                cap.emit(Failed(str(err)), ROUTED_PORT, shard=src)
            raise err

        self.cap.post(fail)


class GatherOp(DispatchedOp):
    """On each token device: put the rows the experts sent back into place; once no more can
    come, publish the ``[T/D, k, ...]`` row outputs (zeros for dropped slots)."""

    sequential = True

    def __init__(self, spec: RouteSpec, host: HostServices):
        super().__init__(host)
        self.spec = spec
        self.rows: dict = {}

    def on_input(self, ctx, t, port, piece):
        got = self.rows.setdefault(t, [])
        if type(piece) is Failed:
            self.rows[t] = piece.reason if isinstance(got, list) else got
        elif isinstance(got, list):
            slots, rows, link = piece
            rows = [unwrap(r) for r in rows]
            nbytes = sum(r.nbytes for r in rows)
            got.append((slots, rows, self.host.clock.time() + link_time(link, nbytes, self.host)))

    def dispatch(self, ctx, t, cap):
        host, arg = self.host, ctx.arg
        fn, spec = self.spec.fn, self.spec
        device = fn.token_mesh.ids[ctx.shard]
        owner = (arg.client, arg.run_id)
        got = self.rows.pop(t, [])
        keys = [(arg.array_id(v), device) for v in spec.outputs[:fn.row_outputs]]
        if isinstance(got, str):
            for key in keys:
                host.store.fail(key, RemoteError(got), owner)
        else:
            n = fn.token_mesh.size
            outs = [np.zeros((a.shape[0] // n, *a.shape[1:]), a.dtype)
                    for a in spec.out_avals[:fn.row_outputs]]
            arrival = host.clock.time()  # rows put together now, or modelled later
            for slots, rows, at in got:
                arrival = max(arrival, at)
                for o, r in zip(outs, rows):
                    o.reshape(-1, *o.shape[2:])[slots] = r
            for key, o in zip(keys, outs):
                host.put(key, o, owner, arrival=arrival)
        cap.release()

