"""Data-parallel training across two islands (examples/two_islands.py): on one island or two,
the distributed training equals the same training in numpy, bit for bit between layouts."""

import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, load_example

EXAMPLE = ROOT / "examples" / "two_islands.py"


ex = load_example("two_islands")
CFG = ex.Config(steps=12)


@pytest.fixture(scope="module")
def trained():
    """The training on each layout, and in numpy."""
    return {"numpy": ex.numpy_train(CFG), 1: ex.run(1, CFG), 2: ex.run(2, CFG)}


@pytest.mark.parametrize("islands", [1, 2])
def test_training_equals_numpy(trained, islands):
    got, want = trained[islands], trained["numpy"]
    np.testing.assert_array_equal(got.theta0, got.theta1)  # the replicas never drift apart
    np.testing.assert_allclose(got.theta0, want.theta0, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-9, atol=1e-12)
    assert got.losses.shape == (CFG.steps,)


def test_the_loss_falls(trained):
    losses = trained[2].losses
    assert losses[-3:].mean() < 0.25 * losses[:3].mean()


def test_both_layouts_give_the_same_numbers(trained):
    one, two = trained[1], trained[2]
    np.testing.assert_array_equal(one.theta0, two.theta0)
    np.testing.assert_array_equal(one.losses, two.losses)


def test_the_script_runs_on_two_islands():
    out = subprocess.run([sys.executable, str(EXAMPLE), "--islands", "2", "--steps", "4"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"slice 0: devices \[[\d, ]+\], island\(s\) \[0\], host\(s\) \[\d\]", out)
    assert re.search(r"slice 1: devices \[[\d, ]+\], island\(s\) \[1\], host\(s\) \[\d\]", out)
    assert "equal to the numpy training" in out
