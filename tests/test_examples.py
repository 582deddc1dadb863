"""Every example runs to completion by itself, as a script and through ``ezflow run``,
with the core alone (no extra installed: what the README's "Try it" sets up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ezflow._cli._run import run

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
#: The top-level modules of the extras (pyproject.toml): an example may import none.
EXTRAS = ("zenoh", "ezmsg", "opentelemetry", "pytest", "hypothesis")


@pytest.fixture(scope="module")
def core_only(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment in which importing any extra's module fails, as in a venv where
    only `pip install -e .` ran (first on PYTHONPATH: a module of that name that raises)."""
    shadow = tmp_path_factory.mktemp("core_only")
    for name in EXTRAS:
        (shadow / f"{name}.py").write_text(
            f"raise ImportError('{name} is not part of the core (an extra brings it)')\n"
        )
    path = os.pathsep.join(p for p in (str(shadow), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "EZFLOW_GRAPH_ADDRESS": "127.0.0.1:0"}


def run_example(env: dict[str, str], name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    # What a newcomer sees: no warning (a deprecated name in an example printed one).
    assert "Warning:" not in result.stderr, result.stderr
    return result.stdout


def test_quickstart(core_only: dict[str, str]) -> None:
    out = run_example(core_only, "quickstart.py", "--blocks", "100")
    assert "received 100 blocks" in out
    assert "mean power 0.500" in out
    assert "via tcp: 100 messages, 100 decoded" in out


def test_units_quickstart(core_only: dict[str, str]) -> None:
    out = run_example(core_only, "units_quickstart.py", "--blocks", "40")
    assert "received 40 blocks, peak 2.000" in out


def test_signal_pipeline(core_only: dict[str, str]) -> None:
    out = run_example(core_only, "signal_pipeline.py", "--duration", "2")
    assert "20 spectra received; dominant frequency after the band-pass: 50.0 Hz" in out


def test_leaky_visualizer(core_only: dict[str, str]) -> None:
    out = run_example(core_only, "leaky_visualizer.py", "--frames", "1000")
    assert "recorder: 1000/1000 frames, 0 out of order" in out
    shown = int(out.split("viewer: showed ")[1].split()[0])
    assert 5 <= shown < 1000  # 1 s at 1000 fps, 20 ms a frame: about 50


def test_nested_collection(core_only: dict[str, str]) -> None:
    out = run_example(core_only, "nested_collection.py", "--count", "40")
    assert "PIPELINE/GAIN: gain is now 10.0" in out
    assert "printer: 40 values, last 375.00" in out  # mean of 36..39, times 10


def test_video_pipeline(core_only: dict[str, str]) -> None:
    out = run_example(core_only, "video_pipeline.py", "--seconds", "1")
    assert "display: 30 frames," in out


#: The examples of units run through `ezflow run FILE:graph`, and what each prints at its
#: end. (units_quickstart.py and signal_pipeline.py are the examples of `ezflow run
#: --help`, which tests/test_cli_run.py runs as written; quickstart.py is the low-level
#: API, a program of its own.)
THROUGH_EZFLOW_RUN = {
    "leaky_visualizer.py": ([], "recorder: 2000/2000 frames, 0 out of order"),
    # --set reaches into the collection: a window of 2 ends on the mean of 38 and 39.
    "nested_collection.py": (["--set", "PIPELINE.width=2"], "printer: 40 values, last 385.00"),
    "video_pipeline.py": (
        ["--set", "CAMERA.seconds=0.5", "--set", "DISPLAY.frames=15"],
        "display: 15 frames,",
    ),
}
IN_RUN_HELP = ("units_quickstart.py", "signal_pipeline.py")


def test_every_unit_example_runs_through_ezflow_run(core_only: dict[str, str]) -> None:
    # All at once (each is mostly waiting on its own pacing): a few seconds in total.
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "ezflow", "run", f"examples/{name}:graph", "-q", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=core_only,
        )
        for name, (args, _) in THROUGH_EZFLOW_RUN.items()
    }
    try:
        for name, process in runs.items():
            out, err = process.communicate(timeout=90)
            assert process.returncode == 0, (name, err)
            assert "Warning:" not in err, (name, err)
            assert THROUGH_EZFLOW_RUN[name][1] in out, (name, out)
    finally:
        for process in runs.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
    # And no example is left out.
    scripts = {path.name for path in EXAMPLES.glob("*.py")}
    assert scripts == {*THROUGH_EZFLOW_RUN, *IN_RUN_HELP, "quickstart.py"}
    for name in IN_RUN_HELP:
        assert f"ezflow run examples/{name}:graph" in (run.__doc__ or "")
