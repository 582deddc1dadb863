"""MCAP recordings: ezflow messages to MCAP files and back (docs/foxglove.md).

:class:`McapWriter` writes one channel per topic (another one on the same topic when a
message needs another schema), each message with the schema and encoding of
:func:`~ezflow._foxglove._mapping.mapping_for` (the live server's too), chunked
(``MCAP_CHUNK_SIZE``), compressed (zstd, lz4 or none) and indexed: the summary at the
end lets a reader seek to any topic or time without reading the file through.

:class:`McapReader` reads messages back in log-time order: through the index when the
file has one, else (a file whose writer was killed) straight through, up to the point
where it was cut, then raises :class:`~ezflow.ProtocolError` saying so. Channels of an
encoding ezflow does not read (``ros1``, ``cdr``, ``flatbuffer``, protobuf other than
``foxglove.RawImage``...) are skipped, counted per topic and logged once each.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, Final, Literal, NamedTuple

from mcap.reader import NonSeekingReader, SeekingReader
from mcap.records import Channel, Message, Schema
from mcap.writer import CompressionType, Writer

from .._core._codec import Codec
from .._core._config import MCAP_CHUNK_SIZE, MCAP_FLUSH_INTERVAL
from .._core._exceptions import ConfigurationError, ProtocolError
from ._mapping import Mapping, NotMappable, decode_message, encode_message, mapping_for

__all__ = [
    "COMPRESSIONS",
    "MCAP_MAGIC",
    "McapReader",
    "McapWriter",
    "RecordedMessage",
    "is_mcap",
]

log = logging.getLogger("ezflow.foxglove")

#: The 8 bytes every MCAP file starts (and ends) with.
MCAP_MAGIC: Final = b"\x89MCAP0\r\n"

Compression = Literal["zstd", "lz4", "none"]
COMPRESSIONS: Final[dict[str, CompressionType]] = {
    "zstd": CompressionType.ZSTD,
    "lz4": CompressionType.LZ4,
    "none": CompressionType.NONE,
}


def is_mcap(path: str) -> bool:
    """Whether the file at *path* starts with the MCAP magic (``\\x89MCAP0\\r\\n``)."""
    with open(path, "rb") as file:
        return file.read(len(MCAP_MAGIC)) == MCAP_MAGIC


class RecordedMessage(NamedTuple):
    """One message read back: its *topic*, *log_time* and *publish_time* (unix ns) and
    the *message* itself."""

    topic: str
    log_time: int
    publish_time: int
    message: Any


class McapWriter:
    """Writes messages to the MCAP file *path* (replaced if it exists), with
    *compression* ``"zstd"`` (default), ``"lz4"`` or ``"none"``. Use as a context
    manager, or call :meth:`close`: the index and summary are written then.

    Not thread-safe; one writer per file. A file whose writer never closes (a killed
    process) keeps every chunk written before: :class:`McapReader` reads those and says
    where the file was cut.
    """

    def __init__(
        self,
        path: str,
        *,
        compression: str = "zstd",
        chunk_size: int = MCAP_CHUNK_SIZE,
        codec: Codec | None = None,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ConfigurationError(
                f"compression={compression!r}: MCAP recordings are compressed with one of "
                f"{', '.join(COMPRESSIONS)}"
            )
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ConfigurationError(f"chunk_size={chunk_size!r} must be a positive int (bytes)")
        self.path = path
        self._file: IO[bytes] = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._writer = Writer(
            self._file, chunk_size=chunk_size, compression=COMPRESSIONS[compression]
        )
        self._writer.start(profile="", library="ezflow")
        self._codec = codec if codec is not None else Codec()
        self._topics: dict[str, tuple[Mapping, int]] = {}  # the latest mapping of a topic
        self._channels: dict[tuple[str, Mapping], int] = {}
        self._schemas: dict[Mapping, int] = {}
        self._closed = False
        self._flushed = time.monotonic()
        #: Messages written, by topic.
        self.counts: dict[str, int] = {}

    def _channel(self, topic: str, mapping: Mapping) -> int:
        channel_id = self._channels.get((topic, mapping))
        if channel_id is None:
            schema_id = self._schemas.get(mapping, 0)
            if mapping.schema_name and not schema_id:
                schema_id = self._writer.register_schema(
                    mapping.schema_name, mapping.schema_encoding, mapping.schema_data
                )
                self._schemas[mapping] = schema_id
            channel_id = self._writer.register_channel(
                topic, mapping.message_encoding, schema_id, metadata={}
            )
            self._channels[topic, mapping] = channel_id
        self._topics[topic] = (mapping, channel_id)
        return channel_id

    def write(
        self,
        topic: str,
        message: object,
        *,
        log_time: int | None = None,
        publish_time: int | None = None,
    ) -> None:
        """Append *message* on *topic*, logged at *log_time* and published at
        *publish_time* (unix ns; default: now, and the log time). Raises what the codec
        raises for a message it cannot encode (the ``ezflow`` fallback), and
        :class:`ValueError` after :meth:`close`."""
        if self._closed:
            raise ValueError(f"{self.path}: the MCAP writer is closed")
        now = time.time_ns() if log_time is None else log_time
        stamp = now if publish_time is None else publish_time
        known = self._topics.get(topic)
        data: bytes | None = None
        if known is not None:
            mapping, channel_id = known
            try:
                data = encode_message(message, mapping, stamp, self._codec)
            except NotMappable:
                data = None
        if data is None:
            mapping = mapping_for(message)
            channel_id = self._channel(topic, mapping)
            data = encode_message(message, mapping, stamp, self._codec)
        self._writer.add_message(channel_id, log_time=now, data=data, publish_time=stamp)
        self.counts[topic] = self.counts.get(topic, 0) + 1
        if time.monotonic() - self._flushed >= MCAP_FLUSH_INTERVAL:
            self.flush()

    def flush(self) -> None:
        """Finish the chunk in progress and flush it to the file (smaller chunks compress
        worse: for a recording that must survive a kill, not for every message). A
        chunk is finished at least every ``MCAP_FLUSH_INTERVAL`` seconds anyway."""
        self._writer.flush()  # type: ignore[no-untyped-call]
        self._flushed = time.monotonic()

    def sync(self) -> None:
        """:meth:`flush`, then ``fsync`` the file: what was written is on the disk."""
        self.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Write the index and summary and close the file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.finish()  # type: ignore[no-untyped-call]
        finally:
            self._file.close()

    def __enter__(self) -> McapWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class McapReader:
    """Reads the messages of the MCAP file *path* in log-time order (of *topics* only,
    if given), as :class:`RecordedMessage`. Iterating opens the file; each iteration
    reads it again.

    Raises :class:`~ezflow.ProtocolError` naming the file: for a file that is not MCAP,
    for a message that does not decode (naming its topic), and, after yielding every
    message before it, where a file was cut (a writer killed before it closed). Channels
    of encodings ezflow does not read are skipped: :attr:`skipped` counts their messages
    by topic, :attr:`skipped_encodings` names each one's encoding."""

    def __init__(self, path: str, *, topics: Iterable[str] | None = None) -> None:
        self.path = path
        self.topics = None if topics is None else set(topics)
        self.skipped: dict[str, int] = {}
        self.skipped_encodings: dict[str, str] = {}
        self._codec = Codec()

    def _records(self, file: IO[bytes]) -> Iterator[tuple[Schema | None, Channel, Message]]:
        reader = SeekingReader(file)
        try:
            summary = reader.get_summary()
        except Exception:  # no footer or summary: the file was cut, or written unindexed
            summary = None
        topics = None if self.topics is None else sorted(self.topics)
        if summary is not None and summary.chunk_indexes:
            yield from reader.iter_messages(topics=topics, log_time_order=True)
            return
        # No index (a writer that did not finish): read it through, in file order.
        file.seek(0, io.SEEK_SET)
        yield from NonSeekingReader(file).iter_messages(topics=topics, log_time_order=False)

    def __iter__(self) -> Iterator[RecordedMessage]:
        path = self.path
        with open(path, "rb") as file:
            if file.read(len(MCAP_MAGIC)) != MCAP_MAGIC:
                raise ProtocolError(
                    f"{path} is not an MCAP file (it does not start with the MCAP magic "
                    "\\x89MCAP0\\r\\n)"
                )
            file.seek(0, io.SEEK_SET)
            read = 0
            records = self._records(file)
            while True:
                try:
                    schema, channel, record = next(records)
                except StopIteration:
                    return
                except Exception as exc:  # the mcap library's many ways to say "cut"
                    raise ProtocolError(
                        f"{path} was cut or is damaged after {read} readable messages (a "
                        f"recording whose writer did not finish?): {type(exc).__name__}: "
                        f"{exc}"
                    ) from exc
                message = self._decode(schema, channel, record)
                if message is _SKIP:
                    continue
                read += 1
                yield RecordedMessage(channel.topic, record.log_time, record.publish_time, message)

    def _decode(self, schema: Schema | None, channel: Channel, record: Message) -> Any:
        topic = channel.topic
        if topic in self.skipped_encodings:
            self.skipped[topic] += 1
            return _SKIP
        schema_name = schema.name if schema is not None else ""
        try:
            return decode_message(schema_name, channel.message_encoding, record.data, self._codec)
        except NotMappable as exc:
            self.skipped_encodings[topic] = channel.message_encoding
            self.skipped[topic] = 1
            log.warning("%s: skipping topic %s: %s", self.path, topic, exc)
            return _SKIP
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(
                f"{self.path}: a message of topic {topic} ({schema_name or 'no schema'}, "
                f"{channel.message_encoding or 'no encoding'}) logged at {record.log_time} "
                f"does not decode: {exc}"
            ) from exc


