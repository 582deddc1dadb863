"""The optional C extension (ezflow/_core/_speedups.c) against its pure-Python twins.

Each compiled function gets the same inputs as the Python code it replaces and must give
the same output and the same errors (type and message): ``_speedups.Template``'s
``encode_small`` against ``_Template.encode_small_py``, for any message of a template's
shape and near misses (other item types, lengths, keys, out-of-range ints, surrogates,
limits). The compiled side is skipped only where the extension is not built (CI builds
it: the dev install compiles it). Also: which path is chosen at import and how to force
the pure one, no leak over 1e5 calls, a build free of -Wall -Wextra warnings, and the
end-to-end tests of a few files on the pure path (the suite itself runs the compiled one
where it is built).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from typing import Any

import numpy as np
import pytest
from _leaks import blocks_grown
from _messages import (
    _INT_EDGES,
    LEAVES,
    OTHER,
    Sample,
    Wide,
    assert_same_decoded,
    mutations,
    shapes,
)
from _soon import Soon
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ezflow._core import _compiled
from ezflow._core._codec import _RELEARN_CHECK_AFTER, HEADER, SMALL_BODY, Codec, message
from ezflow._core._codec._format import _body_view, _spans
from ezflow._core._codec._general import _check
from ezflow._core._codec._layouts import _Layout, _learn_layout
from ezflow._core._codec._registry import _TYPES_BY_CLASS
from ezflow._core._codec._templates import (
    _TEMPLATE_MAX_ITEMS,
    _compiled_template,
    _Template,
    _template_for,
)
from ezflow._core._config import ENV_PURE_PYTHON, STREAM_FLUSH_MESSAGES
from ezflow._core._framing import DATA, DATA_PREFIX, END, HEARTBEAT, LENGTH, TRACE
from ezflow._transports._stream_channel import _small_frames_py
from ezflow._transports._stream_frames import HEADER_SIZE

try:
    from ezflow._core import _speedups
except ImportError:  # pragma: no cover - a machine without a C compiler
    _speedups = None  # type: ignore[assignment]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "ezflow", "_core", "_speedups.c")
needs_extension = pytest.mark.skipif(
    _speedups is None, reason="the C extension ezflow._core._speedups is not built"
)


def outcome(call: Any) -> tuple[str, object]:
    """("ok", result) or ("raised", (exception type, message))."""
    try:
        return "ok", call()
    except Exception as exc:
        return "raised", (type(exc), str(exc))


def twins(obj: Any) -> tuple[_Template, Any] | None:
    """The pure-Python template of *obj*'s shape and its compiled twin's
    ``encode_small`` (None when no template covers the shape)."""
    found = compiled_twin(obj)
    if found is None:
        return None
    template, compiled = found
    return template, None if compiled is None else compiled.encode_small


def compiled_twin(obj: Any) -> tuple[_Template, Any] | None:
    """The pure-Python template of *obj*'s shape and a compiled ``_speedups.Template``
    of it, or None for it where the extension does not cover the shape (None when no
    template covers the shape)."""
    template = _template_for(obj, type(obj))
    if template is None:
        return None
    values, names = values_and_names(obj)
    return template, _compiled_template(type(obj), names, values, template.entry, _speedups)


def values_and_names(obj: Any) -> tuple[tuple[Any, ...], tuple[str, ...] | None]:
    if type(obj) in (tuple, list):
        return tuple(obj), None
    if type(obj) is dict:
        return tuple(obj.values()), tuple(obj)
    names = _TYPES_BY_CLASS[type(obj)].fields
    return tuple(getattr(obj, name) for name in names), names


def compiled_covers(values: tuple[Any, ...]) -> bool:
    """The documented rule: at most one array, no numpy scalar."""
    kinds = (type(None), bool, int, float, str, bytes, np.ndarray)
    return (
        all(type(v) in kinds for v in values) and [type(v) for v in values].count(np.ndarray) <= 1
    )


limits = st.sampled_from([0, 8, 40, 100, 300, 1100, SMALL_BODY - 1, SMALL_BODY, 1 << 20]) | (
    st.integers(0, 2 * SMALL_BODY)
)


@st.composite
def near_misses(draw: st.DrawFn, obj: Any) -> Any:
    """A message like *obj*: the same values anew, one item of another kind, one item
    more or less, another key, a dict of other key order."""
    values, names = values_and_names(obj)
    values_list = list(values)
    how = draw(st.sampled_from(["same", "value", "kind", "length", "keys"]))
    if values_list and how in ("value", "kind"):
        i = draw(st.integers(0, len(values_list) - 1))
        if how == "value" and type(values_list[i]) is np.ndarray:
            arr = values_list[i]
            values_list[i] = draw(st.sampled_from([arr.copy(), arr.T]) | LEAVES["array"])
        else:
            values_list[i] = draw(st.sampled_from(list(LEAVES.values())).flatmap(lambda s: s))
    if type(obj) in (tuple, list):
        if how == "length":
            if values_list and draw(st.booleans()):
                values_list.pop()
            else:
                values_list.append(draw(LEAVES["int"]))
        return type(obj)(values_list)
    if type(obj) is dict:
        assert names is not None
        keys = list(names)
        if how == "keys" and keys:
            if draw(st.booleans()):
                keys.reverse()
            else:
                keys[0] = keys[0] + "x"
        if how == "length":
            keys.append("extra")
            values_list.append(draw(OTHER))
        return dict(zip(keys, values_list, strict=False))
    return type(obj)(*values_list) if len(values_list) == len(values) else obj


@needs_extension
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(other=False), st.data())
def test_the_compiled_encode_is_the_python_twin(shape: Any, data: st.DataObject) -> None:
    from _messages import build  # noqa: PLC0415

    obj = build(shape, data.draw)
    found = twins(obj)
    if found is None:
        return
    template, compiled = found
    values, _ = values_and_names(obj)
    assert (compiled is not None) == compiled_covers(values)
    if compiled is None:
        return
    for _ in range(4):
        probe = data.draw(near_misses(obj))
        limit = data.draw(limits)
        expected = outcome(lambda p=probe, n=limit: template.encode_small_py(p, n))
        got = outcome(lambda p=probe, n=limit: compiled(p, n))
        assert got == expected, (probe, limit)
        if expected[0] == "ok" and expected[1] is not None:
            # ... and both are the general encoder's bytes
            assert expected[1] == Codec().encode(probe).to_bytes()


@needs_extension
def test_every_msgpack_width_boundary_encodes_alike() -> None:
    # Each side of every int, str, bytes, array and map width boundary, deterministic
    # (hypothesis draws them too, but not every one every run).
    probes: list[Any] = [(v, 0) for v in _INT_EDGES]
    for n in (0, 1, 15, 16, 31, 32, 255, 256, 1023, 1024, 4000, 65535, 65536):
        probes += [(0, "a" * n), (0, "é" * n), (0, b"b" * n)]
        probes += [tuple(range(n))] if n < 70 else []
    probes += [(0, np.zeros(n, np.uint8)) for n in (0, 1, 7, 8, 15, 16, 17, 4000, 4100)]
    probes += [{f"k{i}": i for i in range(n)} for n in (0, 15, 16, 17, 64)]
    compared = 0
    for probe in probes:
        found = twins(probe)
        if found is None:
            continue
        template, compiled = found
        assert compiled is not None, probe
        for limit in (64, SMALL_BODY):
            expected = outcome(lambda t=template, p=probe, n=limit: t.encode_small_py(p, n))
            got = outcome(lambda c=compiled, p=probe, n=limit: c(p, n))
            assert got == expected, probe
            compared += expected[0] == "ok" and expected[1] is not None
    assert compared > len(probes)  # (most are bytes at the larger limit, some at both)


# --------------------------------------------------------------------------- validate


def general_check(obj: Any) -> tuple[str, object]:
    """What the general check (``Codec.validate``'s pure path) does with *obj*."""
    return outcome(lambda: _check(obj, 0))


@needs_extension
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(), st.data())
def test_the_compiled_check_passes_only_what_the_general_check_passes(
    shape: Any, data: st.DataObject
) -> None:
    from _messages import build  # noqa: PLC0415

    obj = build(shape, data.draw)
    found = compiled_twin(obj)
    if found is None or found[1] is None:
        return
    template, compiled = found
    check = template.check  # (what validate uses: the template's compiled twin's)
    assert check is not None
    # The message of the shape itself: passed exactly when the general check passes
    # (an int out of range: False, and it raises).
    assert check(obj) == compiled.check(obj) == (general_check(obj)[0] == "ok"), obj
    for _ in range(6):
        probe = data.draw(near_misses(obj))
        assert check(probe) == compiled.check(probe)
        if check(probe):
            assert general_check(probe) == ("ok", None), probe


@needs_extension
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(shapes(), min_size=1, max_size=3), st.data())
def test_validate_of_a_stream_raises_what_the_general_check_raises(
    kinds: list[Any], data: st.DataObject
) -> None:
    # One codec (its hint and relearning countdown) over a stream mixing a few shapes,
    # near misses and bad messages: every message gets the general check's outcome.
    from _messages import build  # noqa: PLC0415

    codec = Codec()
    firsts = [build(kind, data.draw) for kind in kinds]
    stream = data.draw(
        st.lists(st.sampled_from(firsts).flatmap(near_misses_or_self), min_size=1, max_size=40)
    )
    for probe in stream:
        assert outcome(lambda p=probe: codec.validate(p)) == general_check(probe), probe


