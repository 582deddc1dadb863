"""``ezflow record`` and ``ezflow replay``: topics of a running graph to a file and back.

Formats: ezflow's own recording (one topic; ``ezflow.units.read_recording``) or MCAP
(``--format mcap``: any number of topics, what Foxglove opens; needs
``ezflow-pubsub[foxglove]``, docs/foxglove.md). ``replay`` tells ezflow recordings,
MCAP files and ezmsg message logs apart by content, as the Replayer unit does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

import msgpack
import typer

from .._core._codec import Codec
from .._core._exceptions import EndOfStream, ProtocolError, UndecodableMessageError
from .._graph._context import GraphContext
from .._units._ezmsg_log import is_ezmsg_log, read_ezmsg_log
from .._units._stock import RECORDING_FORMAT, is_mcap_file, read_recording
from ._connection import AddressOption, fail, graph_context, resolve_address, run_async
from ._echo import ImportOption, _import_modules

__all__ = ["record", "replay"]

Format = Literal["ezflow", "mcap"]


class _EzflowFile:
    """ezflow's own recording of one topic (the format of the Recorder unit)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._codec = Codec()
        header = {"format": RECORDING_FORMAT, "version": 1, "created": time.time()}
        self._file.write(msgpack.packb(header))
        self._started = time.monotonic_ns()

    def write(self, topic: str, message: Any) -> None:
        body = self._codec.encode(message).to_bytes()
        self._file.write(msgpack.packb([time.monotonic_ns() - self._started, body]))

    def close(self) -> None:
        self._file.close()


def _open_writer(path: str, fmt: str, compression: str) -> Any:
    if fmt == "ezflow":
        return _EzflowFile(path)
    try:
        from .._foxglove._mcap import McapWriter  # noqa: PLC0415 - the extra, only for MCAP
    except ImportError as exc:
        fail(f"--format mcap needs the foxglove extra: pip install 'ezflow-pubsub[foxglove]' "
             f"({exc})", 2)  # fmt: skip
    return McapWriter(path, compression=compression)


def record(
    path: Annotated[str, typer.Argument(help="The file to write (replaced if it exists).")],
    topics: Annotated[list[str], typer.Argument(help="The topics to record.")],
    *,
    address: AddressOption = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="ezflow (ezflow's own recording, one topic) or mcap (any number of "
            "topics; Foxglove opens it).",
        ),
    ] = "ezflow",
    compression: Annotated[
        str, typer.Option("--compression", help="MCAP chunks: zstd, lz4 or none.")
    ] = "zstd",
    seconds: Annotated[
        float | None, typer.Option("--seconds", min=0.0, help="Stop after this long.")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Stop after this many messages in all.")
    ] = None,
    leaky: Annotated[
        int | None,
        typer.Option(
            "--leaky",
            min=1,
            help="Keep only the newest N messages per topic when the disk falls behind "
            "(drops counted) instead of holding the publishers back.",
        ),
    ] = None,
    modules: ImportOption = None,
) -> None:
    """Record topics of a running graph to a file, until Ctrl-C, --seconds or --count.

    Lossless by default: a disk slower than the topics holds their publishers back
    (--leaky N drops instead, counted). MCAP recordings have one channel per topic with
    the schema Foxglove shows (docs/foxglove.md), zstd-compressed chunks and an index.

    Examples:

        ezflow record run.mcap /CAMERA/OUTPUT /IMU/OUTPUT --format mcap

        ezflow record spectrum.rec SPECTRUM/OUTPUT --import examples/signal_pipeline.py
    """
    if fmt not in ("ezflow", "mcap"):
        fail(f"--format {fmt!r}: choose ezflow or mcap", 2)
    if compression not in ("zstd", "lz4", "none"):
        fail(f"--compression {compression!r}: choose zstd, lz4 or none", 2)
    if fmt == "ezflow" and len(topics) != 1:
        fail("ezflow's own format records one topic; record several with --format mcap", 2)
    where = resolve_address(address)
    _import_modules(modules)

    async def main() -> None:
        async with graph_context(where, "ezflow record") as context:
            writer = _open_writer(path, fmt, compression)
            written: dict[str, int] = dict.fromkeys(topics, 0)
            done = asyncio.Event()
            try:
                await _record(context, writer, topics, written, done, leaky, count, seconds)
            finally:
                writer.close()
            total = sum(written.values())
            detail = ", ".join(f"{topic} {n}" for topic, n in written.items())
            typer.echo(f"recorded {total} messages to {path} ({detail})")

    run_async(main)


