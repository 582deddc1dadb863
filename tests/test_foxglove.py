"""ezflow.foxglove live: ``ezflow foxglove`` on a running graph, watched by a real
Foxglove WebSocket client (tests/_foxglove_client.py: RFC 6455 and
``foxglove.websocket.v1`` from their specs), and the message mapping it shares with MCAP.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from _foxglove_client import FoxgloveClient
from _proc import Child
from _waiting import wait_until
from conftest import loop_kind
from foxglove.messages import RawImage, Timestamp

import ezflow
from ezflow._core._config import FOXGLOVE_BACKLOG, FOXGLOVE_BUSY_BYTES, FOXGLOVE_STOP_TIMEOUT
from ezflow._foxglove._mapping import image_parts
from ezflow._foxglove._server import _accepted
from ezflow.foxglove import (
    FoxgloveServer,
    decode_message,
    encode_message,
    image_encoding,
    mapping_for,
)

H, W = 24, 32  # small frames: the 4K figures are `ezflow perf foxglove`'s
#: The live tests run one loop: the server is its own process, on its own loop.
ONE_LOOP = pytest.mark.asyncio(loop_factories=["asyncio"])


def frame(seq: int) -> np.ndarray:
    """Frame *seq*: a gradient, its seq in the first pixel."""
    out = (np.arange(H * W * 3, dtype=np.uint32).reshape(H, W, 3) + seq) % 251
    out = out.astype(np.uint8)
    out[0, 0, 0] = seq % 251  # (so that frame(out[0, 0, 0]) is this frame again)
    return out


def block(seq: int) -> np.ndarray:
    return np.arange(16.0) + 16.0 * seq


# -- the mapping (shared with MCAP) -----------------------------------------------------


@pytest.mark.parametrize(
    ("array", "encoding"),
    [
        (np.zeros((4, 6), np.uint8), "mono8"),
        (np.zeros((4, 6, 3), np.uint8), "rgb8"),
        (np.zeros((4, 6, 4), np.uint8), "rgba8"),
        (np.zeros((4, 6), np.uint16), "mono16"),
        (np.zeros((4, 6, 3), np.uint16), "rgb16"),
        (np.zeros((4, 6), np.float32), "32FC1"),
        (np.zeros((4, 6), np.float64), None),  # samples x channels: a time series
        (np.zeros((4, 6, 2), np.uint8), None),
        (np.zeros(8, np.uint8), None),
    ],
)
def test_image_shaped_arrays_are_raw_images(array: np.ndarray, encoding: str | None) -> None:
    assert image_encoding(array) == encoding
    assert mapping_for(array).schema_name == ("foxglove.RawImage" if encoding else "ezflow.Array")


def test_raw_images_are_the_sdks_bytes_and_read_back() -> None:
    rng = np.random.default_rng(1)
    for array in (
        rng.integers(0, 256, (5, 7, 3), np.uint8),
        rng.integers(0, 65536, (5, 7), np.uint16),
        rng.random((5, 7), np.float32),
        rng.integers(0, 256, (10, 14, 4), np.uint8)[::2, ::2],  # not contiguous
    ):
        mapping = mapping_for(array)
        ours = encode_message(array, mapping, 12_000_000_034)
        sdk = RawImage(
            timestamp=Timestamp(sec=12, nsec=34),
            width=array.shape[1],
            height=array.shape[0],
            encoding=image_encoding(array) or "",
            step=array.shape[1] * array.itemsize * (array.shape[2] if array.ndim == 3 else 1),
            data=np.ascontiguousarray(array).tobytes(),
        ).encode()
        assert ours == sdk
        back = decode_message(mapping.schema_name, mapping.message_encoding, ours)
        assert back.dtype == array.dtype
        np.testing.assert_array_equal(back, array)


@ezflow.message(name="tests.foxglove.Reading")
@dataclasses.dataclass(frozen=True)
class Reading:
    name: str
    value: float
    samples: np.ndarray


@ezflow.message(name="tests.foxglove.Camera")
@dataclasses.dataclass(frozen=True)
class Camera:
    seq: int
    frame: np.ndarray


MESSAGES: list[Any] = [
    np.arange(10.0),
    np.arange(12, dtype=np.int32).reshape(3, 4),
    np.array([1.0, np.nan, -np.inf]),  # not finite: base64, exact
    np.arange(70_000, dtype=np.float32),  # beyond FOXGLOVE_JSON_LIST_MAX: base64
    np.float32(2.5),
    Reading("x", 1.5, np.arange(3.0)),
    (7, np.zeros((2, 2), np.uint8), "seven"),
    [1, (2, b"\x00\xff"), {"a": None}],
    {"dtype": 1, "shape": 2, "data": 3},  # looks like an array: wrapped, still a dict
    {"nested": Reading("y", float("inf"), np.zeros(0))},
    3,
    "text",
    None,
    b"raw bytes",
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_json_mapped_message_comes_back_exactly(message: Any) -> None:
    mapping = mapping_for(message)
    data = encode_message(message, mapping, 0)
    if mapping.message_encoding == "json":
        json.loads(data)  # standard JSON: no NaN, no Infinity
    back = decode_message(mapping.schema_name, mapping.message_encoding, data)
    _assert_same(back, message)


def _assert_same(got: Any, want: Any) -> None:
    assert type(got) is type(want), (got, want)
    if isinstance(want, np.ndarray | np.generic):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, tuple | list):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _assert_same(a, b)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            _assert_same(got[key], want[key])
    elif dataclasses.is_dataclass(want):
        for field in dataclasses.fields(want):
            _assert_same(getattr(got, field.name), getattr(want, field.name))
    else:
        assert got == want


def test_axis_arrays_are_json_with_their_axes() -> None:
    axisarray = pytest.importorskip("ezmsg.util.messages.axisarray")
    message = axisarray.AxisArray(
        np.arange(12.0).reshape(6, 2),
        dims=["time", "ch"],
        axes={"time": axisarray.AxisArray.TimeAxis(fs=100.0, offset=1.5)},
        key="eeg",
    )
    mapping = mapping_for(message)
    assert mapping.schema_name == "ezmsg.util.messages.axisarray.AxisArray"
    assert json.loads(mapping.schema_data)["properties"]["data"]["type"] == "object"
    data = encode_message(message, mapping, 0)
    body = json.loads(data)
    assert body["data"]["data"][:3] == [0.0, 1.0, 2.0]  # Plot: .data.data[:]
    assert body["axes"]["time"]["gain"] == 0.01
    _assert_same(decode_message(mapping.schema_name, "json", data), message)


def test_messages_without_an_exact_json_form_fall_back_to_the_codec() -> None:
    for message in (np.array([1 + 2j]), {1: "int key"}, (np.array([1j]),)):
        mapping = mapping_for(message)
        assert mapping.message_encoding == "ezflow" and not mapping.viewable
        back = decode_message("", "ezflow", encode_message(message, mapping, 0))
        assert repr(back) == repr(message)


def test_dataclass_schema_names_its_fields() -> None:
    mapping = mapping_for(Reading("x", 1.0, np.zeros(2)))
    assert mapping.schema_name == "tests.foxglove.Reading"
    schema = json.loads(mapping.schema_data)
    assert schema["properties"]["value"] == {"type": "number"}
    assert schema["properties"]["samples"]["properties"]["data"]["type"] == "array"


def test_images_inside_tuples_and_dataclasses_are_parts_of_their_own() -> None:
    image = np.zeros((4, 6, 3), np.uint8)
    message = (7, image, np.zeros((2, 2), np.float64), image[..., 0])
    parts = image_parts(message)
    assert [suffix for suffix, _ in parts] == ["[1]", "[3]"]  # (float64 H x W is no image)
    for _, take in parts:
        assert image_encoding(take(message)) is not None
    camera = Camera(3, image)
    assert [(suffix, take(camera) is image) for suffix, take in image_parts(camera)] == [
        (".frame", True)
    ]
    assert image_parts(Reading("x", 1.0, np.zeros(2))) == []  # a 1-D array is no image
    assert image_parts(image) == [] and image_parts({"frame": image}) == []


# -- the live server ----------------------------------------------------------------------


async def _publish(ctx: ezflow.GraphContext, stop: asyncio.Event, rate: float) -> None:
    camera = await ctx.publisher("/camera")
    signal = await ctx.publisher("/signal")
    framed = await ctx.publisher("/framed")  # a frame with its number, as examples do
    seq = 0
    while not stop.is_set():
        await camera.publish(frame(seq))
        await signal.publish(block(seq))
        await framed.publish((seq, frame(seq)))
        seq += 1
        await asyncio.sleep(1 / rate)
    await camera.aclose()
    await signal.aclose()
    await framed.aclose()


@contextlib.asynccontextmanager
async def foxglove_command(
    address: str, started: list[asyncio.subprocess.Process] | None = None
) -> AsyncIterator[tuple[str, int, str]]:
    """``ezflow foxglove`` on *address*: (host, ws port, page URL) from its startup line
    (and its process appended to *started*)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ezflow",
        "foxglove",
        "--address",
        address,
        "--port",
        "0",
        "--http-port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert process.stdout is not None
    if started is not None:
        started.append(process)
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        found = re.search(r"ws://([\d.]+):(\d+) .* open (http://\S+/)", line)
        assert found, line
        yield found[1], int(found[2]), found[3]
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _advertised(client: FoxgloveClient, *topics: str) -> None:
    async def wait() -> None:
        while not all(t in client.channels for t in topics):
            await client.next_frame()

    await asyncio.wait_for(wait(), 20)


