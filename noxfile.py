"""Sessions: tests, lint, typecheck, perf."""

from __future__ import annotations

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
    session.install("-e", ".")
    session.run("python", "perf/bench_tcp.py", *session.posargs)
