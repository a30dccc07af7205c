"""Plaque: an open sharded dataflow engine over ZeroMQ.

Build a ``Graph`` of sharded ``Operator`` nodes joined by ONE_TO_ONE, BROADCAST or KEYED edges,
install it on a cluster once, and run it many times; each run is a timestamp, and every shard
is told when its input for a timestamp is complete (progress tracking), even if it got nothing.
Operators take tuples one by one (``on_input``, ``ctx.emit``) or in batches (``on_batch``,
``ctx.emit_batch``, lists or numpy arrays); KEYED edges route by a stable hash of a key.
"""

from .cluster import Cluster, InstalledGraph, local_cluster
from .coordinator import RunResult
from .counters import total
from .errors import (
    ClusterClosed,
    CoordinatorLost,
    GraphError,
    OperatorError,
    PlaqueError,
    ProtocolError,
    SinkError,
    SourceError,
    WorkerLost,
)
from .graph import BROADCAST, KEYED, ONE_TO_ONE, Combiner, Graph, Routing
from .keys import stable_hash, stable_shard, stable_shards
from .operator import Context, Operator
from .readers import parquet_parts, read_lines, read_parquet, text_parts
from .sinks import JsonlSink, ParquetSink, Sink, TextSink

__all__ = [
    "BROADCAST", "KEYED", "ONE_TO_ONE", "Cluster", "ClusterClosed", "Combiner", "Context",
    "CoordinatorLost", "Graph", "GraphError", "InstalledGraph", "Operator", "OperatorError",
    "JsonlSink", "ParquetSink", "PlaqueError", "ProtocolError", "Routing", "RunResult", "Sink",
    "SinkError", "SourceError", "TextSink", "WorkerLost", "local_cluster", "parquet_parts", "read_lines",
    "read_parquet", "stable_hash", "stable_shard", "stable_shards", "text_parts", "total",
]
