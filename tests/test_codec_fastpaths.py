"""Differential tests of every codec fast path against the general path (the reference).

Encode side: ``Codec.encode`` (the top-level array cache, the shape templates),
``Codec._encode_small``, ``Codec._small_array_body`` and ``Codec._array_prefix`` must give
exactly the bytes of ``_encode_general``, or raise what it raises. Decode side:
``Codec.decode`` (``_last_array``, ``_cached_array``, the top-level array shortcut, the
shape layouts) must give what ``_decode_general`` gives - same types, values, dtypes,
shapes, read-only views - or raise ProtocolError where it does, also for mutated bodies.
Messages repeat (cache hits) and interleave (misses), with caches shrunk (evictions).
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import time
from collections.abc import Iterator
from typing import Any, Final

import numpy as np
import pytest
from _messages import (
    Sample,
    arrays,
    assert_same_decoded,
    assert_same_outcome,
    build,
    head_size,
    messages,
    mutations,
    outcome,
    shapes,
    templated,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ezflow._core import _codec
from ezflow._core._codec import (
    HEADER,
    SMALL_BODY,
    Codec,
    EncodedMessage,
    _decode_general,
    _dtypes,
    _encode_general,
    _layouts,
    _templates,
)
from ezflow._core._exceptions import ProtocolError

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def joined(encoded: EncodedMessage) -> bytes:
    body = b"".join(encoded.parts)
    assert len(body) == encoded.nbytes
    for part in encoded.parts:
        assert type(part) is bytes or (
            type(part) is memoryview and part.format == "B" and part.ndim == 1
        )
    return body


def check_encode(codec: Codec, obj: object) -> bytes | None:
    """Encode *obj* through every fast path and the general path: identical bytes or
    the same exception. Returns the body (None if encoding raised)."""
    ref = outcome(lambda: joined(_encode_general(codec, obj)))
    got = outcome(lambda: joined(codec.encode(obj)))
    assert ref[0] == got[0], (ref, got)
    assert ref[1] == got[1]  # the bytes, or the exception type
    small = codec._encode_small(obj)
    if small is not None:
        assert ref[0] == "ok" and small == ref[1]
        assert len(small) <= SMALL_BODY
    if type(obj) is np.ndarray:
        array_small = codec._small_array_body(obj)
        assert array_small is None or array_small == ref[1]
    return ref[1] if ref[0] == "ok" else None  # type: ignore[return-value]


def check_decode(codec: Codec, body: bytes) -> tuple[str, object]:
    """Decode *body* (as bytes and as a memoryview) through the fast paths and through
    the general decoder alone: the same outcome."""
    ref = outcome(lambda: _decode_general(codec, body))
    assert ref[0] == "ok" or ref[1] is ProtocolError
    for variant in (body, memoryview(body)):
        assert_same_outcome(ref, outcome(lambda v=variant: codec.decode(v)))  # type: ignore[misc]
    return ref


def check_repeated(codec: Codec, obj: object) -> bytes | None:
    """Encode and decode *obj* three times in a row: the second and third take the
    cached paths, which must be taken where the documented rule says so."""
    body = None
    for _ in range(3):
        body = check_encode(codec, obj)
    if body is None:
        return None
    if templated(obj) and len(body) <= SMALL_BODY:
        # The template path was taken: one bytes part, and the small-body path.
        assert len(codec.encode(obj).parts) == 1
        assert codec._encode_small(obj) == body
    # From a fresh state for this body's key: the second decode learns its layout, the
    # third uses it.
    forget_layouts(body)
    for _ in range(3):
        ref = check_decode(codec, body)
    if templated(obj) and head_size(body) <= _layouts._LAYOUT_MAX_HEAD and ref[0] == "ok":
        layout = codec._last_layout  # learned on the second decode, used on the third
        assert layout is not None and layout.size == len(body)
        assert_same_decoded(ref[1], layout.decode(body))
    return body


def forget_layouts(body: bytes) -> None:
    """Forget what the shared decode caches know of bodies like *body* (other tests
    fill them too)."""
    key = (len(body), body[: HEADER.size])
    _layouts._DEC_SEEN.pop(key, None)
    _layouts._DEC_LAYOUTS.pop(key, None)


@contextlib.contextmanager
def small_caches() -> Iterator[None]:
    """Shrink every fast-path cache so that interleaved shapes evict each other."""
    sizes = {
        (_templates, "_TEMPLATE_CACHE_SIZE"): 2,
        (_layouts, "_LAYOUT_CACHE_SIZE"): 2,
        (_layouts, "_LAYOUTS_PER_KEY"): 1,
        (_codec, "_ARRAY_CACHE_SIZE"): 2,
        (_dtypes, "_DTYPE_CACHE_SIZE"): 2,
    }
    saved = {(module, name): getattr(module, name) for module, name in sizes}
    try:
        for (module, name), value in sizes.items():
            setattr(module, name, value)
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


# --------------------------------------------------------------------------- encode + decode


@FAST
@given(messages())
def test_every_fast_path_matches_the_general_path_on_repeats(obj: object) -> None:
    check_repeated(Codec(), obj)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), min_size=2, max_size=4), st.data(), st.booleans())
def test_interleaved_shapes_hit_miss_and_evict_alike(
    objs: list[object], data: st.DataObject, shrink: bool
) -> None:
    order = data.draw(st.lists(st.integers(0, len(objs) - 1), min_size=4, max_size=16))
    codec = Codec()
    with small_caches() if shrink else contextlib.nullcontext():
        for i in order + list(range(len(objs))) * 2:
            body = check_encode(codec, objs[i])
            if body is not None:
                check_decode(codec, body)


@FAST
@given(shapes(other=False), st.data())
def test_one_shape_with_new_values_each_time(shape: Any, data: st.DataObject) -> None:
    # One shape, different values: templates and layouts hit (or must miss, when a
    # value changes its encoded width) and always agree with the general path.
    codec = Codec()
    for _ in range(4):
        obj = build(shape, data.draw)
        body = check_encode(codec, obj)
        if body is not None:
            check_decode(codec, body)
            check_decode(codec, body)


# --------------------------------------------------------------------------- mutated bodies


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages() | arrays(max_side=20), st.data())
def test_mutated_bodies_are_judged_alike(obj: object, data: st.DataObject) -> None:
    codec = Codec()
    body = check_repeated(codec, obj)  # every cache warm for this shape
    if body is None:
        return
    for _ in range(6):
        mutated = data.draw(mutations(body))
        check_decode(codec, mutated)
        check_decode(codec, mutated)  # (a second time: learned, if it was valid)
        check_decode(codec, body)  # the original still decodes, from the caches


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages() | arrays(max_side=8), min_size=1, max_size=3), st.data())
def test_decode_many_is_decode_of_each(objs: list[object], data: st.DataObject) -> None:
    """Differential: ``Codec._decode_many`` (a relay's batch: one C loop of the layout
    decoded last, for bytes bodies of its size) gives what ``decode`` of each body in
    turn gives - the same objects, or a ProtocolError where one is bad: batches of one
    shape and of several,
    mutated bodies (of the same size too) among them, after any of them decoded last."""
    bodies = []
    for obj in objs:
        body = check_repeated(Codec(), obj)  # (every cache warm for this shape)
        if body is not None:
            bodies.append(body)
    if not bodies:
        return
    batch = data.draw(st.lists(st.sampled_from(bodies), min_size=1, max_size=12))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(batch) - 1))
        batch[at] = data.draw(mutations(batch[at]))
    last = data.draw(st.sampled_from(bodies))
    codecs = [Codec(), Codec()]
    for codec in codecs:  # (the same hints: the body decoded last, twice to learn it)
        for _ in range(2):
            with contextlib.suppress(ProtocolError):
                codec.decode(last)
    many = outcome(lambda: codecs[0]._decode_many(batch))
    each = outcome(lambda: [codecs[1].decode(body) for body in batch])
    assert many[0] == each[0]
    if many[0] == "ok":
        assert len(many[1]) == len(each[1])  # type: ignore[arg-type]
        for got, expected in zip(many[1], each[1], strict=True):  # type: ignore[call-overload]
            assert_same_decoded(expected, got)
    else:
        assert many[1] is each[1] is ProtocolError
    # (Not compared: the hints each codec is left with. A body's layout is learned on its
    # second decode in the process, whichever codec decodes it, so the second codec here
    # learns what the first only saw: the hints depend on the order, not on the path.)


# --------------------------------------------------------------------------- bare arrays


@FAST
@given(arrays(max_side=40))
def test_bare_array_fast_paths_match_the_general_path(arr: np.ndarray[Any, Any]) -> None:
    codec = Codec()
    body = check_repeated(codec, arr)
    if body is None:
        return
    small = codec._small_array_body(arr)
    if len(body) <= SMALL_BODY and arr.nbytes and small is None:
        # _small_array_body declines only kinds without a cached prefix
        assert (arr.dtype, arr.shape) not in _codec._ENC_ARRAYS
    if arr.nbytes and arr.dtype.kind not in "mMV" and not arr.dtype.names:
        prefix, total = codec._array_prefix(arr.shape, arr.dtype)
        assert prefix + np.ascontiguousarray(arr).tobytes() == body
        assert total == len(body)


def test_the_paced_tuple_is_one_bytes_body_from_the_second_message_on() -> None:
    codec = Codec()
    payload = np.random.default_rng(1).random(16).astype(np.float32)
    forget_layouts(codec.encode((1, 0, time.perf_counter_ns(), payload)).to_bytes())
    for seq in range(3):
        message = (1, seq, time.perf_counter_ns(), payload)
        encoded = codec.encode(message)
        assert encoded.to_bytes() == _encode_general(codec, message).to_bytes()
        assert len(encoded.parts) == 1 and type(encoded.parts[0]) is bytes
        assert codec._encode_small(message) == encoded.parts[0]
        decoded = codec.decode(encoded.parts[0])
        assert_same_decoded(_decode_general(codec, encoded.parts[0]), decoded)
    assert codec._last_layout is not None  # the third decode took the layout
    large = (1, 2, 3, np.zeros(2048, np.float32))  # 8 KiB: referenced, not copied
    encoded = codec.encode(large)
    assert len(encoded.parts) == 2 and np.shares_memory(
        np.frombuffer(encoded.parts[1], np.uint8), large[3]
    )
    assert codec._encode_small(large) is None


def test_templates_stand_aside_for_what_the_general_path_refuses() -> None:
    codec = Codec(max_message_size=4096)
    codec.encode((1, "a", np.zeros(4)))
    for obj in [
        (2**64, "a", np.zeros(4)),  # int out of range
        (1, "\ud800", np.zeros(4)),  # a lone surrogate
        (1, "a", np.zeros(4096)),  # over max_message_size
        (1, "a", np.zeros(4, dtype=object)),  # a dtype that cannot travel
    ]:
        ref = outcome(lambda o=obj: _encode_general(codec, o))  # type: ignore[misc]
        got = outcome(lambda o=obj: codec.encode(o))  # type: ignore[misc]
        assert ref[0] == got[0] == "raised" and ref[1] is got[1]
        assert codec._encode_small(obj) is None


def test_a_huge_str_gets_the_same_bytes_and_leaves_no_huge_packer() -> None:
    codec = Codec()
    small = {"text": "y" * 10, "n": 1}
    assert codec.encode(small).to_bytes() == _encode_general(codec, small).to_bytes()
    before = _templates._thread_packer()
    huge = {"text": "x" * 200_000, "n": 1}
    assert codec.encode(huge).to_bytes() == _encode_general(codec, huge).to_bytes()
    after = _templates._thread_packer()
    assert after is not before  # the packer that grew to 200 KB was dropped
    assert codec.encode(small).to_bytes() == _encode_general(codec, small).to_bytes()
    assert _templates._thread_packer() is after  # small messages keep the packer


def test_dataclass_templates_send_init_fields_and_rebuild_by_the_constructor() -> None:
    @_codec.message(name="tests.fastpaths.Derived")
    @dataclasses.dataclass
    class Derived:
        a: int
        b: np.ndarray[Any, Any]
        total: float = dataclasses.field(init=False)

        def __post_init__(self) -> None:
            self.total = float(self.b.sum()) + self.a

    codec = Codec()
    obj = Derived(2, np.arange(3.0))
    forget_layouts(codec.encode(obj).to_bytes())
    for _ in range(3):
        body = codec.encode(obj).to_bytes()
        assert body == _encode_general(codec, obj).to_bytes()
        got = codec.decode(body)
        assert type(got) is Derived and got.total == 5.0
    assert codec._last_layout is not None


def test_a_dataclass_is_rebuilt_by_position_only_where_its_init_binds_so() -> None:
    """A layout calls a dataclass with its fields as positional arguments (cheaper than
    a dict of keywords) only when its ``__init__`` takes them in that order; a
    keyword-only field or an ``__init__`` of the class's own keeps the keywords. Both
    ways, compiled and pure, rebuild what the general decoder rebuilds. (Where the
    generated ``__init__`` runs, the compiled twin writes the fields instead: see
    ``test_a_dataclass_is_built_by_writing_its_fields_only_where_init_would_do_just_that``.)"""

    @_codec.message(name="tests.fastpaths.InOrder")
    @dataclasses.dataclass(slots=True)
    class InOrder:
        phase: int
        payload: np.ndarray[Any, Any]
        source: str = "mixed"

    @_codec.message(name="tests.fastpaths.KeywordOnly")
    @dataclasses.dataclass
    class KeywordOnly:
        phase: int
        payload: np.ndarray[Any, Any] = dataclasses.field(kw_only=True)

    @_codec.message(name="tests.fastpaths.OwnInit")
    @dataclasses.dataclass(init=False)
    class OwnInit:
        phase: int
        source: str

        def __init__(self, source: str, phase: int) -> None:  # (the other order)
            self.phase, self.source = phase, source

    cases = [  # (message, called with keywords by the pure path, compiled layout kind)
        (InOrder(3, np.arange(4.0), "x"), False, _layouts._KIND_FIELDS),
        (KeywordOnly(3, payload=np.arange(4.0)), True, _layouts._KIND_FIELDS),
        (OwnInit("x", 3), True, _layouts._KIND_DATACLASS),
    ]
    for obj, keywords, kind in cases:
        codec = Codec()
        body = codec.encode(obj).to_bytes()
        forget_layouts(body)
        for _ in range(3):
            ref = check_decode(codec, body)
        layout = codec._last_layout
        assert layout is not None and layout.spec[0] == kind, (obj, layout.spec)
        opnames = {instruction.opname for instruction in dis.get_instructions(layout.build)}
        assert ("CALL_FUNCTION_EX" in opnames) is keywords, (obj, opnames)
        assert ref[0] == "ok" and type(ref[1]) is type(obj)
        for field in dataclasses.fields(obj):  # (each field where it belongs)
            sent, got = getattr(obj, field.name), getattr(ref[1], field.name)
            assert np.array_equal(got, sent) if isinstance(sent, np.ndarray) else got == sent
        for decode in (layout.decode, layout.decode_py):
            assert_same_decoded(ref[1], decode(body))


class _Calls(type):
    """A metaclass with a ``__call__`` of its own (which a layout must not skip)."""

    calls = 0

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _Calls.calls += 1
        return super().__call__(*args, **kwargs)


# What the classes of _field_classes ran of their own code, in order.
_RAN: list[str] = []


class _Stored:
    """A data descriptor as a field's default: ``__init__`` stores through it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = "_" + name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return 7 if obj is None else getattr(obj, self.name)

    def __set__(self, obj: object, value: Any) -> None:
        _RAN.append("set " + self.name)
        setattr(obj, self.name, value)


