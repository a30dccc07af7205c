"""Shared helper for the benchmarks: describe the machine and append a
Markdown section (command, machine, table, notes) to ``bench/RESULTS.md``,
so every figure we quote can be traced back to how and where it was made."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys

_BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_BENCH_DIR)
RESULTS_PATH = os.path.join(_BENCH_DIR, "RESULTS.md")
# what the notes of a simulated bench say of the CPU it charges
SIM_CPU = ("Measured CPU leaves out garbage collections (this process's heap holds every"
           " role's objects; a real process would scan only its own).")


def machine() -> dict:
    """Facts that most affect the figures (core count above all)."""
    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _command_line() -> str:
    # Independent of the interpreter path, and of where the repo is checked out.
    args = list(sys.argv) or [""]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:  # run as ``python -m bench.NAME``
        return " ".join(["python", "-m", spec.name, *args[1:]])
    if args[0] and os.path.exists(args[0]):
        args[0] = os.path.relpath(os.path.abspath(args[0]), _REPO_ROOT)
    return "python " + " ".join(args)


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows) -> list[str]:
    if not rows:
        return ["_(no rows)_"]
    if isinstance(rows[0], dict):
        header = list(rows[0].keys())
        body = [[r.get(k, "") for k in header] for r in rows]
    else:
        header = ["Metric", "Value"]
        body = [list(r) for r in rows]
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in body]
    return lines


def append_results(title: str, rows, notes: str = "") -> None:
    """Append one section to RESULTS.md (created with a header if missing)."""
    m = machine()
    lines = ["", f"## {title} — {m['date']}", "",
             f"Command: `{_command_line()}`", "",
             f"Machine: nproc={m['nproc']}, Python {m['python']}, {m['platform']}", ""]
    lines += table(rows)
    if notes:
        lines += ["", notes.strip()]
    new_file = not os.path.exists(RESULTS_PATH)
    with open(RESULTS_PATH, "a", encoding="utf-8") as f:
        if new_file:
            f.write("# Benchmark results\n")
        f.write("\n".join(lines) + "\n")


def publish(title: str, rows: list[dict], notes: str, profile: str = "",
            append: bool = True) -> None:
    """Print a benchmark's table, notes and profile; append them to RESULTS.md if asked."""
    print()
    print(f"{title} (nproc={os.cpu_count()})")
    for r in rows:
        print("  " + " | ".join(f"{k}: {v}" for k, v in r.items()))
    print()
    print(notes)
    if profile:
        print("\nProfile (py-spy, samples holding the GIL):")
        print(profile)
    if append:
        append_results(title, rows, notes)
        print("\nappended to bench/RESULTS.md")
    else:
        print("\n(nothing appended to RESULTS.md)")


class BenchParser(argparse.ArgumentParser):
    """Options of a benchmark; ``sized`` ones default to one value with --quick, another
    without."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sized: list[tuple[str, object, object]] = []

    def sized(self, flag: str, type, quick, full, help: str) -> None:
        self.add_argument(flag, type=type, default=None,
                          help=f"{help} (default {full}; {quick} with --quick)")
        self._sized.append((flag.lstrip("-").replace("-", "_"), quick, full))

    def parse_args(self, args=None, namespace=None):
        ns = super().parse_args(args, namespace)
        for dest, quick, full in self._sized:
            if getattr(ns, dest) is None:
                setattr(ns, dest, quick if ns.quick else full)
        return ns


@contextlib.contextmanager
def security_for_all(insecure: bool, curve: bool = False):
    """One security setting for everything a benchmark starts, our clusters and the baselines
    alike. By default none is forced: local clusters pick their own default (Unix sockets in a
    private directory) and baselines that open sockets use plain loopback TCP; ``curve``: a
    throw-away CURVE key pair in ``$PLAQUE_KEYS`` for everything (TCP, what clusters across
    machines use); ``insecure``: plain TCP for our clusters too. Yields the keyword
    arguments for ``pw.local_cluster`` / ``plaque.local_cluster``."""
    from plaque import security

    if insecure and curve:
        raise ValueError("--insecure and --curve contradict each other: choose one")
    old = os.environ.pop(security.ENV, None)
    directory = security.ephemeral("bench-keys-") if curve else None
    if directory is not None:
        os.environ[security.ENV] = directory
    try:
        yield {"insecure": True} if insecure else {}
    finally:
        os.environ.pop(security.ENV, None)
        if old is not None:
            os.environ[security.ENV] = old
        if directory is not None:
            security.discard(directory)


def bench_parser(doc: str, quick: str, profile: str | None = None) -> BenchParser:
    """The options every benchmark takes: --quick, --no-append and, if it can, --profile."""
    ap = BenchParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{quick}; no RESULTS.md entry")
    ap.add_argument("--no-append", action="store_true", help="print only; no RESULTS.md entry")
    ap.add_argument("--insecure", action="store_true",
                    help="plain loopback TCP for the clusters it starts (default: their own"
                         " default, Unix sockets in a private directory)")
    ap.add_argument("--curve", action="store_true",
                    help="TCP with one throw-away CURVE key pair for the clusters and"
                         " baselines it starts (as clusters across machines run)")
    if profile:
        ap.add_argument("--profile", action="store_true", help=profile)
    ap.add_argument("--plot", metavar="PNG", default=None,
                    help="also draw the sweep as a PNG (needs matplotlib: '.[plot]')")
    return ap


def plot_sweep(path: str, title: str, xlabel: str, ylabel: str, series: dict,
               logx: bool = False, target: float | None = None) -> None:
    """Draw ``series`` ({name: [(x, y), ...]}) as lines into ``path`` (PNG)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=name)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label="target")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}")


def wants_simulation(argv=None) -> bool:
    """Whether the command line asks for ``--simulate`` (read before the parser is made,
    since the simulated form of a benchmark takes other options)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--simulate", action="store_true")
    return pre.parse_known_args(argv)[0].simulate


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``--sizes`` ("4x16,8x16": hosts x devices per host) as [(hosts, per_host)]."""
    out = []
    for part in text.split(","):
        h, d = part.lower().split("x")
        out.append((int(h), int(d)))
    return out
