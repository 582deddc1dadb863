"""Stock units: DebugLog, TerminateAfter, Clock, Recorder, Replayer, and rate_limited.

Recording format (a "msgpack stream"): the file is a sequence of msgpack objects. The
first is a header map ``{"format": "ezflow-recording", "version": 1, "created": <unix
seconds>}``; each following object is a two-element array ``[offset_ns, body]``, where
*offset_ns* is the time since recording started (monotonic clock, nanoseconds) and
*body* the message encoded by ezflow's codec (numpy arrays, registered dataclasses and
everything else a topic can carry) as msgpack ``bin``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import IO, Any, Literal

import msgpack

from .._core._codec import Codec
from .._core._config import DEFAULT_MAX_MESSAGE_SIZE
from .._core._exceptions import ConfigurationError, ProtocolError
from ._component import Unit
from ._decorators import publisher, subscriber, task
from ._errors import NormalTermination
from ._settings import Settings, State
from ._streams import InputStream, OutputStream

__all__ = [
    "RECORDING_FORMAT",
    "Clock",
    "ClockSettings",
    "DebugLog",
    "DebugLogSettings",
    "Recorder",
    "RecorderSettings",
    "Replayer",
    "ReplayerSettings",
    "TerminateAfter",
    "TerminateAfterSettings",
    "TerminateOnTotal",
    "TerminateOnTotalSettings",
    "rate_limited",
    "read_recording",
]

log = logging.getLogger("ezflow.units")

RECORDING_FORMAT = "ezflow-recording"
_RECORDING_VERSION = 1


async def rate_limited(rate: float, count: int | None = None) -> AsyncIterator[int]:
    """Yield ``0, 1, 2, ...`` at most *rate* times per second (*count* values, or
    forever), on a fixed schedule that does not drift. When the consumer falls more
    than one period behind, the schedule restarts from now instead of bursting to catch
    up. Raises :class:`~ezflow.ConfigurationError` for a rate that is not positive.

    Use it in a publisher::

        @ezflow.publisher(OUTPUT)
        async def generate(self):
            async for i in ezflow.units.rate_limited(self.SETTINGS.rate):
                yield self.OUTPUT, make_block(i)
    """
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ConfigurationError(f"rate={rate!r} must be a positive number of values per second")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ConfigurationError(f"count={count!r} must be a non-negative int or None")
    loop = asyncio.get_running_loop()
    period = 1.0 / rate
    due = loop.time()
    index = 0
    while count is None or index < count:
        now = loop.time()
        if due > now:
            await asyncio.sleep(due - now)
        elif now - due > period:
            due = now
        yield index
        index += 1
        due += period


# -- DebugLog ---------------------------------------------------------------------------


class DebugLogSettings(Settings):
    """*name* prefixes each line; *max_length* truncates the shown ``repr`` (None: no
    limit); *use_logging* logs at INFO on the ``ezflow.units`` logger instead of
    printing to stdout."""

    name: str = "DEBUG"
    max_length: int | None = 400
    use_logging: bool = False


class DebugLog(Unit):
    """Shows every message arriving on ``INPUT`` and passes it on, unchanged, to
    ``OUTPUT`` (so it can sit inside a pipeline)."""

    SETTINGS: DebugLogSettings
    INPUT = InputStream(Any)
    OUTPUT = OutputStream(Any)

    @subscriber(INPUT)
    @publisher(OUTPUT)
    async def on_message(self, message: Any) -> AsyncIterator[tuple[Any, Any]]:
        settings: DebugLogSettings = self.SETTINGS
        text = repr(message)
        if settings.max_length is not None and len(text) > settings.max_length:
            text = text[: settings.max_length] + "..."
        if settings.use_logging:
            log.info("%s %s: %s", settings.name, self.path, text)
        else:
            print(f"{settings.name} {self.path}: {text}", flush=True)
        yield self.OUTPUT, message


# -- TerminateAfter -----------------------------------------------------------------------


class TerminateAfterSettings(Settings):
    """End the graph after *count* messages on ``INPUT``, after *seconds* from the start,
    or at whichever comes first; at least one is required."""

    count: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.count is None and self.seconds is None:
            raise ConfigurationError(
                "TerminateAfterSettings needs count=N (messages) or seconds=S (or both)"
            )
        if self.count is not None and self.count < 1:
            raise ConfigurationError(f"TerminateAfterSettings.count={self.count} must be >= 1")
        if self.seconds is not None and not self.seconds > 0:
            raise ConfigurationError(f"TerminateAfterSettings.seconds={self.seconds} must be > 0")


class TerminateAfterState(State):
    received: int = 0


class TerminateAfter(Unit):
    """Raises :class:`~ezflow.NormalTermination` (the graph ends normally, draining)
    after ``count`` messages arrived on ``INPUT`` or ``seconds`` after the start."""

    SETTINGS: TerminateAfterSettings
    STATE: TerminateAfterState
    INPUT = InputStream(Any)

    @subscriber(INPUT)
    def on_message(self, message: Any) -> None:
        state: TerminateAfterState = self.STATE
        state.received += 1
        count = self.SETTINGS.count
        if count is not None and state.received >= count:
            raise NormalTermination

    @task
    async def timer(self) -> None:
        seconds = self.SETTINGS.seconds
        if seconds is not None:
            await asyncio.sleep(seconds)
            raise NormalTermination


# -- TerminateOnTotal -------------------------------------------------------------------------


class TerminateOnTotalSettings(Settings):
    """End the graph once *total* samples arrived on ``INPUT`` (ezmsg's TerminateOnTotal)."""

    total: int

    def __post_init__(self) -> None:
        if self.total < 1:
            raise ConfigurationError(f"TerminateOnTotalSettings.total={self.total} must be >= 1")


class TerminateOnTotalState(State):
    received: int = 0


def _sample_count(message: Any) -> int:
    """Samples a message carries: the length of its ``time`` axis for an AxisArray-like
    message (``dims`` and ``data`` attributes, as ezmsg's AxisArray), else 1."""
    dims = getattr(message, "dims", None)
    shape = getattr(getattr(message, "data", None), "shape", None)
    if isinstance(dims, (list, tuple)) and "time" in dims and shape is not None:
        return int(shape[list(dims).index("time")])
    return 1


class TerminateOnTotal(Unit):
    """Raises :class:`~ezflow.NormalTermination` once ``total`` samples arrived on
    ``INPUT``. Unlike :class:`TerminateAfter` (which counts messages), an AxisArray-like
    message counts as the length of its ``time`` axis; any other message counts as one."""

    SETTINGS: TerminateOnTotalSettings
    STATE: TerminateOnTotalState
    INPUT = InputStream(Any)

    @subscriber(INPUT)
    def on_message(self, message: Any) -> None:
        state: TerminateOnTotalState = self.STATE
        state.received += _sample_count(message)
        if state.received >= self.SETTINGS.total:
            raise NormalTermination


# -- Clock ----------------------------------------------------------------------------------


class ClockSettings(Settings):
    """*rate* ticks per second; *count* ticks then stop (None: forever); *complete*: end
    the graph after the last tick (:class:`~ezflow.NormalTermination`; without it the
    output just ends, as the stream of a finished publisher)."""

    rate: float = 10.0
    count: int | None = None
    complete: bool = False


class Clock(Unit):
    """Publishes the tick number (0, 1, 2, ...) on ``OUTPUT`` at ``rate`` per second
    (see :func:`rate_limited`)."""

    SETTINGS: ClockSettings
    OUTPUT = OutputStream(int)

    @publisher(OUTPUT)
    async def tick(self) -> AsyncIterator[tuple[Any, int]]:
        settings: ClockSettings = self.SETTINGS
        async for index in rate_limited(settings.rate, settings.count):
            yield self.OUTPUT, index
        if settings.complete:
            raise NormalTermination


# -- Recorder / Replayer ----------------------------------------------------------------------


class RecorderSettings(Settings):
    """*path* of the recording to create (replaced if it exists)."""

    path: str


class RecorderState(State):
    file: IO[bytes]
    codec: Codec
    started: int = 0
    recorded: int = 0


class Recorder(Unit):
    """Writes every message arriving on ``INPUT`` to a recording (see the module
    docstring for the format). The file is written through a buffer and closed in
    ``shutdown()``; a message the codec cannot encode fails the unit."""

    SETTINGS: RecorderSettings
    STATE: RecorderState
    INPUT = InputStream(Any)

    def initialize(self) -> None:
        state: RecorderState = self.STATE
        state.codec = Codec()
        state.file = open(self.SETTINGS.path, "wb")  # noqa: SIM115 - closed in shutdown()
        header = {"format": RECORDING_FORMAT, "version": _RECORDING_VERSION, "created": time.time()}
        state.file.write(msgpack.packb(header))
        state.started = time.monotonic_ns()

    @subscriber(INPUT)
    def on_message(self, message: Any) -> None:
        state: RecorderState = self.STATE
        body = state.codec.encode(message).to_bytes()
        state.file.write(msgpack.packb([time.monotonic_ns() - state.started, body]))
        state.recorded += 1

    def shutdown(self) -> None:
        file = getattr(self.STATE, "file", None)
        if file is not None:
            file.close()


def read_recording(path: str, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Any:
    """Iterate ``(offset_seconds, message)`` over a recording made by :class:`Recorder`.

    Raises :class:`~ezflow.ProtocolError` for a file that is not a recording (or a
    record that is malformed), naming the file."""
    codec = Codec(max_message_size=max_message_size)
    with open(path, "rb") as file:
        unpacker = msgpack.Unpacker(file, max_buffer_size=max_message_size + 1024)
        try:
            header = next(unpacker)
        except (StopIteration, ValueError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"{path} is not an ezflow recording (no header)") from exc
        if not isinstance(header, dict) or header.get("format") != RECORDING_FORMAT:
            raise ProtocolError(f"{path} is not an ezflow recording (header {header!r:.80})")
        if header.get("version") != _RECORDING_VERSION:
            raise ProtocolError(
                f"{path}: recording version {header.get('version')!r} is not supported "
                f"(this build reads version {_RECORDING_VERSION})"
            )
        index = 0
        while True:
            try:
                record = next(unpacker)
            except StopIteration:
                return
            except (ValueError, msgpack.UnpackException) as exc:
                raise ProtocolError(f"{path}: record {index} is malformed: {exc}") from exc
            if (
                not isinstance(record, (list, tuple))
                or len(record) != 2
                or not isinstance(record[0], int)
                or not isinstance(record[1], bytes)
            ):
                raise ProtocolError(f"{path}: record {index} is not [offset_ns, body]")
            yield record[0] / 1e9, codec.decode(record[1])
            index += 1


class ReplayerSettings(Settings):
    """*path* of a recording; *rate* ``"recorded"`` (the recorded timing, divided by
    *speed*) or ``"max"`` (as fast as subscribers take them); *complete*: end the graph
    after the last message (:class:`~ezflow.NormalTermination`; without it, ``OUTPUT``
    ends after the last message, and an ``end_when_done`` graph ends once everything
    downstream handled it)."""

    path: str
    rate: Literal["recorded", "max"] = "recorded"
    speed: float = 1.0
    complete: bool = False

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ConfigurationError(f"ReplayerSettings.speed={self.speed} must be > 0")


class Replayer(Unit):
    """Publishes the messages of a recording on ``OUTPUT``, in order, at the recorded
    rate or at maximum rate. A file that is not a recording fails the unit with a
    :class:`~ezflow.ProtocolError` naming it."""

    SETTINGS: ReplayerSettings
    OUTPUT = OutputStream(Any)

    @publisher(OUTPUT)
    async def replay(self) -> AsyncIterator[tuple[Any, Any]]:
        settings: ReplayerSettings = self.SETTINGS
        loop = asyncio.get_running_loop()
        started = loop.time()
        for offset, message in read_recording(settings.path):
            if settings.rate == "recorded":
                delay = started + offset / settings.speed - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            yield self.OUTPUT, message
        if settings.complete:
            raise NormalTermination
