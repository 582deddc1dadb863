"""The graph server's ring watcher (ezflow/_graph/_ringwatch.py) over a registry, without a
server: real rings in this test's shm directory, scanned for real. With a server and
subscribers: the watching tests of test_ezring.py."""

from __future__ import annotations

import logging
import os
import secrets

import numpy as np
import pytest

from ezflow._graph._registry import Registry
from ezflow._graph._ringwatch import RingWatcher
from ezflow.ezring import RingWriter

ADDRESS = ("127.0.0.1", 9)
ATTACH = {"op": "register_publisher", "topic": "/cam", "address": list(ADDRESS)}


def fresh_name() -> str:
    return f"w{os.getpid()}-{secrets.token_hex(4)}"


async def test_a_live_ring_is_a_publisher_until_it_is_closed() -> None:
    registry = Registry("h", "box")
    watcher = RingWatcher(registry)
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, slot_count=8, topic=f"/w/{name}") as writer:
        rings = await watcher.scan()
        assert watcher.update(rings, ADDRESS)
        pub = registry.publishers[registry.watched()[name]]
        assert (pub.topic, pub.transport, pub.ring, pub.address) == (
            f"/w/{name}",
            "ezring",
            name,
            ADDRESS,
        )
        assert pub.client is registry.watcher
        assert pub.ring_created_ns == rings[name].header.created_ns
        assert not watcher.update(await watcher.scan(), ADDRESS)  # nothing changed
        for _ in range(3):
            assert writer.publish(np.zeros(8, "<u8"))
        await watcher.scan()
        telemetry = watcher.telemetry()
        assert telemetry is not None and telemetry.name == "graph server ring watcher"
        (published,) = [p for p in telemetry.publishers if p.publisher_id == pub.id]
        assert (published.messages, published.drops, published.channels) == (3, 0, 0)
    assert watcher.update(await watcher.scan(), ADDRESS)  # closed: unregistered
    assert name not in registry.watched() and pub.id not in registry.publishers
    assert watcher.telemetry() is None


async def test_a_ring_a_client_attached_is_left_to_it_and_taken_back_after() -> None:
    registry = Registry("h", "box")
    watcher = RingWatcher(registry)
    owner = registry.add_client(None, {"op": "hello", "pid": 1, "host_id": "h"})
    name = fresh_name()
    with RingWriter.create(name, slot_size=64, topic="/cam"):
        watcher.update(await watcher.scan(), ADDRESS)
        attach = {**ATTACH, "publisher_id": "p-mine", "ring": name}
        registry.apply(owner, "register_publisher", attach)  # replaces the watcher's
        assert not watcher.update(await watcher.scan(), ADDRESS)
        assert [p.id for p in registry.publishers.values() if p.ring == name] == ["p-mine"]
        registry.remove_client(owner)  # detached: the watcher registers it again
        assert watcher.update(await watcher.scan(), ADDRESS)
        assert name in registry.watched()


async def test_a_writer_restarted_under_the_same_name_is_a_new_publisher() -> None:
    registry = Registry("h", "box")
    watcher = RingWatcher(registry)
    name = fresh_name()
    ids = []
    for _ in range(2):
        with RingWriter.create(name, slot_size=64, topic="/again"):
            assert watcher.update(await watcher.scan(), ADDRESS)
            ids.append(registry.watched()[name])
    assert ids[0] != ids[1]


async def test_a_ring_whose_topic_is_refused_is_logged_once_and_not_registered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry("h", "box")
    watcher = RingWatcher(registry)
    name = fresh_name()
    caplog.set_level(logging.WARNING, "ezflow.server")
    with RingWriter.create(name, slot_size=64, topic="has a space"):
        for _ in range(3):
            watcher.update(await watcher.scan(), ADDRESS)
    assert name not in registry.watched()
    refused = [r for r in caplog.records if f"ezring {name} is not registered" in r.getMessage()]
    assert len(refused) == 1, refused
