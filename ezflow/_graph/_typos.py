"""Topic names that are probably typos: the nearest existing topic by edit distance.

A subscriber of ``/sensor/rwa`` next to a publisher of ``/sensor/raw`` receives nothing
and raises nothing. :func:`nearest_topic` finds the topic a name was probably meant to
be — one within a few edits (a transposition counts as one) — so that ezflow can say so
once: for a connection of a unit graph to a topic name (at start) and for a low-level
subscriber that has had no publisher for ``TYPO_GRACE_PERIOD`` seconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["edit_distance", "fed_topics", "nearest_topic", "read_topics", "typo_limit"]


def edit_distance(a: str, b: str, limit: int) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) from *a* to *b*; any
    value above *limit* is returned as ``limit + 1`` (the rows stop early)."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cost = 0 if ca == cb else 1
            best = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                best = min(best, before[j - 2] + 1)
            current[j] = best
        if min(current) > limit:
            return limit + 1
        before, previous = previous, current
    return min(previous[-1], limit + 1)


def typo_limit(name: str) -> int:
    """How many edits a typo of *name* may have: one per 5 characters, at most 3
    (``/sensor/rwa``: 2); none for names shorter than 5 (``/a`` next to ``/b`` is
    more likely two topics than a typo)."""
    return min(3, len(name) // 5)


_DIGITS = re.compile(r"\d+")


def nearest_topic(name: str, topics: Iterable[str]) -> str | None:
    """The topic of *topics* nearest to *name* within :func:`typo_limit` edits (the
    first in sorted order on a tie), or None. *name* itself does not count, nor a topic
    that differs from it only in numbers (``/fan/3`` next to ``/fan/2`` is a family of
    topics, not a typo)."""
    limit = typo_limit(name)
    if limit == 0:
        return None
    shape = _DIGITS.sub("#", name)
    best: tuple[int, str] | None = None
    for topic in sorted(set(topics)):
        if topic == name or _DIGITS.sub("#", topic) == shape:
            continue
        distance = edit_distance(name, topic, limit)
        if distance <= limit and (best is None or distance < best[0]):
            best = (distance, topic)
    return None if best is None else best[1]


def _closure(start: Iterable[str], edges: Mapping[str, Sequence[str]]) -> set[str]:
    seen = set(start)
    pending = list(seen)
    while pending:
        for nxt in edges.get(pending.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                pending.append(nxt)
    return seen


def fed_topics(snapshot: Mapping[str, Any]) -> set[str]:
    """The topics of a graph server snapshot (``GraphContext.graph()``) that messages
    reach: those with a publisher, and those topic edges lead to from them."""
    forward: dict[str, list[str]] = {}
    for src, dst in snapshot.get("edges", ()):
        forward.setdefault(src, []).append(dst)
    return _closure((p["topic"] for p in snapshot.get("publishers", ())), forward)


def read_topics(snapshot: Mapping[str, Any]) -> set[str]:
    """The topics of a snapshot that somebody reads: those with a subscriber, and those
    topic edges lead from to them."""
    backward: dict[str, list[str]] = {}
    for src, dst in snapshot.get("edges", ()):
        backward.setdefault(dst, []).append(src)
    return _closure((s["topic"] for s in snapshot.get("subscribers", ())), backward)
