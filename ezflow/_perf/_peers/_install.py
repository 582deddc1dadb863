"""One virtualenv per peer framework, made on demand from PyPI (``--install``).

A peer's venv holds the peer's package (pinned: :data:`PEERS`) and ezflow itself, so
that the runner starts ``VENV/bin/python -m ezflow._perf._peers._NAME`` and the peer
runs the very worker code of this source tree:

* ezflow is *linked*, not installed: ``site-packages/ezflow`` is a symbolic link to the
  ``ezflow`` package this process imported. Every run uses the current sources, with
  no rebuild, and the venv never goes stale when they change.
* ezflow's dependencies are installed *afresh* in the venv, pinned to the versions of
  the current environment (``numpy==X`` ...), and not layered on it (no
  ``--system-site-packages``): a peer sees only its own package and what ezflow needs,
  as a user who installs it would, and both sides of a comparison run the same numpy.
  pip's wheel cache makes this a matter of seconds (about 15 s per venv here, with
  ``--no-compile``: modules are compiled when a worker first imports them), which
  keeps the tests that create one from PyPI fast enough.

A venv is *current* when its stamp file (:data:`STAMP`, written last, so a broken
install is never current) records the same requirements, Python and ezflow location as
this process would install; ``--install`` rebuilds one that is not, and without it a
missing or outdated venv is an error that says to pass ``--install``.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "INSTALL_TIMEOUT",
    "PEERS",
    "STAMP",
    "Peer",
    "PeerInstallError",
    "PeerSetupError",
    "cache_dir",
    "cache_root",
    "ensure",
    "install",
    "is_current",
    "output_tail",
    "python_of",
    "requirements",
    "resolve",
    "site_packages",
]


@dataclass(frozen=True, slots=True)
class Peer:
    """A peer framework: its name, the pip requirement of its package, the module its
    worker runs (``python -m MODULE``) and the flavours of that worker (the idioms its
    users pick between, each run as its own framework ``NAME-FLAVOUR``; none: one)."""

    name: str
    requirement: str
    module: str
    flavours: tuple[str, ...] = ()

    @property
    def frameworks(self) -> tuple[str, ...]:
        """The names this peer runs as: ``NAME``, or ``NAME-FLAVOUR`` per flavour."""
        return tuple(f"{self.name}-{f}" for f in self.flavours) or (self.name,)

    def command(self, venv_dir: Path, flavour: str | None = None) -> list[str]:
        """The worker command of this peer (of *flavour*) in *venv_dir*."""
        command = [str(python_of(venv_dir)), "-m", self.module]
        return command if flavour is None else [*command, "--flavour", flavour]


#: The peers of ``ezflow perf peers``, in table order, with the pinned versions.
PEERS: Final = {
    peer.name: peer
    for peer in (
        Peer("ezmsg", "ezmsg==3.9.0", "ezflow._perf._peers._ezmsg"),
        Peer("pyzmq", "pyzmq==27.*", "ezflow._perf._peers._pyzmq", ("sync", "asyncio")),
        Peer("zenoh", "eclipse-zenoh==1.10.*", "ezflow._perf._peers._zenoh", ("callback", "fifo")),
        Peer("iceoryx2", "iceoryx2==0.10.*", "ezflow._perf._peers._iceoryx2"),
    )
}
#: The ezflow package of this process, linked into every peer venv.
EZFLOW_PACKAGE: Final = Path(__file__).resolve().parents[2]
#: The stamp file of a complete venv (JSON: what it was made with).
STAMP: Final = "ezflow-peer.json"
#: Seconds one ``pip install`` of a peer (or of a ref, ``perf waterfall``) may take.
INSTALL_TIMEOUT: Final = 900.0
#: Lines of pip's output quoted in an install error.
PIP_TAIL_LINES: Final = 15

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class PeerSetupError(RuntimeError):
    """A peer's venv is missing or outdated and ``--install`` was not given, or ezflow
    itself cannot be located; the message says what to do (one line)."""


class PeerInstallError(RuntimeError):
    """Creating a peer's venv failed: the message names the peer, the venv and pip's
    exit status, then the tail of pip's output."""


def cache_root() -> Path:
    """ezflow's cache directory: ``$XDG_CACHE_HOME/ezflow``, else ``~/.cache/ezflow``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ezflow"


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Where the peer venvs live: *override*, else ``perf-peers`` in :func:`cache_root`."""
    if override is not None:
        return Path(override).expanduser().resolve()
    return cache_root() / "perf-peers"


def python_of(venv_dir: Path) -> Path:
    """The interpreter of the venv *venv_dir*."""
    return venv_dir / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def site_packages(venv_dir: Path) -> Path:
    """The site-packages directory of the venv *venv_dir* (made with this Python)."""
    relative = sysconfig.get_path("purelib", vars={"base": ".", "platbase": "."})
    return (venv_dir / relative).resolve()


def _ezflow_requirements() -> list[str]:
    """ezflow's own dependencies, pinned to the versions installed here (markers kept,
    pip evaluates them)."""
    try:
        # ezflow's distribution (_core._config.DISTRIBUTION: `ezflow` on PyPI is another).
        declared = importlib.metadata.requires("ezflow-pubsub") or []
    except importlib.metadata.PackageNotFoundError:
        raise PeerSetupError(
            "ezflow's package metadata is missing: install ezflow (pip install -e .) "
            "before creating peer venvs"
        ) from None
    pinned = []
    for requirement in declared:
        if "extra ==" in requirement:
            continue
        match = _NAME.match(requirement)
        if match is None:
            continue
        name = match.group(1)
        _, _, marker = requirement.partition(";")
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pinned.append(requirement.strip())  # not here (its marker): pip decides
            continue
        pinned.append(f"{name}=={version}" + (f"; {marker.strip()}" if marker else ""))
    return pinned


