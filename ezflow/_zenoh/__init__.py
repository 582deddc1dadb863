"""ezflow on Eclipse Zenoh (``ezflow-pubsub[zenoh]``): the session helper, topic <-> key
expression mapping and the bridge. The public names are in :mod:`ezflow.zenoh`; the core
never imports this package."""
