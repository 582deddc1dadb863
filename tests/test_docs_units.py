"""Every Python block of docs/units.md is a complete program that runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).parent.parent / "docs" / "units.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_page_has_snippets() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_snippet_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(BLOCKS[index])
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"snippet {index} failed:\n{result.stderr}"
    assert result.stdout.strip(), f"snippet {index} printed nothing"
