"""What Plaque's own tests use, for tests of code built on Plaque.

- ``TransportConformance``: the suite any ``Transport`` implementation must pass; subclass it
  as ``Test...`` with a ``make_transport`` and pytest runs it (``transport_suite``).
- ``SimulatedCluster``: a coordinator and workers as state machines over in-memory FIFO
  queues, delivering in an order the test chooses; no sockets, threads or clocks
  (``simulated_cluster``).
- ``Source``, ``Forward``, ``Route``, ``Collect``: small operators to build test graphs with,
  and ``chain``, ``sparse_graph`` (with ``expected_sparse``) built from them (``operators``).

The cores take time as an argument (``tick(now, heard_until)``) and the adapters take a
``clock``: tests pass the times they want, no fake clock is needed.
"""

from .operators import Collect, Forward, Route, Source, chain, expected_sparse, sparse_graph
from .simulated_cluster import COORD, SimulatedCluster
from .transport_suite import DEADLINE, TransportConformance, TransportNet

__all__ = ["COORD", "DEADLINE", "Collect", "Forward", "Route", "SimulatedCluster", "Source",
           "TransportConformance", "TransportNet", "chain", "expected_sparse", "sparse_graph"]