def _recording_setattr(self: object, name: str, value: Any) -> None:
    _RAN.append("set " + name)
    object.__setattr__(self, name, value)


def _field_classes() -> list[tuple[str, type, bool]]:
    """Dataclasses of every kind a user writes: (name, class, whether a compiled layout
    may build it by writing its fields instead of calling it)."""
    counted = _RAN

    @dataclasses.dataclass(slots=True)
    class Slots:
        a: int
        b: np.ndarray[Any, Any]

    @dataclasses.dataclass
    class Plain:
        a: int
        b: np.ndarray[Any, Any]

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        a: int
        b: np.ndarray[Any, Any]

    @dataclasses.dataclass(frozen=True, slots=True)
    class FrozenSlots:
        a: int
        b: np.ndarray[Any, Any]

    @dataclasses.dataclass
    class Defaults:
        a: int = 1
        b: float = dataclasses.field(default_factory=float)
        c: str = dataclasses.field(default="x", kw_only=True)

    @dataclasses.dataclass(slots=True)
    class Child(Slots):
        c: str = "c"

    class NotADataclass(Plain):
        pass

    @dataclasses.dataclass
    class Descriptor:
        a: int
        b: _Stored = _Stored()

    @dataclasses.dataclass
    class PostInit:
        a: int
        b: np.ndarray[Any, Any]

        def __post_init__(self) -> None:
            counted.append("post_init")

    @dataclasses.dataclass
    class NotInInit:
        a: int
        b: int = dataclasses.field(default=5, init=False)

    @dataclasses.dataclass
    class OwnSetattr:
        a: int
        b: np.ndarray[Any, Any]

        def __setattr__(self, name: str, value: Any) -> None:
            counted.append(name)
            object.__setattr__(self, name, value)

    @dataclasses.dataclass
    class OwnNew:
        a: int
        b: np.ndarray[Any, Any]

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            counted.append("new")
            return super().__new__(cls)

    @dataclasses.dataclass
    class Meta(metaclass=_Calls):
        a: int
        b: np.ndarray[Any, Any]

    @dataclasses.dataclass(init=False)
    class OwnInit:
        a: int
        b: np.ndarray[Any, Any]

        def __init__(self, a: int, b: np.ndarray[Any, Any]) -> None:
            self.a = -a  # (the generated one's names, parameters and stores, not its code)
            self.b = b

    return [
        ("slots", Slots, True),
        ("plain", Plain, True),
        ("frozen", Frozen, True),
        ("frozen_slots", FrozenSlots, True),
        ("defaults", Defaults, True),
        ("child", Child, True),
        ("not_a_dataclass", NotADataclass, False),
        ("descriptor", Descriptor, True),
        ("post_init", PostInit, False),
        ("not_in_init", NotInInit, False),
        ("own_setattr", OwnSetattr, False),
        ("own_new", OwnNew, False),
        ("metaclass_call", Meta, False),
        ("own_init", OwnInit, False),
    ]