def near_misses_or_self(obj: Any) -> st.SearchStrategy[Any]:
    return st.just(obj) | near_misses(obj) if twins(obj) is not None else st.just(obj)


class _StrKey(str):
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        raise AssertionError("a key's __eq__ ran")

    __hash__ = str.__hash__


@needs_extension
def test_validate_takes_the_compiled_check_for_a_stream_of_one_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ezflow._core._codec as codec_module  # noqa: PLC0415

    calls: list[object] = []

    def counted(obj: object, depth: int) -> None:
        calls.append(obj)
        _check(obj, depth)

    monkeypatch.setattr(codec_module, "_check", counted)
    codec = Codec()
    arr = np.zeros(16, np.float32)
    for seq in range(100):
        codec.validate((0, seq, time.perf_counter_ns(), arr))
    assert len(calls) == 1  # the first: the shape learned, then the compiled check
    for seq in range(100):
        codec.validate(Sample(0, seq, 2**64 - 1, arr))
        codec.validate({"a": seq, "b": "x" * seq})
    # Two shapes alternating: the hint misses every other message; learning again is
    # bounded (one in _RELEARN_CHECK_AFTER + 1 general checks), and they stay correct.
    assert 100 <= len(calls) - 1 <= 200
    calls.clear()
    for seq in range(100):
        codec.validate({"a": seq, "b": "x" * seq})
    assert len(calls) <= _RELEARN_CHECK_AFTER + 1


@needs_extension
def test_validate_refuses_at_the_edges_of_a_learned_shape() -> None:
    # Each probe has the learned shape but one thing the general check refuses (or that
    # only it may judge); validate raises exactly what the general check raises.
    arr = np.zeros(4, np.float32)
    bad_key = {_StrKey("a"): 1, "b": 2}
    probes: list[Any] = [(v, arr) for v in _INT_EDGES]
    probes += [
        (0, np.ma.masked_array(arr)),  # a masked array: refused
        (0, np.array([object()], dtype=object)),  # an object dtype: refused
        (0, arr.astype(np.float64)),  # another dtype: the general check decides
        (0, arr.reshape(2, 2)),  # another ndim: passes (validate ignores shapes)
        (0, arr[::2]),  # not contiguous: passes
        (True, arr),  # another item type
        bad_key,  # a str subclass key: its __eq__ must not run
        {"a": 1, "b": [1]},
        {"b": 1, "a": 2},
        (0, "\ud800"),  # a lone surrogate: not checked by validate (documented)
    ]
    learned: list[Any] = [(0, arr), {"a": 1, "b": 2}, (0, "s")]
    for first in learned:
        for probe in probes:
            codec = Codec()
            codec.validate(first)
            assert codec._last_checked is not None, first
            assert outcome(lambda c=codec, p=probe: c.validate(p)) == general_check(probe), (
                first,
                probe,
            )


@needs_extension
def test_the_compiled_check_clears_exceptions_but_not_an_interrupt() -> None:
    @message(name="tests.speedups.Getter")
    @dataclasses.dataclass
    class Getter:
        a: int
        b: int

    codec = Codec()
    codec.validate(Getter(1, 2))
    found = codec._last_checked
    assert found is not None
    check = found[1]

    class Raising(Getter):  # (another class: the check of Getter says False at once)
        pass

    assert check(Raising(1, 2)) is False
    broken = Getter(1, 2)
    del broken.b
    assert check(broken) is False  # (AttributeError: the general check raises it)
    interrupted = Getter(1, 2)
    interrupted.__dict__.clear()
    Getter.__getattr__ = lambda self, name: (_ for _ in ()).throw(KeyboardInterrupt())  # type: ignore[attr-defined]
    try:
        with pytest.raises(KeyboardInterrupt):
            check(interrupted)
    finally:
        del Getter.__getattr__  # type: ignore[attr-defined]


@needs_extension
def test_a_dataclass_missing_a_field_raises_as_the_general_check_does() -> None:
    arr = np.zeros(4, np.float32)
    codec = Codec()
    codec.validate(Sample(0, 1, 2, arr))
    broken = Sample(0, 1, 2, arr)
    del broken.payload
    expected = general_check(broken)
    assert expected[0] == "raised" and expected[1][0] is AttributeError  # type: ignore[index]
    assert outcome(lambda: codec.validate(broken)) == expected
    # ... and a frozen, slotted one (its fields read at their offsets)
    wide = Wide(0, 1, 2, 3, arr)
    codec.validate(wide)
    assert codec._last_checked is not None
    assert outcome(lambda: codec.validate(Wide(0, 1, 2, 2**64, arr))) == general_check(
        Wide(0, 1, 2, 2**64, arr)
    )


# --------------------------------------------------------------------------- framing

# One frame of a stream a channel reads: a DATA frame of a body (any bytes, a small
# message's body, one at the small-frame size or past it), a DATA frame shorter than
# its header, a control frame, a header claiming more than any limit.
_FRAME = st.one_of(
    st.binary(max_size=60).map(lambda b: ("data", b)),
    st.sampled_from([0, 1, SMALL_BODY - 1, SMALL_BODY, SMALL_BODY + 1]).map(
        lambda n: ("data", bytes(n % 251 for n in range(n)))
    ),
    st.integers(0, HEADER_SIZE - 1).map(lambda n: ("short", n)),
    st.sampled_from([HEARTBEAT, END, TRACE, 0, 255]).map(lambda k: ("control", k)),
    st.just(("huge", 0)),
)


def frame_bytes(what: str, value: Any, seq: int) -> bytes:
    if what == "data":
        return (
            DATA_PREFIX.pack(HEADER_SIZE + len(value), DATA, 0, seq, -seq, 2**64 - 1 - seq) + value
        )
    if what == "short":
        return LENGTH.pack(value) + bytes([DATA]) + bytes(range(1, value))
    if what == "control":
        return LENGTH.pack(40) + bytes([value]) + bytes(39)
    return DATA_PREFIX.pack(1 << 30, DATA, 0, seq, 0, 0)


@needs_extension
@settings(max_examples=200, deadline=None)
@given(
    st.lists(_FRAME, max_size=12),
    st.data(),
    st.sampled_from([300, 4096, 1 << 16, 1 << 30]),
)
def test_the_compiled_frame_split_is_the_python_twin(
    frames: list[tuple[str, Any]], data: st.DataObject, max_frame_size: int
) -> None:
    stream = b"".join(frame_bytes(w, v, seq) for seq, (w, v) in enumerate(frames, 1))
    buffer = memoryview(bytearray(b"\xee" * data.draw(st.integers(0, 50)) + stream + b"\xee"))
    start = data.draw(st.integers(0, len(buffer)))
    end = data.draw(st.integers(start, len(buffer)))
    if data.draw(st.booleans()):  # (mostly a whole stream from its first frame)
        start, end = len(buffer) - 1 - len(stream), len(buffer) - 1
        # (cut short: a last frame a byte or two from whole, mostly)
        cut = data.draw(st.sampled_from([0, 1, 2]) | st.integers(0, min(len(stream), 50)))
        end -= min(cut, len(stream))
    for slice_below in (SMALL_BODY + HEADER_SIZE, 100):
        args = (buffer, start, end, max_frame_size, slice_below)
        expected = outcome(lambda a=args: _small_frames_py(*a))
        assert outcome(lambda a=args: _speedups.small_frames(*a)) == expected


@needs_extension
def test_the_compiled_frame_split_refuses_what_the_python_twin_refuses() -> None:
    buffer = memoryview(bytearray(100))
    for start, end in ((-1, 10), (10, 5), (0, 101), (101, 101)):
        args = (buffer, start, end, 1 << 16, SMALL_BODY)
        expected = outcome(lambda a=args: _small_frames_py(*a))
        assert expected[0] == "raised"
        assert outcome(lambda a=args: _speedups.small_frames(*a)) == expected
    stream = b"".join(frame_bytes("data", b"x" * n, n) for n in range(5))
    view = memoryview(stream)
    got = _speedups.small_frames(view, 0, len(stream), 1 << 16, SMALL_BODY)
    assert got == _small_frames_py(view, 0, len(stream), 1 << 16, SMALL_BODY)
    assert [(seq, body, drops, sent) for _, seq, body, drops, sent in got] == [
        (n, b"x" * n, 2**64 - 1 - n, -n) for n in range(5)
    ]


# --------------------------------------------------------------------------- decode


def layout_of(body: bytes) -> _Layout | None:
    """The decode layout learned from *body* (None if no layout covers it)."""
    mv = _body_view(body, 1 << 30)
    meta_start, meta_end, spans = _spans(mv, *HEADER.unpack_from(mv))
    return _learn_layout(mv, meta_start, meta_end, spans)


def decoded(call: Any) -> tuple[str, object]:
    """("ok", result) or ("raised", (exception type, message))."""
    try:
        return "ok", call()
    except Exception as exc:
        return "raised", (type(exc), str(exc))


def assert_same_decode(layout: _Layout, compiled: Any, body: bytes | memoryview) -> bool:
    """The compiled decode of *body* gives what the Python one gives (None, an equal
    message - same types, values, dtypes, views - or the same error); True when it
    gave a message."""
    expected = decoded(lambda: layout.decode_py(body))
    got = decoded(lambda: compiled(body))
    assert got[0] == expected[0], (expected, got)
    if expected[0] == "raised" or expected[1] is None:
        assert got == expected
        return False
    assert_same_decoded(expected[1], got[1])
    for want, have in zip(_arrays_in(expected[1]), _arrays_in(got[1]), strict=True):
        assert (have.base is body) == (want.base is body)  # views into the body alike
    return True


