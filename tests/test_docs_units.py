"""Every Python block of docs/units.md is a complete program that runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doc_snippets import Snippet, run_snippet, snippets

SNIPPETS = snippets("units.md")


def test_the_page_has_snippets() -> None:
    assert len(SNIPPETS) >= 4


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    run_snippet(snippet, tmp_path)
