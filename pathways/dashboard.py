"""A live dashboard: the cluster in a browser, pushed as it runs.

``pathways dashboard ADDRESS`` connects to a cluster as a normal client (the same address and
keys as any other), gathers what it sees a few times a second and serves one page on
``127.0.0.1`` that the browser keeps open:

- per-device timelines of the last seconds: kernels coloured by client, those that held
  collectives marked, and the data arriving for each device (transfers) on a thin row under
  it; click one for its function, run, seq, start and end, input avals, collectives (time
  waiting for peers, bytes to other hosts) and compile time;
- busy % and HBM per device; islands and hosts with their liveness (a lost one stays listed,
  in red);
- clients with weight, priority, runs running, gangs queued and runs held behind an install;
- each run in flight with its age and where its Plaque graph is: per node, the shards not
  done yet (the hosts' ``WorkerCore.frontier``, joined by the run's graph and timestamp);
- live and suspended slices; the latest failed runs with their remote tracebacks.

Updates are pushed (server-sent events), never polled by the page. The URL carries a random
token, as Jupyter's does; requests without it are refused. The page is one file with no
library and nothing fetched from elsewhere, so it works offline.

``Dashboard`` is the server: ``snapshot()`` is what the page is sent (a JSON-able dict).
"""

from __future__ import annotations

import hmac
import http.server
import json
import secrets
import threading
import time
import urllib.parse
from collections import deque
from importlib import resources

from . import protocol

__all__ = ["Dashboard"]

HOST_TIMEOUT = 1.0  # a host that does not answer a status request this fast is shown down