async def _http_get(url: str) -> str:
    host, port = re.match(r"http://([\d.]+):(\d+)/", url).groups()  # type: ignore[union-attr]
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    return data.decode()


async def _viewer_subscriptions(ctx: ezflow.GraphContext, topic: str) -> list[dict[str, Any]]:
    graph = await ctx.graph()
    ours = {c["client_id"] for c in graph["clients"] if c.get("name") == "ezflow foxglove"}
    return [s for s in graph["subscribers"] if s["topic"] == topic and s["client_id"] in ours]


async def _viewer_subscribers(ctx: ezflow.GraphContext, topic: str) -> int:
    return len(await _viewer_subscriptions(ctx, topic))


@ONE_LOOP
async def test_a_viewer_receives_the_published_images_and_time_series(
    ctx: ezflow.GraphContext, server: ezflow.GraphServer
) -> None:
    stop = asyncio.Event()
    publishing = asyncio.create_task(_publish(ctx, stop, rate=100))
    address = f"{server.address[0]}:{server.address[1]}"
    started: list[asyncio.subprocess.Process] = []
    try:
        async with foxglove_command(address, started) as (host, port, page_url):
            client = await FoxgloveClient.connect(host, port)
            try:
                await _advertised(client, "/camera", "/signal", "/ezflow/graph", "/framed[1]")
                # Every thread of the command (the SDK's too) at the idle CPU priority.
                threads = os.listdir(f"/proc/{started[0].pid}/task")
                assert len(threads) > 1
                assert {os.sched_getscheduler(int(tid)) for tid in threads} == {os.SCHED_IDLE}
                # A tuple holding an image: its JSON, and the image as a channel of its own.
                assert client.channels["/framed"]["schemaName"] == "ezflow.Tuple"
                assert client.channels["/framed[1]"]["schemaName"] == "foxglove.RawImage"
                assert client.channels["/ezflow/graph"]["schemaName"] == "ezflow.Graph"
                assert client.channels["/camera"]["schemaName"] == "foxglove.RawImage"
                assert client.channels["/camera"]["encoding"] == "protobuf"
                assert client.channels["/signal"]["schemaName"] == "ezflow.Array"
                assert client.channels["/signal"]["encoding"] == "json"
                # Advertised, not subscribed: the graph has no subscriber of the viewer's.
                await wait_until(
                    lambda: _zero(_viewer_subscribers(ctx, "/camera")), "the peek closed"
                )
                await client.subscribe(1, "/camera")
                await client.subscribe(2, "/signal")
                await client.subscribe(3, "/ezflow/graph")
                await client.subscribe(4, "/framed[1]")
                images, blocks, graphs = await _receive(client, want=5)
                assert {4} <= {subscription for subscription, _ in images}
                # The graph's picture as a topic: its topics, with their rates.
                assert {"/camera", "/signal"} <= set(graphs[0]["topics"])
                assert graphs[0]["topics"]["/camera"]["publishers"] == 1
                assert {1} <= {subscription for subscription, _ in images}
                for _, got in images:
                    np.testing.assert_array_equal(got, frame(int(got[0, 0, 0])))
                for got in blocks:
                    np.testing.assert_array_equal(got, block(int(got[0]) // 16))
                assert await _viewer_subscribers(ctx, "/camera") == 1
                # Unsubscribed: the subscriber feeding the channel is gone.
                await client.unsubscribe(1)
                await wait_until(
                    lambda: _zero(_viewer_subscribers(ctx, "/camera")),
                    "the viewer's subscriber closed after unsubscribe",
                )
                page = await _http_get(page_url)
                assert "200 OK" in page and "<svg" in page
                assert f"ws://{host}:{port}" in page and "app.foxglove.dev" in page
            finally:
                await client.close()
    finally:
        stop.set()
        await publishing


async def _zero(count: Any) -> bool:
    return await count == 0


async def _receive(client: FoxgloveClient, want: int) -> tuple[list[Any], list[Any], list[Any]]:
    images: list[tuple[int, np.ndarray]] = []  # (subscription, image)
    blocks: list[np.ndarray] = []
    graphs: list[dict[str, Any]] = []

    async def take() -> None:
        while len(images) < 2 * want or len(blocks) < want or not graphs:
            item = await client.next_frame()
            if isinstance(item, tuple):
                subscription, log_time, payload = item
                assert abs(log_time - time.time_ns()) < 60e9
                if subscription in (1, 4):
                    image = decode_message("foxglove.RawImage", "protobuf", payload)
                    images.append((subscription, image))
                elif subscription == 2:
                    blocks.append(decode_message("ezflow.Array", "json", payload))
                elif subscription == 3:
                    graphs.append(json.loads(payload))

    await asyncio.wait_for(take(), 30)
    return images, blocks, graphs


SIZE = FOXGLOVE_BUSY_BYTES  # bytes of an int64 array: the smallest held for a busy viewer


@ONE_LOOP
async def test_a_viewer_that_never_reads_does_not_slow_the_graph(
    ctx: ezflow.GraphContext, server: ezflow.GraphServer
) -> None:
    """A publisher in its own process (256 KiB messages at 200/s) and a lossless
    subscriber here: their rate with a viewer that subscribed and never reads, against
    the same without a viewer, in one run. Once the viewer's connection is full, the
    server writes nothing more for it (held, counted); stopping with the viewer still
    connected is bounded."""
    address = f"{server.address[0]}:{server.address[1]}"
    publisher = await Child.start(
        "publish_forever", loop_kind(), address=address, topic="/frames", size=SIZE // 8, pace=0.005
    )
    try:
        receiver = await ctx.subscriber("/frames")
        await publisher.event("ready")
        latest = [0]

        async def take() -> None:  # the graph's own lossless subscriber, always taking
            async for message in receiver:
                latest[0] = int(message[0])

        async def rate(seconds: float) -> float:
            first, started = latest[0], time.monotonic()
            await asyncio.sleep(seconds)
            return (latest[0] - first) / (time.monotonic() - started)

        taking = asyncio.create_task(take())

        started: list[asyncio.subprocess.Process] = []
        async with foxglove_command(address, started) as (host, port, _):
            client = await FoxgloveClient.connect(host, port)
            try:
                await _advertised(client, "/frames")
                alone = await rate(1.5)
                await client.subscribe(1, "/frames")  # ... and never reads again
                await wait_until(lambda: _viewer_count(ctx), "the viewer's subscriber")
                watched = await rate(1.5)
                leaky = [s["leaky"] for s in await _viewer_subscriptions(ctx, "/frames")]
                # Stopped with that viewer still connected, its socket full (the SDK's
                # own stop waits for such a viewer for ever): bounded, and said.
                command = started[0]
                stopping = time.monotonic()
                command.terminate()
                await asyncio.wait_for(command.wait(), 2 * FOXGLOVE_STOP_TIMEOUT + 10)
                stop_took = time.monotonic() - stopping
                assert command.stderr is not None and command.stdout is not None
                said = (await command.stderr.read()).decode()
                summary = (await command.stdout.read()).decode()
            finally:
                await client.close()
        taking.cancel()
    finally:
        await publisher.aclose()
    ratio = alone / watched
    print(f"slow viewer: {alone:.0f} msg/s alone, {watched:.0f} msg/s watched, x{ratio:.2f}")
    # A viewer that held the graph back would stop it (a lossless subscriber that never
    # reads stalls its publisher within max_in_flight messages: ratio -> infinity); what
    # remains is the CPU the viewer's process spends encoding on a 2-core host shared
    # with other work (it runs at nice 10). The report has the figures.
    assert ratio < 2.0, (alone, watched)
    assert leaky == [True]
    assert command.returncode == 0, said
    assert stop_took < 2 * FOXGLOVE_STOP_TIMEOUT + 5, said
    # What the viewer's socket and the SDK's backlog take (loopback buffers: a few MiB
    # each way), then nothing more: the rest is held, not copied for nobody.
    found = re.search(r"/frames: \S+, (\d+) sent, \d+ dropped, (\d+) held", summary)
    assert found, summary
    sent, held = int(found[1]), int(found[2])
    assert held > 0 and sent <= FOXGLOVE_BACKLOG + (16 << 20) // SIZE, summary


async def _viewer_count(ctx: ezflow.GraphContext) -> bool:
    return await _viewer_subscribers(ctx, "/frames") == 1


@ONE_LOOP
async def test_a_stop_with_a_viewer_that_stopped_reading_is_bounded(
    ctx: ezflow.GraphContext, caplog: pytest.LogCaptureFixture
) -> None:
    """Messages a busy viewer is not spared (JSON of 1 MiB, not an array) fill its
    socket and the SDK's backlog: the SDK's own stop would wait for that viewer for
    ever (foxglove-sdk 0.30). The server's stop shuts its connection down and says so."""
    publisher = await ctx.publisher("/notes")
    note = {"text": "x" * (1 << 20)}

    async def publish(count: int | None) -> None:
        sent = 0
        while count is None or sent < count:
            await publisher.publish(note)
            sent += 1
            await asyncio.sleep(0.005)

    async with FoxgloveServer(ctx, port=0, backlog=4) as viewer_server:
        client = await FoxgloveClient.connect("127.0.0.1", viewer_server.port)
        try:
            peeked = asyncio.create_task(publish(None))  # until the server has seen one
            try:
                await _advertised(client, "/notes")
                await client.subscribe(1, "/notes")  # ... and never reads again
                await wait_until(lambda: _viewer_count_of(ctx, "/notes"), "its subscriber")
            finally:
                peeked.cancel()
            await publish(60)  # 60 MiB: more than the socket buffers and the backlog
            started = time.monotonic()
            with caplog.at_level("WARNING", logger="ezflow.foxglove"):
                await asyncio.wait_for(viewer_server.aclose(), 2 * FOXGLOVE_STOP_TIMEOUT + 10)
            took = time.monotonic() - started
        finally:
            await client.close()
    assert took < 2 * FOXGLOVE_STOP_TIMEOUT + 5
    assert "1 viewer connection(s) did not take their messages" in caplog.text


def test_looking_at_the_viewers_connections_leaves_no_descriptor() -> None:
    """The server looks at every descriptor of its process for the viewers' sockets
    (each check of a busy viewer, each stop): files, pipes and sockets of other ports
    are passed over, and no duplicate is left open."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        port = listener.getsockname()[1]
        viewer = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
        accepted, _ = listener.accept()
        stack.enter_context(accepted)
        stack.enter_context(open(__file__, "rb"))  # a file
        read_end, write_end = os.pipe()  # a pipe
        stack.callback(os.close, read_end)
        stack.callback(os.close, write_end)
        before = sorted(os.listdir("/proc/self/fd"))
        for _ in range(20):
            found = [fd for fd, _ in _accepted(port)]
            assert found == [accepted.fileno()]  # not the listener, not the client's end
            for _ in _accepted(port):
                break  # (a caller that stops early)
        assert sorted(os.listdir("/proc/self/fd")) == before
        assert viewer.fileno() not in found


async def _viewer_count_of(ctx: ezflow.GraphContext, topic: str) -> bool:
    graph = await ctx.graph()
    return any(s["topic"] == topic and s["leaky"] for s in graph["subscribers"])


def test_perf_foxglove_measures_mcap_writes(tmp_path: Any) -> None:
    """`ezflow perf foxglove` (the viewer's 4K cell is run by hand: docs/foxglove.md)."""
    result = subprocess.run(
        [sys.executable, "-m", "ezflow", "perf", "foxglove", "--no-viewer", "--rounds", "1",
         "--mcap-messages", "16", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for cell in ("write() floor", "mapping only", "mcap none", "mcap lz4", "mcap zstd"):
        assert re.search(rf"{re.escape(cell)} +\d+\.\d .* GB/s", result.stdout), result.stdout
    assert list(tmp_path.iterdir()) == []  # its files are gone
    bad = subprocess.run(
        [sys.executable, "-m", "ezflow", "perf", "foxglove", "--rounds", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "--rounds" in bad.stderr
