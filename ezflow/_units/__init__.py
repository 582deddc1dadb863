"""The declarative layer: Unit, Collection, Settings, State, streams and the runner.

Sits above ``_graph``: units talk to each other through GraphContext publishers and
subscribers on topics derived from their component paths (``"SINE/OUTPUT"``).
"""
