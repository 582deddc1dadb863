"""One way to say a public name is deprecated (kept one release, then removed)."""

from __future__ import annotations

import warnings

__all__ = ["warn_deprecated"]


def warn_deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn (``DeprecationWarning``) that *old* goes in the next release and *new*
    replaces it; *stacklevel* 3 points at the caller of the function that calls this."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
