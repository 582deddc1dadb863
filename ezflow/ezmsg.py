"""Deprecated alias of ezflow's private ezmsg adapter; removed in the next release.

The one ezmsg module users import is :mod:`ezflow.compat.ezmsg` (``import
ezflow.compat.ezmsg as ez``: ezmsg's API on ezflow). ezmsg's own units and collections
need no import at all: :func:`ezflow.run` adapts them by itself (docs/ezmsg.md). Importing
this module warns (``DeprecationWarning``) and gives the adapter's names as before.
"""

from __future__ import annotations

import warnings

warnings.warn(
    "ezflow.ezmsg is deprecated and will be removed in the next release: import "
    "ezflow.compat.ezmsg for ezmsg's API; ezflow.run adapts ezmsg's own units and "
    "collections without any import (docs/ezmsg.md)",
    DeprecationWarning,
    stacklevel=2,
)

from ._units._ezmsg_adapter import EzmsgCollection, EzmsgUnit, adapt  # noqa: E402

__all__ = ["EzmsgCollection", "EzmsgUnit", "adapt"]
