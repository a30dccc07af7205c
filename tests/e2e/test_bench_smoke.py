"""Every benchmark still runs (quick sizes, nothing appended to bench/RESULTS.md)."""

import subprocess
import sys

import pytest
from conftest import ROOT

BENCHES = ["plaque_bench", "dispatch", "pipeline", "islands", "gpipe", "moe", "multitenancy",
           "scale", "jax_bodies", "checkpoint"]


PLOTS = {"dispatch", "multitenancy"}  # sweeps that can draw themselves


@pytest.mark.parametrize("script", BENCHES)
def test_benchmark_runs_quickly(script, tmp_path):
    results = ROOT / "bench" / "RESULTS.md"
    before = results.read_bytes() if results.exists() else b""
    png = tmp_path / "sweep.png"
    extra = ["--plot", str(png)] if script in PLOTS else []
    out = subprocess.run([sys.executable, "-m", f"bench.{script}", "--quick", *extra],
                         capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "nothing appended" in out.stdout
    assert (results.read_bytes() if results.exists() else b"") == before
    if extra:
        assert png.read_bytes()[:4] == b"\x89PNG"
