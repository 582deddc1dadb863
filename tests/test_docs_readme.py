"""README.md's commands are what the project runs: its test command is exactly the
command of .ci/run, and that command checks lint, formatting and types before the
tests, on the same files as `nox -s lint typecheck`."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"this is exactly what `\.ci/run` does:\n\n```bash\n(.*?)\n```", text)
    assert found is not None, "README.md no longer shows the command .ci/run runs"
    (line,) = found.group(1).splitlines()
    return line


def _ci_command() -> str:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands[:2] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."'], commands
    (command,) = commands[2:]
    return command


def test_the_readme_test_command_is_what_ci_runs() -> None:
    assert _readme_test_command() == _ci_command()


def test_ci_runs_lint_formatting_types_and_tests_in_that_order() -> None:
    steps = [shlex.split(step) for step in _ci_command().split(" && ")]
    programs = [" ".join(step[:2]) for step in steps]
    assert programs == [
        "python3 -m",
        ".venv/bin/pip install",
        ".venv/bin/ruff check",
        ".venv/bin/ruff format",
        ".venv/bin/mypy",
        ".venv/bin/python -m",
    ]
    assert steps[-1] == [".venv/bin/python", "-m", "pytest"]
    assert steps[4] == [".venv/bin/mypy"]  # the files and strictness of pyproject.toml
    check, formatting = steps[2][2:], steps[3][2:]
    assert formatting[0] == "--check" and formatting[1:] == check
    # The same files as the nox session `lint`.
    lint = "session.run(" + ", ".join(f'"{word}"' for word in ["ruff", "check", *check]) + ")"
    assert lint in (ROOT / "noxfile.py").read_text()