class Dashboard:
    """Serve the page of the cluster at ``address`` on ``bind``:``port`` (0: any free one).

    ``hz``: snapshots per second; ``window``: seconds of kernels kept per device. ``url``
    is what to open (with the token). ``close()`` stops it; it is also a context manager.
    """

    def __init__(self, address: str, port: int = 0, bind: str = "127.0.0.1",
                 hz: float = 4.0, window: float = 10.0, token: str | None = None,
                 client=None):
        from .client.client import Client  # the dashboard is a client like any other

        if hz <= 0 or window <= 0:
            raise ValueError(f"hz and window must be positive, got hz={hz}, window={window}")
        self.hz, self.window = float(hz), float(window)
        self.token = token or secrets.token_urlsafe(18)
        self._own_client = client is None
        self.client = client if client is not None else Client(address)
        self._kernels: dict[int, deque] = {}  # device -> (start, end, client, name, run, seq,
        # failed, details) in this process's clock
        self._transfers: dict[int, deque] = {}  # device -> (start, end, client, name, bytes,
        # link): data that arrived for it
        self._since: dict[int, float] = {}  # host -> its clock at the last timeline read
        self._busy: dict[int, tuple[float, float]] = {}  # device -> (busy s, host uptime)
        self._hosts_seen: dict[int, dict] = {}  # host -> its hello: a lost host stays shown
        self._devices_seen: dict[int, dict] = {}  # device -> its description, likewise
        self._version = 0
        self._delta_text: str | None = None  # the current version's event for a page that
        # has the one before (its new kernels only), made once
        self._changed = threading.Condition()
        self._stop = threading.Event()
        try:
            self._state, self._delta = self._gather()  # the page has something at once
            self.server = _Server((bind, port), _Handler)
        except BaseException:
            if self._own_client:
                self.client.close()
            raise
        self.server.dashboard = self
        host, port = self.server.server_address[:2]
        self.url = f"http://{host}:{port}/?token={self.token}"
        self._threads = [threading.Thread(target=self.server.serve_forever, name="dashboard",
                                          daemon=True),
                         threading.Thread(target=self._gather_loop, name="dashboard-gather",
                                          daemon=True)]
        for t in self._threads:
            t.start()

    # ---- what the page shows -------------------------------------------------------------
    def snapshot(self) -> dict:
        """The latest snapshot in full, as the page first gets it: the cluster's state and
        every device's kernels of the last ``window`` seconds (``"full": True``)."""
        with self._changed:
            return self._full()

    def _full(self) -> dict:  # with self._changed held
        return {**self._state, "full": True,
                "kernels": {str(d): list(ks) for d, ks in self._kernels.items()},
                "transfers": {str(d): list(ts) for d, ts in self._transfers.items()}}

    def _gather_loop(self) -> None:
        period = 1.0 / self.hz
        while not self._stop.is_set():
            started = time.monotonic()  # paces a real browser's updates, in real time
            try:
                state, delta = self._gather()
                state["gather_seconds"] = time.monotonic() - started  # what it costs here
            except Exception as exc:  # a lost coordinator, say: the page says so
                state, delta = {"error": repr(exc)}, {}
            with self._changed:
                self._state, self._delta = state, delta
                self._delta_text = None
                self._version += 1
                self._changed.notify_all()
            self._stop.wait(max(0.0, period - (time.monotonic() - started)))

    def _gather(self) -> tuple[dict, dict]:
        """A snapshot of the cluster (without kernels or transfers), and what is new on
        the devices since the last one: ``{"kernels": {device: rows}, "transfers": ...}``."""
        c = self.client
        st = c.cluster_status(timeout=HOST_TIMEOUT * 5)
        hosts = {}
        requests = {h: (c.session.request(a, protocol.Status(None)),
                        c.session.request(a, protocol.Timeline(None, self._since.get(h))))
                    for h, a in c.cluster.hosts().items()}
        now = c.clock()  # the clock client traces are drawn in
        for h, (status, timeline) in requests.items():
            try:
                hosts[h] = (status.result(HOST_TIMEOUT), timeline.result(HOST_TIMEOUT))
            except Exception:
                hosts[h] = None
        self._hosts_seen.update(st["hosts"])
        self._devices_seen.update((d["id"], d) for d in st["devices"])
        new = self._take_records(hosts, now)
        frontier = _merge_frontiers(got[0].get("frontier", {}) for got in hosts.values() if got)
        ago = st.get("now", 0.0)  # the coordinator's clock: ages, not times, are shown
        return {
            "now": now, "window": self.window, "hz": self.hz,
            "policy": st["policy"],
            "hosts": [{"id": h, "island": hello.get("island"),
                       "hostname": hello.get("hostname"), "pid": hello.get("pid"),
                       "live": hosts.get(h) is not None, "member": h in st["hosts"]}
                      for h, hello in sorted(self._hosts_seen.items())],
            "devices": self._devices(hosts),
            "clients": [_client_row(cid, info, frontier, ago)
                        for cid, info in st["clients"].items() if cid != c.id],
            "slices": _slices(st.get("resources", {})),
            "errors": [{**e, "age": ago - e["at"]} for e in reversed(st.get("errors", ()))],
        }, new

    def _devices(self, hosts: dict) -> list[dict]:
        """Each device seen so far: live or not, busy since the last snapshot, HBM."""
        devices = []
        for d in sorted(self._devices_seen.values(), key=lambda d: d["id"]):
            got = hosts.get(d["host"])
            info = got[0]["devices"].get(d["id"], {}) if got else {}
            busy, up = info.get("busy_seconds", 0.0), (got[0].get("uptime", 0.0) if got else 0.0)
            b0, u0 = self._busy.get(d["id"], (busy, up))
            if got:
                self._busy[d["id"]] = (busy, up)
            devices.append({"id": d["id"], "host": d["host"], "island": d["island"],
                            "kind": d["kind"], "live": got is not None,
                            "busy": (busy - b0) / (up - u0) if up > u0 else 0.0,
                            "hbm_used": info.get("hbm_used", 0),
                            "hbm_capacity": info.get("hbm_capacity", 0)})
        return devices

    def _take_records(self, hosts: dict, now: float) -> dict:
        """The kernels and transfers the hosts' timelines gave since the last read, as rows
        in our clock, added to the window a new page starts from (which drops the old)."""
        new: dict[str, dict[str, list]] = {"kernels": {}, "transfers": {}}
        for h, got in hosts.items():
            if got is None:
                continue
            timeline = got[1]
            offset = now - timeline["now"]  # host clock -> ours, as traces do
            self._since[h] = timeline["now"]
            for dev, records in timeline["devices"].items():
                rows = [(start + offset, end + offset, labels.get("client"), name,
                         labels.get("run"), seq, bool(failed), _details(labels))
                        for seq, name, labels, start, end, failed in records]
                if rows:
                    new["kernels"][str(dev)] = rows
            for dev, moved in timeline.get("transfers", {}).items():
                rows = [(start + offset, end + offset, labels.get("client"), name,
                         labels.get("bytes"), labels.get("link"))
                        for name, labels, start, end in moved]
                if rows:
                    new["transfers"][str(dev)] = rows
        with self._changed:
            for kind, kept in (("kernels", self._kernels), ("transfers", self._transfers)):
                for dev, rows in new[kind].items():
                    kept.setdefault(int(dev), deque()).extend(rows)
                for rows in kept.values():
                    while rows and rows[0][1] < now - self.window:
                        rows.popleft()
        return new

    # ---- serving -------------------------------------------------------------------------
    def allowed(self, query: str) -> bool:
        token = urllib.parse.parse_qs(query).get("token", [""])[0]
        return hmac.compare_digest(token.encode(), self.token.encode())

    def next_event(self, version: int, timeout: float) -> tuple[int, str | None]:
        """For a stream that has sent snapshot ``version``: the next version and its event,
        only the kernels new since ``version`` when it is the one after, else in full (a new
        or lagging page); None if nothing changed within ``timeout``."""
        with self._changed:
            if self._version == version:
                self._changed.wait(timeout)
            if self._version == version:
                return version, None
            current = self._version
            if current == version + 1:
                if self._delta_text is None:
                    self._delta_text = json.dumps({**self._state, **self._delta,
                                                   "full": False})
                return current, self._delta_text
            full = self._full()
        return current, json.dumps(full)

    def close(self) -> None:
        """Stop serving (open pages see the stream end) and close the client."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self.server.shutdown()
        self.server.server_close()
        for t in self._threads:
            t.join(5)
        if self._own_client:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _details(labels: dict) -> dict:
    """What a page shows of a kernel when it is clicked, beyond its row: its equation,
    input avals, collectives (and time waiting in them), compile time, batch."""
    return {k: v for k, v in labels.items() if k not in ("client", "run")}


def _merge_frontiers(frontiers) -> dict:
    """The hosts' ``WorkerCore.frontier``s as one: ``{graph: {"nodes", "runs": {t: {node:
    shards not done}}}}`` (shards summed over the hosts)."""
    out: dict = {}
    for frontier in frontiers:
        for gid, got in frontier.items():
            mine = out.setdefault(gid, {"nodes": got["nodes"], "runs": {}})
            for t, pending in got["runs"].items():
                run = mine["runs"].setdefault(t, {})
                for node, n in pending.items():
                    run[node] = run.get(node, 0) + n
    return out


def _client_row(cid, info: dict, frontier: dict, now: float) -> dict:
    """A client as the page shows it: weight, priority, counts, and its runs in flight,
    each with its age and, once started, its nodes with the shards not done yet."""
    runs = []
    for r in info.get("runs", ()):
        graph = frontier.get(r.get("graph"), {})
        pending = graph.get("runs", {}).get(r.get("t")) if r.get("started") else None
        runs.append({"program": r["program"], "run": r["run"], "started": r["started"],
                     "age": now - r["since"],
                     "nodes": None if pending is None else [
                         [node, pending.get(node, 0), shards]
                         for node, shards in graph["nodes"].items()]})
    return {"id": cid, "runs": runs, **{k: info.get(k) for k in ("weight", "priority",
                                                                "running", "queued", "held")}}


def _slices(resources: dict) -> list[dict]:
    """Live and suspended slices: whose, shape, island, devices."""
    out = [{"id": sid, "client": s["client"], "shape": list(s["shape"]), "island": s["island"],
            "devices": s["devices"], "state": "broken" if s.get("broken") else "live"}
           for sid, s in resources.get("slices", {}).items()]
    out += [{"id": sid, "client": s["client"], "shape": list(s["shape"]),
             "island": s["island"], "devices": [], "state": "suspended"}
            for sid, s in resources.get("suspended", {}).items()]
    return sorted(out, key=lambda s: s["id"])


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # an open page's stream never holds up close()
    dashboard: Dashboard


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # a request per page and stream: nothing worth a line each

    def do_GET(self):
        dash = self.server.dashboard
        url = urllib.parse.urlsplit(self.path)
        if not dash.allowed(url.query):
            self._send(403, "text/plain", b"this dashboard needs the token of its URL\n")
        elif url.path == "/":
            page = resources.files("pathways").joinpath("dashboard.html").read_bytes()
            self._send(200, "text/html; charset=utf-8", page)
        elif url.path == "/snapshot.json":
            self._send(200, "application/json", json.dumps(dash.snapshot()).encode())
        elif url.path == "/events":
            self._stream(dash)
        else:
            self._send(404, "text/plain", b"not found\n")

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, dash: Dashboard) -> None:
        """Server-sent events: each new snapshot as one ``data:`` line, as it is made."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        version = -2  # not the one before any: the first event is in full
        try:
            while not dash._stop.is_set():
                version, text = dash.next_event(version, 1.0)
                self.wfile.write(b": idle\n\n" if text is None else f"data: {text}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page was closed
