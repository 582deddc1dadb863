"""Simulated hosts for tests: Linux network namespaces joined by veth pairs.

Needs root and iproute2 (``ip netns``); the context managers raise :class:`NetnsUnavailable`
when namespaces cannot be made, and the fixtures that use them skip. Names and subnets
carry the pid (and a counter), so tests in parallel workers do not collide. Everything made
is deleted on the way out, also after a failure; what a killed test process left (its pid
gone) is deleted by the next one that makes a namespace.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

_counter = itertools.count()


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be created here (not root, or no iproute2)."""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def on(namespace: str) -> tuple[str, ...]:
    """The command prefix that runs a program inside *namespace*."""
    return ("ip", "netns", "exec", namespace)


def _tag() -> str:
    # (the pid, then the counter: a later run can tell whose namespace it is; with the
    # device prefixes at most 15 characters, the kernel's limit for a device name)
    return f"{os.getpid()}x{next(_counter)}"


#: A namespace of this module's, and the pid of the process that made it.
_OURS = re.compile(r"ezflow-[abr](\d+)x\d+")
_swept: list[bool] = []


def namespaces() -> set[str]:
    """The names of the network namespaces that exist now."""
    listed = subprocess.run(
        ["ip", "netns", "list"], check=True, capture_output=True, text=True, timeout=10
    )
    return {line.split()[0] for line in listed.stdout.splitlines() if line.split()}


def _sweep_stale() -> None:
    """Delete the namespaces a killed test process left behind (its pid gone; deleting a
    namespace deletes its veth pairs), once per process."""
    if _swept:
        return
    _swept.append(True)
    try:
        names = namespaces()
    except (OSError, subprocess.CalledProcessError):
        return  # (no namespaces here: _add_namespace says so)
    for name in names:
        found = _OURS.fullmatch(name)
        if found is None:
            continue
        try:
            os.kill(int(found[1]), 0)
        except ProcessLookupError:
            _delete([name])
        except OSError:
            pass  # (alive, another user's)


def _add_namespace(name: str) -> None:
    _sweep_stale()
    try:
        ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NetnsUnavailable(
            f"network namespaces unavailable (needs root and iproute2): {exc}"
        ) from exc


def _delete(namespaces: list[str], links: list[str] = []) -> None:  # noqa: B006 - read only
    # Deleting a namespace deletes its end of a veth pair, and so the pair.
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=10)
    for link in links:
        subprocess.run(["ip", "link", "del", link], check=False, capture_output=True, timeout=10)


@dataclass(frozen=True)
class TwoHosts:
    """Two namespaces joined by one veth pair: host A at ``address_a``, B at ``address_b``."""

    a: str
    b: str
    address_a: str
    address_b: str


@contextlib.contextmanager
def two_hosts(address_a: str = "10.77.0.1", address_b: str = "10.77.0.2") -> Iterator[TwoHosts]:
    """Two fresh namespaces on a /24 link (the addresses are private to the namespaces)."""
    tag = _tag()
    a, b = f"ezflow-a{tag}", f"ezflow-b{tag}"
    veth_a, veth_b = f"ezva{tag}", f"ezvb{tag}"
    _add_namespace(a)
    try:
        ip("netns", "add", b)
        ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        ip("link", "set", veth_a, "netns", a)
        ip("link", "set", veth_b, "netns", b)
        for ns, dev, addr in ((a, veth_a, address_a), (b, veth_b, address_b)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield TwoHosts(a, b, address_a, address_b)
    finally:
        _delete([a, b])


@dataclass(frozen=True)
class RemoteHost:
    """One namespace joined to the current one: its name, its veth device, this side's
    address and its address."""

    namespace: str
    device: str
    here: str
    there: str


@contextlib.contextmanager
def remote_host() -> Iterator[RemoteHost]:
    """A fresh namespace linked to this one. Its subnet is routed from here only, and
    differs per pid so parallel workers do not share one."""
    tag = _tag()
    ns, here_dev, there_dev = f"ezflow-r{tag}", f"ezrh{tag}", f"ezrt{tag}"
    octet = 100 + os.getpid() % 100
    here, there = f"10.{octet}.79.1", f"10.{octet}.79.2"
    _add_namespace(ns)
    try:
        ip("link", "add", here_dev, "type", "veth", "peer", "name", there_dev)
        ip("link", "set", there_dev, "netns", ns)
        ip("addr", "add", f"{here}/24", "dev", here_dev)
        ip("link", "set", here_dev, "up")
        ip("-n", ns, "addr", "add", f"{there}/24", "dev", there_dev)
        ip("-n", ns, "link", "set", there_dev, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        yield RemoteHost(ns, there_dev, here, there)
    finally:
        _delete([ns], [here_dev])
