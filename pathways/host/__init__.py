"""A host, in each host's process (§4.3, §4.5): ``server`` (the host process: devices, data
service, ICI), ``device`` (emulated TPUs: a kernel queue in scheduler order, HBM, a timeline),
``executor`` (one thread runs every device's kernels), ``kernel`` and ``routing`` (the Plaque
operators that dispatch kernels, sends and routed rows), ``exchange`` and ``ici`` (collectives
between devices, in memory and over ZeroMQ), ``object_store`` (the buffers of arrays), ``alarm``
and ``watchdog`` (timers, kernel time limits).

Importing the package registers its operators by kind (``kernel``: kernel and send, ``routing``:
route, expert and gather) in ``pathways.lowering.specs.OPERATORS``, which the nodes of lowered
graphs look up when a host instantiates them.
"""

from . import kernel, routing

__all__ = ["kernel", "routing"]
