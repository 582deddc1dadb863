"""Stock units: logging, terminating, clocks, recording and replaying topics.

::

    from ezflow.units import DebugLog, Recorder, RecorderSettings, TerminateAfter
"""

from __future__ import annotations

from ._units._stock import (
    RECORDING_FORMAT,
    Clock,
    ClockSettings,
    DebugLog,
    DebugLogSettings,
    Recorder,
    RecorderSettings,
    Replayer,
    ReplayerSettings,
    TerminateAfter,
    TerminateAfterSettings,
    TerminateOnTotal,
    TerminateOnTotalSettings,
    rate_limited,
    read_recording,
)

__all__ = [
    "RECORDING_FORMAT",
    "Clock",
    "ClockSettings",
    "DebugLog",
    "DebugLogSettings",
    "Recorder",
    "RecorderSettings",
    "Replayer",
    "ReplayerSettings",
    "TerminateAfter",
    "TerminateAfterSettings",
    "TerminateOnTotal",
    "TerminateOnTotalSettings",
    "rate_limited",
    "read_recording",
]
