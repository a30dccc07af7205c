"""Every benchmark still runs (quick sizes, nothing appended to bench/RESULTS.md)."""

import re
import subprocess
import sys

import pytest
from conftest import ROOT

BENCHES = ["plaque_bench", "dispatch", "pipeline", "islands", "gpipe", "moe", "multitenancy",
           "scale", "jax_bodies", "checkpoint", "jax_steps", "dataflow"]


PLOTS = {"dispatch", "multitenancy"}  # sweeps that can draw themselves

# smaller than --quick where a bench's figures need not mean anything here: every part of it
# (each side, mode and cluster shape, its own checks of results) still runs, on fewer steps,
# rows or seconds per cell. jax_steps: 55 -> 31 s (most of it is compiling each side's first
# step), dataflow 14 -> 2 s, dispatch 15 -> 9 s, scale 12 -> 5 s (two sizes still, so the
# growth of its controller's CPU is still worked out), islands 9 -> 6 s, multitenancy 10 ->
# 7.5 s.
SMALLER = {
    "jax_steps": ["--chain", "2", "--runs", "1", "--steps", "1", "--warmup", "1"],
    "dataflow": ["--words", "20000", "--events", "50000", "--records", "50"],
    "dispatch": ["--budget", "0.05"],
    "scale": ["--sizes", "2x4,4x4", "--budget", "0.1", "--idle", "0.2"],
    "islands": ["--steps", "3"],
    "multitenancy": ["--programs", "10"],
}


@pytest.mark.parametrize("script", BENCHES)
def test_benchmark_runs_quickly(script, tmp_path):
    results = ROOT / "bench" / "RESULTS.md"
    before = results.read_bytes() if results.exists() else b""
    png = tmp_path / "sweep.png"
    extra = ["--plot", str(png)] if script in PLOTS else []
    out = subprocess.run([sys.executable, "-m", f"bench.{script}", "--quick",
                          *SMALLER.get(script, []), *extra],
                         capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "nothing appended" in out.stdout
    assert (results.read_bytes() if results.exists() else b"") == before
    if extra:
        assert png.read_bytes()[:4] == b"\x89PNG"


# each simulated bench and a figure of its table that must be printed (a number, any value)
SIMULATED = {
    "scale": [r"Fig\. 5 comps/s \(virtual\): [\d,.]+ ", r"pipeline comps/s \(virtual\): [\d,.]+ ",
              r"Fig\. 5 controller CPU ms/comp \(net of idle\): [\d.]+ \(", r"Status: ok"],
    "dispatch": [r"Multi-controller /s: [\d,.]+ ", r"OpByOp /s: [\d,.]+ ", r"Chained /s: [\d,.]+ ",
                 r"Fused /s: [\d,.]+ "],
    "pipeline": [r"Parallel runs/s: [\d,.]+ ", r"Sequential runs/s: [\d,.]+ ",
                 r"Parallel/Sequential: [\d.]+ ",
                 r"Hosts CPU ms per comp par, seq: [\d.]+, [\d.]+ "],
    "multitenancy": [r"Comp/s \(best\): [\d,]+ ", r"Utilization: [\d.]+% ",
                     r"CPU ms/program: coord, host, clients: [\d.]+, [\d.]+, [\d.]+ "],
    "moe": [r"Tokens/s \(best, virtual\): [\d,]+ ", r"Wire / routed: [\d.]+ ",
            r"Host CPU ms/run: \d+ ", r"\| 1 \| \d+ \| [\d.]+ \| 1\.00x \|"],
}


@pytest.mark.parametrize("script", sorted(SIMULATED))
def test_simulated_benchmark_runs_quickly(script):
    """``--simulate --quick``: tiny simulated clusters, virtual time; figures printed, none
    checked (they are the simulation's, not this test's business)."""
    results = ROOT / "bench" / "RESULTS.md"
    before = results.read_bytes() if results.exists() else b""
    out = subprocess.run([sys.executable, "-m", f"bench.{script}", "--simulate", "--quick",
                          "--no-append"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "simulated" in out.stdout
    for figure in SIMULATED[script]:
        assert re.search(figure, out.stdout), (figure, out.stdout[-2000:])
    assert "nothing appended" in out.stdout
    assert (results.read_bytes() if results.exists() else b"") == before
