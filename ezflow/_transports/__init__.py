"""Transports: how one publisher's messages reach a channel in another place.

Each transport implements the small interface in :mod:`._base`: the publisher side
registers :class:`~ezflow._core._outlet.Outlet` objects and attaches a
:class:`~ezflow._core._outlet.Link` per subscribing channel; the subscriber side opens an
:class:`~._base.Inbound` that feeds a :class:`~ezflow._core._channel.Channel`.
Imports from _core only.
"""