# The classes of _field_classes whose own code runs when one is built.
_RUNS_CODE: Final = {
    "descriptor",
    "post_init",
    "own_setattr",
    "own_new",
    "metaclass_call",
}


def _state(obj: object) -> dict[str, Any]:
    """Every attribute an instance holds (its __dict__ and its slots), arrays as lists."""
    names = list(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        names += [n for n in getattr(klass, "__slots__", ()) if n not in ("__weakref__",)]
    state = {n: getattr(obj, n) for n in names if hasattr(obj, n)}
    return {n: v.tolist() if isinstance(v, np.ndarray) else v for n, v in state.items()}


def test_a_dataclass_is_built_by_writing_its_fields_only_where_init_would_do_just_that() -> None:
    """The compiled layout builds a registered dataclass with ``object.__new__`` and a
    store per field (a fifth of the cost of calling it) only where the ``__init__``
    that ``@dataclass`` generated would run and do just that: nothing of the class's
    own (``__post_init__``, ``__setattr__``, ``__new__``, a metaclass ``__call__``, an
    ``__init__`` it wrote) may be skipped. Every kind rebuilds, compiled and pure, the
    same instance as the general decoder, with the same calls of the class's code."""
    for name, cls, fields_build in _field_classes():
        _codec.message(name=f"tests.fastpaths.fields.{name}")(cls)
        kwargs: dict[str, Any] = {"a": 3}
        if "b" in {f.name for f in dataclasses.fields(cls) if f.init}:
            kwargs["b"] = {"defaults": 2.5, "descriptor": 2}.get(name, np.arange(4.0))
        obj = cls(**kwargs)
        codec = Codec()
        body = codec.encode(obj).to_bytes()
        forget_layouts(body)
        for _ in range(3):
            ref = check_decode(codec, body)
        layout = codec._last_layout
        assert layout is not None, name
        assert (layout.spec[0] == _layouts._KIND_FIELDS) is fields_build, (name, layout.spec)
        assert ref[0] == "ok" and type(ref[1]) is cls
        assert _state(ref[1]) == _state(obj) or name == "own_init", name
        # The class's own code runs as often on each path as on the general decoder's.
        ran = []
        general = functools.partial(_decode_general, codec)
        for decode in (general, layout.decode, layout.decode_py):
            del _RAN[:]
            calls = _Calls.calls
            got = decode(body)
            ran.append((list(_RAN), _Calls.calls - calls))
            assert type(got) is cls and _state(got) == _state(ref[1]), name
        assert ran[0] == ran[1] == ran[2], (name, ran)
        assert (ran[0] != ([], 0)) is (name in _RUNS_CODE), (name, ran)
        if name == "plain":  # a __setattr__ given to the class later is called too
            cls.__setattr__ = _recording_setattr  # type: ignore[method-assign]
            try:
                del _RAN[:]
                assert _state(layout.decode(body)) == _state(ref[1])
                assert _RAN == ["set a", "set b"]
            finally:
                del cls.__setattr__
            del _RAN[:]
            assert _state(layout.decode(body)) == _state(ref[1]) and not _RAN


def test_a_failing_constructor_is_a_protocol_error_on_the_layout_path_too() -> None:
    codec = Codec()
    good = Sample(1, 2, 3, 4)
    body = codec.encode(good).to_bytes()
    forget_layouts(body)
    for _ in range(3):
        codec.decode(body)
    assert codec._last_layout is not None

    original = Sample.__init__

    def refuse(self: Sample, *args: Any, **kwargs: Any) -> None:
        raise ValueError("no")

    Sample.__init__ = refuse  # type: ignore[method-assign]
    try:
        with pytest.raises(ProtocolError, match="could not build"):
            codec.decode(body)
    finally:
        Sample.__init__ = original  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "arr",
    [
        np.asfortranarray(np.arange(12, dtype=">i4").reshape(3, 4)),
        np.arange(10.0)[::-2],
        np.arange(24, dtype=np.uint8).reshape(2, 3, 4).transpose(2, 0, 1),
        np.zeros((0, 3), dtype="S3"),
        np.array(7, dtype="<M8[s]"),
        np.zeros(3, dtype=[("a", "<i2"), ("b", ">f8", (2,))]),
    ],
    ids=["fortran", "negative", "transposed", "empty", "0-d", "structured"],
)
def test_templates_copy_any_array_layout_to_the_general_paths_bytes(
    arr: np.ndarray[Any, Any],
) -> None:
    for obj in [(1, arr), [arr, "x", arr], {"a": arr}, Sample(arr, 1, 2.0, arr)]:
        check_repeated(Codec(), obj)
        big = (1, np.repeat(arr[np.newaxis], 300, axis=0) if arr.size else arr)
        check_repeated(Codec(), big)


def test_one_container_shape_with_arrays_of_other_ndims_and_dtypes_gets_new_templates() -> None:
    codec = Codec()
    variants = [
        np.zeros(3),
        np.zeros((2, 3)),
        np.zeros(()),
        np.zeros(3, dtype=">f8"),
        np.zeros(3, dtype=np.float32),
        np.zeros((0,)),
    ]
    for _ in range(2):
        for arr in variants:
            for obj in [(1, arr), [arr], {"a": arr}, Sample(1, 2, 3, arr)]:
                check_encode(codec, obj)
                check_encode(codec, obj)
                check_decode(codec, codec.encode(obj).to_bytes())
