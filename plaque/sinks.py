"""Sinks: nodes that write their shard's input to files, one directory per run, atomically.

A sink is a node whose factory is a ``Sink``: ``g.node("out", JsonlSink("out/counts-{t}"),
shards=4)``. Each shard writes what reaches it to ``part-<shard>.<suffix>`` and outputs a
report, ``{"shard", "file", "records", "bytes"}``. The files go to a hidden staging directory
next to the target, made by the driver when the run starts; when the run succeeds the driver
checks every shard's file and renames the directory to the target (``{t}`` in its last
component becomes the run's timestamp), so a reader sees all of a run's output or none of it,
and a run with several sinks publishes all of them or none (``plaque.staging``). A failed
run's staging directory is removed once no worker can write to it any more; one a killed
driver left is removed by the next run to its target or by ``plaque clean``
(``plaque.leftovers``).

The target must not exist unless ``overwrite=True`` (then the old directory is replaced in one
rename and removed last). The driver and the workers must share the filesystem of the target,
as on one machine or a cluster with a shared filesystem; a worker that cannot see the staging
directory fails the run saying so.

Formats: ``TextSink`` (``str(value)`` per line), ``JsonlSink`` (one JSON document per line) and
``ParquetSink`` (records are dicts; needs pyarrow: ``pip install 'pathways-open[parquet]'``).
A format is a ``Sink`` subclass with ``open``, ``write`` and ``close``.
"""

from __future__ import annotations

import json
import os

from .errors import GraphError, SinkError
from .operator import Operator
from .readers import pyarrow_modules

__all__ = ["JsonlSink", "ParquetSink", "Sink", "TextSink"]


class Sink:
    """What a sink node writes and where; call it to make one shard's writer (an operator).

    ``path``: the run's output directory, made absolute where the graph is built; ``{t}``
    in its last component is replaced by the run's timestamp. ``overwrite``: replace an
    existing directory (otherwise a run whose target exists fails, and says where its output
    was kept).
    """

    suffix = ".out"

    def __init__(self, path, overwrite: bool = False):
        path = os.path.abspath(os.fspath(path))
        parent, leaf = os.path.split(path)
        if not leaf or "{" in parent or set("{}") & set(leaf.replace("{t}", "")):
            raise GraphError(f"sink path {path!r}: give a directory whose last component may"
                             " hold {t} (the run's timestamp), and no other braces")
        self.path, self.overwrite = path, bool(overwrite)

    def __call__(self) -> SinkWriter:
        return SinkWriter(self)

    def target(self, t) -> str:
        """The directory run ``t`` commits to."""
        return self.path.replace("{t}", str(t))

    # ---- the format: override these ------------------------------------------------------
    def open(self, path: str):
        """A new file at ``path`` to write one shard's records to."""
        return open(path, "w", encoding="utf-8")

    def write(self, fh, values) -> None:
        """Write a batch of records."""
        raise NotImplementedError

    def close(self, fh) -> None:
        """Flush ``fh`` to disk and close it."""
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()


class TextSink(Sink):
    """One line per record: ``str(value)``."""

    suffix = ".txt"

    def write(self, fh, values) -> None:
        fh.write("".join(f"{v}\n" for v in values))


class JsonlSink(Sink):
    """One JSON document per line (JSON Lines). numpy scalars and arrays (what a numpy
    computation's records hold) are written as JSON numbers, booleans and lists; anything
    else JSON has no form for fails the run naming its type."""

    suffix = ".jsonl"

    def write(self, fh, values) -> None:
        dumps = json.dumps
        fh.write("".join(dumps(v, default=_json_numpy) + "\n" for v in values))


def _json_numpy(value):
    """``json.dumps``'s fallback: numpy scalars as Python numbers, arrays as lists."""
    kind = type(value).__module__
    if kind == "numpy" and hasattr(value, "tolist"):  # np.int64, np.float32, ndarray, ...
        return value.tolist()
    raise TypeError(f"JsonlSink cannot write a {type(value).__name__} ({value!r:.60}): give"
                    " records of JSON types (dict, list, str, number, bool, None) or numpy")


