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


def run_example(name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_units_quickstart() -> None:
    out = run_example("units_quickstart.py", "--blocks", "40")
    assert "received 40 blocks, peak 2.000" in out


def test_signal_pipeline() -> None:
    out = run_example("signal_pipeline.py", "--duration", "2")
    assert "20 spectra received; dominant frequency after the band-pass: 50.0 Hz" in out


def test_leaky_visualizer() -> None:
    out = run_example("leaky_visualizer.py", "--frames", "1000")
    assert "recorder: 1000/1000 frames, 0 out of order" in out
    shown = int(out.split("viewer: showed ")[1].split()[0])
    assert 1 <= shown < 1000


def test_nested_collection() -> None:
    out = run_example("nested_collection.py", "--count", "40")
    assert "PIPELINE/GAIN: gain is now 10.0" in out
    assert "printer: 40 values, last 375.00" in out  # mean of 36..39, times 10


def test_video_pipeline() -> None:
    out = run_example("video_pipeline.py", "--seconds", "1")
    assert "display: 30 frames," in out
