"""Draw a Chrome trace made by ``client.trace`` as a PNG timeline, like the paper's Figures 9,
11 and 12: one row per device (grouped by island and host), kernels coloured by client, data
arriving drawn thin under each row, and each device's utilization (busy / traced time).

Needs matplotlib: ``.venv/bin/pip install -e '.[plot]'`` (or ``pip install
'pathways-open[plot]'``).
"""

from __future__ import annotations

import json

from .client.trace import TRANSFER_TID


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plotting needs matplotlib: .venv/bin/pip install -e '.[plot]' (or"
                         " pip install 'pathways-open[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def utilization(trace: dict) -> dict:
    """``{row label: busy fraction}`` over the traced interval, per device."""
    rows, _, span = _rows(trace)
    return {label: (sum(e["dur"] for e in evs) / span if span else 0.0)
            for label, evs, _, _ in rows}


def _rows(trace):
    names, procs = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        if e.get("ph") == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
    kernels, moved, compiles = {}, {}, {}
    lo, hi = float("inf"), float("-inf")
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        lo, hi = min(lo, e["ts"]), max(hi, e["ts"] + e["dur"])
        if e["tid"] >= TRANSFER_TID:
            moved.setdefault((e["pid"], e["tid"] - TRANSFER_TID), []).append(e)
        elif e.get("cat") == "compile":  # host work: the device idled
            compiles.setdefault((e["pid"], e["tid"]), []).append(e)
        else:
            kernels.setdefault((e["pid"], e["tid"]), []).append(e)
    keys = sorted(set(kernels) | set(moved), key=lambda k: (procs.get(k[0], ""), k[1]))
    rows = [(f"{procs.get(p, p)} / {names.get((p, d), d)}", kernels.get((p, d), []),
             moved.get((p, d), []), compiles.get((p, d), [])) for p, d in keys]
    return rows, (0.0 if lo == float("inf") else lo), max(0.0, hi - lo)


def plot(trace_path: str, out_path: str, title: str | None = None) -> dict:
    """Render ``trace_path`` to ``out_path`` (PNG); returns per-device utilization."""
    plt = _matplotlib()
    with open(trace_path) as f:
        trace = json.load(f)
    rows, origin, span = _rows(trace)
    if not rows:
        raise SystemExit(f"{trace_path}: no kernels in this trace")
    clients = sorted({e["args"].get("client") for _, ks, _, _ in rows for e in ks},
                     key=lambda c: (c is None, c))
    colours = {c: plt.cm.tab10(i % 10) for i, c in enumerate(clients)}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.5))
    util = {}
    for y, (label, ks, ms, cs) in enumerate(rows):
        ax.broken_barh([((e["ts"] - origin) / 1e3, e["dur"] / 1e3) for e in cs], (y - 0.4, 0.6),
                       facecolors="white", edgecolor="grey", hatch="//", linewidth=0.2)
        ax.broken_barh([((e["ts"] - origin) / 1e3, e["dur"] / 1e3) for e in ks], (y - 0.4, 0.6),
                       facecolors=[colours[e["args"].get("client")] for e in ks],
                       edgecolor="black", linewidth=0.2)
        ax.broken_barh([((e["ts"] - origin) / 1e3, e["dur"] / 1e3) for e in ms],
                       (y + 0.25, 0.12), facecolors="grey")
        util[label] = sum(e["dur"] for e in ks) / span if span else 0.0
        ax.text(span / 1e3 * 1.01, y, f"{util[label]:.0%}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_xlim(0, span / 1e3 * 1.08)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[c]) for c in clients]
    ax.legend(handles, [f"client {c}" for c in clients], loc="upper center", fontsize=8,
              bbox_to_anchor=(0.5, -0.08 - 0.5 / len(rows)), ncol=min(len(clients), 8),
              frameon=False)
    ax.set_title(title or "device timeline (busy % at the right; grey: data arriving;"
                 " hatched: the host compiling, device idle)")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return util
