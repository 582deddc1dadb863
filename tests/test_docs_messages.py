"""Every Python block of docs/messages.md is a complete program that runs and prints
what the page shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doc_snippets import Snippet, run_snippet, snippets

SNIPPETS = snippets("messages.md")


def test_the_page_has_snippets_with_their_output() -> None:
    assert len(SNIPPETS) >= 8
    assert all(snippet.output is not None for snippet in SNIPPETS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    run_snippet(snippet, tmp_path, timeout=30)
