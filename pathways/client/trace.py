"""Device timelines as Chrome trace JSON (opens in Perfetto or chrome://tracing).

One process row per host ("island I / host H"), one thread row per device with its kernels
(and, before a kernel whose host compiled its program first, a "compile" span: the device
idled meanwhile, so it is not the kernel's time), and one more per device for the data that
arrived for it (transfers, routed rows). Each kernel carries its client, run, equation and
sequence number; gaps between kernels are the device's idle time. Hosts keep their records
in their own monotonic clocks; each host's clock is mapped onto the client's by the moment
its reply arrived (good to a round trip, which is far below a kernel on another host).

>>> with client.trace("run.json"):
...     step(x).result()
>>> # then open run.json in https://ui.perfetto.dev
"""

from __future__ import annotations

import json

from .. import protocol

TRANSFER_TID = 1_000_000  # thread ids of the transfer rows: device id + this


def collect(client, since: dict | float | None = None, timeout: float = 10.0) -> list[dict]:
    """Every host's records that ended after ``since`` (per host, in its own clock; a number
    applies to every host), each with ``offset`` = client clock - host clock."""
    futures = {h: client.session.request(a, protocol.Timeline(
                   None, since.get(h) if isinstance(since, dict) else since))
               for h, a in client.cluster.hosts().items()}
    out = []
    for h, f in futures.items():
        reply = f.result(timeout)
        reply["host"] = h
        reply["offset"] = client.clock() - reply["now"]
        out.append(reply)
    return out


def marks(client, timeout: float = 10.0) -> dict:
    """Each host's clock now: the start of a trace window."""
    return {r["host"]: r["now"] for r in collect(client, float("inf"), timeout)}


def chrome_trace(records: list[dict], begin: float | None = None) -> dict:
    """The Chrome trace of ``collect``'s records; times in µs from ``begin`` (client clock;
    default: the first event)."""
    events, meta = [], []
    starts = [k[3] - k[2].get("compile", 0.0) + r["offset"] for r in records
              for ks in r["devices"].values() for k in ks]
    starts += [t[2] + r["offset"] for r in records for ts in r["transfers"].values()
               for t in ts]
    origin = begin if begin is not None else (min(starts) if starts else 0.0)

    def us(t):
        return round((t - origin) * 1e6, 3)

    for r in sorted(records, key=lambda r: (r["island"], r["host"])):
        pid, off = r["host"], r["offset"]
        meta.append({"ph": "M", "name": "process_name", "pid": pid,
                     "args": {"name": f"island {r['island']} / host {pid}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                     "args": {"sort_index": r["island"] * 10_000 + pid}})
        for d, kernels in r["devices"].items():
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": d,
                         "args": {"name": f"device {d}"}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": d,
                         "args": {"sort_index": 2 * d}})
            for seq, name, labels, start, end, failed in kernels:
                events.append({"ph": "X", "cat": "kernel", "name": name, "pid": pid,
                               "tid": d, "ts": us(start + off), "dur": us(end + off) - us(
                                   start + off),
                               "args": dict(labels, seq=seq, failed=bool(failed))})
                if labels.get("compile"):  # the host compiled first; the device was idle
                    before = start - labels["compile"]
                    events.append({"ph": "X", "cat": "compile", "name": f"compile {name}",
                                   "pid": pid, "tid": d, "ts": us(before + off),
                                   "dur": us(start + off) - us(before + off),
                                   "args": {"seq": seq, "host work": "not device time"}})
            moved = r["transfers"].get(d, [])
            if moved:
                meta.append({"ph": "M", "name": "thread_name", "pid": pid,
                             "tid": TRANSFER_TID + d,
                             "args": {"name": f"device {d} data in"}})
                meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid,
                             "tid": TRANSFER_TID + d, "args": {"sort_index": 2 * d + 1}})
            for name, labels, start, end in moved:
                events.append({"ph": "X", "cat": "transfer", "name": name, "pid": pid,
                               "tid": TRANSFER_TID + d, "ts": us(start + off),
                               "dur": max(0.0, us(end + off) - us(start + off)),
                               "args": dict(labels)})
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write(path, trace: dict) -> None:
    with open(path, "w") as f:
        json.dump(trace, f)


class Tracing:
    """``client.trace(path)``: record every device's kernels while the block runs."""

    def __init__(self, client, path):
        self.client, self.path = client, path
        self.trace: dict | None = None

    def __enter__(self):
        self._since = marks(self.client)
        self._begin = self.client.clock()
        return self

    def __exit__(self, *exc):
        records = collect(self.client, self._since)
        self.trace = chrome_trace(records, self._begin)
        if self.path is not None:
            write(self.path, self.trace)
        return False


def client_spans(timeline: dict, clients) -> dict:
    """``{client: (first kernel start, last kernel end)}`` over a ``Client.timeline()``."""
    spans: dict = {}
    for records in timeline.values():
        for _, _, labels, start, end, _ in records:
            c = labels.get("client")
            if c in clients:
                lo, hi = spans.get(c, (start, end))
                spans[c] = (min(lo, start), max(hi, end))
    return spans


def device_time_by_client(timeline: dict, clients) -> tuple[dict, float]:
    """Device seconds of each client's kernels while all of ``clients`` had kernels running
    (from the last first start to the first last end), and that interval's length: how a
    scheduling policy shared the devices while everyone wanted them.

    >>> busy, seconds = device_time_by_client(client.timeline(), [client.id, other.id])
    """
    spans = client_spans(timeline, clients)
    busy = dict.fromkeys(clients, 0.0)
    if len(spans) < len(busy):  # a client ran nothing: there was no such interval
        return busy, 0.0
    since = max(lo for lo, _ in spans.values())
    until = min(hi for _, hi in spans.values())
    if until <= since:
        return busy, 0.0
    for records in timeline.values():
        for _, _, labels, start, end, _ in records:
            c = labels.get("client")
            if c in busy:
                busy[c] += max(0.0, min(end, until) - max(start, since))
    return busy, until - since


def kernels(trace: dict) -> dict:
    """``{(pid, device): [kernel events by start]}`` of a Chrome trace made here."""
    out: dict = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            out.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in out.values():
        evs.sort(key=lambda e: e["ts"])
    return out
