"""examples/moe_routing.py: the MoE model trains on a real cluster, routed sparsely, and its
losses equal the same training run by the in-process reference interpreter."""

import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, load_example

EXAMPLE = ROOT / "examples" / "moe_routing.py"


ex = load_example("moe_routing")


@pytest.fixture(scope="module")
def trained(pw_cluster):
    import pathways as pw

    args = ex.parse(["--steps", "40", "--every", "10", "--top-k", "2", "--capacity", "1.0"])
    lines = []
    with pw.connect(pw_cluster.address) as client:
        losses, per_layer, drops, (model, _) = ex.train(client, args, log=lines.append)
    return args, losses, per_layer, drops, model, lines


def test_the_loss_falls(trained):
    _, losses, *_ = trained
    assert losses.shape == (40,)
    assert losses[-10:].mean() < 0.85 * losses[:10].mean()


def test_losses_equal_the_in_process_reference(trained):
    args, losses, _, _, model, _ = trained
    np.testing.assert_allclose(losses[:6], ex.reference_losses(model, args, 6), rtol=1e-5)


def test_tokens_per_expert_and_drops_are_reported_and_consistent(trained):
    args, _, per_layer, drops, _, lines = trained
    for load, drop in zip(per_layer, drops):
        assert load.sum() == 10 * args.batch * args.top_k  # every slot is kept or dropped
        assert 0.0 < drop < 0.5  # capacity factor 1.0 drops some slots, not most
    assert any(re.search(r"tokens/expert \(layer 0\) \[[\d, ]+\]\s+dropped \d", line)
               for line in lines)


def test_the_script_runs_experts_on_another_island_and_checks_itself():
    out = subprocess.run([sys.executable, str(EXAMPLE), "--islands", "2", "--steps", "12",
                          "--every", "4", "--check", "4", "--capacity", "none"],
                         capture_output=True, text=True, timeout=110, check=True).stdout
    assert "island(s) [1]" in out
    assert "capacity factor none (dropless)" in out
    assert re.search(r"layer 0: .* dropped 0\.0%", out)
    assert "the first 4 losses equal the in-process reference" in out


def test_experts_written_in_jax_train_as_the_numpy_experts():
    """--jax: experts in JAX, backward by jax.vjp; the losses equal the numpy experts'."""
    pytest.importorskip("jax")
    out = subprocess.run([sys.executable, str(EXAMPLE), "--jax", "--steps", "8", "--every",
                          "4", "--check", "4"], capture_output=True, text=True, timeout=180,
                         check=True).stdout
    assert "the first 4 losses equal the in-process reference" in out, out
