"""A graph spanning two hosts: two network namespaces joined by a veth pair.

The graph server and a publisher run on host A (10.77.0.1), three subscribers on host B
(10.77.0.2); data crosses the link over tcp. Needs root and iproute2 (``ip netns``);
skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from _proc import Child
from conftest import loop_kind

HOST_A, HOST_B = "10.77.0.1", "10.77.0.2"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[tuple[str, str]]:
    tag = f"{os.getpid() % 100000}"
    a, b = f"ezflow-a{tag}", f"ezflow-b{tag}"
    veth_a, veth_b = f"ezva{tag}", f"ezvb{tag}"
    try:
        ip("netns", "add", a)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"network namespaces unavailable (needs root and iproute2): {exc}")
    try:
        ip("netns", "add", b)
        ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        ip("link", "set", veth_a, "netns", a)
        ip("link", "set", veth_b, "netns", b)
        for ns, dev, addr in ((a, veth_a, HOST_A), (b, veth_b, HOST_B)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in (a, b):  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=10)


def on(host: str) -> tuple[str, ...]:
    return ("ip", "netns", "exec", host)


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
        assert done["errors"] == []
        assert done["received"] == [count] * 3
        assert done["transports"] == ["tcp"] and done["decoded"] == [count]
        assert await subs.stop() == 0
        assert await pub.stop() == 0
    finally:
        for child in children:
            await child.aclose()
