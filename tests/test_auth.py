"""Authentication and TLS (``ezflow._core._auth``), end to end over real sockets.

Graph port and data ports: the right token is admitted, a wrong or missing one is
refused with :class:`~ezflow.AuthenticationError` on the client and a log line on the
server, and the token appears in no log, error or repr. A non-loopback ``ezflow serve``
without a token refuses to start. TLS (certificates made here with the ``openssl``
command): a graph connection and a tcp edge deliver; a client whose CA did not sign the
server's certificate is refused. Floods of bad connections cost a bounded number of log
lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from _proc import ezflow_cli
from _unit_graphs import Checker, Counter
from _waiting import wait_until
from conftest import loop_kind, without_shm_notices

import ezflow
from ezflow._core._auth import Credentials, TlsFiles, Token
from ezflow._core._channel import Channel
from ezflow._core._codec import Codec
from ezflow._core._config import BAD_PEER_LOG_FIRST
from ezflow._core._inbox import Inbox
from ezflow._core._protocol import PROTOCOL, PublisherInfo
from ezflow._graph._client import GraphClient
from ezflow._transports._tcp import TcpTransport

TOKEN = "s3cret-" + "7f" * 16
OTHER = "other-" + "a1" * 16


def frame(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message)
    return struct.pack("<I", len(body)) + body


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    (size,) = struct.unpack("<I", await asyncio.wait_for(reader.readexactly(4), 5))
    message: dict[str, Any] = msgpack.unpackb(await reader.readexactly(size))
    return message


@pytest.fixture
async def secured() -> AsyncIterator[ezflow.GraphServer]:
    async with ezflow.GraphServer(("127.0.0.1", 0), token=TOKEN) as server:
        yield server


def test_token_hides_itself_and_refuses_short_secrets() -> None:
    token = Token(TOKEN)
    credentials = Credentials(token)
    for text in (repr(token), str(token), repr(credentials), f"{token}"):
        assert TOKEN not in text
        assert "hidden" in text
    with pytest.raises(TypeError):
        __import__("pickle").dumps(token)
    with pytest.raises(ezflow.ConfigurationError, match="at least 16"):
        Token("short")


def test_token_file_must_be_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o644)
    monkeypatch.delenv("EZFLOW_TOKEN", raising=False)
    monkeypatch.setenv("EZFLOW_TOKEN_FILE", str(path))
    with pytest.raises(ezflow.ConfigurationError, match="chmod 600"):
        Credentials.resolve()
    path.chmod(0o600)
    token = Credentials.resolve().token
    assert token is not None
    assert token.check(Token(TOKEN).proof(b"x", b"1", b"2"), b"x", b"1", b"2")


async def test_graph_port_admits_the_token_and_refuses_wrong_or_missing(
    secured: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ezflow")
    async with ezflow.GraphContext(secured.address, auto_start=False, token=TOKEN) as ctx:
        assert (await ctx.graph())["clients"]
    for token, says in ((OTHER, "different tokens"), (None, "requires a token")):
        with pytest.raises(ezflow.AuthenticationError, match=says) as caught:
            async with ezflow.GraphContext(secured.address, auto_start=False, token=token):
                pass
        assert "\n" not in str(caught.value)
    # Mutual: a client with a token does not trust a server that asks for none.
    async with ezflow.GraphServer(("127.0.0.1", 0)) as open_server:
        with pytest.raises(ezflow.AuthenticationError, match="asks for no token"):
            async with ezflow.GraphContext(open_server.address, auto_start=False, token=TOKEN):
                pass
    assert secured.bad_peers.counts["auth"] == 2
    assert "refusing connection from" in caplog.text
    assert TOKEN not in caplog.text
    assert OTHER not in caplog.text


async def test_old_protocol_peer_gets_a_clear_error_not_a_hang(
    secured: ezflow.GraphServer,
) -> None:
    reader, writer = await asyncio.open_connection(*secured.address)
    writer.write(frame({"op": "hello", "protocol": "ezflow/1", "pid": 1, "host_id": "h"}))
    reply = await read_message(reader)
    assert reply["op"] == "error"
    assert "'ezflow/1'" in reply["error"]
    assert repr(PROTOCOL) in reply["error"]
    writer.close()


async def test_data_port_admits_the_token_and_refuses_wrong_or_missing(
    secured: ezflow.GraphServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ezflow")
    address = secured.address
    async with (
        ezflow.GraphContext(address, auto_start=False, token=TOKEN) as ctx,
        ezflow.GraphContext(address, auto_start=False, token=TOKEN) as other,
    ):
        pub = await ctx.publisher("/secret")
        subs = [
            await other.subscriber("/secret", transport="tcp"),
            await other.subscriber("/secret", transport="shm"),
        ]
        await pub.publish(7)
        assert [await asyncio.wait_for(sub.recv(), 5) for sub in subs] == [7, 7]
        assert ctx._transports is not None
        tcp = ctx._transports.get("tcp", TcpTransport)
        assert tcp.address is not None
        info = PublisherInfo(pub.id, "/secret", "c0", "h", os.getpid(), tcp.address)
        for token, says in ((OTHER, "different tokens"), (None, "requires a token")):
            transport = TcpTransport(
                max_message_size=1 << 20,
                credentials=Credentials(None if token is None else Token(token)),
            )
            channel = Channel(pub.id, "/secret", Codec(max_message_size=1 << 20))
            channel.attach(Inbox())
            with pytest.raises(ezflow.AuthenticationError, match=says):
                await transport.open_channel(channel, info, on_lost=lambda: None)
            await transport.aclose()
        assert tcp.bad_peers.counts["auth"] == 2
        await pub.publish(8)  # the admitted channels are untouched
        assert [await asyncio.wait_for(sub.recv(), 5) for sub in subs] == [8, 8]
    assert "tcp data server: refusing channel from" in caplog.text
    assert TOKEN not in caplog.text
    assert OTHER not in caplog.text


async def test_unit_processes_inherit_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    if loop_kind() == "uvloop":
        pytest.skip("what a child inherits does not depend on the event loop")
    monkeypatch.setenv("EZFLOW_TOKEN", TOKEN)
    async with ezflow.GraphServer(("127.0.0.1", 0)) as server:  # the token from the env
        # The checker's process is read while the graph starts: it cannot end before
        # start() returns (it gets no message before), and its unit takes half a second
        # to initialize meanwhile. Read after start(), it could have taken its 100
        # messages and ended already (it did, once in a dozen runs).
        counter, checker = Counter(count=100), Checker(count=100, init_delay=0.5)
        runner = ezflow.GraphRunner(
            COUNT=counter,
            CHECK=checker,
            connections=[(counter.OUTPUT, checker.INPUT)],
            process_components=[checker],
            graph_address=server.address,
        )
        starting = asyncio.ensure_future(runner.start())
        try:
            await wait_until(lambda: "CHECK" in runner.processes, "the checker's process", 20)
            where = Path(f"/proc/{runner.processes['CHECK']}/cmdline")
            cmdline = await asyncio.to_thread(where.read_bytes)
            await starting
            await asyncio.wait_for(runner.wait(), 20)
        finally:
            if not starting.done():
                starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await runner.stop()
        assert runner.completed_by == "CHECK"  # its process received all 100 messages
        assert not server.bad_peers.counts
    assert TOKEN.encode() not in cmdline


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ezflow", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_serve_on_a_routable_address_needs_a_token_or_insecure(tmp_path: Path) -> None:
    env = {"EZFLOW_TOKEN": "", "EZFLOW_TOKEN_FILE": ""}
    refused = run_cli("serve", "--address", "0.0.0.0:0", env=env)
    out, err = refused.communicate(timeout=60)
    assert refused.returncode == 2
    assert err.count("\n") == 1
    assert "without a token" in err
    assert "--token-file" in err
    assert "--insecure" in err
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    for extra in (["--insecure"], ["--token-file", str(token_file)]):
        serving = run_cli("serve", "--address", "0.0.0.0:0", *extra, env=env)
        try:
            assert serving.stdout is not None
            line = serving.stdout.readline()
            assert "listening on 0.0.0.0:" in line
            if extra[0] == "--token-file":
                # Every command that connects takes the token the same way.
                where = "127.0.0.1:" + line.split("0.0.0.0:")[1].split(",")[0].split(";")[0]
                listed = run_cli("--token-file", str(token_file), "topics", "-a", where, env=env)
                assert listed.communicate(timeout=60)[1] == ""
                assert listed.returncode == 0
                denied = run_cli("topics", "-a", where, env=env)
                _, denied_err = denied.communicate(timeout=60)
                assert denied.returncode == 1
                assert denied_err.count("\n") == 1
                assert "requires a token" in denied_err
        finally:
            serving.terminate()
            out, err = serving.communicate(timeout=30)
        assert serving.returncode == 0, err
        assert TOKEN not in out + err


# -- insecure on a routable address: loud --------------------------------------------------


def test_serve_insecure_on_a_routable_address_warns_at_start_and_in_top_and_graph() -> None:
    """`ezflow serve --insecure` on 0.0.0.0 starts with one WARNING line, and tells its
    clients (``welcome``): `ezflow top` and `ezflow graph` show it in their header, or on
    stderr when stdout is JSON or a picture."""
    env = {**os.environ, "EZFLOW_TOKEN": "", "EZFLOW_TOKEN_FILE": ""}
    serving = run_cli("serve", "--address", "0.0.0.0:0", "--insecure", env=env)
    try:
        assert serving.stdout is not None
        line = serving.stdout.readline()
        port = line.split("0.0.0.0:")[1].split(";")[0].split(",")[0]
        where = f"127.0.0.1:{port}"
        warning = (
            f"WARNING: the graph server at {where} runs insecure (no token, on an address "
            "other than loopback): anyone who can reach it can read, inject and stop the graph"
        )
        top = ezflow_cli("top", "--once", "--address", where, env=env)
        assert top.returncode == 0 and top.stderr == "", top.stderr
        # (the header wraps at the terminal's width, 160 here)
        header, _, rest = top.stdout.partition("\n")
        assert header.startswith(f"ezflow top: graph server {where}"), top.stdout
        assert " ".join(rest.split()).startswith(warning), top.stdout  # right under it
        top_json = ezflow_cli("top", "--once", "--json", "--address", where, env=env)
        assert json.loads(top_json.stdout)["insecure"] is True
        assert top_json.stderr.startswith(warning) and top_json.stderr.count("\n") == 1
        tree = ezflow_cli("graph", "--address", where, env=env)
        assert tree.returncode == 0 and tree.stderr == "", tree.stderr
        assert tree.stdout.startswith("graph server ")
        assert warning in " ".join(tree.stdout.split()[:40]), tree.stdout
        for machine in ("--json", "--mermaid", "--dot"):
            shown = ezflow_cli("graph", machine, "--address", where, env=env)
            assert shown.returncode == 0
            assert shown.stderr.startswith(warning) and shown.stderr.count("\n") == 1
            assert "insecure" not in shown.stdout or machine == "--json"
    finally:
        serving.terminate()
        _, err = serving.communicate(timeout=30)
    assert serving.returncode == 0, err
    [start] = without_shm_notices(err).splitlines()  # one line, at start
    assert " ezflow.server WARNING graph server " in start
    assert f"on 0.0.0.0:{port} runs insecure (no token, on an address other than loopback)" in (
        start
    )
    assert "--token-file" in start


def test_top_and_graph_say_nothing_of_a_server_with_a_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    env = {**os.environ, "EZFLOW_TOKEN": "", "EZFLOW_TOKEN_FILE": str(token_file)}
    serving = run_cli("serve", "--address", "0.0.0.0:0", env=env)
    try:
        assert serving.stdout is not None
        port = serving.stdout.readline().split("0.0.0.0:")[1].split(";")[0].split(",")[0]
        where = f"127.0.0.1:{port}"
        top = ezflow_cli("top", "--once", "--json", "--address", where, env=env)
        assert top.returncode == 0 and top.stderr == "", top.stderr
        assert json.loads(top.stdout)["insecure"] is False
        tree = ezflow_cli("graph", "--address", where, env=env)
        assert tree.returncode == 0 and tree.stderr == ""
        assert "WARNING" not in tree.stdout
    finally:
        serving.terminate()
        _, err = serving.communicate(timeout=30)
    assert serving.returncode == 0 and without_shm_notices(err) == "", err


async def test_an_insecure_graph_server_logs_one_warning_and_tells_its_clients(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EZFLOW_TOKEN", raising=False)
    monkeypatch.delenv("EZFLOW_TOKEN_FILE", raising=False)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "runs insecure" in r.getMessage()]

    for host, token, insecure in [
        ("0.0.0.0", None, True),  # (any address other than loopback is routable)
        ("127.0.0.1", None, False),  # loopback: insecure=True changes nothing
        ("0.0.0.0", TOKEN, False),  # a token: secure whatever insecure= says
    ]:
        caplog.clear()
        async with ezflow.GraphServer((host, 0), token=token, insecure=True) as server:
            assert server.insecure is insecure
            port = server.address[1]
            [started] = warnings() or [""]
            if insecure:
                assert started.startswith(
                    f"graph server {server.server_id} on 0.0.0.0:{port} runs insecure"
                )
            else:
                assert not warnings()
            credentials = Credentials.resolve(token)
            for _ in range(2):  # told to every client; logged once
                client = await GraphClient.connect(
                    ("127.0.0.1", port),
                    name="observer",
                    on_routes=lambda version, routes: None,
                    on_lost=lambda exc: None,
                    credentials=credentials,
                )
                assert client.server_insecure is insecure
                client.close()
        assert len(warnings()) == (1 if insecure else 0)


# -- TLS ----------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca_and_node(directory: Path, name: str) -> TlsFiles:
    """A CA and a node certificate it signed, as PEM files in *directory*."""
    directory.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj",
             f"/CN={name}-ca", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign", cwd=directory)  # fmt: skip
    _openssl("req", "-x509", *ec, "-keyout", "node.key", "-out", "node.pem", "-subj",
             f"/CN={name}", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-addext", "basicConstraints=CA:FALSE", cwd=directory)  # fmt: skip
    return TlsFiles(
        str(directory / "node.pem"), str(directory / "node.key"), str(directory / "ca.pem")
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsFiles, TlsFiles]]:
    """The graph's TLS files, and those of a stranger (another CA)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    root = tmp_path_factory.mktemp("pki")
    yield _make_ca_and_node(root / "graph", "graph"), _make_ca_and_node(root / "other", "other")


