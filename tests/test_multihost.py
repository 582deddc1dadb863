"""A graph spanning two hosts: two network namespaces joined by a veth pair.

The graph server and a publisher run on host A (10.77.0.1), three subscribers on host B
(10.77.0.2); data crosses the link over tcp. Needs root and iproute2 (``ip netns``);
skipped otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import _netns as netns
import pytest
from _netns import on
from _proc import Child
from conftest import loop_kind

HOST_A, HOST_B = "10.77.0.1", "10.77.0.2"


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[tuple[str, str]]:
    try:
        with netns.two_hosts(HOST_A, HOST_B) as hosts:
            yield hosts.a, hosts.b
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))


async def test_publisher_and_subscribers_on_different_hosts(
    two_hosts: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server on a routable address needs a token; every child inherits it.
    monkeypatch.setenv("EZFLOW_TOKEN", os.urandom(16).hex())
    host_a, host_b = two_hosts
    count, size = 2000, 512
    children: list[Child] = []
    try:
        server = await Child.start("serve", loop_kind(), prefix=on(host_a), host=HOST_A)
        children.append(server)
        address = [HOST_A, int((await server.event("ready"))["address"].rsplit(":", 1)[1])]
        subs = await Child.start(
            "subscribers",
            loop_kind(),
            prefix=on(host_b),
            address=address,
            topic="/remote",
            subs=3,
            count=count,
            size=size,
        )
        children.append(subs)
        await subs.event("ready")
        pub = await Child.start(
            "publish",
            loop_kind(),
            prefix=on(host_a),
            address=address,
            topic="/remote",
            count=count,
            size=size,
        )
        children.append(pub)
        await pub.event("ready")
        done = await subs.event("done", timeout=60)
        # Nothing on host A waits for its CPU: no handoff after a paced publish.
        assert (await pub.event("done"))["handoff"] == [False]
        assert done["errors"] == []
        assert done["received"] == [count] * 3
        assert done["transports"] == ["tcp"] and done["decoded"] == [count]
        assert await subs.stop() == 0
        assert await pub.stop() == 0
    finally:
        for child in children:
            await child.aclose()