_SKIP: Final[Any] = object()


def summary(path: str) -> dict[str, Any]:
    """What an MCAP file holds, without reading its messages when it has a summary:
    ``{"topics": {topic: {"messages", "schema", "encoding"}}, "messages", "start",
    "end"}`` (times in unix ns). Raises :class:`~ezflow.ProtocolError` as
    :class:`McapReader` does."""
    with open(path, "rb") as file:
        if file.read(len(MCAP_MAGIC)) != MCAP_MAGIC:
            raise ProtocolError(f"{path} is not an MCAP file")
        file.seek(0, io.SEEK_SET)
        with contextlib.suppress(Exception):
            found = SeekingReader(file).get_summary()
            if found is not None and found.statistics is not None:
                stats = found.statistics
                topics: dict[str, dict[str, Any]] = {}
                for channel_id, channel in found.channels.items():
                    entry = topics.setdefault(
                        channel.topic, {"messages": 0, "schema": "", "encoding": ""}
                    )
                    entry["messages"] += stats.channel_message_counts.get(channel_id, 0)
                    schema = found.schemas.get(channel.schema_id)
                    entry["schema"] = schema.name if schema is not None else ""
                    entry["encoding"] = channel.message_encoding
                return {
                    "topics": topics,
                    "messages": stats.message_count,
                    "start": stats.message_start_time,
                    "end": stats.message_end_time,
                }
    raise ProtocolError(f"{path} has no MCAP summary (a recording whose writer did not finish)")
