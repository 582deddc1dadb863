"""The graph server: handshake, requests, routing, and hostile input on its port."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import re
import signal
import struct
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from _proc import Child
from _rawpeer import closed_by_peer
from conftest import loop_kind, without_shm_notices

import ezflow
from ezflow._core._config import BAD_PEER_LOG_FIRST, BAD_PEER_LOG_INTERVAL
from ezflow._core._protocol import PROTOCOL
from ezflow._graph import _server


def frame(message: object) -> bytes:
    body = msgpack.packb(message)
    return struct.pack("<I", len(body)) + body


HELLO = {"op": "hello", "protocol": PROTOCOL, "pid": 1, "host_id": "h", "name": "raw"}


async def read_message(reader: asyncio.StreamReader) -> dict:
    (size,) = struct.unpack("<I", await reader.readexactly(4))
    return msgpack.unpackb(await reader.readexactly(size))


async def assert_still_serving(server: ezflow.GraphServer) -> None:
    async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
        sub = await ctx.subscriber("/alive")
        pub = await ctx.publisher("/alive")
        await pub.publish(1)
        assert await sub.recv() == 1


async def test_handshake_and_ping(server: ezflow.GraphServer) -> None:
    reader, writer = await asyncio.open_connection(*server.address)
    writer.write(frame(HELLO))
    welcome = await read_message(reader)
    assert welcome["op"] == "welcome" and welcome["protocol"] == PROTOCOL
    writer.write(frame({"op": "ping", "id": 7}))
    assert await read_message(reader) == {"op": "reply", "id": 7, "ok": True}
    writer.close()


async def test_wrong_protocol_version_is_refused_with_reason(server: ezflow.GraphServer) -> None:
    reader, writer = await asyncio.open_connection(*server.address)
    writer.write(frame({**HELLO, "protocol": "ezflow/99"}))
    error = await read_message(reader)
    assert error["op"] == "error" and "ezflow/99" in error["error"]
    assert await closed_by_peer(reader)
    writer.close()


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
        pytest.param(struct.pack("<I", 0xFFFFFFFF) + b"\x00" * 64, id="4GB-header"),
        pytest.param(struct.pack("<I", 10) + b"\xc1" * 10, id="not-msgpack"),
        pytest.param(frame([1, 2, 3]), id="not-a-map"),
        pytest.param(frame({"op": "ping", "id": 1}), id="request-before-hello"),
        pytest.param(frame(HELLO) + frame({"op": "explode", "id": 1}), id="unknown-command"),
        pytest.param(frame(HELLO) + frame({"op": "connect", "id": "x"}), id="bad-field"),
        pytest.param(
            frame(HELLO) + struct.pack("<I", 1 << 30) + b"\x00" * 100, id="1GB-after-hello"
        ),
    ],
)
async def test_bad_input_closes_only_that_connection(
    server: ezflow.GraphServer, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async with ezflow.GraphContext(server.address, auto_start=False) as bystander:
        sub = await bystander.subscriber("/b")
        pub = await bystander.publisher("/b")
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(payload)
        assert await closed_by_peer(reader)
        writer.close()
        await pub.publish("still here")
        assert await sub.recv() == "still here"
        await bystander.connect("/b", "/c")  # the bystander's control connection works
    assert "closing connection" in caplog.text
    await assert_still_serving(server)


async def read_until_closed(reader: asyncio.StreamReader, timeout: float) -> list[Any]:
    """Every message the server sends until it closes the connection (within
    *timeout*, else TimeoutError)."""
    data = bytearray()
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), timeout):
            data += chunk
    messages, at = [], 0
    while at + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, at)
        messages.append(msgpack.unpackb(bytes(data[at + 4 : at + 4 + size])))
        at += 4 + size
    return messages


@pytest.mark.parametrize(
    ("payload", "told"),
    [
        pytest.param(
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            [{"op": "error", "cause": "protocol", "error": "look like an HTTP request"}],
            id="http",
        ),
        pytest.param(
            struct.pack("<I", 0xFFFFFFFF),
            [{"op": "error", "error": "frame header claims 4294967295 bytes"}],
            id="4GB-header",
        ),
        pytest.param(
            frame({"op": "ping", "id": 1}),
            [{"op": "error", "error": "expected 'hello' first, got 'ping'"}],
            id="request-before-hello",
        ),
        pytest.param(
            frame({**HELLO, "pid": "one"}),
            [{"op": "error", "error": "'hello' message field 'pid' must be int, got str"}],
            id="bad-hello",
        ),
        pytest.param(
            frame(HELLO) + frame({"op": "register_publisher", "id": 3}),
            [
                {"op": "welcome"},
                {"op": "reply", "id": 3, "ok": False, "error": "field 'publisher_id' must be"},
            ],
            id="malformed-request",
        ),
        pytest.param(
            frame(HELLO) + frame({"op": "explode", "id": 1}),
            [{"op": "welcome"}, {"op": "error", "error": "unknown command 'explode'"}],
            id="unknown-command",
        ),
        pytest.param(
            frame(HELLO) + struct.pack("<I", 1 << 30),
            [{"op": "welcome"}, {"op": "error", "error": "claims 1073741824 bytes"}],
            id="1GB-after-hello",
        ),
    ],
)
async def test_a_bad_peer_is_told_why_before_the_close(
    server: ezflow.GraphServer, payload: bytes, told: list[dict[str, Any]]
) -> None:
    reader, writer = await asyncio.open_connection(*server.address)
    writer.write(payload)
    messages = await read_until_closed(reader, 5)
    writer.close()
    assert len(messages) == len(told), messages
    for message, expected in zip(messages, told, strict=True):
        for key, value in expected.items():
            if key == "error":
                assert value in message[key], message
            else:
                assert message[key] == value, message
    await assert_still_serving(server)


async def test_truncated_frame_then_disconnect(server: ezflow.GraphServer) -> None:
    _, writer = await asyncio.open_connection(*server.address)
    writer.write(frame(HELLO)[:7])
    await writer.drain()
    writer.close()
    await asyncio.sleep(0.05)  # a window for the server to trip over the torn frame
    await assert_still_serving(server)


async def test_silent_connection_is_dropped_after_handshake_timeout(
    server: ezflow.GraphServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_server, "HANDSHAKE_TIMEOUT", 0.2)
    reader, writer = await asyncio.open_connection(*server.address)
    assert await closed_by_peer(reader, timeout=3)
    writer.close()


async def test_connection_limit(
    server: ezflow.GraphServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_server, "MAX_SERVER_CONNECTIONS", 3)
    held = [await asyncio.open_connection(*server.address) for _ in range(3)]
    reader, writer = await asyncio.open_connection(*server.address)
    assert await closed_by_peer(reader)
    assert server.rejected_connections == 1
    for _, w in [*held, (reader, writer)]:
        w.close()


async def test_registrations_die_with_connection(server: ezflow.GraphServer) -> None:
    async with ezflow.GraphContext(server.address, auto_start=False) as observer:
        async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
            await ctx.publisher("/p")
            await ctx.subscriber("/s")
            await ctx.connect("/p", "/s")
            graph = await observer.graph()
            assert len(graph["publishers"]) == 1 and graph["edges"] == [["/p", "/s"]]
        await asyncio.sleep(0.05)
        graph = await observer.graph()
        assert graph["publishers"] == graph["subscribers"] == graph["edges"] == []
        assert len(graph["clients"]) == 1


async def test_a_known_id_is_accepted_again_from_its_process_only(
    server: ezflow.GraphServer,
) -> None:
    """Ids are kept across reconnections: the server accepts a registration of a known
    id from the same connection (a retry) or from another connection of the same
    process (its old one is stale), moving it; another process gets a clear refusal."""
    register = {"op": "register_publisher", "publisher_id": "p-1", "topic": "/k"}
    register["address"] = ["127.0.0.1", 9]
    first = await asyncio.open_connection(*server.address)
    first[1].write(frame({**HELLO, "pid": 10}) + frame({**register, "id": 1}))
    assert (await read_message(first[0]))["op"] == "welcome"
    assert (await read_message(first[0]))["ok"]
    first[1].write(frame({**register, "id": 2}))  # the same connection again: a retry
    assert (await read_message(first[0]))["ok"]
    other = await asyncio.open_connection(*server.address)
    other[1].write(frame({**HELLO, "pid": 11}) + frame({**register, "id": 1}))
    assert (await read_message(other[0]))["op"] == "welcome"
    refused = await read_message(other[0])
    assert not refused["ok"]
    assert "'p-1' is already registered by client" in refused["error"]
    assert "pid 10" in refused["error"]
    same = await asyncio.open_connection(*server.address)
    same[1].write(frame({**HELLO, "pid": 10}) + frame({**register, "id": 1}))
    welcome = await read_message(same[0])
    assert (await read_message(same[0]))["ok"]
    publishers = server.snapshot()["publishers"]
    assert [(p["id"], p["client_id"]) for p in publishers] == [("p-1", welcome["client_id"])]
    first[1].close()  # the stale connection goes: the moved registration stays
    for _ in range(500):  # up to 5 s
        if len(tuple(server.clients)) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(tuple(server.clients)) == 2
    assert [p["id"] for p in server.snapshot()["publishers"]] == ["p-1"]
    for _, writer in (other, same):
        writer.close()


async def test_routes_follow_edges_and_cycles(server: ezflow.GraphServer) -> None:
    async with ezflow.GraphContext(server.address, auto_start=False) as ctx:
        pub_a = await ctx.publisher("/a")
        pub_b = await ctx.publisher("/b")
        sub_a = await ctx.subscriber("/a")
        sub_b = await ctx.subscriber("/b")
        await ctx.connect("/a", "/b")
        await ctx.connect("/b", "/a")  # a cycle is fine: topics reach each other
        await pub_a.publish("from a")
        await pub_b.publish("from b")
        assert {await sub_a.recv(), await sub_a.recv()} == {"from a", "from b"}
        assert {await sub_b.recv(), await sub_b.recv()} == {"from a", "from b"}
        with pytest.raises(ezflow.GraphError, match="itself"):
            await ctx.connect("/a", "/a")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_fuzzing_the_port_of_a_server_process() -> None:
    """Random bytes, truncated frames and huge headers against a real server process:
    each bad connection is closed, the server keeps serving, memory stays flat."""
    child = await Child.start("serve", loop_kind())
    try:
        ready = await child.event("ready")
        host, port = ready["address"].rsplit(":", 1)
        address = (host, int(port))
        rng = random.Random(1234)
        valid = frame(HELLO) + frame({"op": "graph", "id": 1})

        async def attack(payload: bytes) -> None:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(payload)
            try:
                await writer.drain()
                await asyncio.wait_for(reader.read(65536), 0.1)
            except (ConnectionError, asyncio.TimeoutError):
                pass
            writer.close()

        async def round_of_attacks(n: int) -> None:
            payloads = []
            for i in range(n):
                kind = i % 4
                if kind == 0:
                    payloads.append(rng.randbytes(rng.randint(1, 4096)))
                elif kind == 1:
                    payloads.append(valid[: rng.randint(1, len(valid) - 1)])
                elif kind == 2:
                    payloads.append(struct.pack("<I", rng.randint(1 << 24, 0xFFFFFFFF)))
                else:
                    payloads.append(frame(HELLO) + struct.pack("<I", 0xFFFFFFF0) + b"x" * 1000)
            for start in range(0, n, 40):
                await asyncio.gather(*(attack(p) for p in payloads[start : start + 40]))

        await round_of_attacks(400)  # let the allocator reach its working set
        before = rss_kib(child.pid)
        await round_of_attacks(400)
        after = rss_kib(child.pid)
        # A leak of even 10 KiB per connection would show as 4 MiB here; what remains
        # is allocator noise (test_no_objects_left_behind_by_bad_connections shows no
        # Python object survives a bad connection).
        assert after - before < 6 * 1024, f"server RSS grew by {after - before} KiB"
        async with ezflow.GraphContext(address, auto_start=False) as ctx:
            sub = await ctx.subscriber("/after")
            pub = await ctx.publisher("/after")
            await pub.publish("ok")
            assert await sub.recv() == "ok"
    finally:
        await child.aclose()


async def test_shutdown_request_stops_the_server(server: ezflow.GraphServer) -> None:
    serving = asyncio.ensure_future(server.serve_forever())
    reader, writer = await asyncio.open_connection(*server.address)
    writer.write(frame(HELLO) + frame({"op": "shutdown", "id": 1}))
    assert (await read_message(reader))["op"] == "welcome"
    assert await read_message(reader) == {"op": "reply", "id": 1, "ok": True}
    await asyncio.wait_for(serving, 3)
    assert await closed_by_peer(reader)
    writer.close()
    with pytest.raises(ezflow.BrokenResourceError):
        async with ezflow.GraphContext(server.address, auto_start=False):
            pass


async def test_no_objects_left_behind_by_bad_connections(
    server: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="ezflow")  # captured log records are objects too
    payloads = [
        frame(HELLO) + struct.pack("<I", 0xFFFFFFF0),  # handshaken, then a 4 GB header
        frame(HELLO) + frame({"op": "graph", "id": 1})[:5],  # truncated request
        b"\x00" * 100,  # garbage before any handshake
    ]

    async def attack(payload: bytes) -> None:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(payload)
        with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
            await asyncio.wait_for(reader.read(65536), 0.05)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def rounds(n: int) -> None:
        for _ in range(n):
            await asyncio.gather(*(attack(p) for p in payloads for _ in range(10)))

    await rounds(3)
    await asyncio.sleep(0.1)
    gc.collect()
    before = len(gc.get_objects())
    await rounds(10)
    await asyncio.sleep(0.1)
    gc.collect()
    # 300 bad connections; a leak of one object each would be 300
    assert len(gc.get_objects()) - before < 100
    assert server.clients == ()


# -- a flood of garbage against `ezflow serve` ----------------------------------------------

#: The malformed requests an admitted client sends in the flood, in turn.
_MALFORMED = [
    frame({"op": "register_publisher", "id": 1}),  # fields missing
    frame({"op": "connect", "id": 1, "src": 5, "dst": "/x"}),  # a field of the wrong type
    frame({"op": "explode", "id": 1}),  # an unknown command
    frame([1, 2, 3]),  # not a map
]


async def test_a_flood_of_five_kinds_of_garbage_costs_a_bounded_number_of_stderr_lines(
    tmp_path: Path,
) -> None:
    """5,000 bad connections to an `ezflow serve` process, on both sides of the
    handshake: random bytes, an HTTP request and a truncated frame left hanging before
    it; a 4 GB frame header and malformed requests after it. Each is told why it is
    closed, the server's stderr holds at most BAD_PEER_LOG_FIRST lines per cause plus
    the summaries (which count every one), and a normal client is served afterwards."""
    rng = random.Random(24)
    handshake = frame(HELLO)
    kinds: dict[str, tuple[int, Any]] = {
        "random": (1125, lambda i: rng.randbytes(rng.randint(5, 256))),
        "http": (1125, lambda i: b"GET /metrics HTTP/1.1\r\nHost: graph\r\n\r\n"),
        "truncated": (500, lambda i: struct.pack("<I", 100) + b"\x81\xa2op"),
        "4GB-after-hello": (1125, lambda i: handshake + struct.pack("<I", 0xFFFFFFF0)),
        "malformed-after-hello": (1125, lambda i: handshake + _MALFORMED[i % 4]),
    }
    assert sum(count for count, _ in kinds.values()) == 5000
    stderr_path = tmp_path / "serve.stderr"
    env = dict(os.environ, EZFLOW_EVENT_LOOP=loop_kind(), EZFLOW_TOKEN="", EZFLOW_TOKEN_FILE="")
    with stderr_path.open("wb") as stderr:  # a file: a pipe nobody reads would block it
        serve = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ezflow", "serve", "--address", "127.0.0.1:0"),
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    started = time.monotonic()
    try:
        assert serve.stdout is not None
        banner = (await asyncio.wait_for(serve.stdout.readline(), 60)).decode()
        found = re.search(r"listening on (\S+):(\d+);", banner)
        assert found, banner
        address = (found.group(1), int(found.group(2)))
        told: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
        gate = asyncio.Semaphore(64)  # the hanging truncated frames do not take a place

        async def attack(kind: str, payload: bytes) -> None:
            async with contextlib.AsyncExitStack() as stack:
                if kind != "truncated":
                    await stack.enter_async_context(gate)
                reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), 30)
                writer.write(payload)
                messages = await read_until_closed(reader, 30)
                writer.close()
            told[kind].append(messages[-1] if messages else {})

        await asyncio.gather(
            *(attack(kind, make(i)) for kind, (count, make) in kinds.items() for i in range(count))
        )

        def count(kind: str, op: str, error: str) -> int:
            return sum(1 for m in told[kind] if m.get("op") == op and error in m.get("error", ""))

        # Each offender was told why (the random bytes: whatever they amount to).
        assert len(told["random"]) == 1125
        assert count("http", "error", "look like an HTTP request") == 1125
        assert count("truncated", "error", "handshake not done within 5 s") == 500
        assert count("4GB-after-hello", "error", "claims 4294967280 bytes") == 1125
        assert count("malformed-after-hello", "reply", "'publisher_id' must be str") == 282
        assert count("malformed-after-hello", "reply", "'src' must be str, got int") == 281
        assert count("malformed-after-hello", "error", "unknown command 'explode'") == 281
        assert count("malformed-after-hello", "error", "frame is a list, expected a map") == 281
        async with ezflow.GraphContext(address, auto_start=False) as ctx:
            sub = await ctx.subscriber("/after")
            pub = await ctx.publisher("/after")
            await pub.publish("still serving")
            assert await sub.recv() == "still serving"
        serve.send_signal(signal.SIGTERM)  # its summary of what was not logged comes now
        assert await asyncio.wait_for(serve.wait(), 30) == 0
    finally:
        if serve.returncode is None:
            serve.kill()
            await serve.wait()
    elapsed = time.monotonic() - started
    lines = without_shm_notices(stderr_path.read_text()).splitlines()
    assert all("ezflow.server WARNING graph server: " in line for line in lines), lines
    summaries = [line for line in lines if "more bad connections closed" in line]
    # At most one summary per BAD_PEER_LOG_INTERVAL, and one at the stop.
    periods = 1 + int(elapsed // BAD_PEER_LOG_INTERVAL)
    assert 1 <= len(summaries) <= periods + 1, summaries
    totals = {
        cause: int(n)
        for cause, n in re.findall(r"(\w+) (\d+)", summaries[-1].split("totals so far: ")[1])
    }
    assert sum(totals.values()) == 5000, totals  # every one counted, once
    assert {"protocol", "timeout", "request"} <= set(totals), totals
    bound = BAD_PEER_LOG_FIRST * len(totals) * periods + len(summaries)
    assert len(lines) <= bound, "\n".join(lines)
    assert any("closing connection of client c" in line for line in lines)  # after hello
