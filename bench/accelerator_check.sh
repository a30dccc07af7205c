#!/usr/bin/env bash
# Run pathways on whatever accelerators this machine's JAX has (GPUs or TPUs; else XLA CPU
# devices): hosts whose devices are their own JAX devices (pathways host --backend jax).
#
#   bash bench/accelerator_check.sh            # from the repository, after `make` (.venv)
#
# 1. Correctness: the backend's own tests, then every JAX-body test on a cluster of two such
#    hosts x 4 devices (PATHWAYS_TEST_BACKEND=jax), each checked against plain JAX.
# 2. Speed: bench.jax_steps on the same backend (a JAX user's training step, pw against
#    jax.jit(jax.shard_map) in the same run), printed, not appended to bench/RESULTS.md.
#
# Each host of a local cluster takes every device its JAX sees: on CPU it makes as many as
# it is told; on a GPU machine run one host per machine (or give each host process its own
# devices, e.g. CUDA_VISIBLE_DEVICES) -- two hosts here would share the same GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
"$py" -c "import jax; print('JAX devices here:', jax.devices())"
"$py" -m pytest -q -p no:cacheprovider tests/pathways/host/test_jax_backend.py
PATHWAYS_TEST_BACKEND=jax "$py" -m pytest -q -p no:cacheprovider \
    tests/pathways/program/test_jax_bodies.py tests/pathways/jax
"$py" -m bench.jax_steps --backend jax --no-append "$@"
