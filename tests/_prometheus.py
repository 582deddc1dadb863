"""A strict reader of the Prometheus text exposition format (0.0.4), for the tests of
the graph server's metrics endpoint, and a plain HTTP GET."""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from typing import Any

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(\{{(.*)\}})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"(,|$)')
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        assert match, f"bad labels at {text[position:]!r}"
        name, raw = match.group(1), match.group(2)
        assert name not in labels, f"label {name} twice"
        labels[name] = raw.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        position = match.end()
    return labels


def parse_exposition(text: str) -> dict[str, dict[str, Any]]:
    """``{family: {"type", "help", "samples": [(name, labels, value)]}}``; asserts that
    the text is well formed: HELP and TYPE before a family's samples, each family in one
    block, valid names, labels and values, histogram buckets cumulative and ending in
    ``+Inf`` equal to ``_count``."""
    assert text.endswith("\n"), "the exposition ends with a newline"
    families: dict[str, dict[str, Any]] = {}
    current: str | None = None
    finished: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert re.fullmatch(_NAME, name), name
            assert name not in families, f"family {name} twice"
            if current is not None:
                finished.add(current)
            current = name
            families[name] = {"help": help_text, "type": None, "samples": []}
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name == current, f"TYPE of {name} outside its block"
            assert kind in _TYPES, kind
            families[name]["type"] = kind
        elif line.startswith("#"):
            continue
        else:
            match = _SAMPLE.match(line)
            assert match, f"bad sample line {line!r}"
            name, labels, value = match.group(1), _labels(match.group(3) or ""), match.group(4)
            assert current is not None and name.startswith(current), f"{name} outside its block"
            number = float(value)  # also "+Inf", "NaN"
            assert not math.isnan(number) or value == "NaN"
            families[current]["samples"].append((name, labels, number))
    for name, family in families.items():
        assert family["type"] is not None, f"{name} has no TYPE"
        if family["type"] == "histogram":
            _check_histogram(name, family["samples"])
    return families


def _check_histogram(name: str, samples: list[tuple[str, dict[str, str], float]]) -> None:
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    counts: dict[tuple[tuple[str, str], ...], float] = {}
    for sample, labels, value in samples:
        if sample == f"{name}_bucket":
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            series.setdefault(key, []).append((float(labels["le"]), value))
        elif sample == f"{name}_count":
            counts[tuple(sorted(labels.items()))] = value
        else:
            assert sample == f"{name}_sum", sample
    for key, buckets in series.items():
        bounds = [b for b, _ in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == math.inf, f"{name} buckets {bounds}"
        values = [v for _, v in buckets]
        assert values == sorted(values), f"{name} buckets are not cumulative"
        assert values[-1] == counts[key], f"{name} +Inf bucket != _count"


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    """Status and body of a GET (error statuses included)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