async def test_tls_graph_connection_and_tcp_edge_deliver(
    pki: tuple[TlsFiles, TlsFiles], caplog: pytest.LogCaptureFixture
) -> None:
    tls, stranger = pki
    async with ezflow.GraphServer(("127.0.0.1", 0), token=TOKEN, tls=tls) as server:
        address = server.address
        async with (
            ezflow.GraphContext(address, auto_start=False, token=TOKEN, tls=tls) as ctx,
            ezflow.GraphContext(address, auto_start=False, token=TOKEN, tls=tls) as other,
        ):
            assert ctx._client is not None
            assert ctx._client._protocol.transport.get_extra_info("sslcontext") is not None
            pub = await ctx.publisher("/tls")
            sub = await other.subscriber("/tls", transport="tcp")
            big = bytes(range(256)) * 4096  # 1 MiB: many TLS records
            await pub.publish({"n": 1, "blob": big})
            got = await asyncio.wait_for(sub.recv(), 10)
            assert got == {"n": 1, "blob": big}
            # A channel whose CA did not sign the publisher's certificate is refused.
            assert ctx._transports is not None
            data_address = ctx._transports.get("tcp", TcpTransport).address
            assert data_address is not None
            info = PublisherInfo(pub.id, "/tls", "c0", "h", os.getpid(), data_address)
            transport = TcpTransport(
                max_message_size=1 << 20, credentials=Credentials(Token(TOKEN), stranger)
            )
            channel = Channel(pub.id, "/tls", Codec(max_message_size=1 << 20))
            with pytest.raises(ezflow.AuthenticationError, match="TLS handshake"):
                await transport.open_channel(channel, info, on_lost=lambda: None)
            await transport.aclose()
        # A graph client without the graph's CA is refused with a clear error.
        with pytest.raises(ezflow.AuthenticationError, match=r"TLS handshake.*same CA"):
            async with ezflow.GraphContext(address, auto_start=False, token=TOKEN, tls=stranger):
                pass
        # ... and one without TLS at all is told the server closed during the handshake.
        with pytest.raises(ezflow.BrokenResourceError, match="TLS"):
            async with ezflow.GraphContext(address, auto_start=False, token=TOKEN, tls=None):
                pass
    assert TOKEN not in caplog.text


