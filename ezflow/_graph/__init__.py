"""The graph layer: the graph server (control plane), its client, and GraphContext with
the Publisher/Subscriber low-level API. Imports from _core and _transports only."""
