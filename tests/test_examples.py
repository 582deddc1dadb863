"""Every example runs to completion by itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_quickstart() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--blocks", "100"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "received 100 blocks" in result.stdout
    assert "mean power 0.500" in result.stdout
    assert "via tcp: 100 messages, 100 decoded" in result.stdout
