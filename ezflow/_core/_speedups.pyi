"""Types of the optional C extension ezflow/_core/_speedups.c (see _compiled.py)."""

from collections.abc import Callable
from typing import Any

class Template:
    """The compiled encode of one message shape (``_templates._Template``'s twin)."""

    def __new__(
        cls,
        kind: type,
        container: int,
        names: tuple[str, ...] | None,
        types: tuple[type, ...],
        item_kinds: tuple[int, ...],
        dtype: Any,
        ndim: int,
        descr: bytes,
        prefix: bytes,
        max_empty: int,
    ) -> Template: ...
    def encode_small(self, obj: Any, limit: int, /) -> bytes | None: ...
    def check(self, obj: Any, /) -> bool: ...

class Layout:
    """The compiled decode of one body layout (``_layouts._Layout``'s twin)."""

    def __new__(
        cls,
        size: int,
        mask: bytes,
        fixed: bytes,
        codes: tuple[tuple[int, str, int], ...],
        spec: tuple[int, tuple[tuple[int, Any, Any, Any], ...], tuple[str, ...] | None, Any],
        frombuffer: Any,
        ndarray: Any,
    ) -> Layout: ...
    def decode(self, body: bytes | memoryview, /) -> object: ...

def run_frames(
    frames: list[tuple[int, int, bytes, int, int]],
    index: int,
    size: int,
    decode: Callable[[bytes], Any],
    upstream: int,
    lossless: int,
    pending_append: Callable[[list[int]], None],
    appends: list[tuple[Any, Callable[[tuple[Any, int, Any]], None]]],
    buckets: list[int],
    now_ns: int,
    mask: int,
    progress: list[int],
    clock: Callable[[], int],
    decode_buckets: list[int],
    /,
) -> tuple[int, int, int]: ...
def small_frames(
    data: memoryview, start: int, end: int, max_frame_size: int, slice_below: int, /
) -> list[tuple[int, int, bytes, int, int]]: ...

class PublishPath:
    """The compiled one-call small publish (``_stream_publish.publish_small_py``'s twin)."""

    def __new__(
        cls,
        outlet_type: type,
        link_type: type,
        stats_type: type,
        codec_type: type,
        template_type: type,
        tracing: Any,
        hooks: list[Any],
        yield_after: int,
        yield_bytes: int,
        paced_gap_ns: int,
        flush_messages: int,
        flush_bytes: int,
        data_kind: int,
        header_size: int,
        handoff_globals: dict[str, Any] | None = None,
        hand_off: Any = None,
        switches: Any = None,
        sched_yield: Any = None,
        clock: Any = None,
        local_link_type: type | None = None,
        local_deliver: Any = None,
        relay_share_below: int = 0,
    ) -> PublishPath: ...
    def publish(self, outlet: Any, message: Any, /) -> bool: ...
    def relay(self, outlet: Any, message: Any, nbytes: int, /) -> bool: ...
    #: paced handoffs done in C (not by calling ``Outlet._hand_off``), and their yields
    handoffs: int
    handoff_yields: int
    #: messages sent by the local publish and by the local relay
    local_publishes: int
    local_relays: int

class TakePath:
    """The compiled take of a queued message (``_inbox.take_queued_py``'s twin)."""

    def __new__(
        cls,
        inbox_type: type,
        attachment_type: type,
        channel_type: type,
        stats_type: type,
        histogram_type: type,
        deque_type: type,
        nothing: object,
        sample_mask: int,
    ) -> TakePath: ...
    def take(self, inbox: Any, /) -> Any: ...

def voluntary_switches() -> int: ...
