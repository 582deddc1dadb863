"""Sessions: tests, lint, typecheck, perf, perf_peers."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "ezflow", "tests", "perf", "examples", "noxfile.py")
    session.run("ruff", "format", "--check", "ezflow", "tests", "perf", "examples", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session
def perf(session: nox.Session) -> None:
    """`ezflow perf run` (arguments pass through, e.g. `nox -s perf -- -s p2p --quick`)."""
    session.install("-e", ".")
    session.run("ezflow", "perf", "run", *session.posargs)


#: The peer comparison of the issue: these cells, ezflow and ezmsg back to back.
PEER_CELLS = ("-s", "fanout,fanin,relay", "-t", "shm,tcp", "--size", "1KiB,1MiB", "-n", "4")


@nox.session
def perf_peers(session: nox.Session) -> None:
    """ezflow against ezmsg 3.9.0, cell by cell, in a venv of its own (ezmsg is never a
    dependency of ezflow). Extra arguments go to `ezflow perf run` after the defaults,
    e.g. `nox -s perf_peers -- --repeats 5 -o peers.json`."""
    session.install("-e", ".", "ezmsg==3.9.0")
    Path("perf/results").mkdir(parents=True, exist_ok=True)  # git ignores it
    args = list(session.posargs)
    flags = [flag for flag in ("-o", "--output") if flag in args]
    if flags:
        output = args[args.index(flags[0]) + 1]
    else:
        output = "perf/results/peers.json"
        args += ["-o", output]
    peer = f"{session.bin}/python perf/peers/ezmsg_peer.py"
    session.run("ezflow", "perf", "run", *PEER_CELLS, "--peer", peer, *args)
    session.run("ezflow", "perf", "peers", output, "--markdown")
