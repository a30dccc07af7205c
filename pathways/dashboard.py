"""A live dashboard: the cluster in a browser, pushed as it runs.

``pathways dashboard ADDRESS`` connects to a cluster as a normal client (the same address and
keys as any other), gathers what it sees a few times a second and serves one page on
``127.0.0.1`` that the browser keeps open:

- per-device timelines of the last seconds: kernels coloured by client, those that held
  collectives marked, and the data arriving for each device (transfers) on a thin row under
  it; click one for its function, run, seq, start and end, input avals, collectives (time
  waiting for peers, bytes to other hosts) and compile time;
- busy % per device, the share of the timeline's window its kernels cover (what its row
  shows, as one figure), and HBM; islands and hosts with their liveness (a lost one stays listed,
  in red);
- clients with weight, priority, runs running, gangs queued and runs held behind an install;
- each run in flight with its age and where its Plaque graph is: per node, the shards not
  done yet (the hosts' ``WorkerCore.frontier``, joined by the run's graph and timestamp);
- live and suspended slices; the latest failed runs with their remote tracebacks.

Updates are pushed (server-sent events), never polled by the page. The URL carries a random
token, as Jupyter's does; requests without it are refused. Anyone who can reach the port can
still open connections before a token is seen, so each is served on a thread for at most
``max_connections`` at once (more are closed unread) and closed after ``idle_timeout``
seconds without a byte. The page is one file with no library and nothing fetched from
elsewhere, so it works offline.

``Dashboard`` is the server: ``snapshot()`` is what the page is sent (a JSON-able dict).
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
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

HOST_TIMEOUT = 2.0  # a host that does not answer a status request this fast is shown down


class Dashboard:
    """Serve the page of the cluster at ``address`` on ``bind``:``port`` (0: any free one).

    ``hz``: snapshots per second; ``window``: seconds of kernels kept per device. ``url``
    is what to open (with the token). At most ``max_connections`` are served at once, each
    closed once idle for ``idle_timeout`` seconds (waiting that long for its request, or for
    the browser to take what it is sent). ``close()`` stops it; it is also a context manager.
    """

    def __init__(self, address: str, port: int = 0, bind: str = "127.0.0.1",
                 hz: float = 4.0, window: float = 10.0, token: str | None = None,
                 client=None, idle_timeout: float = 5.0, max_connections: int = 32):
        from .client.client import Client  # the dashboard is a client like any other

        if hz <= 0 or window <= 0:
            raise ValueError(f"hz and window must be positive, got hz={hz}, window={window}")
        if idle_timeout <= 0 or max_connections < 1:
            raise ValueError(f"idle_timeout and max_connections must be positive, got"
                             f" {idle_timeout} and {max_connections}")
        self.hz, self.window = float(hz), float(window)
        self.token = token or secrets.token_urlsafe(18)
        self._own_client = client is None
        self.client = client if client is not None else Client(address)
        self._kernels: dict[int, deque] = {}  # device -> (start, end, client, name, run, seq,
        # failed, collectives) in this process's clock
        self._details: dict[int, dict[int, dict]] = {}  # device -> seq -> what a click shows
        self._transfers: dict[int, deque] = {}  # device -> (start, end, client, name, bytes,
        # link): data that arrived for it
        self._since: dict[int, float] = {}  # host -> its clock at the last timeline read
        self._kept: dict[int, float] = {}  # device -> seconds of its kernels in _kernels
        self._started = self.client.clock()  # our first look: the window starts no earlier
        self._asks: dict[int, _Ask] = {}  # host -> its requests not answered yet
        self._status: dict[int, dict] = {}  # host -> its latest status
        self._live: dict[int, bool] = {}  # host -> whether it answered within HOST_TIMEOUT
        self._hosts_seen: dict[int, dict] = {}  # host -> its hello: a lost host stays shown
        self._devices_seen: dict[int, dict] = {}  # device -> its description, likewise
        self._version = 0
        self._delta_text: str | None = None  # the current version's event for a page that
        # has the one before (its new kernels only), made once
        self._changed = threading.Condition()
        self._stop = threading.Event()
        try:
            self._state, self._delta = self._gather()  # the page has something at once
            self.server = _Server((bind, port), idle_timeout, max_connections)
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
        the devices since the last one: ``{"kernels": {device: rows}, "transfers": ...}``.

        Each host is asked for its status and its timeline since the last read; a host's
        answers are waited for up to most of an update's period, then the snapshot goes out
        with what came. A host that has not answered yet keeps its last state and is asked
        again only once it has (a slow host never slows the page down, nor is it asked
        twice at once); one silent for ``HOST_TIMEOUT`` is shown down."""
        c = self.client
        st = c.cluster_status(timeout=HOST_TIMEOUT * 5)
        addresses = c.cluster.hosts()
        for h, a in addresses.items():
            if h not in self._asks:
                self._asks[h] = _Ask(c, a, self._since.get(h))
        futures = [f for ask in self._asks.values() for f in ask.futures]
        cf.wait(futures, timeout=min(HOST_TIMEOUT, 0.8 / self.hz))
        fresh: dict[int, tuple | None] = {}  # host -> (status, timeline, arrived) or None
        for h, ask in list(self._asks.items()):
            if ask.done() or time.monotonic() - ask.sent > HOST_TIMEOUT or h not in addresses:
                del self._asks[h]
                fresh[h] = ask.answer()
        for h in self._live:
            if h not in addresses:
                self._live[h] = False  # gone from the cluster
        for h, got in fresh.items():
            self._live[h] = got is not None
            if got is not None:
                self._status[h] = got[0]
        self._hosts_seen.update(st["hosts"])
        self._devices_seen.update((d["id"], d) for d in st["devices"])
        now = c.clock()  # the clock client traces are drawn in
        new = self._take_records(fresh, now)
        frontier = _merge_frontiers(self._status[h].get("frontier", {})
                                    for h, live in self._live.items() if live)
        ago = st.get("now", 0.0)  # the coordinator's clock: ages, not times, are shown
        begin = max(now - self.window, self._started)  # what busy is over, to now
        return {
            "now": now, "window": self.window, "hz": self.hz, "busy_from": begin,
            "policy": st["policy"],
            "hosts": [{"id": h, "island": hello.get("island"),
                       "hostname": hello.get("hostname"), "pid": hello.get("pid"),
                       "live": self._live.get(h, False), "member": h in st["hosts"]}
                      for h, hello in sorted(self._hosts_seen.items())],
            "devices": self._devices(begin, now),
            "clients": [_client_row(cid, info, frontier, ago)
                        for cid, info in st["clients"].items() if cid != c.id],
            "slices": _slices(st.get("resources", {})),
            "errors": [{**e, "age": ago - e["at"]} for e in reversed(st.get("errors", ()))],
        }, new

    def _devices(self, begin: float, now: float) -> list[dict]:
        """Each device seen so far: live or not, busy (``_busy``), HBM as of its host's last
        answer."""
        devices = []
        for d in sorted(self._devices_seen.values(), key=lambda d: d["id"]):
            status = self._status.get(d["host"])
            info = status["devices"].get(d["id"], {}) if status else {}
            live = self._live.get(d["host"], False)
            devices.append({"id": d["id"], "host": d["host"], "island": d["island"],
                            "kind": d["kind"], "live": live,
                            "busy": self._busy(d["id"], begin, now) if live else 0.0,
                            "hbm_used": info.get("hbm_used", 0),
                            "hbm_capacity": info.get("hbm_capacity", 0)})
        return devices

    def _busy(self, device: int, begin: float, now: float) -> float:
        """The share of the timeline's window, [``begin``, ``now``] (the last ``window``
        seconds, or since our first look), that the device's kernels cover: what its row
        shows, as one figure. Counted from the running sum of the kept kernels' lengths
        (``_kept``: a window holds thousands of kernels, summed at every update otherwise),
        with the parts outside the window taken off; one device runs one kernel at a time,
        so they do not overlap."""
        if now <= begin:
            return 0.0
        with self._changed:
            rows = self._kernels.get(device, ())
            covered = self._kept.get(device, 0.0)
            for start, end, *_ in rows:  # the oldest may begin before the window
                if start >= begin:
                    break
                covered -= min(end, begin) - start
            for start, end, *_ in reversed(rows):  # and the newest end after now (clocks)
                if end <= now:
                    break
                covered -= end - max(start, now)
        return min(1.0, max(0.0, covered / (now - begin)))

    def _take_records(self, fresh: dict, now: float) -> dict:
        """The kernels and transfers the hosts' timelines gave since the last read, as rows
        in our clock, added to the window a new page starts from (which drops the old)."""
        new: dict[str, dict[str, list]] = {"kernels": {}, "transfers": {}}
        for h, got in fresh.items():
            if got is None:
                continue
            _, timeline, arrived = got
            offset = arrived - timeline["now"]  # host clock -> ours: good to the reply's way
            self._since[h] = timeline["now"]
            for dev, records in timeline["devices"].items():
                if not records:
                    continue
                new["kernels"][str(dev)] = [
                    (start + offset, end + offset, labels.get("client"), name,
                     labels.get("run"), seq, bool(failed), labels.get("collectives", 0))
                    for seq, name, labels, start, end, failed in records]
                details = {seq: _details(labels) for seq, _, labels, *_ in records}
                with self._changed:
                    self._details.setdefault(dev, {}).update(details)
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
                    if kind == "kernels":
                        self._kept[int(dev)] = self._kept.get(int(dev), 0.0) + sum(
                            end - start for start, end, *_ in rows)
                for dev, rows in kept.items():
                    while rows and rows[0][1] < now - self.window:
                        old = rows.popleft()
                        if kind == "kernels":
                            self._details.get(dev, {}).pop(old[5], None)
                            self._kept[dev] -= old[1] - old[0]
        return new

    def kernel(self, device: int, seq: int) -> dict | None:
        """What a click on a kernel still in the window shows beyond its row (equation, input
        avals, collectives and the wait in them, compile time, batch); None if it left."""
        with self._changed:
            return self._details.get(device, {}).get(seq)

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