class ParquetSink(Sink):
    """Records are dicts of column -> value; each batch becomes a row group.

    ``schema`` (a ``pyarrow.Schema``): every shard's file has it, an empty one too, and
    values are cast to it; give it when shards must agree (one may see only ints where
    another sees floats). Without it a shard's file takes its first batch's columns (from
    every record of it) and their inferred types. A record with a column the file does not
    have, or a value its column cannot hold, fails the run naming them: nothing is dropped.
    """

    suffix = ".parquet"

    def __init__(self, path, overwrite: bool = False, schema=None):
        super().__init__(path, overwrite)
        pa, _ = pyarrow_modules()  # refuse at graph-building time, not on the workers
        if schema is not None and not isinstance(schema, pa.Schema):
            raise GraphError(f"ParquetSink schema must be a pyarrow.Schema, got"
                             f" {type(schema).__name__}")
        self.schema = schema

    def open(self, path: str):
        return _ParquetFile(path, self.schema)

    def write(self, fh, values) -> None:
        fh.write(values)

    def close(self, fh) -> None:
        fh.close()


class _ParquetFile:
    """A Parquet file written a batch (row group) at a time, in one schema: the sink's, or
    its first batch's."""

    def __init__(self, path, schema=None):
        self.path, self.schema, self.writer = path, schema, None

    def write(self, records) -> None:
        pa, pq = pyarrow_modules()
        records = list(records)
        if not records:  # no row group, and no columns learnt from nothing
            return
        columns = _columns(records)
        try:
            if self.schema is None:  # every record's columns, types from every value
                table = pa.table({c: [r.get(c) for r in records] for c in columns})
            else:
                extra = [c for c in columns if c not in self.schema.names]
                if extra:
                    raise SinkError(f"records have columns {extra} that {self.path!r} has"
                                    f" not (its columns: {self.schema.names}); give"
                                    " ParquetSink a schema= with every column")
                table = pa.Table.from_pylist(records, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SinkError(f"records do not fit {self.path!r}"
                            f"{'' if self.schema is None else f' ({self.schema})'}: {exc}"
                            ) from exc
        if self.writer is None:
            self.schema = table.schema
            self.writer = pq.ParquetWriter(self.path, table.schema)
        self.writer.write_table(table)

    def close(self) -> None:
        if self.writer is None:  # no records: an empty file, in the schema if it has one
            pa, pq = pyarrow_modules()
            pq.write_table(pa.table({}) if self.schema is None else self.schema.empty_table(),
                           self.path)
        else:
            self.writer.close()
        with open(self.path, "rb") as fh:
            os.fsync(fh.fileno())


def _columns(records) -> list:
    """Every column of ``records`` (dicts), in the order first seen."""
    columns: dict = {}
    for r in records:
        if not isinstance(r, dict):
            raise SinkError(f"ParquetSink records are dicts of column -> value, got"
                            f" {type(r).__name__}: {r!r:.80}")
        columns.update(dict.fromkeys(r))
    return list(columns)


class SinkWriter(Operator):
    """One shard of a sink node: writes to ``ctx.part``, the run's staging directory."""

    def __init__(self, spec: Sink):
        self.spec = spec

    def _file(self, ctx):
        state = ctx.state
        fh = state.get("fh")
        if fh is None:
            staging = ctx.part
            if staging is None:
                raise SinkError(f"sink {ctx.node!r} ran without a staging directory: start"
                                " runs of a graph with sinks with InstalledGraph.run")
            if not os.path.isdir(staging):
                raise SinkError(f"sink {ctx.node!r}: its staging directory {staging} does not"
                                f" exist on worker {ctx.worker}; sinks need a filesystem the"
                                " driver and the workers share")
            name = f"part-{ctx.shard:05d}{self.spec.suffix}"
            fh = state["fh"] = self.spec.open(os.path.join(staging, name))
            state["name"], state["records"] = name, 0
        return fh

    def on_batch(self, ctx, t, port, values) -> None:
        self.spec.write(self._file(ctx), values)
        ctx.state["records"] += len(values)

    def on_complete(self, ctx, t) -> None:
        fh, state = self._file(ctx), ctx.state
        self.spec.close(fh)
        path = os.path.join(ctx.part, state["name"])
        ctx.output({"shard": ctx.shard, "file": state["name"], "records": state["records"],
                    "bytes": os.path.getsize(path)})
