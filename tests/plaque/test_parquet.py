"""Parquet in and out: ``parquet_parts`` cuts files into parts of whole row groups (reading
only footers), ``read_parquet`` reads a part where its shard runs, and ``ParquetSink`` writes
a shard's records as row groups of one file per shard."""

from __future__ import annotations

import collections
import operator
import os
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plaque
from plaque import KEYED, ONE_TO_ONE, Graph, Operator, ParquetSink

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write(path, users, amounts, row_group_size):
    table = pa.table({"user": users, "amount": amounts})
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 9)), min_size=1,
                      max_size=4), n=st.integers(1, 6))
def test_every_row_group_is_in_exactly_one_part_in_order(tmp_path_factory, sizes, n):
    d = tmp_path_factory.mktemp("pq")
    paths = [write(d / f"f{i}.parquet", list(range(rows)), [1] * rows, group)
             for i, (rows, group) in enumerate(sizes)]
    parts = plaque.parquet_parts(paths, n)
    assert len(parts) == n
    flat = [pair for part in parts for pair in part]
    want = [(p, g) for p in paths for g in range(pq.ParquetFile(p).metadata.num_row_groups)]
    assert flat == want
    rows = [sum(t.num_rows for t in plaque.read_parquet(part)) for part in parts]
    assert sum(rows) == sum(r for r, _ in sizes)
    largest_group = max((pq.ParquetFile(p).metadata.row_group(g).num_rows for p, g in want),
                        default=0)
    assert max(rows) <= sum(rows) / n + largest_group  # about equal: off by a group at most


def test_read_parquet_takes_columns_and_bad_input_is_named(tmp_path):
    path = write(tmp_path / "a.parquet", [1, 2, 3], [10, 20, 30], 2)
    (part,) = plaque.parquet_parts(path, 1)
    tables = list(plaque.read_parquet(part, columns=["amount"]))
    assert [t.column_names for t in tables] == [["amount"], ["amount"]]
    assert [v for t in tables for v in t.column("amount").to_pylist()] == [10, 20, 30]
    with pytest.raises(FileNotFoundError, match="no file at"):
        plaque.parquet_parts([tmp_path / "nope.parquet"], 2)
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        plaque.parquet_parts(path, 0)


class Events(Operator):
    """Per tuple: each row's amount under its user's key."""

    def on_start(self, ctx, t):
        for table in plaque.read_parquet(ctx.part):
            for row in table.to_pylist():
                ctx.emit(row["amount"], key=row["user"])


class Totals(Operator):
    def on_batch(self, ctx, t, port, pairs):
        totals = ctx.state.setdefault("totals", collections.Counter())
        for user, amount in pairs:
            totals[user] += amount

    def on_complete(self, ctx, t):
        ctx.emit_batch([{"user": u, "total": n} for u, n in
                        sorted(ctx.state.get("totals", {}).items())])


@pytest.mark.parametrize("transport", ["inproc", None])
def test_keyed_aggregation_from_parquet_to_parquet_matches_python(tmp_path, transport):
    paths = [write(tmp_path / f"e{i}.parquet", [u % 7 for u in range(i, i + 300)],
                   list(range(300)), 40) for i in range(3)]
    g = Graph("pq")
    src = g.node("events", Events, shards=3)
    tot = g.node("totals", Totals, shards=2)
    g.edge(src, tot, KEYED, combine=operator.add)
    g.edge(tot, g.node("out", ParquetSink(tmp_path / "totals"), shards=2), ONE_TO_ONE)
    with plaque.local_cluster(workers=2, transport=transport) as c:
        result = c.install(g).run(parts={"events": plaque.parquet_parts(paths, 3)}).result(60)
    want: collections.Counter = collections.Counter()
    for p in paths:
        for row in pq.read_table(p).to_pylist():
            want[row["user"]] += row["amount"]
    files = sorted(os.listdir(tmp_path / "totals"))
    assert files == ["part-00000.parquet", "part-00001.parquet"]
    got = {}
    for f in files:
        for row in pq.read_table(tmp_path / "totals" / f).to_pylist():
            assert row["user"] not in got
            got[row["user"]] = row["total"]
    assert got == dict(want)
    assert sum(r["records"] for r in result.values("out")) == len(want)


def test_a_parquet_sink_shard_with_no_records_writes_an_empty_file(tmp_path):
    class One(Operator):
        def on_start(self, ctx, t):
            if ctx.shard == 0:
                ctx.emit({"x": 1})

    g = Graph("empty")
    src = g.node("src", One, shards=2)
    g.edge(src, g.node("out", ParquetSink(tmp_path / "out"), shards=2), ONE_TO_ONE)
    with plaque.local_cluster(workers=1, transport="inproc") as c:
        c.install(g).run().result(30)
    tables = [pq.read_table(tmp_path / "out" / f) for f in sorted(os.listdir(tmp_path / "out"))]
    assert [t.num_rows for t in tables] == [1, 0]


class Batches(Operator):
    """Emits each batch of records of the run's argument as its own batch (one row group)."""

    def on_start(self, ctx, t):
        for batch in ctx.arg:
            ctx.emit_batch(batch)


def run_batches(tmp_path, batches, sink):
    g = Graph("batches")
    src = g.node("src", Batches, shards=1)
    g.edge(src, g.node("out", sink, shards=1), ONE_TO_ONE)
    with plaque.local_cluster(workers=1, transport="inproc") as c:
        return c.install(g).run(batches).result(30)


