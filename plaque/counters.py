"""Traffic counters, per worker and per peer: what went over the wire, in messages and bytes."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .wire import frame_bytes


@dataclass
class PeerCounters:
    """Traffic with one peer: messages, frames, bytes, tuples and progress messages each way,
    and the messages from it that were dropped."""

    messages_sent: int = 0
    frames_sent: int = 0
    bytes_sent: int = 0
    tuples_sent: int = 0
    progress_sent: int = 0
    messages_received: int = 0
    frames_received: int = 0
    bytes_received: int = 0
    tuples_received: int = 0
    progress_received: int = 0
    dropped: int = 0  # messages that could not be decoded or delivered

    def count_sent(self, frames, progress: bool, tuples: int = 0) -> None:
        self.messages_sent += 1
        self.frames_sent += len(frames)
        self.bytes_sent += frame_bytes(frames)
        self.tuples_sent += tuples
        self.progress_sent += progress

    def count_received(self, frames, progress: bool) -> None:
        self.messages_received += 1
        self.frames_received += len(frames)
        self.bytes_received += frame_bytes(frames)
        self.progress_received += progress


class Counters:
    """Counters keyed by peer id (an int; -1 is the coordinator)."""

    def __init__(self):
        self.peers: dict[int, PeerCounters] = {}

    def peer(self, peer: int) -> PeerCounters:
        c = self.peers.get(peer)
        if c is None:
            c = self.peers[peer] = PeerCounters()
        return c

    def snapshot(self) -> dict[int, dict[str, int]]:
        return {p: asdict(c) for p, c in self.peers.items()}


def total(snapshot: dict[int, dict[str, int]]) -> dict[str, int]:
    """Sum a snapshot over peers."""
    out: dict[str, int] = {}
    for c in snapshot.values():
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out
