"""The graph server's registry (ezflow/_graph/_registry.py): registrations in, routes out,
without a socket or a server. The server's own tests (test_server.py) drive it over
connections; these pin its rules one by one."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezflow._core._exceptions import ProtocolError
from ezflow._core._protocol import PublisherInfo
from ezflow._graph._registry import RegisteredClient, Registry

ADDRESS = ["127.0.0.1", 9]


class Pushed:
    """A client connection that keeps what it is sent."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def send_message(self, message: dict[str, Any]) -> None:
        self.messages.append(message)


def client(
    registry: Registry, pid: int = 10, host: str = "h", name: str = "proc"
) -> RegisteredClient:
    hello = {"op": "hello", "pid": pid, "host_id": host, "hostname": "box", "name": name}
    return registry.add_client(Pushed(), hello)


def publish(
    registry: Registry, owner: RegisteredClient, pub_id: str, topic: str, **extra: Any
) -> bool:
    message = {"op": "register_publisher", "publisher_id": pub_id, "topic": topic}
    return registry.apply(owner, "register_publisher", {**message, "address": ADDRESS, **extra})


def subscribe(registry: Registry, owner: RegisteredClient, sub_id: str, topic: str) -> bool:
    message = {"op": "register_subscriber", "subscriber_id": sub_id, "topic": topic}
    return registry.apply(owner, "register_subscriber", message)


def connect(
    registry: Registry, owner: RegisteredClient, src: str, dst: str, op: str = "connect"
) -> bool:
    return registry.apply(owner, op, {"op": op, "src": src, "dst": dst})


def feeds(registry: Registry) -> dict[str, list[str]]:
    """Every subscriber's publishers, over every client."""
    return {
        sub_id: pubs
        for routes in registry.compute_routes().values()
        for sub_id, pubs in routes["subscribers"].items()
    }


def test_a_subscriber_is_fed_by_its_topic_and_every_topic_with_a_path_to_it() -> None:
    registry = Registry("h", "box")
    a, b = client(registry, pid=1), client(registry, pid=2)
    publish(registry, a, "p-x", "/x")
    publish(registry, b, "p-y", "/y")
    publish(registry, a, "p-z", "/z")
    subscribe(registry, b, "s-x", "/x")
    subscribe(registry, a, "s-y", "/y")
    assert feeds(registry) == {"s-x": ["p-x"], "s-y": ["p-y"]}
    assert connect(registry, a, "/x", "/y")  # a new edge may change routes
    assert connect(registry, b, "/z", "/x")
    assert feeds(registry) == {"s-x": ["p-x", "p-z"], "s-y": ["p-x", "p-y", "p-z"]}
    assert not connect(registry, b, "/x", "/y")  # the same edge again: nothing new
    connect(registry, a, "/y", "/x")  # a cycle: every publisher once
    assert feeds(registry) == {s: ["p-x", "p-y", "p-z"] for s in ("s-x", "s-y")}
    routes = registry.compute_routes()
    assert (
        routes[a.id]["publishers"]["p-y"]
        == PublisherInfo(
            publisher_id="p-y",
            topic="/y",
            client_id=b.id,
            host_id="h",
            pid=2,
            address=("127.0.0.1", 9),
        ).to_wire()
    )
    assert set(routes[b.id]["publishers"]) == {"p-x", "p-y", "p-z"}


def test_an_edge_lives_while_one_of_the_clients_that_made_it_does() -> None:
    registry = Registry("h", "box")
    a, b, c = (client(registry, pid=n) for n in (1, 2, 3))
    publish(registry, a, "p-x", "/x")
    subscribe(registry, c, "s-y", "/y")
    connect(registry, a, "/x", "/y")
    connect(registry, b, "/x", "/y")
    registry.remove_client(a)
    assert feeds(registry) == {"s-y": []}  # its publisher went, b's edge stays
    assert registry.snapshot()["edges"] == [["/x", "/y"]]
    registry.remove_client(b)
    assert registry.snapshot()["edges"] == []
    assert registry.snapshot()["topics"] == ["/y"]


