"""A host, in each host's process: ``process`` (``serve_host``: what starts a host), ``host``
(the ``Host``: devices, executor, object store, commands from the coordinator and peers),
``data_service`` (the client-facing socket: put, get, save, delete), ``device`` (emulated
TPUs: a kernel queue in scheduler order, HBM, a timeline), ``executor`` (one thread runs every
device's kernels) over ``timeline`` (its pure core: when kernels start, end and publish, in
virtual time), ``body_runner`` (kernel bodies in greenlets) and ``drivers`` (an event loop's
thread or a thread of its own), ``kernel`` and ``routing`` (the Plaque operators that
dispatch kernels, sends and routed rows), ``operators`` (the table of those operators by node
kind, handed to a host's worker), ``services`` (``HostServices``: what an operator may call
on its host), ``exchange`` and ``ici`` (collectives between devices, in memory and over
ZeroMQ), ``object_store`` (the buffers of arrays and their use counts), ``hbm`` (a device's
HBM account and grants), ``admission`` (HBM taken without blocking the host's thread),
``alarm`` and ``watchdog`` (timers, kernel time limits).

Importing the package registers nothing: a host hands its worker the operator table
(``operators.operator_table``) when it starts.
"""

from .host import Host
from .operators import host_operators, operator_table
from .process import serve_host
from .services import HostServices

__all__ = ["Host", "HostServices", "host_operators", "operator_table", "serve_host"]
