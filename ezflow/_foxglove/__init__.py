"""Foxglove live view and MCAP recordings (needs ``ezflow-pubsub[foxglove]``; the public
surface is :mod:`ezflow.foxglove`, the guide docs/foxglove.md).

``_mapping``: messages to schemas and back (the one source of truth); ``_mcap``: MCAP
writing and reading; ``_server``: the live Foxglove WebSocket server on a graph.
"""