async def _record(  # noqa: PLR0917 - the command's whole state
    context: GraphContext,
    writer: Any,
    topics: list[str],
    written: dict[str, int],
    done: asyncio.Event,
    leaky: int | None,
    count: int | None,
    seconds: float | None,
) -> None:
    from ._connection import until_stopped  # noqa: PLC0415

    subscribers = [
        await context.subscriber(topic, leaky=leaky is not None, queue=leaky) for topic in topics
    ]

    async def take(topic: str, subscriber: Any) -> None:
        while True:
            try:
                message = await subscriber.recv()
            except EndOfStream:
                return
            except UndecodableMessageError as exc:
                fail(f"{topic}: {exc} (--import the module that registers its message class)")
            writer.write(topic, message)
            written[topic] += 1
            if count is not None and sum(written.values()) >= count:
                done.set()

    takers = [
        asyncio.create_task(take(topic, sub))
        for topic, sub in zip(topics, subscribers, strict=True)
    ]
    stoppers = [asyncio.create_task(done.wait()), asyncio.create_task(until_stopped())]
    if seconds is not None:
        stoppers.append(asyncio.create_task(asyncio.sleep(seconds)))
    typer.echo(f"recording {', '.join(topics)}; Ctrl-C stops")
    all_taken: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*takers))
    waited: list[asyncio.Future[Any]] = [*stoppers, all_taken]
    try:
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        failed = [t for t in takers if t.done() and not t.cancelled() and t.exception()]
        if failed:
            raise failed[0].exception()  # type: ignore[misc]  # (an undecodable message)
    finally:
        for task in (*takers, *stoppers, all_taken):
            task.cancel()
        await asyncio.gather(*takers, *stoppers, all_taken, return_exceptions=True)
        for sub in subscribers:
            await sub.aclose()


def _records(path: str, topics: list[str] | None, to: str | None) -> Any:
    """``(topic, offset_seconds, message)`` of the file at *path*, whatever its format."""
    if is_mcap_file(path):
        try:
            from .._foxglove._mcap import McapReader  # noqa: PLC0415
        except ImportError as exc:
            fail(f"{path} is MCAP: replaying it needs pip install 'ezflow-pubsub[foxglove]' "
                 f"({exc})", 2)  # fmt: skip
        first: int | None = None
        for record in McapReader(path, topics=topics):
            first = record.log_time if first is None else first
            yield to or record.topic, (record.log_time - first) / 1e9, record.message
        return
    if not is_ezmsg_log(path):
        try:  # (a file that is no recording at all is named as such before --to is asked)
            next(iter(read_recording(path)), None)
        except ProtocolError as exc:
            fail(f"{exc}; ezflow replay reads MCAP files, ezflow recordings and ezmsg logs", 2)
    if to is None:
        fail(
            f"{path} records no topic names (ezflow's own format or an ezmsg log): give --to TOPIC",
            2,
        )
    source = read_ezmsg_log(path) if is_ezmsg_log(path) else read_recording(path)
    for offset, message in source:
        yield to, offset, message


def replay(
    path: Annotated[str, typer.Argument(help="The recording: ezflow's, MCAP, or an ezmsg log.")],
    *,
    address: AddressOption = None,
    topics: Annotated[
        list[str] | None,
        typer.Option("--topic", help="Of an MCAP file: replay only this topic (repeatable)."),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="Publish every message on this topic (required for the formats that "
            "record no topic; default for MCAP: each on its recorded topic).",
        ),
    ] = None,
    rate: Annotated[
        str, typer.Option("--rate", help="recorded (the recorded timing) or max.")
    ] = "recorded",
    speed: Annotated[
        float,
        typer.Option("--speed", min=0.001, help="With --rate recorded: this many times faster."),
    ] = 1.0,
    modules: ImportOption = None,
) -> None:
    """Publish a recording's messages on a running graph, in order.

    The format is told by content: ezflow's own recording, MCAP (ezflow's, and other
    tools' JSON and raw-bytes channels; other encodings are listed and skipped), or an
    ezmsg message log.

    Examples:

        ezflow replay run.mcap

        ezflow replay run.mcap --topic /CAMERA/OUTPUT --rate max

        ezflow replay spectrum.rec --to /spectrum --import examples/signal_pipeline.py
    """
    if rate not in ("recorded", "max"):
        fail(f"--rate {rate!r}: choose recorded or max", 2)
    where = resolve_address(address)
    _import_modules(modules)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", 2)

    async def main() -> None:
        async with graph_context(where, "ezflow replay") as context:
            publishers: dict[str, Any] = {}
            loop = asyncio.get_running_loop()
            started = loop.time()
            sent = 0
            try:
                for topic, offset, message in _records(path, topics, to):
                    if rate == "recorded":
                        delay = started + offset / speed - loop.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    publisher = publishers.get(topic)
                    if publisher is None:
                        publisher = publishers[topic] = await context.publisher(topic)
                    await publisher.publish(message)
                    sent += 1
            finally:
                for publisher in publishers.values():
                    await publisher.aclose()
            typer.echo(
                f"replayed {sent} messages from {path} on {', '.join(publishers) or 'no topic'}"
            )

    run_async(main)
