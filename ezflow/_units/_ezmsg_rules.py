"""The rules ezflow's two faces of ezmsg share, written once.

:mod:`ezflow.compat.ezmsg` (ezmsg's API, what users import) and
:mod:`ezflow._units._ezmsg_adapter` (ezmsg's own classes, run as they are) translate the
same ezmsg declarations, so they must translate them alike:

- a dataclass message type a stream names is registered with the codec
  (:func:`register_stream_type`): ezmsg pickles any message, ezflow carries registered
  dataclasses, so every process of the graph can decode it;
- an ``OutputStream``'s ``num_buffers`` of 32 (ezmsg's default) keeps ezflow's default
  ``max_in_flight``, another value is taken as ``max_in_flight``, and ``force_tcp``
  forces the tcp transport (:func:`output_options`);
- an ezmsg ``@main`` that returned does not end the graph: its thread waits, looking at
  ``running`` every ``COMPAT_MAIN_POLL_INTERVAL``, until the graph stops
  (:func:`wait_while_running`).

This module imports no ezmsg (``ezflow.compat.ezmsg`` works without it).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, TypedDict

from .._core._codec import register_message, registered_name
from .._core._config import COMPAT_MAIN_POLL_INTERVAL, DEFAULT_MAX_IN_FLIGHT

if TYPE_CHECKING:
    from ._component import Unit

__all__ = [
    "EZMSG_DEFAULT_NUM_BUFFERS",
    "OutputOptions",
    "output_options",
    "register_stream_type",
    "wait_while_running",
]

#: ezmsg's default ``OutputStream(num_buffers=...)``: an output declaring it keeps
#: ezflow's default ``max_in_flight`` (``DEFAULT_MAX_IN_FLIGHT``). ezmsg's value, not an
#: ezflow limit.
EZMSG_DEFAULT_NUM_BUFFERS = 32


class OutputOptions(TypedDict):
    """The ezflow ``OutputStream`` options an ezmsg output's declaration stands for."""

    max_in_flight: int
    transport: str | None


def register_stream_type(message_type: Any) -> None:
    """Register *message_type*, named by a stream, when it is a dataclass not registered
    yet (anything else - a ``TypeVar``, a union, a plain class - is left alone)."""
    if (
        isinstance(message_type, type)
        and dataclasses.is_dataclass(message_type)
        and registered_name(message_type) is None
    ):
        register_message(message_type)


def output_options(num_buffers: int, force_tcp: bool | None) -> OutputOptions:
    """The options of the ezflow output for an ezmsg ``OutputStream(num_buffers=...,
    force_tcp=...)``."""
    in_flight = DEFAULT_MAX_IN_FLIGHT if num_buffers == EZMSG_DEFAULT_NUM_BUFFERS else num_buffers
    return {"max_in_flight": in_flight, "transport": "tcp" if force_tcp else None}


def wait_while_running(unit: Unit) -> None:
    """Block (an ezmsg ``@main``'s thread, once the function returned) until the graph
    stops *unit* (clears its ``running``)."""
    while unit.running:
        time.sleep(COMPAT_MAIN_POLL_INTERVAL)
