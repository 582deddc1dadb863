"""The README's install story: the distribution's own name everywhere a line installs
it, a core-only first step, the tests' command as CI runs it, a note per extra."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import ezflow
from ezflow._core._config import DISTRIBUTION
from ezflow._perf import _environment
from ezflow._perf._peers import _install

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _texts() -> dict[Path, str]:
    """Where install lines are written: the README, the docs, the package's messages."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    paths += sorted((ROOT / "ezflow").rglob("*.py"))
    return {path: path.read_text() for path in paths}


def test_the_distribution_is_installed_under_its_own_name() -> None:
    # `ezflow` on PyPI is an unrelated project: this one is ezflow-pubsub, imported as
    # ezflow, and the metadata says so.
    assert DISTRIBUTION == "ezflow-pubsub"
    assert importlib.metadata.version(DISTRIBUTION)
    assert DISTRIBUTION in importlib.metadata.packages_distributions()["ezflow"]
    # ezflow perf reads the metadata too: the environment of its results, the
    # requirements of the peers' venvs.
    assert _environment.capture("asyncio")["packages"]["ezflow"] == ezflow.__version__
    assert _install._ezflow_requirements()


def test_no_line_installs_another_project() -> None:
    for path, text in _texts().items():
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            for rest in re.findall(r"pip install ([^`\n]*)", line):
                words = re.split(r"&&|\|\||;|\|", rest)[0]  # the pip command's own words
                for word in words.split():
                    requirement = word.strip("'\"(),;")
                    if requirement.startswith("ezflow"):
                        assert requirement.startswith(f"{DISTRIBUTION}"), (where, line)
            # An extra named by the package's name ("ezflow[zenoh]") is PyPI's ezflow.
            assert not re.search(r"(?<![\w-])ezflow\[", line), (where, line)


def test_the_readme_notes_the_clash_and_how_to_install_from_source() -> None:
    install = README.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    assert "`ezflow` on PyPI belongs to an" in " ".join(install.split())
    assert "pip install /path/to/ezflow" in install  # a checkout
    assert f"pip install '{DISTRIBUTION}[zenoh] @ git+" in install  # a git URL


def test_try_it_installs_the_core_and_the_tests_install_dev() -> None:
    commands = re.findall(r"```bash\n(python3 -m venv[^\n]*)\n```", README)
    try_it = next(c for c in commands if "examples/quickstart.py" in c)
    tests = next(c for c in commands if "pytest" in c)
    assert "pip install -q -e . &&" in try_it and "[" not in try_it  # the core only
    assert "pip install -q -e '.[dev]'" in tests
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == tests  # CI runs exactly the README's command


def test_every_extra_is_explained() -> None:
    extras = importlib.metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or []
    assert set(extras) >= {"dev", "zenoh", "otel", "ezmsg"}
    table = README.split("| extra | brings | for |", 1)[1].split("\n\n", 1)[0]
    for extra in extras:
        assert f"| `{extra}` |" in table, extra
