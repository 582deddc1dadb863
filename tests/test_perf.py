"""ezflow perf, without the command line: options, layouts, sinks, schema, ratios."""

from __future__ import annotations

import numpy as np
import pytest

from ezflow._perf._spec import (
    END,
    LATENCY,
    RATE,
    WARMUP,
    Cell,
    Plan,
    SpecError,
    latency_count,
    layout,
    parse_size,
)
from ezflow._perf._worker import HEADER, WARM_MESSAGES, SinkState, is_end, payload_for


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64", 64),
        ("64B", 64),
        ("1KiB", 1024),
        ("1kib", 1024),
        ("4K", 4096),
        ("1KB", 1000),
        ("1MiB", 1 << 20),
        (" 2 MiB ", 2 << 20),
        ("64MiB", 64 << 20),
    ],
)
def test_sizes_parse(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1XiB", "KiB", "1.5KiB", "-1", "0", "31", "65MiB", "1 Ki B"])
def test_bad_sizes_are_refused_with_one_line(text: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_size(text)
    assert "\n" not in str(caught.value)
    assert repr(text) in str(caught.value)


def test_bad_cells_and_plans_are_refused() -> None:
    with pytest.raises(SpecError, match="unknown suite 'ring'"):
        Cell("ring", "tcp", 64, 1)
    with pytest.raises(SpecError, match="unknown transport 'udp'"):
        Cell("relay", "udp", 64, 1)
    with pytest.raises(SpecError, match="clients"):
        Cell("relay", "tcp", 64, 0)
    with pytest.raises(SpecError, match="warm-up"):
        Plan(duration=0.1, warmup=0.2)
    with pytest.raises(SpecError, match="repeats"):
        Plan(repeats=0)


def _edges_cross(cell: Cell) -> bool:
    """Every edge of *cell*'s layout joins two different processes."""
    groups = layout(cell, "/t")
    where = {}
    for number, group in enumerate(groups):
        for unit in group.units:
            for topic in (unit.input, unit.output):
                if topic is not None:
                    where.setdefault(topic, set()).add(number)
    return all(len(numbers) == 2 for numbers in where.values())


@pytest.mark.parametrize("suite", ["fanout", "fanin", "relay", "spread"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_layouts(suite: str, n: int) -> None:
    units = [unit for group in layout(Cell(suite, "tcp", 64, n), "/t") for unit in group.units]
    kinds = [unit.kind for unit in units]
    sinks = [unit for unit in units if unit.kind == "sink"]
    if suite == "fanout":
        assert kinds.count("source") == 1 and kinds.count("sink") == n
    elif suite == "fanin":
        assert kinds.count("source") == n and sinks[0].sources == n
    else:
        assert kinds.count("relay") == n and kinds.count("sink") == 1
    assert _edges_cross(Cell(suite, "tcp", 64, n))
    processes = len(layout(Cell(suite, "shm", 64, n), "/t"))
    assert processes == (n + 2 if suite == "spread" else 2)
    if suite != "spread":
        assert len(layout(Cell(suite, "local", 64, n), "/t")) == 1
    else:
        assert Cell(suite, "local", 64, n).applicable is not None


def _frame(payload: np.ndarray, seq: int, source: int, phase: int) -> np.ndarray:
    frame = payload.copy()
    HEADER.pack_into(frame, 0, 0, seq, source, phase)
    return frame


def test_sink_counts_drops_corruption_and_phases() -> None:
    payload = payload_for(7, 0, 64)
    assert payload[HEADER.size :].any(), "payloads are random, not zeros"
    sink = SinkState(sources=1, warmup_ns=0, expected=[payload])
    assert not sink.handle(_frame(payload, 0, 0, RATE))
    assert not sink.handle(_frame(payload, 1, 0, RATE))
    assert not sink.handle(_frame(payload, 3, 0, RATE))  # seq 2 lost
    assert not sink.handle(_frame(payload, 4, 0, LATENCY))
    assert not sink.handle(_frame(payload, 5, 0, LATENCY))
    end = _frame(payload, 6, 0, END)
    end[HEADER.size + 5] ^= 1  # the END message is checked in full
    assert is_end(end)
    assert sink.handle(end)
    result = sink.result(latency_warmup=0)
    assert result["rate_messages"] == 3
    assert result["latency_messages"] == 2
    assert result["drops"] == 1
    assert result["corrupt"] == 1
    assert result["ends"] == 1
    assert len(result["latency_ns"]) == 2


def test_payloads_differ_per_source_and_repeat_per_seed() -> None:
    assert np.array_equal(payload_for(1, 0, 64), payload_for(1, 0, 64))
    assert not np.array_equal(payload_for(1, 0, 64), payload_for(1, 1, 64))


def test_sink_is_warm_once_every_source_sent_enough() -> None:
    payloads = [payload_for(1, source, 40) for source in range(2)]
    warm: list[int] = []
    sink = SinkState(sources=2, warmup_ns=0, expected=payloads, on_warm=lambda: warm.append(1))
    for seq in range(WARM_MESSAGES + 2):
        sink.handle(_frame(payloads[0], seq, 0, WARMUP))
    assert not warm  # nothing from source 1 yet
    for seq in range(WARM_MESSAGES + 2):
        sink.handle(_frame(payloads[1], seq, 1, WARMUP))
    assert warm == [1]
    assert sink.result(latency_warmup=0)["rate_messages"] == 0


def test_latency_phase_is_bounded_in_time_and_split_between_sources() -> None:
    plan = Plan(latency_samples=300, latency_seconds=1.5, period=0.001)
    assert latency_count(plan, 1024, 1) == 300
    assert latency_count(plan, 1024, 4) == 75
    assert latency_count(plan, 1 << 20, 1) == 71  # 1 MiB paced every 21 ms
    assert latency_count(Plan(latency_samples=3), 64, 1) == 10  # never fewer than 10
