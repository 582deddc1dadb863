"""TransportSet (ezflow/_transports/_set.py): the choice per edge, the fall-back, by name,
outlets and options - with real transports, no graph and no sockets (nothing here
starts a data server)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest

import ezflow
from ezflow._core._auth import Credentials
from ezflow._core._codec import Codec
from ezflow._core._config import check_transport
from ezflow._core._outlet import Outlet
from ezflow._core._protocol import PublisherInfo
from ezflow._transports import TransportSet, TransportSettings, transport_names
from ezflow._transports._ezring import EzringTransport
from ezflow._transports._local import LocalTransport
from ezflow._transports._registry import REGISTERED
from ezflow._transports._shm import ShmTransport
from ezflow._transports._tcp import TcpTransport

HOST = "this-host/0"
CODEC = Codec(max_message_size=1 << 20)
SETTINGS = TransportSettings("127.0.0.1", HOST, 1 << 20, CODEC, Credentials())


def info(publisher_id: str = "p-1", **fields: object) -> PublisherInfo:
    base = PublisherInfo(publisher_id, "/pub", "c1", HOST, 1, ("127.0.0.1", 9))
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


@pytest.fixture
async def transports() -> AsyncIterator[TransportSet]:
    made = TransportSet(
        [cls.from_settings(SETTINGS) for cls in REGISTERED], host_id=HOST, registered=REGISTERED
    )
    yield made
    await made.aclose()


async def test_the_order_is_the_registry_and_names_come_back_typed(
    transports: TransportSet,
) -> None:
    assert transports.names == ("ezring", "local", "shm", "tcp")
    assert isinstance(transports.get("shm", ShmTransport), ShmTransport)
    with pytest.raises(ezflow.ConfigurationError, match=r"no transport 'udp'.*local, shm, tcp"):
        transports.get("udp")
    with pytest.raises(TypeError, match="ShmTransport"):
        transports.get("shm", TcpTransport)
    # Exclusive transports cannot be forced by name.
    assert transport_names() == ("local", "shm", "tcp")
    with pytest.raises(ezflow.ConfigurationError, match="'ezring' is not a transport"):
        check_transport("ezring", names=transport_names())


async def test_the_choice_per_edge(
    transports: TransportSet, caplog: pytest.LogCaptureFixture
) -> None:
    here = info(shm_address=f"ezflow-1-{'0' * 16}")
    elsewhere = dataclasses.replace(here, host_id="another-host/0")
    with caplog.at_level(logging.WARNING, logger="ezflow"):
        assert transports.choose(here, None, "s1", "/sub") == "shm"
        assert transports.choose(here, "tcp", "s1", "/sub") == "tcp"
        assert transports.choose(elsewhere, None, "s1", "/sub") == "tcp"
        assert caplog.records == []
        # A forced choice that cannot work: the automatic one, said once per edge.
        for _ in range(2):
            assert transports.choose(elsewhere, "shm", "s1", "/sub") == "tcp"
        assert transports.choose(elsewhere, "local", "s2", "/sub") == "tcp"
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "transport 'shm' asked for /pub -> /sub, but shared memory cannot be used between"
        " these processes (another host, no /dev/shm, or it failed before); using tcp",
        "transport 'local' asked for /pub -> /sub, but the publisher is in another process;"
        " using tcp",
    ]
    # A ring is read through ezring whatever was asked, and nothing is said.
    ring = info("p-ring", ring="cam", ring_created_ns=1)
    caplog.clear()
    assert transports.choose(ring, "tcp", "s1", "/sub") == "ezring"
    assert caplog.records == []


async def test_a_publisher_of_this_loop_is_local_first(transports: TransportSet) -> None:
    outlet = Outlet("p-here", "/pub", CODEC, max_in_flight=4, max_in_flight_bytes=1 << 20)
    transports.add_outlet(outlet)
    try:
        here = info("p-here", shm_address=f"ezflow-1-{'0' * 16}")
        assert transports.choose(here, None, "s1", "/sub") == "local"
        assert transports.choose(here, "shm", "s1", "/sub") == "shm"
        assert transports.loans(outlet) is not None  # shm's, behind a handle
    finally:
        transports.remove_outlet(outlet)
        outlet.close()
    assert transports.choose(here, None, "s1", "/sub") == "shm"
    with pytest.raises(ezflow.ConfigurationError, match="options for unknown transports: udp"):
        transports.add_outlet(outlet, udp=1)


async def test_the_fall_back_is_said_once_and_sticks(
    transports: TransportSet, caplog: pytest.LogCaptureFixture
) -> None:
    here = info(shm_address=f"ezflow-1-{'0' * 16}")
    error = ezflow.BrokenResourceError("no space left")
    with caplog.at_level(logging.WARNING, logger="ezflow"):
        assert transports.fall_back("shm", here, error) == "tcp"
        assert transports.fall_back("shm", here, error) == "tcp"
    (said,) = [r.getMessage() for r in caplog.records]
    assert said == (
        "cannot use shared memory for publisher p-1 on topic '/pub' (no space left); its"
        " edges to this process use tcp"
    )
    assert transports.choose(here, None, "s1", "/sub") == "tcp"
    assert transports.choose(info("p-2", shm_address=here.shm_address), None, "s", "/") == "shm"
    # tcp and ezring have no fall-back: the router retries them.
    assert transports.fall_back("tcp", here, error) is None
    assert transports.fall_back("ezring", here, error) is None


class _Nowhere(LocalTransport):
    name: ClassVar[str] = "nowhere"

    @classmethod
    def available(cls) -> bool:
        return False


async def test_create_leaves_out_what_cannot_work_here() -> None:
    made = await TransportSet.create(SETTINGS, [EzringTransport, _Nowhere, LocalTransport])
    try:
        assert made.names == ("ezring", "local")
    finally:
        await made.aclose()


async def test_close_closes_every_transport_and_logs_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing(LocalTransport):
        name: ClassVar[str] = "failing"

        async def aclose(self) -> None:
            raise OSError("boom")

    local = LocalTransport()
    outlet = Outlet(f"p-{os.getpid()}-x", "/pub", CODEC, max_in_flight=4, max_in_flight_bytes=64)
    made = TransportSet([Failing(), local], host_id=HOST)
    made.add_outlet(outlet)
    with caplog.at_level(logging.ERROR, logger="ezflow"):
        await asyncio.wait_for(made.aclose(), 10)
    assert outlet.closed  # the local transport closed its outlets
    assert [r.getMessage() for r in caplog.records] == ["closing a transport failed"]
