"""What the figures were measured on: CPU, cores, OS, Python, packages, loop, git."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["capture", "load_average"]

#: Distributions whose versions go into every result file (missing ones are null).
PACKAGES = ("ezflow", "numpy", "msgpack", "uvloop", "typer", "rich", "ezmsg")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    # ezflow's distribution is ezflow-pubsub (_core._config.DISTRIBUTION; this module
    # imports nothing of ezflow's); the results keep the key "ezflow".
    distribution = "ezflow-pubsub" if package == "ezflow" else package
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    """Output of ``git ARGS`` run in the source tree of this package, or None when it
    is not a git checkout (an installed wheel) or git is missing."""
    source = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(
            ["git", "-C", str(source), *args],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``uptime``), or None where there are none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def capture(event_loop: str) -> dict[str, Any]:
    """The environment section of a results file (see :mod:`._schema`)."""
    revision = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if revision else None
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count() or 1,
        "cores_available": affinity,
        "machine": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
        "event_loop": event_loop,
        "packages": {name: _version(name) for name in PACKAGES},
        "git_revision": revision,
        "git_dirty": bool(status) if revision else None,
        "hostname": platform.node(),
    }