def _arrays_in(obj: Any) -> list[np.ndarray[Any, Any]]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        obj = list(obj.values())
    return [v for v in obj if isinstance(v, np.ndarray)]


@needs_extension
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(other=False), st.data())
def test_the_compiled_decode_is_the_python_twin(shape: Any, data: st.DataObject) -> None:
    from _messages import build  # noqa: PLC0415

    obj = build(shape, data.draw)
    try:
        body = Codec().encode(obj).to_bytes()
    except (TypeError, ValueError):  # (what the codec refuses: not this test's business)
        return
    layout = layout_of(body)
    if layout is None:
        return
    compiled = layout.compiled(_speedups)
    assert assert_same_decode(layout, compiled, body)
    assert_same_decode(layout, compiled, memoryview(body))
    for _ in range(6):
        probe = data.draw(mutations(body))
        assert_same_decode(layout, compiled, probe)
        assert_same_decode(layout, compiled, memoryview(probe))
    # Another message of the shape: the same layout when only values changed.
    try:
        other = Codec().encode(build(shape, data.draw)).to_bytes()
    except (TypeError, ValueError):
        return
    assert_same_decode(layout, compiled, other)


@needs_extension
def test_the_compiled_decode_of_every_value_kind_and_its_failures() -> None:
    arr = np.arange(6, dtype=">i2").reshape(2, 3)
    messages: list[Any] = [
        (None, True, False, 0, 127, -1, -32, -33, 255, 2**16, 2**32, 2**64 - 1, -(2**63)),
        (1.5, float("nan"), -0.0, np.float32(2.5), np.int8(-3), np.complex64(1j)),
        ["s", "é" * 40, b"b" * 300, np.zeros(4, np.float32), arr, np.zeros((), np.int32)],
        {"a": 1, "b": "x", "c": np.zeros(3)},
        Pair(1, np.ones(2, np.uint8)),
        Pair("x", None),
    ]
    gave = 0
    for message_ in messages:
        body = Codec().encode(message_).to_bytes()
        layout = layout_of(body)
        assert layout is not None, message_
        compiled = layout.compiled(_speedups)
        gave += assert_same_decode(layout, compiled, body)
    assert gave == len(messages)
    # A str that is not UTF-8 and a constructor that raises: None from both
    body = Codec().encode(("abc", 1)).to_bytes()
    layout = layout_of(body)
    assert layout is not None
    bad = body.replace(b"abc", b"a\xffc")
    assert layout.decode_py(bad) is None
    assert layout.compiled(_speedups)(bad) is None
    body = Codec().encode(Pair(1, 2)).to_bytes()
    layout = layout_of(body)
    assert layout is not None
    compiled = layout.compiled(_speedups)
    Pair.__init__, saved = _raising_init, Pair.__init__  # type: ignore[method-assign]
    try:
        assert layout.decode_py(body) is None
        assert compiled(body) is None
    finally:
        Pair.__init__ = saved  # type: ignore[method-assign]
    assert isinstance(compiled(body), Pair)


@needs_extension
def test_the_compiled_decode_hands_out_the_last_str_again_only_for_the_same_bytes() -> None:
    """A str item decoded last is handed out again (an ASCII str, its bytes compared):
    a stream of one tag allocates none; any other bytes of the length are decoded."""
    layout = layout_of(Codec().encode(("abc", 1)).to_bytes())
    assert layout is not None
    compiled = layout.compiled(_speedups)
    order = ["abc", "abd", "abc", "abc", "xbc", "\xe9b", "\xe9b", "abc"]
    last = None
    for text in order:
        body = Codec().encode((text, 1)).to_bytes()
        assert len(body) == layout.size  # ("\xe9b": three bytes of UTF-8 too)
        got = compiled(body)
        assert got == layout.decode_py(body) == (text, 1)
        if last is not None and last[0] == text:
            # the same object where ASCII (nothing allocated), else a new one
            assert (got[0] is last[0]) == text.isascii()
        last = got
    assert compiled(Codec().encode(("abc", 1)).to_bytes().replace(b"abc", b"a\xffc")) is None


@needs_extension
def test_the_compiled_decode_untracks_a_tuple_of_atomic_items_as_the_collector_would() -> None:
    """A decoded tuple whose items the collector does not track (ints, floats, str,
    arrays) is untracked at once: the state CPython's collector leaves the Python
    twin's tuple in after its first pass (``_PyTuple_MaybeUntrack``), without the pass.
    A list message and a dataclass stay tracked (either can join a cycle), and a cycle
    through them is still collected."""
    for message_ in [(0, 1, 2**40, np.zeros(4, np.float32)), (1.5, "s", b"b", None, True)]:
        body = Codec().encode(message_).to_bytes()
        layout = layout_of(body)
        assert layout is not None
        got, twin = layout.compiled(_speedups)(body), layout.decode_py(body)
        assert_same_decoded(twin, got)
        assert not gc.is_tracked(got) and gc.is_tracked(twin)
        gc.collect()
        assert not gc.is_tracked(twin)  # (the collector's own rule: the same end state)
    for message_ in [[0, 1, np.zeros(2)], Pair(1, np.ones(2, np.uint8))]:
        body = Codec().encode(message_).to_bytes()
        layout = layout_of(body)
        assert layout is not None
        decode = functools.partial(layout.compiled(_speedups), body)
        assert gc.is_tracked(decode())
        assert _collected_in_a_cycle(decode)


def _collected_in_a_cycle(make: Any) -> bool:
    """Whether what *make* returns, put in a reference cycle and let go, is collected."""
    import weakref  # noqa: PLC0415

    obj = make()
    holder = type("Holder", (), {})()
    holder.obj = obj
    if isinstance(obj, list):
        obj.append(holder)
    else:
        obj.b = holder
    alive = weakref.ref(holder)
    del holder, obj
    gc.collect()
    return alive() is None


def _raising_init(self: Any, a: Any, b: Any) -> None:
    raise ValueError("no")


@message(name="tests.speedups.Pair")
@dataclasses.dataclass
class Pair:
    a: Any
    b: Any


class _Raising:
    """A dict key equal to "a" that raises when compared to anything else."""

    def __hash__(self) -> int:
        return hash("a")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing me")


@needs_extension
def test_the_compiled_encode_raises_what_the_python_twin_raises() -> None:
    cases: list[tuple[Any, Any]] = []
    pair = Pair(1, np.zeros(3, np.float32))
    broken = Pair(1, 2)
    del broken.b
    cases.append((pair, broken))  # AttributeError from the missing field
    cases.append(({"a": 1, "b": 2}, {_Raising(): 1, "b": 2}))  # the key's __eq__ raises
    cases.append(((1, 2.0, "x"), (1, 2.0, "\ud800")))  # a lone surrogate: None
    cases.append(((1, 2), (2**64, 1)))  # above uint64: None
    cases.append(((1, 2), (-(2**63) - 1, 1)))  # below int64: None
    cases.append(((1, 2), (2**64 - 1, -(2**63))))  # both ends of the range
    cases.append(((b"x",), (b"y" * 1023,)))  # the last inline bytes length
    cases.append(((b"x",), (b"y" * 1024,)))  # out-of-band: None
    arr = np.zeros((2, 3), ">i2")
    cases.append(((0, arr), (0, np.asfortranarray(np.arange(6, dtype=">i2").reshape(2, 3)))))
    cases.append(((0, arr), (0, np.zeros((0, 5), ">i2"))))
    cases.append(((0, np.zeros(2, "M8[s]")), (0, np.arange(3).astype("M8[s]"))))
    cases.append(((0, np.zeros(2, [("x", "<f4")])), (0, np.zeros(5, [("x", "<f4")]))))
    raised = 0
    for template_message, probe in cases:
        found = twins(template_message)
        assert found is not None, template_message
        template, compiled = found
        assert compiled is not None
        for limit in (0, 64, SMALL_BODY, 1 << 20):
            expected = outcome(lambda t=template, p=probe, n=limit: t.encode_small_py(p, n))
            got = outcome(lambda c=compiled, p=probe, n=limit: c(p, n))
            assert got == expected, (template_message, probe, limit)
            raised += expected[0] == "raised"
    assert raised == 8  # (the two raising cases, at four limits: the test tests errors)


@message(name="tests.speedups.Slotted")
@dataclasses.dataclass(slots=True)
class Slotted:
    a: Any
    b: Any
    source: str = "s"


