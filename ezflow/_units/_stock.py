"""Stock units: DebugLog, TerminateAfter, TerminateOnTimeout, TerminateOnTotal,
MessageGate, Clock, Recorder, Replayer, and rate_limited (the ezmsg ones behave as
ezmsg.util's units of the same names; the Replayer also reads ezmsg's message logs).

Recordings are ezflow's own format (below) or, with ``RecorderSettings(format="mcap")``,
MCAP (docs/foxglove.md; needs ``ezflow-pubsub[foxglove]``, imported only then). The
Replayer tells ezflow recordings, MCAP files and ezmsg logs apart by their content.

Recording format (a "msgpack stream"): the file is a sequence of msgpack objects. The
first is a header map ``{"format": "ezflow-recording", "version": 1, "created": <unix
seconds>}``; each following object is a two-element array ``[offset_ns, body]``, where
*offset_ns* is the time since recording started (monotonic clock, nanoseconds) and
*body* the message encoded by ezflow's codec (numpy arrays, registered dataclasses and
everything else a topic can carry) as msgpack ``bin``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import IO, Any, Literal

import msgpack

from .._core._codec import Codec, register_message
from .._core._config import DEFAULT_MAX_MESSAGE_SIZE
from .._core._exceptions import ConfigurationError, ProtocolError
from ._component import Unit
from ._decorators import publisher, subscriber, task
from ._errors import NormalTermination
from ._ezmsg_log import is_ezmsg_log, read_ezmsg_log
from ._settings import Settings, State
from ._streams import InputStream, OutputStream

__all__ = [
    "RECORDING_FORMAT",
    "Clock",
    "ClockSettings",
    "DebugLog",
    "DebugLogSettings",
    "GateMessage",
    "MessageGate",
    "MessageGateSettings",
    "Recorder",
    "RecorderSettings",
    "Replayer",
    "ReplayerSettings",
    "TerminateAfter",
    "TerminateAfterSettings",
    "TerminateOnTimeout",
    "TerminateOnTimeoutSettings",
    "TerminateOnTotal",
    "TerminateOnTotalSettings",
    "is_mcap_file",
    "rate_limited",
    "read_ezmsg_log",
    "read_mcap",
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


# -- TerminateOnTimeout, TerminateOnTotal (ezmsg's) ----------------------------------------


class TerminateOnTimeoutSettings(Settings):
    """End the graph once *time* seconds passed without a message on ``INPUT``, counted
    from the latest message (never before the first: a graph whose source has not
    started yet is not idle); checked *poll_rate* times a second. ezmsg's defaults."""

    time: float = 2.0
    poll_rate: float = 4.0

    def __post_init__(self) -> None:
        if not self.time > 0:
            raise ConfigurationError(f"TerminateOnTimeoutSettings.time={self.time} must be > 0")
        if not self.poll_rate > 0:
            raise ConfigurationError(
                f"TerminateOnTimeoutSettings.poll_rate={self.poll_rate} must be > 0"
            )


class TerminateOnTimeoutState(State):
    last_message: float | None = None  # loop time of the latest message


class TerminateOnTimeout(Unit):
    """Raises :class:`~ezflow.NormalTermination` once no message arrived on ``INPUT`` for
    ``time`` seconds after the first one (ezmsg's ``TerminateOnTimeout``: an idle
    timeout that ends a replay or an acquisition when its data stops)."""

    SETTINGS: TerminateOnTimeoutSettings
    STATE: TerminateOnTimeoutState
    INPUT = InputStream(Any)

    @subscriber(INPUT)
    def keepalive(self, message: Any) -> None:
        self.STATE.last_message = asyncio.get_running_loop().time()

    @task
    async def poll(self) -> None:
        settings: TerminateOnTimeoutSettings = self.SETTINGS
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0 / settings.poll_rate)
            last = self.STATE.last_message
            if last is not None and loop.time() - last >= settings.time:
                log.info("%s: no message for %g s, ending the graph", self.path, settings.time)
                raise NormalTermination


class TerminateOnTotalSettings(Settings):
    """End the graph once *total* messages arrived on ``INPUT_MESSAGE``; ``None``: not
    until a total arrives on ``INPUT_TOTAL``."""

    total: int | None = None

    def __post_init__(self) -> None:
        if self.total is not None and self.total < 0:
            raise ConfigurationError(f"TerminateOnTotalSettings.total={self.total} must be >= 0")


class TerminateOnTotalState(State):
    total: int | None = None
    received: int = 0


