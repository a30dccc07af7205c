"""Messages between clients, the coordinator and hosts' data services.

They reuse Plaque's framing (``plaque.wire``): a small header, a pickle body and large numpy
buffers as their own frames. Payloads are tuples whose first item names the request.
"""

from __future__ import annotations

from dataclasses import dataclass

from plaque import wire

CLIENT = -3  # sender id used by clients in headers


def pack(payload, sender: int = CLIENT) -> list:
    return wire.encode(wire.Kind.USER, sender, payload)


def unpack(frames):
    """The payload of a message; raises plaque.ProtocolError for anything malformed."""
    kind, _sender, payload = wire.decode(frames)
    if kind is not wire.Kind.USER or not isinstance(payload, tuple) or not payload:
        raise wire.ProtocolError(f"unexpected {kind.name} message")
    return payload


def batch(payloads: list):
    """One payload for several sent back to back (``unbatch`` undoes it)."""
    return payloads[0] if len(payloads) == 1 else ("batch", payloads)


def unbatch(payload) -> list:
    """The payloads a received one stands for."""
    if payload[0] == "batch":
        if len(payload) != 2 or not isinstance(payload[1], list):
            raise wire.ProtocolError("a batch carries one list of payloads")
        return [p for p in payload[1] if isinstance(p, tuple) and p]
    return [payload]


@dataclass(frozen=True)
class RunArg:
    """What every host of a program gets with a run (one START message per host)."""

    client: int
    run_id: int
    mode: str  # "parallel" or "sequential"
    inputs: dict  # program input var id -> array id
    outputs: dict  # program output var id -> array id
    seqs: dict  # eqn index -> {device: sequence number on that device}

    def array_id(self, var_id: int):
        if var_id in self.inputs:
            return self.inputs[var_id]
        if var_id in self.outputs:
            return self.outputs[var_id]
        return (self.client, "tmp", self.run_id, var_id)  # intermediate, freed after last use


def transfer_key(arg: RunArg, consumer: int, port: int, device: int):
    """Where a consumer shard assembles an input that arrives by transfer."""
    return (("xfer", arg.client, arg.run_id, consumer, port), device)


# Buffer keys are (array id, device). Array ids: (client, n) named by a client,
# (client, "tmp", run, var) for a run's intermediates, ("xfer", client, run, eqn, port).

def key_client(key):
    """The client a buffer key belongs to, or None for a key of no known form."""
    aid = key[0]
    if isinstance(aid, tuple) and aid:
        return aid[1] if aid[0] == "xfer" and len(aid) > 1 else aid[0]
    return None


def key_run(key):
    """``(client, run)`` of a run's own buffer (an intermediate or a transfer), else None."""
    aid = key[0]
    if isinstance(aid, tuple) and len(aid) >= 3:
        if aid[0] == "xfer":
            return (aid[1], aid[2])
        if aid[1] == "tmp":
            return (aid[0], aid[2])
    return None
