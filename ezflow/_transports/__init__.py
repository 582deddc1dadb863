"""Transports: how one publisher's messages reach a channel in another place.

Each transport implements the small interface in :mod:`._base`: the publisher side
registers :class:`~ezflow._core._outlet.Outlet` objects and attaches a
:class:`~ezflow._core._outlet.Link` per subscribing channel; the subscriber side opens an
:class:`~._base.Inbound` that feeds a :class:`~ezflow._core._channel.Channel`. The
transports are registered in :mod:`._registry` (the one place that names them); the
graph layer uses them through a :class:`~._set.TransportSet` and imports only what this
module exports. Imports from _core only.
"""

from ._base import Inbound, Loans, Transport, TransportSettings
from ._ezring import ring_registration
from ._ezring_files import LiveRing, scan_rings, sweep_stale_rings
from ._registry import register_transport, transport_names, unregister_transport
from ._set import TransportSet
from ._shm import SegmentSweeper, ShmStats

__all__ = [
    "Inbound",
    "LiveRing",
    "Loans",
    "SegmentSweeper",
    "ShmStats",
    "Transport",
    "TransportSet",
    "TransportSettings",
    "register_transport",
    "ring_registration",
    "scan_rings",
    "sweep_stale_rings",
    "transport_names",
    "unregister_transport",
]