class TerminateOnTotal(Unit):
    """Raises :class:`~ezflow.NormalTermination` once ``total`` messages arrived on
    ``INPUT_MESSAGE`` (ezmsg's ``TerminateOnTotal``: it counts messages, whatever they
    carry). A number on ``INPUT_TOTAL`` replaces the total; one already reached ends the
    graph at once. :class:`TerminateAfter` counts the same way, and can also end after
    a time, but has no ``INPUT_TOTAL``."""

    SETTINGS: TerminateOnTotalSettings
    STATE: TerminateOnTotalState
    INPUT_MESSAGE = InputStream(Any)
    INPUT_TOTAL = InputStream(int)

    def initialize(self) -> None:
        self.STATE.total = self.SETTINGS.total

    @subscriber(INPUT_TOTAL)
    def on_total(self, total: int) -> None:
        self.STATE.total = int(total)
        self._maybe_end()

    @subscriber(INPUT_MESSAGE)
    def on_message(self, message: Any) -> None:
        self.STATE.received += 1
        self._maybe_end()

    def _maybe_end(self) -> None:
        state: TerminateOnTotalState = self.STATE
        if state.total is not None and state.received >= state.total:
            raise NormalTermination


# -- MessageGate (ezmsg's) --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GateMessage:
    """Open (``True``) or close the gate of a :class:`MessageGate` (``INPUT_GATE``)."""

    open: bool


register_message(GateMessage)


class MessageGateSettings(Settings):
    """*start_open*: the gate's state at start; after *default_after* messages in a
    state other than *default_open*, the gate goes back to *default_open* (``None``:
    never). ezmsg's settings and defaults (closed)."""

    start_open: bool = False
    default_open: bool = False
    default_after: int | None = None

    def __post_init__(self) -> None:
        if self.default_after is not None and self.default_after < 1:
            raise ConfigurationError(
                f"MessageGateSettings.default_after={self.default_after} must be >= 1 or None"
            )


class MessageGateState(State):
    open: bool = False
    messages: int = 0  # since the gate last changed
    passed: int = 0
    discarded: int = 0


class MessageGate(Unit):
    """Passes ``INPUT`` to ``OUTPUT`` while open and discards it (counted in
    ``STATE.discarded``) while closed (ezmsg's ``MessageGate``). ``INPUT_GATE`` takes a
    :class:`GateMessage` (ezmsg's own ``GateMessage`` too: anything with an ``open``
    attribute) or a plain bool."""

    SETTINGS: MessageGateSettings
    STATE: MessageGateState
    INPUT_GATE = InputStream(Any)
    INPUT = InputStream(Any)
    OUTPUT = OutputStream(Any)

    def initialize(self) -> None:
        self.STATE.open = self.SETTINGS.start_open

    def set_gate(self, open_: bool) -> None:
        """Open or close the gate; a change restarts the count of ``default_after``."""
        state: MessageGateState = self.STATE
        if state.open != open_:
            state.open = open_
            state.messages = 0

    @subscriber(INPUT_GATE)
    def on_gate(self, message: Any) -> None:
        value = message if isinstance(message, bool) else getattr(message, "open", None)
        if not isinstance(value, bool):
            raise TypeError(
                f"{self.path}: INPUT_GATE takes a GateMessage or a bool, not "
                f"{type(message).__qualname__}"
            )
        self.set_gate(value)

    @subscriber(INPUT)
    @publisher(OUTPUT)
    async def on_input(self, message: Any) -> AsyncIterator[tuple[Any, Any]]:
        state: MessageGateState = self.STATE
        settings: MessageGateSettings = self.SETTINGS
        state.messages += 1
        if state.open:
            state.passed += 1
            yield self.OUTPUT, message
        else:
            state.discarded += 1
        if (
            settings.default_after is not None
            and state.open != settings.default_open
            and state.messages >= settings.default_after
        ):
            self.set_gate(settings.default_open)


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
    """*path* of the recording to create (replaced if it exists), in *format*
    ``"ezflow"`` (ezflow's own, the module docstring) or ``"mcap"`` (docs/foxglove.md:
    Foxglove and every MCAP reader open it; needs ``ezflow-pubsub[foxglove]``). For
    MCAP: the *topic* its channel is named (default: the unit's ``INPUT`` topic) and the
    *compression* of its chunks (``"zstd"``, ``"lz4"`` or ``"none"``)."""

    path: str
    format: Literal["ezflow", "mcap"] = "ezflow"
    topic: str | None = None
    compression: Literal["zstd", "lz4", "none"] = "zstd"

    def __post_init__(self) -> None:
        if self.format not in ("ezflow", "mcap"):
            raise ConfigurationError(
                f"RecorderSettings.format={self.format!r} must be 'ezflow' or 'mcap'"
            )
        if self.compression not in ("zstd", "lz4", "none"):
            raise ConfigurationError(
                f"RecorderSettings.compression={self.compression!r} must be 'zstd', 'lz4' or 'none'"
            )