def test_disconnect_removes_an_edge_whoever_made_it() -> None:
    registry = Registry("h", "box")
    a, b = client(registry, pid=1), client(registry, pid=2)
    connect(registry, a, "/x", "/y")
    assert connect(registry, b, "/x", "/y", "disconnect")
    assert registry.edges == {} and a.edges == set()
    with pytest.raises(ValueError, match="there is no edge '/x' -> '/y'"):
        connect(registry, b, "/x", "/y", "disconnect")
    with pytest.raises(ValueError, match="cannot connect topic '/x' to itself"):
        connect(registry, a, "/x", "/x")


def test_a_known_id_moves_within_its_process_and_is_refused_to_another() -> None:
    registry = Registry("h", "box")
    stale, other = client(registry, pid=10), client(registry, pid=11)
    publish(registry, stale, "p-1", "/k")
    publish(registry, stale, "p-1", "/k2")  # a retry on the same connection replaces it
    assert registry.publishers["p-1"].topic == "/k2"
    with pytest.raises(
        ValueError, match=r"'p-1' is already registered by client c1 \(proc, pid 10\)"
    ):
        publish(registry, other, "p-1", "/k")
    fresh = client(registry, pid=10)  # the same process again: the id moves
    publish(registry, fresh, "p-1", "/k")
    assert registry.publishers["p-1"].client is fresh
    assert stale.publishers == set() and fresh.publishers == {"p-1"}
    registry.remove_client(stale)  # the stale connection goes, the moved id stays
    assert list(registry.publishers) == ["p-1"]
    elsewhere = client(registry, pid=10, host="other-host")
    with pytest.raises(ValueError, match="already registered"):
        subscribe(registry, elsewhere, "p-1", "/k")  # same pid, another host


def test_unregister_only_what_the_client_owns() -> None:
    registry = Registry("h", "box")
    a, b = client(registry, pid=1), client(registry, pid=2)
    publish(registry, a, "p-1", "/t")
    subscribe(registry, a, "s-1", "/t")
    with pytest.raises(ValueError, match="'p-1' is not a publisher or subscriber of this client"):
        registry.apply(b, "unregister", {"op": "unregister", "registration_id": "p-1"})
    assert registry.apply(a, "unregister", {"op": "unregister", "registration_id": "p-1"})
    assert registry.apply(a, "unregister", {"op": "unregister", "registration_id": "s-1"})
    assert registry.publishers == registry.subscribers == {}


@pytest.mark.parametrize(
    ("op", "message", "error", "match"),
    [
        ("register_publisher", {"topic": "/t", "address": ADDRESS}, ProtocolError, "publisher_id"),
        ("register_publisher", {"publisher_id": "p", "topic": "/t"}, ProtocolError, "address"),
        ("register_subscriber", {"subscriber_id": "s", "topic": "a b"}, ValueError, "topic"),
        ("register_subscriber", {"subscriber_id": "s", "topic": 5}, ProtocolError, "topic"),
        ("connect", {"src": "/a"}, ProtocolError, "dst"),
        ("launch", {}, ProtocolError, "unknown command 'launch'"),
    ],
)
def test_a_bad_request_changes_nothing(
    op: str, message: dict[str, Any], error: type[Exception], match: str
) -> None:
    registry = Registry("h", "box")
    owner = client(registry)
    before = registry.snapshot()
    with pytest.raises(error, match=match):
        registry.apply(owner, op, {"op": op, **message})
    assert registry.snapshot() == before


def test_a_hello_without_pid_is_refused_and_its_id_not_reused() -> None:
    registry = Registry("h", "box")
    with pytest.raises(ProtocolError, match="'pid' must be int"):
        registry.add_client(None, {"op": "hello", "host_id": "h"})
    assert client(registry).id == "c2"
    assert list(registry.clients) == ["c2"]


