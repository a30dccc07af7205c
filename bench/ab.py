"""The dispatch regression gate: the working tree against an older commit, in one sitting.

``python -m bench.ab BASE`` extracts commit ``BASE`` (``git archive``) into a directory of its
own and runs ``bench/ab_cell.py`` against each side in turn, A (BASE), B (the working tree),
A, B, ... for ``--rounds`` rounds: each round a fresh process per side, which starts its own
local cluster over loopback TCP and times the Fig. 5 cells (``--cells``, hosts x devices per
host; OpByOp, Chained and Stream, as ``bench/ab_cell.py`` says). Alternating in one sitting
cancels most of the machine's drift; what is left shows as the spread of the per-round ratios
B/A, printed for each cell as the median and its interval (the min and max of the rounds'
ratios, and a percentile bootstrap 90% interval of the median). ``--self`` compares the
working tree with itself (A vs A): the gate's own spread, the noise a real change must exceed.

A loss is a cell whose ratio interval lies below 1: explain it or fix it before resolving an
issue that touches the client, coordinator, host or Plaque hot paths (DEVELOPERS.md). Each
sitting is appended to ``bench/RESULTS.md`` with its command, machine and date unless
``--no-append``.

Run: ``python -m bench.ab BASE [--rounds 6] [--cells 1x4,2x1] [--budget 2] [--self]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from statistics import median

from bench import results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELL = os.path.join(ROOT, "bench", "ab_cell.py")


def extract(commit: str, into: str) -> str:
    """Commit ``commit``'s tree in ``into``; returns its full hash."""
    full = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.Popen(["git", "-C", ROOT, "archive", full], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", into], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    return full


def one_round(root: str, cells: str, budget: float) -> dict[str, float]:
    """The cells' computations/s with ``root``'s pathways (a fresh process)."""
    env = dict(os.environ, PYTHONPATH=root)
    env.pop("PLAQUE_KEYS", None)
    done = subprocess.run([sys.executable, CELL, cells, str(budget)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the round in {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def interval(ratios: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap 90% interval of the median of ``ratios``."""
    rng = random.Random(seed)
    medians = sorted(median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]


def report(a: list[dict], b: list[dict], label_a: str) -> list[dict]:
    """One row per cell: each side's median rate and the ratio B/A with its spread."""
    rows = []
    for key in a[0]:
        ratios = [rb[key] / ra[key] for ra, rb in zip(a, b)]
        low, high = interval(ratios)
        rows.append({"cell": key, f"A = {label_a} (/s)": f"{median(r[key] for r in a):,.0f}",
                     "B = working tree (/s)": f"{median(r[key] for r in b):,.0f}",
                     "B/A median": f"{median(ratios):.3f}",
                     "rounds' range": f"{min(ratios):.3f}-{max(ratios):.3f}",
                     "90% interval": f"{low:.3f}-{high:.3f}"})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", nargs="?", default="HEAD", help="the commit to compare against")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cells", default="1x4,2x1", help="hosts x devices per host, ...")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per mode and cell")
    ap.add_argument("--self", dest="self_check", action="store_true",
                    help="the working tree against itself: the gate's own spread")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="pathways-ab-")
    try:
        if args.self_check:
            base_root, label = ROOT, "working tree"
        else:
            base_root = os.path.join(scratch, "base")
            os.mkdir(base_root)
            label = extract(args.base, base_root)[:10]
        a, b = [], []
        for i in range(args.rounds):
            a.append(one_round(base_root, args.cells, args.budget))
            b.append(one_round(ROOT, args.cells, args.budget))
            print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                f"{k} {b[-1][k] / a[-1][k]:.3f}" for k in a[-1]), flush=True)
        rows = report(a, b, label)
        print("\n".join(results.table(rows)))
        if not args.no_append:
            results.append_results(
                "A/B dispatch gate" + (" (A vs A)" if args.self_check else f" vs {label}"),
                rows, f"{args.rounds} rounds, A and B alternated, {args.budget:g} s per mode"
                      " and cell; ratio = B/A computations/s; interval: bootstrap of the median")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
