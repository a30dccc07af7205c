"""The README's tour works as written: its script runs, writes a trace, and the plot command
draws it."""

import json
import re
import subprocess
import sys

from conftest import ROOT


def tour_script() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- tour -->\s*```python\n(.*?)```", text, re.S)
    assert match, "the README lost its tour"
    return match.group(1)


def test_the_readme_tour_runs_and_its_trace_plots(tmp_path):
    out = subprocess.run([sys.executable, "-c", tour_script()], cwd=tmp_path,
                         capture_output=True, text=True, timeout=110, check=True).stdout
    assert "traced to tour.json" in out
    trace = json.loads((tmp_path / "tour.json").read_text())
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == 16 * 8  # 16 steps on 8 devices
    res = subprocess.run([sys.executable, "-m", "pathways", "plot", "tour.json", "-o",
                          "tour.png"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, check=True)
    assert (tmp_path / "tour.png").exists() and res.stdout.count("busy") == 8
