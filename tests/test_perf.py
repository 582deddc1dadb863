"""ezflow perf, without the command line: options, layouts, sinks, variants, floors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import ezflow
from ezflow._perf._floor import memcpy_seconds
from ezflow._perf._spec import (
    END,
    FRAME_SHAPE,
    FRAME_SIZE,
    LATENCY,
    RATE,
    WARMUP,
    Cell,
    Plan,
    SpecError,
    Variant,
    format_size,
    latency_count,
    layout,
    parse_size,
    parse_variant,
    payload_layout,
)
from ezflow._perf._worker import (
    HEADER,
    WARM_MESSAGES,
    EzflowFramework,
    P2PSink,
    SinkState,
    _Callbacks,
    is_end,
    p2p_payload_for,
    payload_for,
)


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


# -- the p2p suite


def test_variants_parse_and_label_round_trip() -> None:
    assert parse_variant("ordinary") == Variant() == parse_variant("default")
    assert Variant().label == "ordinary" and Variant().is_default
    fast = parse_variant("array+uvloop+on_message+loan")
    assert fast == Variant(message="array", loop="uvloop", receive="on_message", loan=True)
    assert parse_variant(fast.label) == fast
    assert parse_variant("loan+copy") == Variant()  # the last word of a field wins
    with pytest.raises(SpecError, match="unknown variant 'fast'"):
        parse_variant("fast")
    with pytest.raises(SpecError, match="unknown loop 'trio'"):
        Variant(loop="trio")
    assert parse_variant("mixed") == Variant(message="mixed")
    assert parse_variant("mixed+uvloop").label == "mixed+uvloop"
    assert parse_variant("pair+uvloop") == Variant(message="pair", loop="uvloop")
    for refused in ("mixed+loan", "mixed+on_message", "pair+loan", "pair+on_message"):
        with pytest.raises(SpecError, match="does not combine with loan or on_message"):
            parse_variant(refused)


def test_p2p_cells_sizes_and_layouts() -> None:
    assert parse_size("frame") == FRAME_SIZE == 2160 * 3840 * 3
    assert format_size(FRAME_SIZE) == "frame"
    assert payload_layout(FRAME_SIZE) == (FRAME_SHAPE, "uint8")
    assert payload_layout(64) == ((16,), "float32")
    cell = Cell("p2p", "shm", 64, 1, Variant())
    assert cell.label == "p2p/shm/64 B/ordinary"
    assert cell.key != Cell("p2p", "shm", 64, 1, parse_variant("uvloop")).key
    shm = layout(cell, "/t")
    assert [[unit.kind for unit in group.units] for group in shm] == [["source"], ["sink"]]
    assert _edges_cross(cell)
    assert len(layout(Cell("p2p", "local", 64, 1, Variant()), "/t")) == 1
    with pytest.raises(SpecError, match="one source and one sink"):
        Cell("p2p", "shm", 64, 2, Variant())
    with pytest.raises(SpecError, match="needs a variant"):
        Cell("p2p", "shm", 64, 1)
    with pytest.raises(SpecError, match="multiple of 4"):
        Cell("p2p", "shm", 66, 1, Variant())
    with pytest.raises(SpecError, match="variants are for the p2p suite"):
        Cell("relay", "shm", 64, 1, Variant())


def test_p2p_pacing_and_counts() -> None:
    plan = Plan(latency_samples=1000, latency_seconds=1.5, period=0.001)
    # p2p paces every size at the period (the frame at 10 ms); the old suites spare
    # large messages.
    assert latency_count(plan, 1 << 20, 1, "p2p") == 1000
    assert latency_count(plan, 1 << 20, 1) == 71
    assert latency_count(plan, FRAME_SIZE, 1, "p2p") == 150
    with pytest.raises(SpecError, match="max duration"):
        Plan(duration=2.0, max_duration=1.0)


def _p2p_sink(array: bool) -> tuple[P2PSink, np.ndarray]:
    payload = p2p_payload_for(3, 64)
    assert payload.dtype == np.float32 and payload.shape == (16,) and payload.all()
    return P2PSink(sources=1, warmup_ns=0, expected=[payload], array=array), payload


def test_p2p_sink_reads_tuples() -> None:
    sink, payload = _p2p_sink(array=False)
    assert not sink.handle((WARMUP, 0, 0, payload))
    assert not sink.handle((WARMUP, 1, 0, payload[:8]))  # wrong shape
    assert not sink.handle((LATENCY, 2, 0, payload))
    assert not sink.handle((RATE, 4, 0, payload))  # seq 3 lost
    assert not sink.handle([RATE, 5, 0, payload])  # any indexable message
    wrong = payload.copy()
    wrong[-1] += 1
    assert sink.handle((END, 6, 0, wrong.astype(np.float64)))  # wrong dtype and value
    result = sink.result(latency_warmup=0)
    assert (result["latency_messages"], result["rate_messages"]) == (1, 2)
    assert (result["drops"], result["corrupt"], result["ends"]) == (1, 2, 1)


def test_p2p_sink_reads_bare_arrays() -> None:
    sink, payload = _p2p_sink(array=True)

    def message(seq: int, phase: int) -> np.ndarray:
        array = payload.copy()
        HEADER.pack_into(array, 0, 0, seq, 0, phase)
        return array

    assert not sink.handle(message(0, WARMUP))
    assert not sink.handle(message(1, LATENCY))
    end = message(2, END)
    end[-1] += 1
    assert sink.handle(end)
    result = sink.result(latency_warmup=0)
    assert (result["latency_messages"], result["drops"], result["corrupt"]) == (1, 0, 1)


async def test_on_message_consumer_keeps_early_messages_and_stops_when_told() -> None:
    callbacks = _Callbacks()
    callbacks("early")  # before consume(): kept, not lost
    seen: list[str] = []

    def handle(message: str) -> bool:
        seen.append(message)
        return message == "end"

    consuming = asyncio.ensure_future(EzflowFramework().consume(callbacks, handle))
    await asyncio.sleep(0)
    for message in ("a", "end", "late"):
        callbacks(message)
    await asyncio.wait_for(consuming, 5)
    assert seen == ["early", "a", "end"]  # nothing after the end


async def test_on_message_consumer_raises_what_the_handler_raised() -> None:
    callbacks = _Callbacks()

    def handle(message: object) -> bool:
        raise ValueError("bad message")

    consuming = asyncio.ensure_future(EzflowFramework().consume(callbacks, handle))
    await asyncio.sleep(0)
    callbacks("x")
    with pytest.raises(ValueError, match="bad message"):
        await asyncio.wait_for(consuming, 5)


def test_memcpy_floor_grows_with_size() -> None:
    small = memcpy_seconds(64, budget=1 << 20)
    large = memcpy_seconds(1 << 20, budget=8 << 20)
    assert 0 < small < large


@pytest.mark.parametrize(("inline_limit", "lent"), [(None, 0), (0, 1)])
async def test_shm_inline_limit_decides_what_a_small_loan_is(
    ctx: ezflow.GraphContext, inline_limit: int | None, lent: int
) -> None:
    """64 B: a private array at the default inline limit, a shared-memory loan once
    ``--shm-inline-limit 0`` sends every message through shared memory."""
    framework = EzflowFramework()
    framework.configure({"variant": None, "plan": {"shm_inline_limit": inline_limit}})
    pub = await framework.publisher(ctx, "/perf/inline", "shm")
    sub = await framework.subscriber(ctx, "/perf/inline", "shm")
    payload = await framework.payload_function(pub, "shm", (16,), "float32", True)()
    payload[...] = 1.0
    await pub.publish((0, 0, 0, payload))
    message = await asyncio.wait_for(sub.recv(), 5)
    assert np.array_equal(message[3], payload)
    assert pub.shm_statistics().loans == lent