def test_records_with_other_columns_keep_every_column_or_fail_naming_them(tmp_path):
    """A file's columns are those of all the records of its first batch (pyarrow alone takes
    the first record's and drops the rest); a later batch with a new column fails, named,
    instead of losing it (here on the file itself: a run's batches may arrive merged)."""
    run_batches(tmp_path, [[{"a": 1}, {"a": 2, "b": "x"}]], ParquetSink(tmp_path / "one"))
    assert pq.read_table(tmp_path / "one" / "part-00000.parquet").to_pylist() == \
        [{"a": 1, "b": None}, {"a": 2, "b": "x"}]
    from plaque.sinks import _ParquetFile

    f = _ParquetFile(str(tmp_path / "two.parquet"))
    f.write([])  # an empty batch first says nothing of the columns
    f.write([{"a": 1}])
    with pytest.raises(plaque.SinkError, match=r"records have columns \['c'\] that .*"
                                              r"has not \(its columns: \['a'\]\)"):
        f.write([{"a": 2}, {"a": 3, "c": 3.5}])
    f.write([{"a": 4}])
    f.close()
    assert pq.read_table(tmp_path / "two.parquet").to_pylist() == [{"a": 1}, {"a": 4}]


def test_a_given_schema_casts_every_shard_and_refuses_what_does_not_fit(tmp_path):
    schema = pa.schema([("user", pa.string()), ("spend", pa.float64())])
    run_batches(tmp_path, [[{"user": "u", "spend": 3}], [{"user": "v"}]],
                ParquetSink(tmp_path / "cast", schema=schema))
    table = pq.read_table(tmp_path / "cast" / "part-00000.parquet")
    assert table.schema == schema
    assert table.to_pylist() == [{"user": "u", "spend": 3.0}, {"user": "v", "spend": None}]
    run_batches(tmp_path, [], ParquetSink(tmp_path / "empty", schema=schema))
    assert pq.read_table(tmp_path / "empty" / "part-00000.parquet").schema == schema
    with pytest.raises(plaque.OperatorError, match=r"records do not fit .*spend: double"):
        run_batches(tmp_path, [[{"user": "u", "spend": "lots"}]],
                    ParquetSink(tmp_path / "bad", schema=schema))
    with pytest.raises(plaque.OperatorError, match=r"ParquetSink records are dicts of column"
                                                  r" -> value, got tuple: \('u', 1\)"):
        run_batches(tmp_path, [[("u", 1)]], ParquetSink(tmp_path / "rows"))
    with pytest.raises(plaque.GraphError, match="schema must be a pyarrow.Schema, got dict"):
        ParquetSink(tmp_path / "x", schema={"user": "string"})
    assert not (tmp_path / "bad").exists() and not (tmp_path / "rows").exists()


def test_a_parquet_file_replaced_after_planning_is_refused_naming_it(tmp_path):
    """Issue 45 item 5: it used to fail with a raw row-group index error, or read another
    file's rows."""
    path = write(tmp_path / "a.parquet", list(range(100)), [1] * 100, 20)
    parts = plaque.parquet_parts(path, 2)
    st = os.stat(path)
    write(tmp_path / "b.parquet", [1, 2], [1, 2], 1)
    os.replace(tmp_path / "b.parquet", path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # whatever the clock
    group = parts[1][0][1]
    with pytest.raises(plaque.SourceError, match=rf"a.parquet at row group {group}: changed"
                                                 r" since its parts were made \(size \d+ ->"):
        list(plaque.read_parquet(parts[1]))
    assert pickle.loads(pickle.dumps(parts[0][0])).mtime_ns == st.st_mtime_ns  # it travels


def test_bad_parquet_is_a_short_source_error_naming_the_file(tmp_path):
    """Issue 45 item 6: these raised pyarrow's own errors, naming no file."""
    good = write(tmp_path / "good.parquet", list(range(50_000)), list(range(50_000)), 10_000)
    data = open(good, "rb").read()
    (tmp_path / "half.parquet").write_bytes(data[:len(data) // 2])
    (tmp_path / "noise.parquet").write_bytes(os.urandom(5000))
    for name in ("half.parquet", "noise.parquet"):
        with pytest.raises(plaque.SourceError, match=rf"{name} at its footer: not a Parquet"
                                                     r" file it can read: ArrowInvalid") as e:
            plaque.parquet_parts([good, tmp_path / name], 2)
        assert len(str(e.value)) < 400 and isinstance(e.value.__cause__, pa.ArrowInvalid)
    column = pq.ParquetFile(good).metadata.row_group(1).column(0)
    broken = bytearray(data)
    for i in range(column.data_page_offset, column.data_page_offset + 400):
        broken[i] ^= 0x5A  # row group 1's first page, its footer intact
    (tmp_path / "broken.parquet").write_bytes(broken)
    (part,) = plaque.parquet_parts(tmp_path / "broken.parquet", 1)
    tables = plaque.read_parquet(part)
    assert next(tables).num_rows == 10_000
    with pytest.raises(plaque.SourceError, match=r"broken.parquet at row group 1: cannot read"
                                                 r" it: ") as e:
        next(tables)
    assert len(str(e.value)) < 400 and e.value.__cause__ is not None


def test_an_empty_parquet_listing_is_refused_unless_allowed():
    """Issue 45 item 7."""
    with pytest.raises(ValueError, match=r"no input files: the listing is empty"):
        plaque.parquet_parts([], 3)
    assert plaque.parquet_parts([], 3, allow_empty=True) == [(), (), ()]