@needs_extension
def test_the_compiled_encode_reads_slots_directly_only_while_getattr_would_read_them() -> None:
    """A __slots__ dataclass's fields are read at their members' offsets: the bytes are
    the twin's (getattr's) while the class is as it was, and after it changes (a field
    turned property, a __getattribute__ added, and each undone) the class is obeyed."""
    arr = np.arange(4, dtype=np.float32)
    template, compiled = twins(Slotted(1, arr))  # type: ignore[misc]
    assert compiled is not None
    assert _speedups.TEMPLATE_MAX_ITEMS == _TEMPLATE_MAX_ITEMS

    def same(probe: Any) -> tuple[str, object]:
        expected = outcome(lambda: template.encode_small_py(probe, SMALL_BODY))
        assert outcome(lambda: compiled(probe, SMALL_BODY)) == expected, probe
        return expected

    probe = Slotted(7, arr, "mixed")  # (made before the class changes)
    plain = same(probe)
    assert plain[0] == "ok" and plain[1] is not None
    unset = Slotted(7, arr)
    del unset.b
    assert same(unset)[0] == "raised"  # AttributeError, from the member as from getattr
    member = Slotted.__dict__["a"]
    changes: list[tuple[str, Any]] = [
        ("a", property(lambda self: 8)),  # a field's member replaced on the class
        (
            "__getattribute__",
            lambda self, name: 9 if name == "a" else object.__getattribute__(self, name),
        ),
        ("__getattr__", lambda self, name: 10),  # (only asked where a member is unset)
    ]
    for name, value in changes:
        setattr(Slotted, name, value)
        try:
            changed = same(probe)
            if name != "__getattr__":
                assert changed != plain, name  # (the class's reading is the one taken)
            assert same(unset)[0] == ("ok" if name == "__getattr__" else "raised")
        finally:
            if name == "a":
                setattr(Slotted, name, member)
            else:
                delattr(Slotted, name)
        assert same(probe) == plain  # as before, fast again

    # a dict of a key that is not Unicode packs nothing on either path
    template, compiled = twins({"\ud800": 1, "b": 2})  # type: ignore[misc]
    assert compiled is not None
    assert outcome(lambda: compiled({"\ud800": 1, "b": 2}, SMALL_BODY)) == ("ok", None)
    assert template.encode_small_py({"\ud800": 1, "b": 2}, SMALL_BODY) is None


