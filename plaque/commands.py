"""What a core state machine asks its adapter to do: the commands of ``take_commands``.

The worker and the coordinator do no I/O: handling a message or a tick leaves commands, and the
adapter (``endpoint.Endpoint``, or a simulated network in tests) carries them out, dispatching
on the command's class. Frames in a ``Send`` are already encoded (``plaque.wire``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Command", "Connect", "Disconnect", "Exit", "Send"]


class Command:
    """Base of every command."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Send(Command):
    """Queue ``frames`` for ``peer`` on ``channel`` (``wire.DATA`` or ``wire.CONTROL``)."""

    peer: int
    channel: int
    frames: list


@dataclass(frozen=True, slots=True)
class Connect(Command):
    """Make ``peer`` reachable at ``address`` (replacing an older address)."""

    peer: int
    address: str


@dataclass(frozen=True, slots=True)
class Disconnect(Command):
    """Forget ``peer``; what is still queued for it is dropped."""

    peer: int


@dataclass(frozen=True, slots=True)
class Exit(Command):
    """Stop this endpoint: close its transport; ``reason`` says why."""

    reason: str
