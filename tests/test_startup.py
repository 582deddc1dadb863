"""The start-up benchmark (``ezflow perf startup``) runs and reports: each framework's
graph started, delivered its first message and exited normally."""

from __future__ import annotations

import re
import subprocess
import sys


def test_startup_benchmark_runs_both_graphs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ezflow", "perf", "startup", "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = dict(re.findall(r"^(ezflow|ezmsg)\s+([\d.]+)\s+[\d.]+$", result.stdout, re.M))
    assert "ezflow" in rows, result.stdout
    assert 0 < float(rows["ezflow"]) < 60
    try:
        import ezmsg.core  # noqa: F401, PLC0415 - optional: ezflow-pubsub[ezmsg]
    except ImportError:
        assert "measuring ezflow only" in result.stdout
    else:
        assert "ezmsg" in rows and re.search(r"^ratio\s", result.stdout, re.M)