@needs_extension
def test_no_leak_over_1e5_calls() -> None:
    arr = np.zeros(16, np.float32)
    fortran = np.asfortranarray(np.zeros((4, 4), np.float32))
    probes: list[tuple[Any, Any]] = [
        ((0, 1, 2, arr), (0, 7, 2**40, arr)),  # bytes, from the buffer
        ((0, fortran), (1, fortran)),  # bytes, through tobytes()
        ((0, 1), (2**70, 1)),  # None
        ((0, "x"), (0, "\udc80")),  # None, after an error cleared
        (Pair(1, 2), Pair(3, 4)),
    ]
    broken = Pair(1, 2)
    del broken.b
    calls: list[tuple[Any, tuple[Any, ...]]] = []
    for template_message, probe in probes:
        found = twins(template_message)
        assert found is not None and found[1] is not None
        calls.append((found[1], (probe, SMALL_BODY)))
    calls.append((twins(Pair(1, 2))[1], (broken, SMALL_BODY)))  # type: ignore[index]
    # check: passed, an int out of range, an error cleared, a dict (and a near miss)
    for template_message, probe in [*probes, (Pair(1, 2), broken), ({"a": 1}, {"a": 2})]:
        found = compiled_twin(template_message)
        assert found is not None and found[1] is not None
        calls += [(found[1].check, (probe,)), (found[1].check, ({"b": 1},))]
    # decode: a tuple with an array view, a dataclass, a body that does not match, a
    # str that is not UTF-8 (an error cleared), a constructor that raises
    for message_ in ((0, 1, 2.5, arr), Pair("x", arr), ("abc", 1)):
        body = Codec().encode(message_).to_bytes()
        layout = layout_of(body)
        assert layout is not None
        decode = layout.compiled(_speedups)
        calls += [(decode, (body,)), (decode, (memoryview(body),)), (decode, (bytes(len(body)),))]
    calls.append((decode, (body.replace(b"abc", b"a\xffc"),)))
    # frame splits: frames, none, a refused range
    stream = b"".join(frame_bytes("data", b"x" * n, n) for n in range(40, 48))
    view = memoryview(stream)
    calls.append((_speedups.small_frames, (view, 0, len(stream), 1 << 16, SMALL_BODY)))
    calls.append((_speedups.small_frames, (view, 0, 10, 1 << 16, SMALL_BODY)))
    calls.append((_speedups.small_frames, (view, 5, 4, 1 << 16, SMALL_BODY)))

    def run(times: int) -> None:
        for compiled, args in calls:
            for _ in range(times):
                with contextlib.suppress(AttributeError, ValueError):
                    compiled(*args)

    grown = blocks_grown(run, warm=1000, times=100_000 // len(calls))
    assert grown < 100, f"{grown} memory blocks more after 1e5 calls"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc on this machine")
def test_the_extension_builds_free_of_warnings(tmp_path: Any) -> None:
    include = sysconfig.get_paths()["include"]
    command = ["gcc", "-Wall", "-Wextra", "-Werror", "-O2", "-fPIC", f"-I{include}"]
    command += ["-c", SOURCE, "-o", str(tmp_path / "speedups.o")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_the_path_is_chosen_at_import_and_the_pure_one_can_be_forced() -> None:
    probe = (
        "from ezflow._core import _compiled\n"
        "from ezflow._core._codec._templates import _template_for\n"
        "t = _template_for((1, 2.0), tuple)\n"
        "print(_compiled.SPEEDUPS is not None, t.encode_small == t.encode_small_py)\n"
        "print(_compiled.active_path())\n"
    )

    def probe_with(setting: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, ENV_PURE_PYTHON: setting},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result

    pure = probe_with("1")
    assert pure.stdout.splitlines() == ["False True", f"pure Python ({ENV_PURE_PYTHON} is set)"]
    default = probe_with("0")
    built = _speedups is not None
    lines = default.stdout.splitlines()
    assert lines[0] == f"{built} {not built}"
    assert lines[1] == _compiled.active_path()
    assert ("compiled" in lines[1]) is built


def test_ezflow_version_says_which_path_is_active() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ezflow", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert f"codec: {_compiled.active_path()}" in result.stdout


# A few end-to-end files (tcp, shm, graphs of processes), on the pure-Python path in
# one child pytest: the rest of the suite runs the compiled path where it is built.
PURE_FILES = [
    "tests/test_codec_fastpaths.py",
    "tests/test_stream.py",
    "tests/test_tcp.py",
    "tests/test_transport_contract.py",
    "tests/test_shm_outlet.py",
]


@pytest.mark.timeout(120)
def test_end_to_end_files_pass_on_the_pure_python_path() -> None:
    env = {**os.environ, ENV_PURE_PYTHON: "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly", "-x"]
    result = subprocess.run(
        command + PURE_FILES,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


# -- the one-call small publish (PublishPath) against publish_small_py ------------------


class _Out:
    """A stream link's write half that records every frame written."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, parts: list[bytes]) -> None:
        for part in parts:
            self.data += part

    def is_closing(self) -> bool:
        return False


class _Connection:
    def __init__(self) -> None:
        self.out = _Out()


def _frames(data: bytes | bytearray) -> list[bytes]:
    """The frames of a byte stream, each with its send time (time_ns) zeroed: the one
    field the two publishes read from the clock themselves."""
    frames, at = [], 0
    while at < len(data):
        (length,) = LENGTH.unpack_from(data, at)
        frame = bytearray(data[at : at + LENGTH.size + length])
        if frame[LENGTH.size] == DATA:
            frame[20:28] = bytes(8)
        frames.append(bytes(frame))
        at += LENGTH.size + length
    return frames


def _state(outlet: Any) -> tuple[Any, ...]:
    """Every counter, window figure and queued or written frame of *outlet* and its
    links (send times zeroed; a handoff's last send time only as "moved or not")."""
    stats = dataclasses.asdict(outlet.stats)
    stats.pop("wait_seconds")
    links = tuple(
        (
            link.sent_count,
            link.sent_bytes,
            link.released_count,
            link.released_bytes,
            link.drops,
            link.inline_sends,
            link._queued_messages,
            link._queued_bytes,
            _frames(b"".join(link._queued)),
            link._flush_scheduled,
            link.stalled,
            _frames(link.connection.out.data),
            link._written_ns != 0,  # (the test zeroes it after each step)
        )
        for link in outlet._links
    )
    moved = outlet._sent_ns not in (0, 1 << 62)
    return (outlet._seq, outlet._unyielded, outlet._unyielded_bytes, stats, moved, links)


_PUBLISH = st.tuples(
    st.just("publish"),
    st.sampled_from(["tuple"] * 6 + ["big", "list", "str"]),
    st.sampled_from([0, 1, -1, 2**40, 2**40, 2**40, 2**40, 2**63, 2**70]),
)
_MOSTLY_FALSE = st.sampled_from([False] * 5 + [True])
_CHANGES = st.one_of(
    st.tuples(st.just("turn")),
    st.tuples(st.just("batch")),
    st.tuples(st.just("batch")),
    st.tuples(st.just("release"), st.integers(0, 2), st.integers(0, 8)),
    st.tuples(st.just("stall"), st.integers(0, 2), _MOSTLY_FALSE),
    st.tuples(st.just("closed"), _MOSTLY_FALSE),
    st.tuples(st.just("tracing"), _MOSTLY_FALSE),
    st.tuples(st.just("hook"), _MOSTLY_FALSE),
    st.tuples(st.just("unyielded"), st.sampled_from([0, 0, 62, 63])),
    st.tuples(st.just("handoff"), st.sampled_from([0, 1 << 62, None, None])),
    st.tuples(st.just("out_of_line"), st.integers(0, 2), st.sampled_from([sys.maxsize, 40])),
    st.tuples(st.just("drops"), st.integers(0, 2), st.integers(0, 300)),
)
#: steps: a change of state, then a few publishes
_PUBLISH_OPS = st.tuples(_CHANGES, st.lists(_PUBLISH, max_size=20)).map(lambda s: [s[0], *s[1]])


def _apply_change(
    op: tuple[Any, ...], worlds: list[Any], loop: Any, tracing: Any, hooks: list[Any]
) -> int | None:
    """Apply one of :data:`_CHANGES` to every world's outlet (and to *tracing* and
    *hooks*, which they share); return the handoff step's last-send mark (None for the
    other steps): far back, a paced publish; ahead, a burst."""
    import asyncio  # noqa: PLC0415

    name = op[0]
    if name == "turn":
        loop.run_until_complete(asyncio.sleep(0))
    elif name == "batch":  # (as a write at once in a burst: StreamLink.send_small)
        for outlet in worlds:
            for link in outlet._links:
                if not link._flush_scheduled:
                    link._flush_scheduled = True
                    loop.call_soon(link._end_of_iteration)
    for outlet in worlds:
        links = outlet._links
        if name == "release" and op[1] < len(links):
            link = links[op[1]]
            count = min(link.sent_count, link.released_count + op[2])
            link.released(count, link.sent_bytes if count == link.sent_count else 0)
        elif name == "stall" and op[1] < len(links):
            links[op[1]].stalled = op[2]
        elif name == "closed":
            outlet._closed = op[1]
        elif name == "unyielded":
            outlet._unyielded = op[1]
        elif name == "handoff":
            outlet._handoff = op[1] is not None
        elif name == "drops" and op[1] < len(links):  # (as a leaky link's)
            links[op[1]].drops = op[2]
        elif name == "out_of_line" and op[1] < len(links):
            links[op[1]].out_of_line_above = op[2]
    if name == "tracing":
        tracing.active = op[1]
    elif name == "hook":
        hooks[:] = [lambda event: None] if op[1] else []
    return (op[1] or 0) if name == "handoff" else None


@needs_extension
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from([(True, 1 << 20)] * 3 + [(False, 1 << 20)] * 2 + [(True, 100)]),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from([(4, 1 << 20), (64, 224), (64, 1 << 20), (64, 1 << 20)]),
    st.lists(_PUBLISH_OPS, min_size=5, max_size=40).map(
        lambda steps: [op for step in steps for op in step]
    ),
    # (STREAM_FLUSH_MESSAGES itself is out of a small window's reach: smaller ones too)
    st.sampled_from([3, 16, STREAM_FLUSH_MESSAGES]),
)
def test_the_compiled_publish_is_the_python_twin(
    kinds: list[tuple[bool, int]],
    window: tuple[int, int],
    ops: list[tuple[Any, ...]],
    flush_messages: int,
) -> None:
    """The same outlets (1-3 stream links: lossless, leaky, small max_message_size; a
    small window), the same steps (publishes of the cached shape and of others, out of
    range ints, bodies over SMALL_BODY; loop turns; releases; stalls; a closed outlet;
    tracing; a hook; the yield counter; handoff paced or not; out-of-line limits; a
    batch under way, as after a first write of a loop turn in a burst; a link's
    upstream drops): the
    compiled publish and publish_small_py give the same results and errors, and leave
    the same counters, windows, statistics and frames, queued and written. What either
    declines goes the general path (publish_nowait), in both."""
    import asyncio  # noqa: PLC0415

    from ezflow._core._outlet import Outlet  # noqa: PLC0415
    from ezflow._core._tracing import TraceState  # noqa: PLC0415
    from ezflow._transports import _stream_publish  # noqa: PLC0415
    from ezflow._transports._stream_publish import StreamLink  # noqa: PLC0415

    tracing, hooks = TraceState(), []
    saved_flush = _stream_publish._FLUSH_MESSAGES
    _stream_publish._FLUSH_MESSAGES = flush_messages  # type: ignore[misc]
    try:
        compiled = _stream_publish.compiled_publish_small(_speedups, tracing=tracing, hooks=hooks)
    finally:
        _stream_publish._FLUSH_MESSAGES = saved_flush  # type: ignore[misc]
    assert compiled is not None
    loop = asyncio.new_event_loop()
    saved = _stream_publish.TRACING, _stream_publish.PUBLISH_HOOKS
    _stream_publish.TRACING, _stream_publish.PUBLISH_HOOKS = tracing, hooks  # type: ignore[misc]
    _stream_publish._FLUSH_MESSAGES = flush_messages  # type: ignore[misc]

    async def world() -> Outlet:
        outlet = Outlet(
            "p-1", "/t", Codec(), max_in_flight=window[0], max_in_flight_bytes=window[1]
        )
        for lossless, max_size in kinds:
            link = StreamLink(_Connection(), lossless=lossless, max_size=max_size)  # type: ignore[arg-type]
            outlet.add_link(link)
        return outlet

    small = np.zeros(16, np.float32)
    big = np.zeros(1100, np.float32)  # (a body over SMALL_BODY)
    messages = {
        "tuple": lambda n: (0, n, 7, small),
        "big": lambda n: (0, n, 7, big),
        "list": lambda n: [n, 1],
        "str": lambda n: "x",
    }
    try:
        worlds = [loop.run_until_complete(world()) for _ in range(2)]
        paths = (compiled, _stream_publish.publish_small_py)
        sent_mark = 0
        for op in ops:
            name = op[0]
            if name == "publish":
                msg = messages[op[1]](op[2])
                results = [
                    outcome(lambda p=p, o=o, m=msg: p(o, m))
                    for p, o in zip(paths, worlds, strict=True)
                ]
                assert results[0] == results[1], (op, results)
                if results[0] == ("ok", False):
                    general = [outcome(lambda o=o, m=msg: o.publish_nowait(m)) for o in worlds]
                    assert general[0] == general[1]
            else:
                mark = _apply_change(op, worlds, loop, tracing, hooks)
                sent_mark = sent_mark if mark is None else mark
            assert _state(worlds[0]) == _state(worlds[1]), op
            for outlet in worlds:
                # (the clock decides nothing: a handoff outlet's last send stays where
                # the "handoff" step put it - far back: paced, ahead: a burst - and a
                # write at once never looks like a burst, the "batch" steps decide)
                outlet._sent_ns = sent_mark
                for link in outlet._links:
                    link._written_ns = 0
    finally:
        _stream_publish.TRACING, _stream_publish.PUBLISH_HOOKS = saved  # type: ignore[misc]
        _stream_publish._FLUSH_MESSAGES = saved_flush  # type: ignore[misc]
        loop.close()


@needs_extension
@pytest.mark.parametrize("start", [0, 250, 2**30 - 3, 2**60 - 3, 2**62 - 3])
def test_the_compiled_publish_counts_across_int_sizes_and_never_changes_a_held_int(
    start: int,
) -> None:
    """Counters that start just below 2**30 or 2**60 (a digit more on 3.11) or at the
    small ints' edge count as publish_small_py counts them; and an int that other code
    holds (the compiled publish writes a counter in place only where its slot is the one
    reference) keeps its value."""
    import asyncio  # noqa: PLC0415

    from ezflow._core._outlet import Outlet  # noqa: PLC0415
    from ezflow._transports import _stream_publish  # noqa: PLC0415
    from ezflow._transports._stream_publish import StreamLink  # noqa: PLC0415

    compiled = _stream_publish.compiled_publish_small(_speedups)
    assert compiled is not None
    loop = asyncio.new_event_loop()
    small = np.zeros(16, np.float32)

    async def world() -> Outlet:
        outlet = Outlet("p-1", "/t", Codec(), max_in_flight=1 << 20, max_in_flight_bytes=1 << 40)
        outlet.add_link(StreamLink(_Connection(), lossless=True, max_size=1 << 20))  # type: ignore[arg-type]
        assert outlet.publish_nowait((0, 0, 7, small))  # (the template learned)
        fresh = lambda: int(str(start))  # noqa: E731  (a new int object each call)
        link = outlet._links[0]
        link.sent_count, link.released_count = fresh(), fresh()
        link.sent_bytes, link.released_bytes = fresh(), fresh()
        link.inline_sends = fresh()  # type: ignore[attr-defined]
        outlet._seq = fresh()
        stats = outlet.stats
        stats.messages, stats.encodes, stats.bytes, stats.sends = (fresh() for _ in range(4))
        return outlet

    try:
        worlds = [loop.run_until_complete(world()) for _ in range(2)]
        link = worlds[0]._links[0]
        stats = worlds[0].stats
        held = [link.sent_count, link.sent_bytes, link.inline_sends, stats.messages]  # type: ignore[attr-defined]
        for n in range(1, 6):
            for outlet in worlds:
                outlet._links[0]._flush_scheduled = True  # type: ignore[attr-defined]
                outlet._unyielded = outlet._unyielded_bytes = 0
            results = [
                compiled(worlds[0], (0, n, 7, small)),
                _stream_publish.publish_small_py(worlds[1], (0, n, 7, small)),
            ]
            assert results == [True, True]
            assert _state(worlds[0]) == _state(worlds[1]), n
        assert held == [start] * 4
        assert link.sent_count == start + 5 and stats.messages == start + 5
        assert worlds[0]._seq == start + 5
    finally:
        loop.close()


@needs_extension
def test_the_compiled_publish_sends_what_the_general_path_sends() -> None:
    """A burst of ordinary messages on two links: the compiled publish takes every one
    after the first of a loop turn, and the channels get the frames the general path
    (publish_nowait) sends, byte for byte (send times aside)."""
    import asyncio  # noqa: PLC0415
    import time  # noqa: PLC0415

    from ezflow._core._outlet import Outlet  # noqa: PLC0415
    from ezflow._transports import _stream_publish  # noqa: PLC0415
    from ezflow._transports._stream_publish import StreamLink  # noqa: PLC0415

    compiled = _stream_publish.compiled_publish_small(_speedups)
    assert compiled is not None
    arr = np.arange(16, dtype=np.float32)

    async def burst(fast: bool) -> tuple[list[list[bytes]], list[bool]]:
        outlet = Outlet("p-1", "/t", Codec(), max_in_flight=1000, max_in_flight_bytes=1 << 30)
        links = [StreamLink(_Connection(), lossless=True, max_size=1 << 20) for _ in range(2)]  # type: ignore[arg-type]
        for link in links:
            outlet.add_link(link)
        took = []
        for seq in range(40):
            msg = (0, seq, 2**40 + seq, arr)
            for link in links:  # (a burst, whatever the load: see StreamLink.send_small;
                # ahead of any clock read, so within the paced gap however late it runs)
                link._written_ns = time.time_ns() + 10**12
            took.append(fast and compiled(outlet, msg))
            if not took[-1]:
                assert outlet.publish_nowait(msg)
            if seq == 20:
                await asyncio.sleep(0)  # (a loop turn: the queue is flushed)
        await asyncio.sleep(0)
        return [_frames(link.connection.out.data) for link in links], took

    async def both() -> None:
        fast, took = await burst(True)
        general, _ = await burst(False)
        assert fast == general and len(fast[0]) == 40
        # Not the first (it teaches the codec its shape; the second too when the shape
        # is new to this process) nor the first of each loop turn (send_small's: it
        # starts the turn's batch); every other.
        assert [seq for seq, fast in enumerate(took) if not fast] in ([0, 21], [0, 1, 21])

    asyncio.run(both())


@needs_extension
def test_the_compiled_paced_publish_writes_and_hands_off_as_the_general_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paced messages on one link (each long after the previous write, no loop turn's
    batch under way): the compiled publish writes each at once and hands off as the
    general path (publish_nowait -> StreamLink.send_small -> Outlet._hand_off) does:
    the same frames written, counters and statistics, and the same yields - after a
    publisher that slept, not after one that was busy or preempted - and the same
    handoff state; it declines the first message of a burst (a write within the paced
    gap), which the general path answers by collecting the loop turn."""
    import asyncio  # noqa: PLC0415

    from ezflow._core import _outlet  # noqa: PLC0415
    from ezflow._core._outlet import Outlet  # noqa: PLC0415
    from ezflow._transports import _stream_publish  # noqa: PLC0415
    from ezflow._transports._stream_publish import StreamLink  # noqa: PLC0415

    compiled = _stream_publish.compiled_publish_small(_speedups)
    assert compiled is not None
    arr = np.arange(16, dtype=np.float32)
    sleeps, yields = [0], [0]
    monkeypatch.setattr(_outlet, "_voluntary_switches", lambda: sleeps[0])
    monkeypatch.setattr(_outlet, "_sched_yield", lambda: yields.__setitem__(0, yields[0] + 1))
    # (slept before each message, or busy: a yield after each that came after a sleep)
    slept = [True, True, False, True, False, False, True, True]

    async def paced(fast: bool) -> tuple[Any, list[bool], list[int], int]:
        outlet = Outlet("p-1", "/t", Codec(), max_in_flight=64, max_in_flight_bytes=1 << 30)
        link = StreamLink(_Connection(), lossless=True, max_size=1 << 20)  # type: ignore[arg-type]
        link.handoff = True  # (as a link to this host is)
        outlet.add_link(link)
        assert outlet._handoff
        yields[0] = sleeps[0] = 0
        took, yielded = [], []
        for seq, sleep in enumerate(slept):
            msg = (0, seq, 2**40 + seq, arr)
            link._written_ns = outlet._sent_ns = 0  # (paced: long after the last write)
            sleeps[0] += sleep
            took.append(fast and compiled(outlet, msg))
            if not took[-1]:
                assert outlet.publish_nowait(msg)
            assert not link._flush_scheduled and not link._queued
            yielded.append(yields[0])
        # the first message of a burst (written within the paced gap): declined
        burst = (0, 99, 0, arr)
        # (ahead of any clock read: within the gap whatever the load delays)
        link._written_ns = time.time_ns() + 10**12
        took.append(fast and compiled(outlet, burst))
        if not took[-1]:
            assert outlet.publish_nowait(burst)
        assert link._flush_scheduled
        await asyncio.sleep(0)
        return _state(outlet), took, yielded, outlet._slept

    async def both() -> None:
        fast = await paced(True)
        general = await paced(False)
        assert fast[0] == general[0] and fast[2:] == general[2:]
        assert len(fast[0][-1][0][-2]) == len(slept) + 1  # (every frame written)
        # (the first teaches the codec its shape; the burst's first is declined)
        assert fast[1] == [False] + [True] * (len(slept) - 1) + [False]
        assert fast[2] == [1, 2, 2, 3, 3, 3, 4, 5]

    asyncio.run(both())


@needs_extension
@pytest.mark.skipif(
    not hasattr(os, "sched_yield") or not hasattr(_speedups, "voluntary_switches"),
    reason="the handoff needs sched_yield and the thread's switch count (Linux)",
)
def test_the_compiled_paced_handoff_decides_as_outlet_hand_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the outlet module's own functions, the compiled paced publish does the
    handoff itself (``PublishPath.handoffs``): it yields after a sleep (a voluntary
    switch since the last paced publish) and not after busy time, as ``Outlet._hand_off``
    decides (counted on the general path by a wrapper around ``_sched_yield``), and
    leaves the outlet's switch mark as the method does. With one of those functions
    replaced (as a test's clock replaces them) it calls the method instead."""
    import asyncio  # noqa: PLC0415

    from ezflow._core import _outlet  # noqa: PLC0415
    from ezflow._core._outlet import Outlet  # noqa: PLC0415
    from ezflow._transports import _stream_publish  # noqa: PLC0415
    from ezflow._transports._stream_publish import StreamLink  # noqa: PLC0415

    compiled = _stream_publish.compiled_publish_small(_speedups)
    assert compiled is not None
    path = compiled.__self__  # type: ignore[attr-defined]
    arr = np.arange(16, dtype=np.float32)
    slept = [True, False, True, True, False, False, True]
    yields = [0]
    real_yield = os.sched_yield

    def counted_yield() -> None:
        yields[0] += 1
        real_yield()

    async def paced(publish: Any) -> tuple[Any, list[int], list[int]]:
        outlet = Outlet("p-1", "/t", Codec(), max_in_flight=64, max_in_flight_bytes=1 << 30)
        link = StreamLink(_Connection(), lossless=True, max_size=1 << 20)  # type: ignore[arg-type]
        link.handoff = True
        outlet.add_link(link)
        assert outlet.publish_nowait((0, -1, 0, arr))  # (teaches the codec the shape)
        here, yielded = [], []
        for seq, sleep in enumerate(slept):
            link._written_ns = outlet._sent_ns = 0  # (paced: long after the last write)
            if sleep:
                await asyncio.sleep(0.001)  # (the thread blocks in its poll: a voluntary switch)
            before = path.handoffs, path.handoff_yields, yields[0], outlet._slept
            assert publish(outlet, (0, seq, 7, arr))
            here.append(path.handoffs - before[0])
            yielded.append(path.handoff_yields - before[1] + yields[0] - before[2])
            assert outlet._slept == _speedups.voluntary_switches()
            # The rule: a yield when the thread switched voluntarily since the last paced
            # publish (after every sleep; after busy time only if it waited on something,
            # such as the GIL, which a loaded test run can make it do).
            assert yielded[-1] == (outlet._slept != before[3]), (seq, sleep)
            assert yielded[-1] or not sleep
        return _state(outlet), here, yielded

    fast = asyncio.run(paced(compiled))
    with monkeypatch.context() as patch:
        patch.setattr(_outlet, "_sched_yield", counted_yield)
        general = asyncio.run(paced(lambda outlet, message: outlet.publish_nowait(message)))
        called = asyncio.run(paced(compiled))  # (the compiled publish, the method called)
    assert fast[1] == [1] * len(slept)  # (each handoff done in C)
    assert general[1] == called[1] == [0] * len(slept)  # (each by the method)
    # (nearly always exactly the sleeps; the rule above decides each)
    assert sum(fast[2]) < len(slept) or sum(general[2]) < len(slept)
    assert fast[0] == general[0] == called[0]


@needs_extension
@pytest.mark.parametrize("slack", [-1, 0, 1])
def test_the_compiled_publish_stops_where_the_byte_window_fills(slack: int) -> None:
    """A byte window of two message bodies (and a byte less, and a byte more): the
    compiled publish sends while the link's in-flight bytes are below the window and
    declines once they reach it exactly, as publish_small_py does and as the general
    room rule (``Link.has_room``) says. (The boundary itself: the hypothesis twin test
    reaches it only by chance.)"""
    import asyncio  # noqa: PLC0415

    from ezflow._core._outlet import Outlet  # noqa: PLC0415
    from ezflow._transports import _stream_publish  # noqa: PLC0415
    from ezflow._transports._stream_publish import StreamLink  # noqa: PLC0415

    compiled = _stream_publish.compiled_publish_small(_speedups)
    assert compiled is not None
    arr = np.zeros(16, np.float32)
    size = len(Codec().encode((0, 1, 7, arr)).to_bytes())

    async def run(publish: Any) -> tuple[list[bool], list[bool], Any]:
        outlet = Outlet(
            "p-1", "/t", Codec(), max_in_flight=64, max_in_flight_bytes=2 * size + slack
        )
        link = StreamLink(_Connection(), lossless=True, max_size=1 << 20)  # type: ignore[arg-type]
        outlet.add_link(link)
        assert outlet.publish_nowait((0, 0, 7, arr))  # (teaches the codec the shape)
        link._flush_scheduled = True  # (a burst: the rest of the loop turn is queued)
        sent, room = [], []
        for seq in (1, 2, 3):
            room.append(link.has_room(outlet))
            sent.append(publish(outlet, (0, seq, 7, arr)))
        assert link.sent_bytes == size * (1 + sent.count(True))
        return sent, room, _state(outlet)

    async def both() -> None:
        fast, room, fast_state = await run(compiled)
        twin, _, twin_state = await run(_stream_publish.publish_small_py)
        assert fast == twin == room
        assert fast_state == twin_state
        # in flight before each: 1, 2 (then 2 or 3) bodies
        assert fast == {-1: [True, False, False], 0: [True, False, False]}.get(
            slack, [True, True, False]
        )

    asyncio.run(both())


# -- the compiled take of a queued message (TakePath) against take_queued_py -----------


_TAKE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("deliver"), st.sampled_from("abb"), st.sampled_from([1, 1, 1, 2])),
        st.tuples(st.just("garbage"), st.sampled_from("ab")),
        st.tuples(st.just("take"), st.integers(0, 2), st.integers(1, 4)),
        st.tuples(st.just("take"), st.integers(0, 2), st.integers(1, 4)),
        st.tuples(st.just("handed"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("detach"), st.integers(0, 3)),
        st.tuples(st.just("callback"), st.booleans()),
        st.tuples(st.just("defer"), st.sampled_from([0, 0, 0, 1, 2])),
        st.tuples(st.just("deferred")),
        # quiet marks: no on_release below released + (count, bytes) ahead; 0 ahead is
        # the default's "every release calls"
        st.tuples(st.just("quiet"), st.sampled_from("ab"), st.integers(0, 4), st.integers(0, 9)),
    ),
    max_size=150,
)


@needs_extension
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TAKE_OPS)
@example(  # (the ordinary program's burst after a wake: a later entry counted to 0)
    [("deliver", "b", 1), ("deliver", "b", 1), ("defer", 0), ("take", 0, 2), ("deferred",)]
)
@example(  # (releases held back by quiet marks, then one at the mark)
    [("deliver", "b", 1), ("deliver", "b", 1), ("quiet", "b", 2, 9), ("take", 0, 2)]
)
def test_the_compiled_take_is_the_python_twin(ops: list[tuple[Any, ...]]) -> None:
    """Two channels feeding three inboxes (two lossless, so that an entry waits for two
    takes, and a leaky one), the same steps in two worlds (deliveries, some with a seq
    skipped, undecodable bodies, takes, handler times under way or not, detaches, a
    channel without on_release, woken takes whose release waits for the loop, as
    get_nowait(loop) defers it, quiet marks that hold release calls back): the compiled
    take and take_queued_py take the same
    messages or decline alike, and leave the same queues, counters, handler-time
    samples, pending entries, releases and release calls. What either declines,
    get_nowait takes, in both."""
    import time  # noqa: PLC0415

    from ezflow._core._channel import Channel, compiled_take_queued  # noqa: PLC0415
    from ezflow._core._inbox import NOTHING, Inbox, take_queued_py  # noqa: PLC0415

    compiled = compiled_take_queued(_speedups)
    assert compiled is not None

    def world() -> tuple[list[Channel], list[Inbox], list[Any], list[Any]]:
        calls: list[Any] = []
        channels = [
            Channel(
                f"p-{name}", "/t", Codec(), on_release=lambda c, n, k=name: calls.append((k, c, n))
            )
            for name in "ab"
        ]
        inboxes = [Inbox(), Inbox(), Inbox(leaky=True, maxlen=3)]
        attachments = [channels[0].attach(inboxes[0]), channels[0].attach(inboxes[1])]
        attachments += [channels[1].attach(inboxes[0]), channels[1].attach(inboxes[2])]
        return channels, inboxes, attachments, calls

    def state(w: Any) -> Any:
        channels, inboxes, attachments, calls = w
        return (
            [
                (c.released, c.pending, c._pending_bytes, [list(e) for e in c._pending])
                for c in channels
            ],
            [
                (
                    len(i),
                    dataclasses.astuple(i.stats),
                    sum(i.handler_time.buckets),
                    i._handed_ns > 0,
                )
                for i in inboxes
            ],
            [(a.active, a.consumed_seq) for a in attachments],
            list(calls),
        )

    worlds = [world(), world()]
    soon = [Soon(), Soon()]
    seqs = {"a": 0, "b": 0}
    for op in ops:
        name = op[0]
        if name in ("deliver", "garbage"):
            seqs[op[1]] += op[2] if name == "deliver" else 1
            for channels, *_ in worlds:
                channel = channels["ab".index(op[1])]
                if name == "deliver":
                    channel.deliver(seqs[op[1]], ("m", seqs[op[1]]), nbytes=seqs[op[1]] % 7)
                else:
                    channel.deliver_body(seqs[op[1]], b"\xff" * 9)
        elif name == "take":
            for _ in range(op[2]):
                boxes = [w[1][op[1]] for w in worlds]
                got = [
                    outcome(lambda p=p, i=i: p(i))
                    for p, i in zip((compiled, take_queued_py), boxes, strict=True)
                ]
                assert got[0] == got[1], (op, got)
                if got[0] == ("ok", NOTHING) and len(boxes[0]):
                    general = [outcome(box.get_nowait) for box in boxes]
                    assert general[0][0] == general[1][0]
        elif name == "defer":  # (a woken get: its release deferred to the loop)
            boxes = [w[1][op[1]] for w in worlds]
            if len(boxes[0]):
                general = [
                    outcome(lambda b=b, s=s: b.get_nowait(s))  # type: ignore[misc]
                    for b, s in zip(boxes, soon, strict=True)
                ]
                assert general[0][0] == general[1][0]
        elif name == "deferred":
            for s in soon:
                s.run()
        elif name == "handed":
            now = time.perf_counter_ns()
            for w in worlds:
                w[1][op[1]]._handed_ns = now - 1000 if op[2] else 0
        elif name == "detach":
            for _, _, attachments, _ in worlds:
                attachment = attachments[op[1]]
                if attachment.active:
                    attachment.channel.detach(attachment)
        elif name == "callback":
            for channels, *_ in worlds:
                channels[0].on_release = None if op[1] else channels[1].on_release
        elif name == "quiet":
            for channels, *_ in worlds:
                channel = channels["ab".index(op[1])]
                count, nbytes = channel.released
                channel.release_quiet_count = count + op[2] if op[2] else 0
                channel.release_quiet_bytes = nbytes + op[3] if op[3] else 0
        assert state(worlds[0]) == state(worlds[1]), op


