"""Stock units: logging, terminating, gating, clocks, recording and replaying topics
(ezmsg users: TerminateOnTimeout, TerminateOnTotal, MessageGate and the Replayer of
ezmsg message logs behave as ezmsg.util's).

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
    GateMessage,
    MessageGate,
    MessageGateSettings,
    Recorder,
    RecorderSettings,
    Replayer,
    ReplayerSettings,
    TerminateAfter,
    TerminateAfterSettings,
    TerminateOnTimeout,
    TerminateOnTimeoutSettings,
    TerminateOnTotal,
    TerminateOnTotalSettings,
    rate_limited,
    read_ezmsg_log,
    read_recording,
)

__all__ = [
    "RECORDING_FORMAT",
    "Clock",
    "ClockSettings",
    "DebugLog",
    "DebugLogSettings",
    "GateMessage",
    "MessageGate",
    "MessageGateSettings",
    "Recorder",
    "RecorderSettings",
    "Replayer",
    "ReplayerSettings",
    "TerminateAfter",
    "TerminateAfterSettings",
    "TerminateOnTimeout",
    "TerminateOnTimeoutSettings",
    "TerminateOnTotal",
    "TerminateOnTotalSettings",
    "rate_limited",
    "read_ezmsg_log",
    "read_recording",
]
