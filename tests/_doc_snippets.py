"""The Python blocks of a docs page, each run as a program (tests/test_docs_*.py).

Every ```python block of a page is a complete program that prints something. When the
block right after it is a ```text block, that is exactly what the program prints: the
page quotes its output (errors included) as users will see it, and the test checks it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).parent.parent / "docs"

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Snippet:
    """One ```python block: where it starts (``page.md:LINE``), its code, and the
    output the page shows for it (None when it shows none)."""

    where: str
    code: str
    output: str | None


def snippets(page: str) -> list[Snippet]:
    """The Python blocks of ``docs/<page>``, in order."""
    text = (DOCS / page).read_text()
    blocks = list(_BLOCK.finditer(text))
    found = []
    for i, block in enumerate(blocks):
        if block.group(1) != "python":
            continue
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        output = None
        if (
            after is not None
            and after.group(1) == "text"
            and not text[block.end() : after.start()].strip()
        ):
            output = after.group(2)
        line = text.count("\n", 0, block.start()) + 1
        found.append(Snippet(f"{page}:{line}", block.group(2), output))
    return found


def run_snippet(snippet: Snippet, directory: Path, timeout: float = 60) -> str:
    """Run *snippet* as a script in *directory* and return what it printed; fail the
    test if it exits with an error, prints nothing, or prints other than the page says."""
    script = directory / "snippet.py"
    script.write_text(snippet.code)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=directory,
        check=False,
    )
    assert result.returncode == 0, f"{snippet.where} failed:\n{result.stderr}"
    assert result.stdout.strip(), f"{snippet.where} printed nothing"
    if snippet.output is not None:
        assert result.stdout == snippet.output, (
            f"{snippet.where} printed\n{result.stdout}\nbut the page shows\n{snippet.output}"
        )
    return result.stdout
