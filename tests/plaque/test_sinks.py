"""Sinks write each shard's input to a file in a staging directory; the driver renames it to
the sink's target when the run succeeds (all of a run's files or none), refuses or replaces an
existing target, and removes a failed run's staging once no worker can write there."""

from __future__ import annotations

import collections
import json
import operator
import os
import time

import pytest

import plaque
from plaque import KEYED, Graph, JsonlSink, Operator, TextSink
from plaque.errors import GraphError, SinkError
from plaque.staging import StagedRun


class Words(Operator):
    """Emits each word of its part, combined per key into (word, count) pairs."""

    def on_start(self, ctx, t):
        if ctx.arg == "fail" and ctx.shard == 1:
            raise RuntimeError("source failed on purpose")
        for word in ctx.part:
            ctx.emit(1, key=word)


class Slow(Operator):
    """Passes pairs on after a pause, so a sink is still writing when another shard fails."""

    def on_batch(self, ctx, t, port, pairs):
        time.sleep(0.05)
        ctx.emit_batch(pairs)


def wc_graph(sink, shards=2, via=None) -> Graph:
    g = Graph("wc-sink")
    src = g.node("src", Words, shards=3)
    out = g.node("out", sink, shards=shards)
    if via is None:
        g.edge(src, out, KEYED, combine=operator.add)
    else:
        mid = g.node("mid", via, shards=shards)
        g.edge(src, mid, KEYED, combine=operator.add)
        g.edge(mid, out, plaque.ONE_TO_ONE)
    return g


PARTS = [["a", "b", "a"], ["c"] * 5, ["b", "d"]]
WANT = collections.Counter(w for p in PARTS for w in p)


def read_jsonl(directory) -> collections.Counter:
    got: collections.Counter = collections.Counter()
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as fh:
            for line in fh:
                word, n = json.loads(line)
                assert word not in got, "a word in two files"
                got[word] = n
    return got


def leftovers(parent) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


