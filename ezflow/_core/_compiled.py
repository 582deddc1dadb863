"""Which codec path runs: the compiled one (``ezflow._core._speedups``, an optional C
extension built at install when a compiler is there) or the pure-Python one.

Chosen here, once, when ezflow is imported; every module that has a compiled twin asks
:data:`SPEEDUPS`, nothing else imports the extension. ``EZFLOW_PURE_PYTHON=1``
(``ENV_PURE_PYTHON``) forces the pure-Python path. Both paths give the same bytes and
the same errors: tests/test_speedups.py pins each compiled function to its pure-Python
twin. docs/architecture.md ("The compiled hot path") says what is compiled and why.
"""

from __future__ import annotations

import os
from types import ModuleType

from ._config import ENV_PURE_PYTHON

__all__ = ["SPEEDUPS", "active_path"]


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(ENV_PURE_PYTHON, "").strip() not in ("", "0"):
        return None, f"pure Python ({ENV_PURE_PYTHON} is set)"
    try:
        from . import _speedups  # noqa: PLC0415 - optional: absent without a compiler
    except ImportError:
        return None, "pure Python (the C extension ezflow._core._speedups is not built)"
    return _speedups, "compiled (ezflow._core._speedups)"


SPEEDUPS, _PATH = _load()


def active_path() -> str:
    """Which codec path this process runs, and why, in a few words."""
    return _PATH