@needs_extension
@pytest.mark.parametrize("next_count", [-1, 0, 1, 2])
def test_the_compiled_take_leaves_a_released_next_entry_to_the_general_path(
    next_count: int,
) -> None:
    """The take that releases the first pending entry when the entry after it is already
    released (its count 0 or below: its last holder's release came first, as a deferred
    release can) declines: Channel.release's _advance removes both, and the publisher
    hears of both at once. With the next entry still held (count 1, 2) the compiled take
    releases the first one itself. The compiled take and take_queued_py alike."""
    from ezflow._core._channel import Channel, compiled_take_queued  # noqa: PLC0415
    from ezflow._core._inbox import NOTHING, Inbox, take_queued_py  # noqa: PLC0415

    compiled = compiled_take_queued(_speedups)
    assert compiled is not None

    def run(take: Any) -> tuple[Any, Any]:
        calls: list[tuple[int, int]] = []
        channel = Channel("p-1", "/t", Codec(), on_release=lambda c, n: calls.append((c, n)))
        inbox = Inbox()
        channel.attach(inbox)
        for seq in (1, 2, 3):
            channel.deliver(seq, ("m", seq), nbytes=10 * seq)
        channel._pending[1][1] = next_count
        took = take(inbox)
        if took is NOTHING:
            assert inbox.get_nowait() == ("m", 1)  # (the general path: Channel.release)
        state = (channel.released, [list(e) for e in channel._pending], calls, len(inbox))
        return took, state

    fast, twin = run(compiled), run(take_queued_py)
    assert fast == twin
    if next_count <= 0:
        assert fast[0] is NOTHING
        assert fast[1][1:] == ([[3, 1, 30]], [(2, 30)], 2)  # both entries released at once
    else:
        assert fast[0] == ("m", 1)
        assert fast[1][1:] == ([[2, next_count, 20], [3, 1, 30]], [(1, 10)], 2)


