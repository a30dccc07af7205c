"""Benchmarks of Plaque and Pathways against their baselines.

Run one from the repository root as a module, ``python -m bench.dispatch [--quick]`` (no
``sys.path`` edits: the root is on the path, and the benchmarks import each other as
``bench.*``). Each prints its figures and appends them, with the exact command, the machine
and the date, to ``bench/RESULTS.md`` (``--no-append`` or ``--quick``: print only).
"""
