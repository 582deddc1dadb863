"""docs/perf.md quotes only figures kept in perf/baselines/: every measured figure sits
in a block that names its results file, the tables of the block are what
``ezflow perf peers --from FILE --markdown`` prints for it, and every other figure of
the block is one that file yields; outside such blocks the page states no figure."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ezflow._perf import _schema
from ezflow._perf._peers import _command, _selfcheck

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "perf.md"
BLOCK = re.compile(r"<!-- figures: (?P<path>\S+) -->\n(?P<body>.*?)<!-- /figures -->", re.S)
FENCE = re.compile(r"```.*?```", re.S)
#: A number as the tables print them (thousands separators, decimals).
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
#: What makes a number a measured figure: a unit of one, or a ratio.
FIGURE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:µs|msgs/s|k msgs/s|M msgs/s|MB/s|GB/s|Gbit/s|"
    r"frames/s|x\b|\u00d7)"
)


def _blocks() -> list[tuple[str, str]]:
    return [(m["path"], m["body"]) for m in BLOCK.finditer(PAGE.read_text())]


def _load(path: str) -> dict[str, Any]:
    file = ROOT / path
    assert file.is_file(), f"docs/perf.md quotes {path}, which is not in the repository"
    document: dict[str, Any] = json.loads(file.read_text())
    if not _selfcheck.is_selfcheck(document):
        assert _schema.validate(document) == [], path
    return document


def _generated(document: dict[str, Any]) -> str:
    """What ``ezflow perf peers --from FILE --markdown`` prints (the tables)."""
    if _selfcheck.is_selfcheck(document):
        return _selfcheck.markdown(document)
    return _command.markdown(document)


def _vocabulary(document: dict[str, Any]) -> set[str]:
    """Every number the file yields: its tables, and each number in it as the tables
    format them (medians, ranges, load averages, sizes...)."""
    words = set(NUMBER.findall(_generated(document)))

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            for fmt in ("{:,.0f}", "{:.0f}", "{:,.1f}", "{:.1f}", "{:.2f}", "{:,.2f}"):
                words.add(fmt.format(value))
            if isinstance(value, float) and value < 1e-3:  # CPU seconds per message
                words.add(f"{value * 1e6:.1f}")
                words.add(f"{value * 1e6:.2f}")

    walk(document)
    return words


def test_the_page_quotes_baselines() -> None:
    blocks = _blocks()
    assert blocks, "docs/perf.md has no <!-- figures: perf/baselines/... --> block"
    assert all(path.startswith("perf/baselines/") for path, _ in blocks)


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_every_figure_of_a_block_comes_from_its_file(index: int) -> None:
    path, body = _blocks()[index]
    document = _load(path)
    generated = set(_generated(document).splitlines())
    tables = [line for line in body.splitlines() if line.startswith("|")]
    assert tables, f"the block of {path} has no table"
    for line in tables:  # the tables, exactly as --from FILE --markdown prints them
        assert line in generated, f"{path}: not what --from prints: {line}"
    vocabulary = _vocabulary(document)
    lines = body.splitlines()
    prose = FENCE.sub("", "\n".join(line for line in lines if not line.startswith("|")))
    for match in FIGURE.finditer(prose):
        number = NUMBER.match(match.group())
        assert number is not None
        assert number.group() in vocabulary, f"{path}: {match.group()!r} is not in the file"


def test_outside_the_blocks_the_page_states_no_figure() -> None:
    text = FENCE.sub("", BLOCK.sub("", PAGE.read_text()))
    text = re.sub(r"`[^`]*`", "", text)  # commands and names, not figures
    found = [m.group() for m in FIGURE.finditer(text)]
    assert not found, f"figures outside a <!-- figures: ... --> block: {found}"
