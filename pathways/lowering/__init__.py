"""From a traced program to a Plaque graph, in the client's process (§4.2 to §4.3):
``lower`` places every function's shards on devices and emits kernel, send and routing nodes;
``resharding`` plans the transfers between two shardings of one array.
"""

__all__: list[str] = []
