"""docs/limits.md and ezflow/_core/_config.py say the same thing, both ways.

Every constant docs/limits.md names in backquotes exists in ``_config`` (and where the
page gives its value right before the name, ``16 MiB (`ZENOH_QUEUE_BYTES`)``, it is that
value); every limit ``_config`` exports is named on the page; every environment variable
the page names is one ``_config`` reads, and the reverse.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from ezflow._core import _config

PAGE = Path(__file__).parent.parent / "docs" / "limits.md"
TEXT = PAGE.read_text()

#: Backquoted upper-case words of the page that are not constants: wire frame kinds.
NOT_CONSTANTS = {"END", "FREE"}

_NAME = re.compile(r"`([A-Z][A-Z0-9_]{2,})`")
# "<number> [unit] [one word] (`NAME`)": the value the page gives for NAME
_VALUE = re.compile(
    r"(?P<number>\d[\d,]*(?:\.\d+)?)\s*(?P<unit>µs|ms|s|B|KiB|MiB|GiB)?"
    r"(?:\s+[a-z]+)?\s*\(`(?P<name>[A-Z][A-Z0-9_]{2,})`\)"
)
_SCALE = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "s": 1}


def _named() -> set[str]:
    return {
        name
        for name in _NAME.findall(TEXT)
        if name not in NOT_CONSTANTS and not name.startswith("EZFLOW_")
    }


def _limits() -> set[str]:
    """The numeric exports of _config: numbers, and tuples of numbers."""
    found = set()
    for name in _config.__all__:
        value = getattr(_config, name)
        numbers = value if isinstance(value, tuple) else (value,)
        if all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
            found.add(name)
    return found


def _in_unit(number: float, unit: str | None, name: str) -> float:
    """*number* given in *unit* on the page, in the unit of the constant *name*."""
    if unit in ("µs", "ms"):
        per_second = 1e6 if unit == "µs" else 1e3
        return number * 1e9 / per_second if name.endswith("_NS") else number / per_second
    return number * _SCALE[unit]


def test_the_page_names_constants() -> None:
    assert len(_named()) >= 90


@pytest.mark.parametrize("name", sorted(_named()))
def test_each_constant_the_page_names_is_in_config(name: str) -> None:
    assert name in _config.__all__, (
        f"docs/limits.md names {name}, which ezflow/_core/_config.py does not export"
    )


def test_each_limit_of_config_is_on_the_page() -> None:
    missing = _limits() - _named()
    assert not missing, f"limits of _config.py that docs/limits.md does not name: {missing}"


def test_the_values_the_page_gives_are_the_constants() -> None:
    checked = 0
    for match in _VALUE.finditer(TEXT):
        name, unit = match["name"], match["unit"]
        value = getattr(_config, name)
        if isinstance(value, tuple):
            # "at 0.05, 0.5 and 2 s (`SHM_SWEEP_DELAYS`)": the last numbers before it
            before = TEXT[: match.end()].rsplit("|", 1)[-1]
            numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", before)]
            assert numbers[-len(value) :] == list(value), name
        else:
            said = _in_unit(float(match["number"].replace(",", "")), unit, name)
            assert math.isclose(said, value), f"docs/limits.md: {match[0]!r}, but {name} = {value}"
        checked += 1
    assert checked >= 80


def test_environment_variables_both_ways() -> None:
    on_page = set(re.findall(r"`(EZFLOW_[A-Z_]+)", TEXT))
    read = {getattr(_config, n) for n in _config.__all__ if n.startswith("ENV_")}
    assert on_page == read
