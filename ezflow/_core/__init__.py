"""The self-contained core: errors, limits, codec, framing, graph protocol, channels.

Nothing in here imports from the transports, the graph client/server or anything above.
"""