@needs_extension
def test_the_compiled_publish_and_take_leak_nothing_over_1e5_calls() -> None:
    """1e5 compiled publishes (frames queued, flushed to a sink that releases them) and
    1e5 compiled takes (each after a delivery; its release removes the pending entry and
    calls on_release) leave no memory block behind."""
    import asyncio  # noqa: PLC0415

    from ezflow._core._channel import Channel, compiled_take_queued  # noqa: PLC0415
    from ezflow._core._inbox import Inbox  # noqa: PLC0415
    from ezflow._core._outlet import Outlet  # noqa: PLC0415
    from ezflow._transports import _stream_publish  # noqa: PLC0415
    from ezflow._transports._stream_publish import StreamLink  # noqa: PLC0415

    publish = _stream_publish.compiled_publish_small(_speedups)
    take = compiled_take_queued(_speedups)
    assert publish is not None and take is not None

    async def main() -> None:
        # (a window the flushes reach: each flush releases what it wrote)
        outlet = Outlet(
            "p-1",
            "/t",
            Codec(),
            max_in_flight=4 * STREAM_FLUSH_MESSAGES,
            max_in_flight_bytes=1 << 22,
        )
        link = StreamLink(_Connection(), lossless=True, max_size=1 << 20)  # type: ignore[arg-type]
        outlet.add_link(link)
        out = link.connection.out

        def writelines(parts: list[bytes]) -> None:  # (the channel's ACK, at once)
            link.released(link.sent_count, link.sent_bytes)

        out.writelines = writelines  # type: ignore[method-assign]
        arr = np.zeros(16, np.float32)
        assert outlet.publish_nowait((0, 0, 0, arr))
        channel = Channel("p-1", "/t", Codec(), on_release=lambda count, nbytes: None)
        inbox = Inbox()
        channel.attach(inbox)

        def run(times: int) -> None:
            for seq in range(1, times + 1):
                link._flush_scheduled = True
                outlet._unyielded = outlet._unyielded_bytes = 0
                assert publish(outlet, (0, seq, 2**40, arr))
                channel.deliver(seq + count[0], ("m", seq), nbytes=3)
                assert take(inbox) == ("m", seq)
            count[0] += times

        count = [0]
        grown = blocks_grown(run, warm=1000, times=100_000)
        assert grown < 100, f"{grown} memory blocks more after 1e5 publishes and takes"
        assert link.inline_sends == 101_001 and channel.pending == 0

    asyncio.run(main())


