"""What ``import ezflow`` costs: every unit process imports it, so it imports no
presentation library (rich, typer: the CLI's, imported by ``ezflow._cli`` only)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PRESENTATION = {"rich", "typer"}


def imported_by(statement: str) -> set[str]:
    """Every module a fresh interpreter imports to run *statement*
    (``python -X importtime``)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {
        line.rsplit("|", 1)[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }


@pytest.mark.parametrize(
    ("statement", "presentation"),
    [
        ("import ezflow", False),
        ("import ezflow.units, ezflow.telemetry", False),
        ("import ezflow._cli._app", True),  # (the CLI does: the check sees it)
    ],
)
def test_import_ezflow_imports_neither_rich_nor_typer(statement: str, presentation: bool) -> None:
    modules = imported_by(statement)
    assert "ezflow" in modules and "ezflow._graph._server" in modules
    found = sorted(m for m in modules if m.split(".")[0] in PRESENTATION)
    assert bool(found) == presentation, found
