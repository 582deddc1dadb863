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
    session.run("ruff", "check", "ezflow", "tests", "examples", "noxfile.py", "_ezflow_cli.py")
    session.run(
        "ruff", "format", "--check", "ezflow", "tests", "examples", "noxfile.py", "_ezflow_cli.py"
    )


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session
def perf(session: nox.Session) -> None:
    """`ezflow perf run` (arguments pass through, e.g. `nox -s perf -- -s p2p --quick`)."""
    session.install("-e", ".")
    session.run("ezflow", "perf", "run", *session.posargs)


@nox.session
def perf_peers(session: nox.Session) -> None:
    """`ezflow perf peers --install`: ezflow's ordinary p2p program next to ezmsg, pyzmq,
    Zenoh and iceoryx2, each in a venv of its own made from PyPI (none of them is ever a
    dependency of ezflow). Extra arguments go to the command, e.g.
    `nox -s perf_peers -- --peers ezmsg,pyzmq --repeats 5 -o peers.json`."""
    session.install("-e", ".")
    Path("perf/results").mkdir(parents=True, exist_ok=True)  # git ignores it
    args = list(session.posargs)
    if not {"-o", "--output"} & set(args):
        args += ["-o", "perf/results/peers.json"]
    session.run("ezflow", "perf", "peers", "--install", *args)