def test_route_pushes_name_only_the_clients_whose_routes_changed() -> None:
    registry = Registry("h", "box")
    a, b, idle = (client(registry, pid=n) for n in (1, 2, 3))
    subscribe(registry, a, "s-a", "/a")
    subscribe(registry, b, "s-b", "/b")
    version, pushes = registry.route_pushes()
    assert version == 1 and [c for c, _ in pushes] == [a, b]  # idle has no routes: none
    publish(registry, idle, "p-a", "/a")
    version, pushes = registry.route_pushes()
    assert version == 2 and [c for c, _ in pushes] == [a]
    assert pushes[0][1]["subscribers"] == {"s-a": ["p-a"]}
    assert a.pushed_version == 2 and b.pushed_version == 1
    assert registry.route_pushes()[1] == []  # nothing changed


def test_a_client_attaching_a_watched_ring_replaces_the_watchers_registration() -> None:
    registry = Registry("h", "box")
    registry.watch("p-ring-cam-1", "/cam", ("127.0.0.1", 9), "cam", 1)
    assert registry.watched() == {"cam": "p-ring-cam-1"}
    assert registry.publishers["p-ring-cam-1"].client is registry.watcher
    assert registry.watcher.id not in registry.clients  # no connection, no routes
    owner = client(registry)
    publish(registry, owner, "p-attached", "/cam", ring="cam", ring_created=1)
    assert registry.watched() == {} and registry.attached_rings() == {"cam"}
    assert list(registry.publishers) == ["p-attached"]
    assert registry.watcher.publishers == set()
    assert not registry.unwatch("p-ring-cam-1")  # (gone already)
    # The snapshot names the ring (`ezflow graph` lists it by name, not by its id).
    (pub,) = registry.snapshot()["publishers"]
    assert (pub["id"], pub["ring"]) == ("p-attached", "cam")


names = st.sampled_from(["/a", "/b", "/c", "/d"])


@settings(max_examples=60, deadline=None)
@given(
    pubs=st.lists(names, max_size=5),
    subs=st.lists(names, min_size=1, max_size=4),
    edges=st.lists(st.tuples(names, names).filter(lambda e: e[0] != e[1]), max_size=6),
)
def test_routes_are_reachability_over_the_edges(
    pubs: list[str], subs: list[str], edges: list[tuple[str, str]]
) -> None:
    """Differential: every subscriber gets exactly the publishers whose topic reaches its
    own by a path of edges (a transitive closure computed here the naive way)."""
    registry = Registry("h", "box")
    owner = client(registry)
    for n, topic in enumerate(pubs):
        publish(registry, owner, f"p-{n}", topic)
    for n, topic in enumerate(subs):
        subscribe(registry, owner, f"s-{n}", topic)
    for src, dst in edges:
        connect(registry, owner, src, dst)
    reaches = {(t, t) for t in ["/a", "/b", "/c", "/d"]} | set(edges)
    while True:
        more = {(a, d) for a, b in reaches for c, d in reaches if b == c} - reaches
        if not more:
            break
        reaches |= more
    expected = {
        f"s-{n}": sorted(f"p-{m}" for m, src in enumerate(pubs) if (src, topic) in reaches)
        for n, topic in enumerate(subs)
    }
    assert feeds(registry) == expected


def test_a_request_of_a_removed_client_changes_nothing() -> None:
    """The server reads a request, waits for its lock, and the connection closes
    meanwhile: the request arrives after the client was removed."""
    registry = Registry("h", "box")
    gone, other = client(registry, pid=1), client(registry, pid=2)
    publish(registry, gone, "p-1", "/x")
    subscribe(registry, gone, "s-1", "/x")
    subscribe(registry, other, "s-2", "/x")
    registry.remove_client(gone)
    before = registry.snapshot()
    unregister = {"op": "unregister", "registration_id": "s-1"}
    assert not registry.apply(gone, "unregister", unregister)  # (was: KeyError)
    assert not publish(registry, gone, "p-2", "/y")  # (was: a publisher nothing removes)
    assert not subscribe(registry, gone, "s-3", "/y")
    assert not connect(registry, gone, "/x", "/z")
    assert registry.snapshot() == before
    assert feeds(registry) == {"s-2": []}