# -- floods of bad connections --------------------------------------------------------------


async def _flood(address: tuple[str, int], count: int, payload: bytes) -> None:
    """*count* connections that each send *payload*, at most 64 at a time."""
    gate = asyncio.Semaphore(64)

    async def one() -> None:
        async with gate:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(payload)
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(reader.read(), 10)
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)))


async def test_a_flood_of_bad_connections_costs_a_bounded_number_of_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if loop_kind() == "uvloop":
        pytest.skip("the log limit does not depend on the event loop; once is enough")
    caplog.set_level(logging.DEBUG, logger="ezflow")
    garbage = struct.pack("<I", 0xFFFFFFFF)
    wrong = frame({"op": "hello", "protocol": PROTOCOL, "pid": 1, "host_id": "h"})
    async with ezflow.GraphServer(("127.0.0.1", 0), token=TOKEN) as server:
        await _flood(server.address, 1500, garbage)
        await _flood(server.address, 500, wrong)  # no nonce: an authentication failure
        assert server.bad_peers.counts == {"protocol": 1500, "auth": 500}
        async with ezflow.GraphContext(server.address, auto_start=False, token=TOKEN) as ctx:
            pub = await ctx.publisher("/flooded")
            assert ctx._transports is not None
            tcp = ctx._transports.get("tcp", TcpTransport)
            assert tcp.address is not None
            await _flood(tcp.address, 500, garbage)
            assert tcp.bad_peers.counts == {"protocol": 500}
            del pub
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    # Per listener and cause: the first few lines, then summaries (one at close here).
    assert len(warnings) <= 3 * (BAD_PEER_LOG_FIRST + 1), [r.getMessage() for r in warnings]
    summaries = [r.getMessage() for r in warnings if "more bad connections" in r.getMessage()]
    assert any("protocol 1495" in line for line in summaries), summaries
