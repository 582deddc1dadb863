"""tests/_netns.py, the simulated hosts of the fleet tests: what a killed test process
left behind is deleted by the next one (namespaces are not files: nothing else would)."""

from __future__ import annotations

import os
import subprocess
import sys

import _netns
import pytest


def test_a_killed_processs_namespaces_are_deleted_by_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead, alive = f"ezflow-a{gone.stdout.strip()}x0", f"ezflow-b{os.getpid()}x999"
    try:
        _netns.ip("netns", "add", dead)
        _netns.ip("netns", "add", alive)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"network namespaces unavailable (needs root and iproute2): {exc}")
    try:
        monkeypatch.setattr(_netns, "_swept", [])  # (this process has not swept yet)
        with _netns.two_hosts() as hosts:
            assert {hosts.a, hosts.b, alive} <= _netns.namespaces()
        assert dead not in _netns.namespaces()  # its process is gone
        assert alive in _netns.namespaces()  # a live process's, whoever it is
    finally:
        _netns._delete([dead, alive])
