"""The results file of ``ezflow perf run``: its JSON schema and a validator.

:data:`SCHEMA` is a JSON Schema (draft 2020-12) document; ``ezflow perf schema`` prints
it, docs/perf.md describes it field by field. :func:`validate` checks a document
against it without any dependency, implementing exactly the keywords the schema uses
(``type``, ``properties``, ``required``, ``additionalProperties``, ``items``,
``enum``, ``const``, ``minimum``, ``$ref`` to ``#/$defs/...``).

The version is in ``schema`` (``ezflow-perf/1``): a change that could break a reader
bumps it; adding an optional field does not. Optional so far (absent in files written
before the p2p suite): a cell's ``variant``, ``loop``, ``crashes``, ``crash_reasons``,
``swept`` and ``unswept``;
the plan's ``min_messages``, ``max_duration`` and ``shm_inline_limit``; the floor's
``memcpy_us``, ``paced_one_way_us`` and ``stream_msgs_per_s``; the environment's
``load_before`` and ``load_after``. A reader takes an absent
``variant`` as null and an absent ``crashes`` as 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from ._spec import LOOPS, MESSAGES, RECEIVES, SUITES, TRANSPORTS

__all__ = ["SCHEMA", "SCHEMA_ID", "ResultsError", "load", "validate"]

SCHEMA_ID: Final = "ezflow-perf/1"

_NUMBER = {"type": "number", "minimum": 0}
_OPT_NUMBER = {"type": ["number", "null"], "minimum": 0}
_COUNT = {"type": "integer", "minimum": 0}
_LOAD = {"anyOf": [{"type": "array", "items": _NUMBER}, {"type": "null"}]}

_METRICS = {
    "type": "object",
    "description": "Figures of one cell (one repeat, or the median over the repeats).",
    "required": [
        "msgs_per_s",
        "mb_per_s",
        "latency_p50_us",
        "latency_p99_us",
        "latency_max_us",
        "loaded_latency_p50_us",
        "drops",
        "cpu_s_per_msg",
        "messages",
    ],
    "additionalProperties": False,
    "properties": {
        "msgs_per_s": _NUMBER | {"description": "messages/s received at the sinks, summed"},
        "mb_per_s": _NUMBER | {"description": "payload megabytes (1e6 B)/s at the sinks"},
        "latency_p50_us": _OPT_NUMBER | {"description": "paced one-way latency, median"},
        "latency_p99_us": _OPT_NUMBER,
        "latency_max_us": _OPT_NUMBER,
        "loaded_latency_p50_us": _OPT_NUMBER
        | {"description": "one-way latency while back-to-back (queueing included)"},
        "drops": _COUNT | {"description": "sequence gaps seen by the sinks (lossless: 0)"},
        "cpu_s_per_msg": _NUMBER
        | {"description": "CPU seconds of every worker process / messages at the sinks"},
        "messages": _COUNT | {"description": "messages the sinks received, all phases"},
    },
}

_VARIANT = {
    "type": "object",
    "description": "How the p2p program is written (null for the other suites).",
    "required": ["message", "loop", "receive", "loan"],
    "additionalProperties": False,
    "properties": {
        "message": {"enum": list(MESSAGES)},
        "loop": {"enum": list(LOOPS)},
        "receive": {"enum": list(RECEIVES)},
        "loan": {"type": "boolean"},
    },
}

_CELL = {
    "type": "object",
    "required": [
        "framework",
        "suite",
        "transport",
        "size",
        "clients",
        "status",
        "reason",
        "processes",
        "repeats",
        "metrics",
    ],
    "additionalProperties": False,
    "properties": {
        "framework": {"type": "string"},
        "suite": {"enum": list(SUITES)},
        "transport": {"enum": list(TRANSPORTS)},
        "size": {"type": "integer", "minimum": 1},
        "clients": {"type": "integer", "minimum": 1},
        "variant": {"anyOf": [{"$ref": "#/$defs/variant"}, {"type": "null"}]},
        "loop": {
            "anyOf": [{"enum": ["uvloop", "asyncio"]}, {"type": "null"}],
            "description": "the event loop the workers of this cell reported",
        },
        "status": {"enum": ["ok", "unavailable", "error"]},
        "reason": {"type": ["string", "null"]},
        "processes": {"type": "integer", "minimum": 0},
        "crashes": _COUNT
        | {"description": "worker crashes in this cell, every attempt (retried ones too)"},
        "crash_reasons": {"type": "array", "items": {"type": "string"}},
        "swept": {
            "type": "array",
            "description": "files the framework's workers left in /dev/shm, removed after "
            "a repeat (see ezflow/_perf/_leftovers.py)",
            "items": {
                "type": "object",
                "required": ["name", "bytes"],
                "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "bytes": _COUNT},
            },
        },
        "unswept": {
            "type": "array",
            "description": "files matching what the workers may leave that were kept, and why",
            "items": {
                "type": "object",
                "required": ["name", "why"],
                "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "why": {"type": "string"}},
            },
        },
        "repeats": {"type": "array", "items": {"$ref": "#/$defs/metrics"}},
        "metrics": {"anyOf": [{"$ref": "#/$defs/metrics"}, {"type": "null"}]},
    },
}

SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "ezflow perf results",
    "type": "object",
    "required": [
        "schema", "created", "command", "wall_seconds", "environment", "plan",
        "frameworks", "floor", "cells",
    ],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "created": {"type": "string", "description": "ISO 8601 UTC time of the start"},
        "command": {"type": "array", "items": {"type": "string"}},
        "wall_seconds": _NUMBER,
        "environment": {
            "type": "object",
            "required": [
                "cpu_model", "cores", "cores_available", "machine", "os", "python",
                "python_implementation", "python_executable", "event_loop", "packages",
                "git_revision", "git_dirty", "hostname",
            ],
            "additionalProperties": False,
            "properties": {
                "cpu_model": {"type": "string"},
                "cores": {"type": "integer", "minimum": 1},
                "cores_available": {"type": "integer", "minimum": 1},
                "machine": {"type": "string"},
                "os": {"type": "string"},
                "python": {"type": "string"},
                "python_implementation": {"type": "string"},
                "python_executable": {"type": "string"},
                "event_loop": {"enum": ["uvloop", "asyncio"]},
                "packages": {
                    "type": "object",
                    "additionalProperties": {"type": ["string", "null"]},
                },
                "git_revision": {"type": ["string", "null"]},
                "git_dirty": {"type": ["boolean", "null"]},
                "hostname": {"type": "string"},
                "load_before": _LOAD | {"description": "load averages (1, 5, 15 min) at the start"},
                "load_after": _LOAD | {"description": "load averages at the end"},
            },
        },
        "plan": {
            "type": "object",
            "required": [
                "duration", "count", "warmup", "latency_samples", "latency_seconds", "period",
                "repeats", "floor_round_trips", "loan",
            ],
            "additionalProperties": False,
            "properties": {
                "duration": _NUMBER,
                "count": {"type": ["integer", "null"], "minimum": 1},
                "warmup": _NUMBER,
                "latency_samples": {"type": "integer", "minimum": 1},
                "latency_seconds": _NUMBER,
                "loan": {"type": "boolean"},
                "period": _NUMBER,
                "repeats": {"type": "integer", "minimum": 1},
                "floor_round_trips": {"type": "integer", "minimum": 1},
                "min_messages": {"type": "integer", "minimum": 0},
                "max_duration": _NUMBER,
                "shm_inline_limit": {"type": ["integer", "null"], "minimum": 0},
            },
        },
        "frameworks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "version", "event_loop"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "event_loop": {"enum": ["uvloop", "asyncio"]},
                },
            },
        },
        "floor": {
            "type": "object",
            "required": ["memcpy_gb_per_s", "socketpair_rtt_us"],
            "additionalProperties": False,
            "properties": {
                "memcpy_gb_per_s": _OPT_NUMBER,
                "socketpair_rtt_us": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["size", "p50", "p99"],
                        "additionalProperties": False,
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "p50": _NUMBER,
                            "p99": _NUMBER,
                        },
                    },
                },
                "paced_one_way_us": {
                    "type": "array",
                    "description": "p2p only: one-way time of paced messages over a raw "
                    "socket (unix next to shm, tcp next to tcp), at the p2p pacing",
                    "items": {
                        "type": "object",
                        "required": ["over", "size", "p50", "p99"],
                        "additionalProperties": False,
                        "properties": {
                            "over": {"enum": ["unix", "tcp"]},
                            "size": {"type": "integer", "minimum": 1},
                            "p50": _NUMBER,
                            "p99": _NUMBER,
                        },
                    },
                },
                "stream_msgs_per_s": {
                    "type": "array",
                    "description": "p2p only: messages/s written back to back on a raw socket",
                    "items": {
                        "type": "object",
                        "required": ["over", "size", "msgs_per_s"],
                        "additionalProperties": False,
                        "properties": {
                            "over": {"enum": ["unix", "tcp"]},
                            "size": {"type": "integer", "minimum": 1},
                            "msgs_per_s": _NUMBER,
                        },
                    },
                },
                "memcpy_us": {
                    "type": "array",
                    "description": "one numpy copy of a message of each size (optional)",
                    "items": {
                        "type": "object",
                        "required": ["size", "us"],
                        "additionalProperties": False,
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "us": _NUMBER,
                        },
                    },
                },
            },
        },
        "cells": {"type": "array", "items": {"$ref": "#/$defs/cell"}},
    },
    "$defs": {"metrics": _METRICS, "cell": _CELL, "variant": _VARIANT},
}  # fmt: skip

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _is(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[name])


def _check(value: Any, schema: dict[str, Any], path: str, errors: list[str]) -> None:
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        _check(value, SCHEMA["$defs"][name], path, errors)
        return
    if "anyOf" in schema:
        attempts = []
        for option in schema["anyOf"]:
            found: list[str] = []
            _check(value, option, path, found)
            if not found:
                return
            attempts.append(found)
        # Report the problems inside the form whose type fits (an object with a bad
        # field, not "expected null"), or say that no form fits at all.
        inside = [found for found in attempts if not found[0].startswith(f"{path}: expected")]
        errors.extend(inside[0] if inside else [f"{path}: matches none of the allowed forms"])
        return
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: must be {schema['const']!r}, not {value!r}")
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
        return
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, name) for name in names):
            errors.append(f"{path}: expected {' or '.join(names)}, got {type(value).__name__}")
            return
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        errors.append(f"{path}: {value!r} is below the minimum {schema['minimum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                errors.append(f"{path}: missing {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                _check(item, properties[name], f"{path}.{name}", errors)
            elif extra is False:
                errors.append(f"{path}: unexpected field {name!r}")
            elif isinstance(extra, dict):
                _check(item, extra, f"{path}.{name}", errors)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{index}]", errors)


def validate(document: Any) -> list[str]:
    """Every way *document* departs from :data:`SCHEMA` (empty when it conforms), as
    ``path: problem`` lines, e.g. ``$.cells[3].metrics.drops: expected integer``."""
    errors: list[str] = []
    _check(document, SCHEMA, "$", errors)
    return errors


class ResultsError(ValueError):
    """A results file that cannot be read or does not match the schema (one line)."""


def load(path: Path) -> dict[str, Any]:
    """Read and validate a results file; :class:`ResultsError` with one line on failure."""
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise ResultsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path} is not a JSON document: {exc}") from None
    errors = validate(document)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ResultsError(f"{path} is not an ezflow perf results file: {errors[0]}{more}")
    result: dict[str, Any] = document
    return result
