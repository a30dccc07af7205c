"""Batch operators, stable keys and per-run state (``on_batch``, ``emit_batch``, ``key=``,
``ctx.state``), on real clusters; the progress properties with batches are in
``test_progress_sim.py``.

What is tested:

- the README's Plaque snippet runs as written (batches, keys, state, two overlapping runs);
- a keyed word count is exact with two hand-started workers of different ``PYTHONHASHSEED``,
  and the coordinator warns that they hash text differently;
- lists and numpy rows sent to one shard in one turn all arrive; a numpy batch arrives as one
  array (rows out of band), and per-tuple operators get its rows one by one;
- bad batches and keys fail the run with an error naming the problem;
- ``ctx.state`` is per run, dropped once the shard completed it (on never-notified nodes,
  once the run retired); nodes without ``on_complete`` are not notified by default;
- stable keys: the array path equals the scalar one, and another process (another
  ``PYTHONHASHSEED``) computes the same hashes.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

import plaque
from plaque import KEYED, ONE_TO_ONE, Graph, Operator

sys.path.insert(0, str(ROOT / "examples"))
import word_count  # noqa: E402  (an example, shipped to workers by value)


@pytest.fixture(scope="module")
def inproc():
    with plaque.local_cluster(workers=2, transport="inproc") as cluster:
        yield cluster


def test_the_readme_plaque_snippet_runs():
    text = (ROOT / "README.md").read_text()
    snippet = re.search(r"<!-- plaque -->\s*```python\n(.*?)```", text, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                         timeout=90, check=True).stdout
    assert out.splitlines()[0] == "54 6534"


def test_a_keyed_word_count_is_exact_across_different_hash_seeds(caplog, tmp_path):
    cluster = plaque.Cluster("tcp://127.0.0.1", heartbeat_timeout=3.0)
    try:
        for seed in ("1", "2"):  # str hashes differ between these two workers
            env = dict(os.environ, PYTHONHASHSEED=seed, PLAQUE_DIE_WITH_PARENT="1")
            cluster.processes.append(subprocess.Popen(
                [sys.executable, "-m", "plaque", "worker", "--join",
                 cluster.address.split("|")[0], "--insecure"], env=env))
        with caplog.at_level(logging.WARNING, logger="plaque.coordinator"):
            cluster.wait_for_workers(2, timeout=30)
        assert "hashes strings differently" in caplog.text
        paths = word_count.write_corpus(str(tmp_path), 5000)
        out = str(tmp_path / "counts-{t}")
        installed = cluster.install(word_count.graph(out, splitters=2, counters=5))
        futures = [installed.run(parts={"split": plaque.text_parts(paths, 2)})
                   for _ in range(3)]
        want = word_count.expected(paths)
        for f in futures:
            t = f.result(60).timestamp
            assert word_count.published(str(tmp_path / f"counts-{t}")) == want
    finally:
        cluster.close()


class MixedSource(Operator):
    """Per-tuple emits, a list and numpy rows, all to the same shards in one turn."""

    def on_complete(self, ctx, t):
        ctx.emit(-1)
        ctx.emit_batch([1, 2, 3])
        ctx.emit_batch(np.arange(10, 15))
        ctx.emit_batch(np.arange(20, 26), shards=np.arange(6) % 2, port=1)
        ctx.emit_batch(["a", "b", "c"], keys=["a", "b", "c"], port=1)
        ctx.emit("z", key="z", port=1)


class Record(Operator):
    """Outputs each batch it gets: (port, type name, values)."""

    def on_batch(self, ctx, t, port, values):
        ctx.output((port, type(values).__name__, [v.item() if hasattr(v, "item") else v
                                                  for v in values]))


class RecordEach(Operator):
    def on_input(self, ctx, t, port, value):
        ctx.output((port, type(value).__name__, value))


@pytest.mark.parametrize("sink", [Record, RecordEach])
def test_lists_and_rows_to_one_shard_in_one_turn_all_arrive(inproc, sink):
    g = Graph(f"mixed-{sink.__name__}")
    src = g.node("src", MixedSource, 2)
    same = g.node("same", sink, 2)
    keyed = g.node("keyed", sink, 2)
    g.edge(src, same, ONE_TO_ONE)
    g.edge(src, keyed, KEYED, src_port=1)
    res = inproc.install(g).run().result(30)
    got = [v for outs in res.outputs["same"].values() for v in outs]
    flat = sorted(x for _, _, vals in got for x in (vals if sink is Record else [vals]))
    assert flat == sorted([-1, 1, 2, 3, *range(10, 15)] * 2)
    if sink is Record:  # the numpy batch arrived whole, as an array
        assert ("ndarray" in {kind for _, kind, _ in got}) and ("list" in {k for _, k, _ in got})
    else:
        assert {kind for _, kind, _ in got} == {"int", "int64"}  # rows one by one
    keyed_out = {s: outs for s, outs in res.outputs["keyed"].items()}
    values = {s: sorted(map(str, (x for _, _, v in outs
                                  for x in (v if sink is Record else [v]))))
              for s, outs in keyed_out.items()}
    for word in "abcz":  # each key on its stable shard, once per source shard
        assert values[plaque.stable_shard(word, 2)].count(word) == 2
    rows = sorted(int(x) for s in values.values() for x in s if x.isdigit())
    assert rows == sorted(list(range(20, 26)) * 2)


class Bad(Operator):
    def __init__(self, emit):
        self.emit = emit

    def on_complete(self, ctx, t):
        self.emit(ctx)


@pytest.mark.parametrize("emit, message", [
    (lambda ctx: ctx.emit_batch([1, 2, 3], shards=[0, 1]), "3 values but 2 shards"),
    (lambda ctx: ctx.emit_batch([1, 2], shards=[0, 5]), r"shards= of ints in \[0, 2\)"),
    (lambda ctx: ctx.emit_batch([1, 2]), "needs key= .or shard=.; a batch also takes keys="),
    (lambda ctx: ctx.emit(1, key=object()), "type object has no stable hash"),
    (lambda ctx: ctx.emit_batch(np.float64(1.0), shard=0), "got a 0-d array"),
    (lambda ctx: ctx.emit(1, shard=True), r"shard= in \[0, 2\), got shard=True"),
])
def test_bad_batches_and_keys_fail_the_run_naming_the_problem(inproc, emit, message):
    g = Graph("bad")
    g.edge(g.node("src", lambda: Bad(emit), 1), g.node("dst", Record, 2), KEYED)
    with pytest.raises(plaque.OperatorError, match=message):
        inproc.install(g).run().result(30)


class StateSource(Operator):
    def on_complete(self, ctx, t):
        ctx.emit_batch(list(range(ctx.arg)))


class StateSum(Operator):
    def on_batch(self, ctx, t, port, values):
        ctx.state["sum"] = ctx.state.get("sum", 0) + sum(values)
        ctx.state.setdefault("batches", 0)
        ctx.state["batches"] += 1

    def on_complete(self, ctx, t):
        ctx.output((ctx.state.get("sum", 0), len(ctx.run_states)))


def test_state_is_per_run_and_dropped_once_the_run_completed(inproc):
    g = Graph("state")
    g.edge(g.node("src", StateSource, 2), g.node("sum", StateSum, 2), ONE_TO_ONE)
    installed = inproc.install(g)
    futures = [installed.run(n) for n in (10, 20, 30, 0)]  # overlapping runs
    for n, f in zip((10, 20, 30, 0), futures):
        for total, live in f.result(30).values("sum"):
            assert total == n * (n - 1) // 2
            assert live <= 4  # at most the runs in flight; never grows with runs
    assert installed.run(5).result(30).values("sum") == [(10, 1), (10, 1)]


class ListSource(Operator):
    def on_complete(self, ctx, t):
        ctx.emit_batch(list(ctx.arg))


class Dedup(Operator):
    """No on_complete, so never notified: per-run state lives until the run retires."""

    def on_batch(self, ctx, t, port, values):
        seen = ctx.state.setdefault("seen", set())
        fresh = list(dict.fromkeys(v for v in values if v not in seen))
        seen.update(fresh)
        ctx.emit_batch(fresh)
        ctx.output(len(ctx.run_states))


class Sorted(Operator):
    def on_batch(self, ctx, t, port, values):
        ctx.state.setdefault("got", []).extend(values)

    def on_complete(self, ctx, t):
        ctx.output(sorted(ctx.state.get("got", [])))


def test_state_of_a_never_notified_node_lives_until_the_run_retires(inproc, monkeypatch):
    monkeypatch.setattr(plaque.local_graph.LocalGraph, "RETIRED_KEPT", 3)
    g = Graph("dedup")
    src = g.node("src", ListSource, 1)
    dedup = g.node("dedup", Dedup, 1)
    out = g.node("out", Sorted, 1)
    assert [n.notify for n in g.nodes] == [True, False, True]  # asked for by on_complete
    g.edge(src, dedup, ONE_TO_ONE)
    g.edge(dedup, out, ONE_TO_ONE)
    installed = inproc.install(g)
    for run in range(8):
        res = installed.run([run, 1, 1, 2, run, 2]).result(30)
        assert res.values("out") == [sorted({run, 1, 2})]
        (live,) = res.values("dedup")
        assert live <= 3 + 1  # the retired window and this run, whatever the number of runs


keys = st.one_of(st.integers(-2**63, 2**64 - 1), st.booleans(), st.text(max_size=8),
                 st.binary(max_size=8), st.floats(allow_nan=False), st.none(),
                 st.tuples(st.integers(), st.text(max_size=3)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=30), st.integers(1, 17))
def test_the_array_path_hashes_as_the_scalar_one(ints, n):
    want = [plaque.stable_shard(k, n) for k in ints]
    assert plaque.stable_shards(np.array(ints, dtype=np.int64), n).tolist() == want
    assert plaque.stable_shards(ints, n).tolist() == want


@settings(max_examples=300, deadline=None)
@given(st.lists(keys, max_size=12), st.lists(st.integers(0, 40), max_size=40),
       st.integers(1, 17))
def test_a_batch_with_repeated_keys_hashes_as_each_key_alone(distinct, picks, n):
    """A batch hashes each distinct key once; every key still gets stable_shard's shard,
    equal keys of different types (1, 1.0, True; str and numpy str) included."""
    batch = [distinct[i % len(distinct)] for i in picks] if distinct else []
    batch += [1, 1.0, True, "a", np.str_("a"), np.float64(2.5), 2.5] * (len(batch) % 2)
    want = [plaque.stable_shard(k, n) for k in batch]
    assert plaque.stable_shards(batch, n).tolist() == want
    assert plaque.stable_shards(np.array(batch + [None], dtype=object), n).tolist() == \
        want + [plaque.stable_shard(None, n)]


def test_a_batch_with_a_key_of_no_stable_hash_is_refused_by_name():
    for batch in (["a", "a", [1]], ["a", "a", object()]):
        with pytest.raises(TypeError, match="has no stable hash"):
            plaque.stable_shards(batch, 4)


@settings(max_examples=200, deadline=None)
@given(st.integers(-2**80, 2**80))
def test_an_int_key_hashes_as_defined(k):
    """The definition (Fibonacci hashing: the top 32 of the low 64 bits of k * 2^64/phi),
    spelled with % here: every worker, of any version, must agree on it."""
    assert plaque.stable_hash(k) == (k % 2**64) * 0x9E3779B97F4A7C15 % 2**64 // 2**32


@settings(max_examples=100, deadline=None)
@given(keys)
def test_equal_keys_hash_equally(key):
    if isinstance(key, float) and key.is_integer():
        assert plaque.stable_hash(key) == plaque.stable_hash(int(key))
    if isinstance(key, bool):
        assert plaque.stable_hash(key) == plaque.stable_hash(int(key))
    assert 0 <= plaque.stable_hash(key) < 2**32


def test_another_process_with_another_hash_seed_computes_the_same_hashes():
    sample = ["word", "", "naïve", b"bytes", 7, -3, 2**70, 1.5, ("a", 1), None]
    here = [plaque.stable_hash(k) for k in sample]
    code = ("import plaque; print([plaque.stable_hash(k) for k in"
            " ['word', '', 'naïve', b'bytes', 7, -3, 2**70, 1.5, ('a', 1), None]])")
    for seed in ("0", "12345"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONHASHSEED=seed), timeout=60,
                             check=True).stdout
        assert out.strip() == str(here)
