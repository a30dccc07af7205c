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