def wait_for_no_leftovers(parent, timeout=20.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while leftovers(parent) and time.monotonic() < deadline:
        time.sleep(0.05)
    return leftovers(parent)


@pytest.fixture(scope="module", params=["inproc", None])  # None: worker processes
def cluster(request):
    with plaque.local_cluster(workers=2, transport=request.param) as c:
        yield c


def test_each_run_publishes_one_directory_with_a_file_per_shard(cluster, tmp_path):
    installed = cluster.install(wc_graph(JsonlSink(tmp_path / "counts-{t}"), shards=3))
    results = [installed.run(parts={"src": PARTS}).result(30) for _ in range(2)]
    for result in results:
        target = tmp_path / f"counts-{result.timestamp}"
        assert sorted(os.listdir(target)) == [f"part-{s:05d}.jsonl" for s in range(3)]
        assert read_jsonl(target) == WANT
        reports = result.values("out")
        assert [r["shard"] for r in reports] == [0, 1, 2]
        assert sum(r["records"] for r in reports) == len(WANT)
        for r in reports:
            assert r["file"] == str(target / f"part-{r['shard']:05d}.jsonl")
            assert os.path.getsize(r["file"]) == r["bytes"]
    assert leftovers(tmp_path) == []


def test_a_shard_with_no_input_writes_an_empty_file(cluster, tmp_path):
    installed = cluster.install(wc_graph(TextSink(tmp_path / "out"), shards=4))
    result = installed.run(parts={"src": [["x"], [], []]}).result(30)
    files = sorted(os.listdir(tmp_path / "out"))
    assert files == [f"part-{s:05d}.txt" for s in range(4)]
    lines = [line for f in files for line in open(tmp_path / "out" / f)]
    assert lines == ["('x', 1)\n"]
    assert sorted(r["records"] for r in result.values("out")) == [0, 0, 0, 1]


def test_an_existing_target_is_refused_and_the_output_kept_aside(cluster, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious").write_text("keep me")
    installed = cluster.install(wc_graph(JsonlSink(tmp_path / "out")))
    with pytest.raises(SinkError, match=r"out already exists; give overwrite=True or a path"
                                        r" with \{t\}.*the run's output is kept in (\S+)") as e:
        installed.run(parts={"src": PARTS}).result(30)
    assert os.listdir(tmp_path / "out") == ["precious"]
    kept = str(e.value).rsplit(" ", 1)[1]
    assert read_jsonl(kept) == WANT


def test_overwrite_replaces_the_old_directory_whole(cluster, tmp_path):
    installed = cluster.install(wc_graph(JsonlSink(tmp_path / "out", overwrite=True)))
    installed.run(parts={"src": [["old"], [], []]}).result(30)
    (tmp_path / "out" / "stray").write_text("from before")
    installed.run(parts={"src": PARTS}).result(30)
    assert read_jsonl(tmp_path / "out") == WANT  # no "old", no "stray"
    assert leftovers(tmp_path) == []


def test_a_failed_run_publishes_nothing_and_its_staging_goes(cluster, tmp_path):
    installed = cluster.install(wc_graph(JsonlSink(tmp_path / "out-{t}"), via=Slow))
    with pytest.raises(plaque.OperatorError, match="source failed on purpose"):
        installed.run("fail", parts={"src": PARTS}).result(30)
    assert wait_for_no_leftovers(tmp_path) == []
    assert not any(n.startswith("out-") for n in os.listdir(tmp_path))
    ok = installed.run(parts={"src": PARTS}).result(30)  # the graph goes on
    assert read_jsonl(tmp_path / f"out-{ok.timestamp}") == WANT


class Hold(Operator):
    """Keeps its run open: holds its capability and never lets it go."""

    def on_start(self, ctx, t):
        ctx.hold()


def test_a_lost_worker_fails_the_run_in_flight_and_its_staging_goes(tmp_path):
    g = Graph("lost")
    src = g.node("src", Hold, shards=1, placement=(0,))
    out = g.node("out", JsonlSink(tmp_path / "out"), shards=2, placement=(0, 1))
    g.edge(src, out, KEYED)
    with plaque.local_cluster(workers=2, transport="inproc", heartbeat_timeout=0.5) as c:
        fut = c.install(g).run()
        assert len(leftovers(tmp_path)) == 1
        c.kill_inproc_worker(1)
        with pytest.raises(plaque.WorkerLost):
            fut.result(30)
        assert wait_for_no_leftovers(tmp_path) == []
        assert not (tmp_path / "out").exists()


def test_staging_is_removed_when_the_cluster_closes_mid_run(tmp_path):
    g = Graph("held")
    src = g.node("src", Hold, shards=1)
    out = g.node("out", TextSink(tmp_path / "out"), shards=1)
    g.edge(src, out, plaque.ONE_TO_ONE)
    with plaque.local_cluster(workers=1, transport="inproc") as c:
        fut = c.install(g).run()
        deadline = time.monotonic() + 10
        while not leftovers(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(leftovers(tmp_path)) == 1
    with pytest.raises(plaque.ClusterClosed):
        fut.result(5)
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_commit_refuses_missing_or_short_files_and_removes_the_staging(tmp_path):
    g = Graph("unit")
    out = g.node("out", JsonlSink(tmp_path / "out"), shards=2)
    result = plaque.RunResult(0, {"out": {0: [{"shard": 0, "file": "part-00000.jsonl",
                                                "records": 1, "bytes": 3}]}})
    staged = StagedRun([out])
    with pytest.raises(SinkError, match=r"1 of its 2 shards reported their files"):
        staged.commit(result)
    assert leftovers(tmp_path) == []
    staged = StagedRun([out])
    staging = staged.staged[0][2]
    result.outputs["out"][1] = [{"shard": 1, "file": "part-00001.jsonl", "records": 0,
                                 "bytes": 0}]
    open(os.path.join(staging, "part-00000.jsonl"), "w").write("[]\n")
    with pytest.raises(SinkError, match=r"part-00001.jsonl is not visible here; sinks need a"
                                        r" filesystem the driver and the workers share"):
        staged.commit(result)
    staged = StagedRun([out])
    staging = staged.staged[0][2]
    open(os.path.join(staging, "part-00000.jsonl"), "w").write("[")
    open(os.path.join(staging, "part-00001.jsonl"), "w").write("")
    with pytest.raises(SinkError, match=r"part-00000.jsonl has 1 bytes, its shard wrote 3"):
        staged.commit(result)
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_bad_sink_paths_and_parts_for_a_sink_are_refused(cluster, tmp_path):
    for bad in [tmp_path / "{run}", tmp_path / "{t}" / "x", tmp_path / "a{"]:
        with pytest.raises(GraphError, match="sink path"):
            JsonlSink(bad)
    installed = cluster.install(wc_graph(JsonlSink(tmp_path / "out")))
    with pytest.raises(GraphError, match=r"parts for 'out': it is a sink"):
        installed.run(parts={"src": PARTS, "out": ["x", "y"]}).result(30)
    assert leftovers(tmp_path) == []


class NumpyRecords(Operator):
    """Emits records holding numpy values, as a numpy computation's would (or, asked to,
    one JSON has no form for)."""

    def on_start(self, ctx, t):
        import numpy as np

        ctx.emit({"n": np.int64(3), "x": np.float32(0.5), "ok": np.bool_(True),
                  "v": np.arange(3), "bad": {1, 2} if ctx.arg == "set" else None})


def test_jsonl_writes_numpy_values_as_json_and_names_what_it_cannot(cluster, tmp_path):
    g = Graph("numpy-jsonl")
    src = g.node("src", NumpyRecords, shards=1)
    g.edge(src, g.node("out", JsonlSink(tmp_path / "out-{t}"), shards=1), plaque.ONE_TO_ONE)
    installed = cluster.install(g)
    result = installed.run().result(30)
    with open(tmp_path / f"out-{result.timestamp}" / "part-00000.jsonl") as fh:
        assert [json.loads(line) for line in fh] == \
            [{"n": 3, "x": 0.5, "ok": True, "v": [0, 1, 2], "bad": None}]
    with pytest.raises(plaque.OperatorError, match=r"JsonlSink cannot write a set \(\{1, 2\}"):
        installed.run("set").result(30)


def two_sinks_graph(first, second) -> Graph:
    g = Graph("two-sinks")
    src = g.node("src", Words, shards=3)
    g.edge(src, g.node("first", first, shards=2), KEYED, combine=operator.add)
    g.edge(src, g.node("second", second, shards=1), KEYED, combine=operator.add)
    return g


def test_a_run_publishes_all_its_sinks_or_none(cluster, tmp_path):
    """Issue 45 item 4: the first sink was published before the second found its target."""
    (tmp_path / "second").mkdir()
    (tmp_path / "second" / "precious").write_text("keep me")
    installed = cluster.install(two_sinks_graph(JsonlSink(tmp_path / "first"),
                                                JsonlSink(tmp_path / "second")))
    with pytest.raises(SinkError, match=r"second already exists; .*the run's output is kept"
                                        r" in (\S+), (\S+)$") as e:
        installed.run(parts={"src": PARTS}).result(30)
    assert not (tmp_path / "first").exists()
    assert os.listdir(tmp_path / "second") == ["precious"]
    kept = str(e.value).split(" kept in ", 1)[1].split(", ")
    assert [read_jsonl(k) for k in kept] == [WANT, WANT]
    assert all(os.path.basename(k).startswith((".first.kept-", ".second.kept-")) for k in kept)


def test_a_failed_rename_undoes_the_sinks_published_before_it(tmp_path, monkeypatch):
    g = two_sinks_graph(JsonlSink(tmp_path / "first", overwrite=True),
                        JsonlSink(tmp_path / "second", overwrite=True))
    first, second = g.nodes[1], g.nodes[2]
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "precious").write_text(f"old {name}")
    staged = StagedRun([first, second])
    outputs: dict = {}  # what the run's shards would report: a 9-byte file each
    for node, _, staging in staged.staged:
        for s in range(node.shards):
            with open(os.path.join(staging, f"part-{s:05d}.jsonl"), "w") as fh:
                fh.write('["x", 1]\n')
            outputs.setdefault(node.name, {})[s] = [{"shard": s, "file": fh.name.rsplit("/")[-1],
                                                     "records": 1, "bytes": 9}]
    real_rename = os.rename

    def rename(src, dst):  # the second sink's output cannot reach its target
        if str(dst) == str(tmp_path / "second") and ".staging-" in str(src):
            raise OSError(5, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(SinkError, match=r"sink 'second': cannot rename its output to .*"
                                        r"Input/output error.*kept in"):
        staged.commit(plaque.RunResult(0, outputs))
    monkeypatch.undo()
    for name in ("first", "second"):  # what the sinks were to replace is back, whole
        assert os.listdir(tmp_path / name) == ["precious"]
        assert (tmp_path / name / "precious").read_text() == f"old {name}"
    assert [n.split("-")[0] for n in leftovers(tmp_path)] == [".first.kept", ".second.kept"]


def test_two_sinks_with_one_target_are_refused_before_the_run(tmp_path):
    g = two_sinks_graph(JsonlSink(tmp_path / "out"), JsonlSink(tmp_path / "out"))
    with pytest.raises(SinkError, match=r"sinks 'first' and 'second' both publish to"):
        StagedRun([g.nodes[1], g.nodes[2]])
    assert leftovers(tmp_path) == []