def requirements(peer: Peer) -> list[str]:
    """What a venv of *peer* holds: the peer's package, then ezflow's dependencies."""
    return [peer.requirement, *_ezflow_requirements()]


def _expected_stamp(peer: Peer) -> dict[str, Any]:
    return {
        "peer": peer.name,
        "requirements": requirements(peer),
        "python": sys.version,
        "base_python": os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
        "ezflow": str(EZFLOW_PACKAGE),
    }


def is_current(peer: Peer, venv_dir: Path) -> bool:
    """Whether *venv_dir* is a complete venv of *peer* as :func:`install` would make it
    now."""
    try:
        stamp = json.loads((venv_dir / STAMP).read_text())
    except (OSError, ValueError):
        return False
    link = site_packages(venv_dir) / "ezflow"
    return (
        stamp == _expected_stamp(peer)
        and python_of(venv_dir).exists()
        and link.resolve() == Path(stamp["ezflow"])
    )


def output_tail(output: str, program: str = "pip") -> str:
    """The last ``PIP_TAIL_LINES`` non-blank lines of what *program* printed."""
    lines = [line for line in output.splitlines() if line.strip()]
    return "\n".join(lines[-PIP_TAIL_LINES:]) or f"({program} printed nothing)"


def install(peer: Peer, venv_dir: Path, log: Callable[[str], None] = lambda _: None) -> Path:
    """(Re)create the venv of *peer* at *venv_dir* from PyPI and return it. Raises
    :class:`PeerInstallError` (the peer, the venv, pip's status and output tail) when
    pip fails or takes more than :data:`INSTALL_TIMEOUT` seconds; the venv is then not
    current, so the next ``--install`` starts over."""
    stamp = _expected_stamp(peer)
    if venv_dir.exists():
        shutil.rmtree(venv_dir)
    log(f"{peer.name}: creating {venv_dir}")
    venv.EnvBuilder(with_pip=True, clear=True, symlinks=sys.platform != "win32").create(venv_dir)
    command = [
        str(python_of(venv_dir)), "-m", "pip", "install", "--disable-pip-version-check",
        "--no-input", "--no-compile", *stamp["requirements"],
    ]  # fmt: skip
    log(f"{peer.name}: pip install {' '.join(stamp['requirements'])}")
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part
            for part in (exc.stdout or "", exc.stderr or "")
        )
        raise PeerInstallError(
            f"installing peer {peer.name} into {venv_dir}: pip took more than "
            f"{INSTALL_TIMEOUT:.0f} s\n{output_tail(output)}"
        ) from None
    if done.returncode != 0:
        raise PeerInstallError(
            f"installing peer {peer.name} ({peer.requirement}) into {venv_dir} failed "
            f"(pip exit status {done.returncode}):\n{output_tail(done.stdout + done.stderr)}"
        )
    link = site_packages(venv_dir) / "ezflow"
    link.symlink_to(stamp["ezflow"], target_is_directory=True)
    (venv_dir / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    return venv_dir


def resolve(
    names: Iterable[str], peers: dict[str, Peer] | None = None
) -> list[tuple[Peer, str | None]]:
    """Each of *names* as (peer, flavour): a peer's name stands for all its flavours,
    ``NAME-FLAVOUR`` for one; in order, without repeats. Raises :class:`KeyError`
    (the unknown name) for anything else."""
    table = PEERS if peers is None else peers
    chosen: dict[tuple[str, str | None], tuple[Peer, str | None]] = {}
    for name in names:
        if name in table:
            peer = table[name]
            for flavour in peer.flavours or (None,):
                chosen.setdefault((peer.name, flavour), (peer, flavour))
            continue
        library, _, flavour = name.partition("-")
        peer_or_none = table.get(library)
        if peer_or_none is None or flavour not in peer_or_none.flavours:
            raise KeyError(name)
        chosen.setdefault((library, flavour), (peer_or_none, flavour))
    return list(chosen.values())


def ensure(
    names: Iterable[str],
    *,
    install_missing: bool,
    cache: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] = lambda _: None,
    peers: dict[str, Peer] | None = None,
) -> dict[str, list[str]]:
    """The worker command of each framework in *names* (peers of *peers*, default
    :data:`PEERS`, or ``NAME-FLAVOUR``: see :func:`resolve`), by framework name, in
    order. A peer's venv that is not current is (re)created when *install_missing*,
    else :class:`PeerSetupError` says to pass ``--install``. Installs into one cache
    are serialised by a lock file, so two runs never build the same venv at once."""
    root = cache_dir(cache)
    commands: dict[str, list[str]] = {}
    ready: set[str] = set()
    for peer, flavour in resolve(names, peers):
        venv_dir = root / peer.name
        if peer.name not in ready:
            _make_current(peer, venv_dir, root, install_missing=install_missing, log=log)
            ready.add(peer.name)
        name = peer.name if flavour is None else f"{peer.name}-{flavour}"
        commands[name] = peer.command(venv_dir, flavour)
    return commands


def _make_current(
    peer: Peer, venv_dir: Path, root: Path, *, install_missing: bool, log: Callable[[str], None]
) -> None:
    if is_current(peer, venv_dir):
        log(f"{peer.name}: {venv_dir} is current")
        return
    if not install_missing:
        state = "outdated" if venv_dir.exists() else "missing"
        raise PeerSetupError(
            f"the venv of peer {peer.name} is {state} ({venv_dir}): pass --install to "
            f"create it from PyPI ({peer.requirement})"
        )
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{peer.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_current(peer, venv_dir):  # another run may have made it
            install(peer, venv_dir, log)