class RecorderState(State):
    file: IO[bytes]
    codec: Codec
    mcap: Any = None  # the McapWriter of format="mcap"
    topic: str = ""
    started: int = 0
    recorded: int = 0


def _mcap_module() -> Any:
    """ezflow._foxglove._mcap, imported on first use (the extra), or a
    ConfigurationError naming the fix."""
    try:
        from .._foxglove import _mcap  # noqa: PLC0415 - only MCAP recordings need the extra
    except ImportError as exc:
        raise ConfigurationError(
            f"MCAP recordings need the foxglove extra: pip install 'ezflow-pubsub[foxglove]' "
            f"({exc})"
        ) from exc
    return _mcap


def is_mcap_file(path: str) -> bool:
    """Whether *path* starts with the MCAP magic (read without the extra)."""
    with open(path, "rb") as file:
        return file.read(8) == b"\x89MCAP0\r\n"


class Recorder(Unit):
    """Writes every message arriving on ``INPUT`` to a recording (see the module
    docstring for the format). The file is written through a buffer and closed in
    ``shutdown()``; a message the codec cannot encode fails the unit."""

    SETTINGS: RecorderSettings
    STATE: RecorderState
    INPUT = InputStream(Any)

    def initialize(self) -> None:
        state: RecorderState = self.STATE
        settings: RecorderSettings = self.SETTINGS
        state.codec = Codec()
        if settings.format == "mcap":
            state.topic = settings.topic or f"{self.path}/INPUT"
            state.mcap = _mcap_module().McapWriter(
                settings.path, compression=settings.compression, codec=state.codec
            )
            return
        state.file = open(settings.path, "wb")  # noqa: SIM115 - closed in shutdown()
        header = {"format": RECORDING_FORMAT, "version": _RECORDING_VERSION, "created": time.time()}
        state.file.write(msgpack.packb(header))
        state.started = time.monotonic_ns()

    @subscriber(INPUT)
    def on_message(self, message: Any) -> None:
        state: RecorderState = self.STATE
        if state.mcap is not None:
            state.mcap.write(state.topic, message)
            state.recorded += 1
            return
        body = state.codec.encode(message).to_bytes()
        state.file.write(msgpack.packb([time.monotonic_ns() - state.started, body]))
        state.recorded += 1

    def shutdown(self) -> None:
        writer = getattr(self.STATE, "mcap", None)
        if writer is not None:
            writer.close()
        file = getattr(self.STATE, "file", None)
        if file is not None:
            file.close()


def read_mcap(path: str, topic: str | None = None) -> Any:
    """Iterate ``(offset_seconds, message)`` over an MCAP file (of *topic* only, if
    given), offsets counted from the first message's log time; needs
    ``ezflow-pubsub[foxglove]``. Channels of encodings ezflow does not read are skipped
    (logged once each); raises :class:`~ezflow.ProtocolError` naming the file as
    ``ezflow.foxglove.McapReader`` does."""
    reader = _mcap_module().McapReader(path, topics=None if topic is None else [topic])
    first: int | None = None
    for record in reader:
        if first is None:
            first = record.log_time
        yield (record.log_time - first) / 1e9, record.message


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
    """*path* of a recording: ezflow's, an MCAP file (ezflow's or another tool's: JSON
    and raw-bytes channels; needs ``ezflow-pubsub[foxglove]``), or a file of ezmsg's
    ``MessageLogger`` (told apart by content; *allow_pickle* lets objects ezmsg pickled
    into one be unpickled). *topic*: of an MCAP file, replay only that topic (default:
    every topic, in log-time order).
    *rate* ``"recorded"`` (the recorded timing, divided by *speed*) or ``"max"`` (as
    fast as subscribers take them); *complete*: end the graph after the last message
    (:class:`~ezflow.NormalTermination`; without it, ``OUTPUT`` ends after the last
    message, and an ``end_when_done`` graph ends once everything downstream handled
    it)."""

    path: str
    rate: Literal["recorded", "max"] = "recorded"
    speed: float = 1.0
    complete: bool = False
    allow_pickle: bool = False
    topic: str | None = None

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
        if is_mcap_file(settings.path):
            records = read_mcap(settings.path, settings.topic)
        elif is_ezmsg_log(settings.path):
            records = read_ezmsg_log(settings.path, allow_pickle=settings.allow_pickle)
        else:
            records = read_recording(settings.path)
        for offset, message in records:
            if settings.rate == "recorded":
                delay = started + offset / settings.speed - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            yield self.OUTPUT, message
        if settings.complete:
            raise NormalTermination
