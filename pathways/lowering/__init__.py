"""From a traced program to a Plaque graph, in the client's process (§4.2 to §4.3):
``lower`` places every function's shards on devices and emits kernel, send and routing nodes
(``specs``: what each node hands its host); ``resharding`` plans the transfers between two
shardings of one array; ``wire`` is the graph's wire form, which the coordinator rebuilds
without importing the rest (so this ``__init__`` imports nothing).
"""

__all__: list[str] = []
