"""The registered transports: the one place that names them.

Each edge uses the first transport of :data:`REGISTERED` that reaches its publisher (an
exclusive one that reaches it wins whatever was asked; a user may force any other by
name). Adding a transport is a module in this folder and one line here (see
docs/architecture.md, "Adding a transport").
"""

from __future__ import annotations

from ._base import Transport
from ._ezring import EzringTransport
from ._local import LocalTransport
from ._shm import ShmTransport
from ._tcp import TcpTransport

__all__ = ["REGISTERED", "register_transport", "transport_names", "unregister_transport"]

#: In order of preference.
REGISTERED: list[type[Transport]] = [EzringTransport, LocalTransport, ShmTransport, TcpTransport]


def transport_names() -> tuple[str, ...]:
    """The names a user may force (``transport="..."``, ``EZFLOW_TRANSPORT``): every
    registered transport but the exclusive ones."""
    return tuple(cls.name for cls in REGISTERED if not cls.exclusive)


def register_transport(cls: type[Transport], *, before: str | None = None) -> None:
    """Register *cls* (preferred over the transport named *before*, else last). Contexts
    made from then on use it. Raises :class:`ValueError` if its name is taken."""
    if any(known.name == cls.name for known in REGISTERED):
        raise ValueError(f"a transport named {cls.name!r} is registered already")
    names = [known.name for known in REGISTERED]
    REGISTERED.insert(names.index(before) if before in names else len(REGISTERED), cls)


def unregister_transport(name: str) -> None:
    """Forget the transport named *name* (contexts made from then on do not use it)."""
    REGISTERED[:] = [cls for cls in REGISTERED if cls.name != name]