# -- copy_into: the shm publisher's copy of a large part (issue 28) ---------------------


def _copy_outcome(copy: Any, dst: bytearray, offset: int, src: Any, nontemporal: bool) -> Any:
    got = outcome(lambda: copy(dst, offset, src, nontemporal))
    return got, bytes(dst)


@needs_extension
@settings(max_examples=300, deadline=None)
@given(
    sizes=st.tuples(st.integers(0, 400), st.integers(0, 400)),  # destination, source
    offset=st.integers(-2, 420),
    skew=st.integers(0, 17),  # (the source's address within a 16-byte line)
    nontemporal=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_compiled_copy_is_the_python_twin(
    sizes: tuple[int, int], offset: int, skew: int, nontemporal: bool, seed: int
) -> None:
    dst_size, src_size = sizes
    rng = np.random.default_rng(seed)
    source = memoryview(bytes(rng.integers(0, 256, skew + src_size, dtype=np.uint8)))[skew:]
    initial = bytes(rng.integers(0, 256, dst_size, dtype=np.uint8))
    compiled = _copy_outcome(_speedups.copy_into, bytearray(initial), offset, source, nontemporal)
    pure = _copy_outcome(_compiled.copy_into_py, bytearray(initial), offset, source, nontemporal)
    assert compiled == pure
    if 0 <= offset <= dst_size - src_size:
        assert compiled[1] == initial[:offset] + bytes(source) + initial[offset + src_size :]


@needs_extension
@pytest.mark.parametrize("nontemporal", [False, True])
def test_the_compiled_copy_of_a_large_part_and_its_refusals(nontemporal: bool) -> None:
    source = np.random.default_rng(7).integers(0, 256, (1 << 20) + 77, dtype=np.uint8)
    for copy in (_speedups.copy_into, _compiled.copy_into_py):
        block = np.zeros((1 << 20) + 200, np.uint8)
        copy(block, 19, source, nontemporal)  # (an odd offset: the head is copied apart)
        assert np.array_equal(block[19 : 19 + source.size], source)
        assert not block[:19].any() and not block[19 + source.size :].any()
        # overlapping source and destination: as memmove
        block[:] = np.arange(block.size, dtype=np.uint64).astype(np.uint8)
        expected = block.copy()
        expected[64 : 64 + 4096] = block[:4096]
        copy(block, 64, block[:4096], nontemporal)
        assert np.array_equal(block, expected)
    refused = [
        (bytes(8), 0, b"x"),  # read-only destination
        (bytearray(8), 0, np.zeros((4, 4), np.uint8)[:, :2]),  # non-contiguous source
        (bytearray(8), 0, 5),  # not a buffer
        (np.zeros((4, 4), np.uint8)[:, :2], 0, b"x"),  # non-contiguous destination
        (bytearray(8), 7, b"xy"),  # past the end
        (bytearray(8), -1, b""),  # before the start
    ]
    for args in refused:
        compiled = outcome(lambda args=args: _speedups.copy_into(*args, nontemporal))
        pure = outcome(lambda args=args: _compiled.copy_into_py(*args, nontemporal))
        assert compiled == pure and compiled[0] == "raised", args


@needs_extension
@pytest.mark.parametrize("nontemporal", [False, True])
@pytest.mark.parametrize("threads", [2, 3, 16, 40])
def test_the_compiled_copy_in_pieces_is_the_one_copy(nontemporal: bool, threads: int) -> None:
    """A copy cut into pieces on several threads (at least 1 MiB a piece, at most 16
    threads) writes what one copy writes, for sizes around the pieces' boundaries and
    unaligned ends, and nothing outside its span; overlapping buffers are one memmove."""
    rng = np.random.default_rng(threads)
    mib = 1 << 20
    for size, skew, offset in [
        (2 * mib - 1, 0, 0),  # (one piece: below two)
        (2 * mib, 0, 64),
        (3 * mib + 13, 5, 19),
        (17 * mib + 4097, 3, 7),
    ]:
        source = rng.integers(0, 256, size + skew, dtype=np.uint8)[skew:]
        initial = rng.integers(0, 256, size + offset + 300, dtype=np.uint8)
        compiled, pure = initial.copy(), initial.copy()
        _speedups.copy_into(compiled, offset, source, nontemporal, threads)
        _compiled.copy_into_py(pure, offset, source, nontemporal, threads)
        assert np.array_equal(compiled, pure), (size, skew, offset)
        assert np.array_equal(compiled[offset : offset + size], source)
        assert np.array_equal(compiled[:offset], initial[:offset])
        assert np.array_equal(compiled[offset + size :], initial[offset + size :])
    block = np.arange(4 * mib, dtype=np.uint64).astype(np.uint8)
    expected = block.copy()
    expected[64 : 64 + 3 * mib] = block[: 3 * mib]
    _speedups.copy_into(block, 64, block[: 3 * mib], nontemporal, threads)
    assert np.array_equal(block, expected)


@needs_extension
@pytest.mark.parametrize("threads", [0, -1])
def test_a_copy_on_no_thread_is_refused_by_both(threads: int) -> None:
    """Refused by both, with the same error first when more than one thing is wrong."""
    for args in [
        (bytearray(8), 0, b"x"),
        (bytes(8), 0, b"x"),  # (read-only too)
        (bytearray(8), 7, b"xy"),  # (past the end too)
        (bytearray(8), 0, 5),  # (not a buffer too)
    ]:
        compiled = outcome(lambda args=args: _speedups.copy_into(*args, False, threads))
        pure = outcome(lambda args=args: _compiled.copy_into_py(*args, False, threads))
        assert compiled == pure and compiled[0] == "raised", args


@needs_extension
def test_the_compiled_copy_leaks_nothing() -> None:
    block, part = bytearray(4096), bytes(range(256)) * 8
    calls: list[tuple[Any, ...]] = [
        (block, 5, part, True),
        (block, 0, part, False),
        (block, 4000, part, True),
        (bytes(8), 0, part, True),
        (block, 0, part, True, 0),
    ]
    big, big_part = bytearray(2 << 20), bytes(2 << 20)
    calls.append((big, 0, big_part, False, 2))  # (two pieces: a helper thread)

    def run(times: int) -> None:
        for _ in range(times):
            for args in calls:
                with contextlib.suppress(ValueError, TypeError):
                    _speedups.copy_into(*args)

    assert blocks_grown(run, warm=300, times=6_000) < 100


# -- voluntary_switches: the paced-publish handoff's test (issue 28) ------------------


@needs_extension
@pytest.mark.skipif(_compiled.RUSAGE_THREAD is None, reason="RUSAGE_THREAD: Linux only")
def test_the_compiled_voluntary_switches_count_what_getrusage_counts() -> None:
    """_speedups.voluntary_switches reads the count voluntary_switches_py reads (this
    thread's voluntary context switches): never behind one read before it, never ahead
    of one read after it; a blocking sleep adds one to both; a busy loop (no blocking)
    adds none."""
    assert _speedups is not None
    compiled, pure = _speedups.voluntary_switches, _compiled.voluntary_switches_py
    if _compiled.SPEEDUPS is not None:  # (what this process runs)
        assert _compiled.voluntary_switches is compiled
    for _ in range(5):
        before = pure()
        got = compiled()
        after = pure()
        assert before <= got <= after
        time.sleep(0.002)
        assert compiled() > got and pure() > after
    deadline = time.perf_counter() + 0.002
    busy = compiled()
    while time.perf_counter() < deadline:
        pass
    assert compiled() == busy