class _Ask:
    """A host's status and timeline requested together; when the timeline's answer came, in
    the client's clock (what maps the host's clock onto ours)."""

    def __init__(self, client, address: str, since: float | None):
        self.sent = time.monotonic()
        self.arrived: float | None = None
        self._clock = client.clock
        self.status = client.session.request(address, protocol.Status(None))
        self.timeline = client.session.request(address, protocol.Timeline(None, since))
        self.futures = (self.status, self.timeline)

        def stamp(_):
            self.arrived = client.clock()
        self.timeline.add_done_callback(stamp)

    def done(self) -> bool:
        return self.status.done() and self.timeline.done()

    def answer(self) -> tuple | None:
        """(status, timeline, arrived), or None if either failed or is not answered."""
        if not self.done() or self.status.exception() or self.timeline.exception():
            return None
        arrived = self.arrived  # None if its callback has not run yet: it is about now
        return self.status.result(), self.timeline.result(), \
            self._clock() if arrived is None else arrived


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


FIRST_SNAPSHOT = b"/*first snapshot*/null"  # in the page's script: what serving it fills in


@functools.cache
def _page() -> bytes:
    return resources.files("pathways").joinpath("dashboard.html").read_bytes()


class _Server(http.server.ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them: one more is closed at
    once, unread. Connections need no token to be opened, so without the cap (and the
    handler's idle timeout) idle ones would pile up threads without bound."""

    daemon_threads = True  # an open page's stream never holds up close()
    block_on_close = False  # nor does a connection not idle long enough to be closed yet
    dashboard: Dashboard

    def __init__(self, address, idle_timeout: float, max_connections: int):
        self.idle_timeout = idle_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def setup(self):
        self.timeout = self.server.idle_timeout  # each read and write; the base class's
        super().setup()  # handle_one_request closes the connection when one times out

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # a request per page and stream: nothing worth a line each

    def do_GET(self):
        dash = self.server.dashboard
        url = urllib.parse.urlsplit(self.path)
        if not dash.allowed(url.query):
            self._send(403, "text/plain", b"this dashboard needs the token of its URL\n")
        elif url.path == "/":  # with the latest snapshot in it: drawn without a request more
            first = json.dumps(dash.snapshot()).replace("<", "\\u003c")  # no tag in script
            self._send(200, "text/html; charset=utf-8",
                       _page().replace(FIRST_SNAPSHOT, first.encode()))
        elif url.path == "/snapshot.json":
            self._send(200, "application/json", json.dumps(dash.snapshot()).encode())
        elif url.path == "/kernel.json":
            self._kernel(dash, urllib.parse.parse_qs(url.query))
        elif url.path == "/events":
            self._stream(dash)
        else:
            self._send(404, "text/plain", b"not found\n")

    def _kernel(self, dash: Dashboard, query: dict) -> None:
        try:
            device, seq = int(query["device"][0]), int(query["seq"][0])
        except (KeyError, ValueError):
            self._send(400, "text/plain", b"kernel.json needs device=N&seq=N\n")
            return
        details = dash.kernel(device, seq)
        if details is None:
            self._send(404, "text/plain", b"no such kernel in the window\n")
        else:
            self._send(200, "application/json", json.dumps(details).encode())

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
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the page was closed, or stopped reading for idle_timeout
