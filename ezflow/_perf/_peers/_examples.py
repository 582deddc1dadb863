"""Each peer library's own throughput example, as ``ezflow perf peers --selfcheck`` runs
it next to our worker (``python -m ezflow._perf._peers._examples LIBRARY ROLE SPEC``, in
the library's venv).

None of these programs ships inside the library's wheel, so each is rewritten here
from the library's repository, keeping what it measures: the same sockets, calls and
options, the same payload (a fixed 64-byte message published back to back), and a sink
that only counts. What differs, everywhere: the endpoints come from the selfcheck
(``SPEC``), the sink counts over a window of ``window`` seconds after ``warmup``
seconds of the stream (one JSON line ``{"event": "result", "msgs_per_s": ...}``), and
the source publishes until its stdin closes.

* ``pyzmq``: ``perf/perf.py`` of the pyzmq repository, ``thr`` (``throughput`` and
  ``thr_sink``): a ``DEALER`` sending one frame per message with a blocking
  ``send(data, copy=True)``, a ``ROUTER`` receiving with ``recv_multipart``, and
  ``zmq.COPY_THRESHOLD = 0`` as that script sets. Its high-water marks are 0
  (unbounded); here libzmq's default (1000), as a stream that runs for seconds instead
  of a fixed count must bound its queue, and as our worker does.
* ``zenoh``: ``examples/z_pub_thr.py`` and ``examples/z_sub_thr.py`` of zenoh-python:
  one ``ZBytes`` payload made once and ``put`` in a loop by a publisher with
  ``CongestionControl.BLOCK``; a subscriber whose ``zenoh.handlers.Callback`` counts.
  Peer mode, multicast scouting off and explicit endpoints (the examples' ``-l`` /
  ``-e`` / ``--no-multicast-scouting``), shared memory as our worker sets it.
* ``iceoryx2``: iceoryx2 ships no throughput example for Python (its ``benchmarks/``
  are Rust latency ping-pongs), so this is the calls of its Python examples
  (``examples/python/publish_subscribe``: ``loan_uninit``, ``write_payload``, ``send``;
  ``receive`` until ``None`` and ``payload()``; ``examples/python/event_based_
  communication``: a ``notify`` per sample, the subscriber waiting on its
  ``Listener``) in a loop with no sleep, with our worker's lossless service settings
  (safe overflow off, ``RetryUntilDelivered``) on a fixed-size 64-byte payload type.
* ``ezmsg``: ezmsg ships its own benchmark, ``ezmsg perf benchmark``; this runs one of
  its tests through the same function (``ezmsg.util.perf.impl.perform_test``: the
  ``relay`` configuration with no relay, a source unit in another process and the
  sink unit here, over ``shm`` or ``tcp``) and reports its ``sample_rate_mean``.
  ``ROLE`` is ``run`` (one process does it all).

SPEC (JSON): ``transport`` (``shm`` or ``tcp``), ``size`` (bytes of the payload),
``warmup`` and ``window`` (seconds), for a source the ``endpoint`` its sink reported
(``{"event": "ready", "endpoint": ...}``), and ``message``: ``"bytes"`` (the example as
it is: one fixed payload) or ``"p2p"`` - the example's loop carrying the p2p message
instead, a new ``(phase, seq, t_ns, payload)`` of a 64 B float32 array every time,
encoded with the harness codec (:class:`._common.StreamCodec`) and decoded by the sink:
what any stream of changing arrays adds to the example, without our worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ._common import StreamCodec

#: Seconds a sink waits for its first message.
FIRST_MESSAGE_TIMEOUT = 60.0


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _leave_when_stdin_closes(cleanup: Callable[[], None] = lambda: None) -> None:
    """Exit the process at once when the selfcheck closes our stdin, or dies (a source
    loops forever, as the examples do; a sink whose source never came, or stopped,
    would wait for it), after *cleanup*."""

    def watch() -> None:
        while sys.stdin.buffer.read(4096):
            pass
        cleanup()
        os._exit(0)

    threading.Thread(target=watch, name="stdin", daemon=True).start()


def _measure(count: Callable[[], int], spec: dict[str, Any], *, then_exit: bool = True) -> None:
    """Wait for the first message, then *warmup* seconds; report the messages per
    second over *window* seconds; exit (the example's loop never returns)."""
    deadline = time.monotonic() + FIRST_MESSAGE_TIMEOUT
    while not count():
        if time.monotonic() > deadline:
            sys.stderr.write("error: no message within the first-message timeout\n")
            os._exit(1)
        time.sleep(0.01)
    time.sleep(float(spec["warmup"]))
    first, started = count(), time.perf_counter()
    time.sleep(float(spec["window"]))
    last, ended = count(), time.perf_counter()
    _emit(
        "result",
        msgs_per_s=(last - first) / (ended - started),
        messages=last - first,
        seconds=ended - started,
    )
    if then_exit:
        os._exit(0)


def _in_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="measure", daemon=True).start()


def _p2p(spec: dict[str, Any]) -> bool:
    return spec.get("message") == "p2p"


def _messages(spec: dict[str, Any]) -> Iterator[bytes]:
    """The p2p messages of the ``"p2p"`` variant: a new header every time (the codec of
    the harness), the same 64 B array, joined into one ``bytes``."""
    codec = StreamCodec()
    join: Callable[[Any], bytes] = b"".join  # (numpy arrays are buffers)
    payload = np.full(int(spec["size"]) // 4, 1.5, np.float32)
    seq = 0
    while True:
        yield join((codec.header(0, seq, 0, payload), payload))
        seq += 1


# -- pyzmq: perf/perf.py, thr ---------------------------------------------------------------


def pyzmq_sink(spec: dict[str, Any]) -> None:
    import zmq  # noqa: PLC0415 - only in the pyzmq venv

    zmq.COPY_THRESHOLD = 0  # as perf/perf.py sets it
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.RCVHWM = 1000
    if spec["transport"] == "tcp":
        s.bind("tcp://127.0.0.1:*")
    else:
        s.bind(f"ipc://@ezflow-selfcheck-{uuid.uuid4().hex}")
    received = [0]
    _leave_when_stdin_closes()
    _in_thread(lambda: _measure(lambda: received[0], spec))
    _emit("ready", endpoint=s.getsockopt_string(zmq.LAST_ENDPOINT))
    if _p2p(spec):
        decode = StreamCodec().decode
        while True:
            decode(s.recv_multipart(copy=True)[1])
            received[0] += 1
    while True:  # thr_sink: recv_multipart per message
        s.recv_multipart(copy=True)
        received[0] += 1


def pyzmq_source(spec: dict[str, Any]) -> None:
    import zmq  # noqa: PLC0415 - only in the pyzmq venv

    zmq.COPY_THRESHOLD = 0
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.SNDHWM = 1000
    s.connect(spec["endpoint"])
    data = b" " * int(spec["size"])
    _leave_when_stdin_closes()
    _emit("ready")
    if _p2p(spec):
        for message in _messages(spec):
            s.send(message, 0, copy=True)
    while True:  # throughput: one blocking send per message, copy=True
        s.send(data, 0, copy=True)


# -- zenoh: examples/z_pub_thr.py and z_sub_thr.py ------------------------------------------


def _zenoh_config(transport: str, *, listen: list[str], connect: list[str]) -> Any:
    import zenoh  # noqa: PLC0415 - only in the zenoh venv

    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps("peer"))
    conf.insert_json5("listen/endpoints", json.dumps(listen))
    conf.insert_json5("connect/endpoints", json.dumps(connect))
    conf.insert_json5("scouting/multicast/enabled", json.dumps(False))
    conf.insert_json5("transport/shared_memory/enabled", json.dumps(transport == "shm"))
    return conf


def zenoh_sink(spec: dict[str, Any]) -> None:
    import zenoh  # noqa: PLC0415 - only in the zenoh venv

    zenoh.init_log_from_env_or("error")
    if spec["transport"] == "tcp":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            endpoint = f"tcp/127.0.0.1:{probe.getsockname()[1]}"
    else:
        path = os.path.join(tempfile.gettempdir(), f"ezflow-selfcheck-{uuid.uuid4().hex}.sock")
        endpoint = f"unixsock-stream/{path}"
    count = [0]
    decode = StreamCodec().decode

    def listener(_sample: Any) -> None:  # z_sub_thr's listener: it counts
        count[0] += 1

    def decoding(sample: Any) -> None:  # the same, decoding the p2p message first
        decode(sample.payload.to_bytes())
        count[0] += 1

    def remove_socket() -> None:  # (and the lock file Zenoh makes beside it)
        if endpoint.startswith("unixsock-stream/"):
            for suffix in ("", ".lock"):
                with contextlib.suppress(OSError):
                    os.unlink(endpoint.removeprefix("unixsock-stream/") + suffix)

    _leave_when_stdin_closes(remove_socket)
    session = zenoh.open(_zenoh_config(spec["transport"], listen=[endpoint], connect=[]))
    handler = decoding if _p2p(spec) else listener
    session.declare_subscriber("test/thr", zenoh.handlers.Callback(handler))
    _emit("ready", endpoint=endpoint)
    try:
        _measure(lambda: count[0], spec, then_exit=False)
    finally:
        remove_socket()
    os._exit(0)


def zenoh_source(spec: dict[str, Any]) -> None:
    import zenoh  # noqa: PLC0415 - only in the zenoh venv

    zenoh.init_log_from_env_or("error")
    data = bytearray()
    for i in range(int(spec["size"])):
        data.append(i % 10)
    payload = zenoh.ZBytes(data)
    session = zenoh.open(_zenoh_config(spec["transport"], listen=[], connect=[spec["endpoint"]]))
    pub = session.declare_publisher("test/thr", congestion_control=zenoh.CongestionControl.BLOCK)
    deadline = time.monotonic() + FIRST_MESSAGE_TIMEOUT
    while not pub.matching_status:  # what is put before a match is dropped
        if time.monotonic() > deadline:
            sys.stderr.write("error: no subscriber matched\n")
            os._exit(1)
        time.sleep(0.001)
    _leave_when_stdin_closes()
    _emit("ready")
    if _p2p(spec):
        for message in _messages(spec):
            pub.put(message)
    while True:
        pub.put(payload)


# -- iceoryx2: the calls of examples/python/publish_subscribe and event_based_communication


def _iceoryx2_services(spec: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    import iceoryx2 as iox2  # noqa: PLC0415 - only in the iceoryx2 venv

    iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
    size = int(spec["size"]) + (40 if _p2p(spec) else 0)  # (+ the p2p header of a 1-D array)
    payload_type = ctypes.c_uint8 * size
    node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
    name = iox2.ServiceName.new(spec["endpoint"])
    data = (
        node.service_builder(name)
        .publish_subscribe(payload_type)
        .enable_safe_overflow(False)
        .subscriber_max_buffer_size(16)
        .open_or_create()
    )
    event = node.service_builder(name).event().open_or_create()
    return iox2, node, data, event


def iceoryx2_sink(spec: dict[str, Any]) -> None:
    spec = dict(spec, endpoint=f"ezflow-selfcheck/{uuid.uuid4().hex}")
    iox2, _node, data, event = _iceoryx2_services(spec)
    subscriber = data.subscriber_builder().buffer_size(16).create()
    listener = event.listener_builder().create()
    count = [0]
    _leave_when_stdin_closes()
    _in_thread(lambda: _measure(lambda: count[0], spec))
    _emit("ready", endpoint=spec["endpoint"])
    wait = iox2.Duration.from_secs_f64(0.05)
    decode = StreamCodec().decode if _p2p(spec) else None
    while True:
        listener.timed_wait(wait)
        while True:
            sample = subscriber.receive()
            if sample is None:
                break
            data = sample.payload()
            if decode is not None:
                decode(data.contents)
            count[0] += 1


def iceoryx2_source(spec: dict[str, Any]) -> None:
    iox2, _node, data, event = _iceoryx2_services(spec)
    publisher = (
        data.publisher_builder()
        .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
        .create()
    )
    notifier = event.notifier_builder().create()
    value = (ctypes.c_uint8 * int(spec["size"]))(*(i % 10 for i in range(int(spec["size"]))))
    _leave_when_stdin_closes()
    _emit("ready")
    if _p2p(spec):
        kind = ctypes.c_uint8 * (int(spec["size"]) + 40)
        for message in _messages(spec):
            sample = publisher.loan_uninit()
            sample = sample.write_payload(kind.from_buffer_copy(message))
            sample.send()
            notifier.notify()
    while True:
        sample = publisher.loan_uninit()
        sample = sample.write_payload(value)
        sample.send()
        notifier.notify()


# -- ezmsg: ezmsg perf benchmark ------------------------------------------------------------


def ezmsg_run(spec: dict[str, Any]) -> None:
    import logging  # noqa: PLC0415

    import ezmsg.core as ez  # noqa: PLC0415 - only in the ezmsg venv
    from ezmsg.core.graphserver import GraphServer  # noqa: PLC0415
    from ezmsg.util.perf.impl import Communication, perform_test, relay  # noqa: PLC0415

    ez.logger.setLevel(logging.WARNING)
    server = GraphServer()
    server.start(("127.0.0.1", 0))
    try:
        metrics = perform_test(
            n_clients=0,
            max_duration=float(spec["warmup"]) + float(spec["window"]),
            num_msgs=10_000_000,
            msg_size=int(spec["size"]),
            buffers=1,
            comms=Communication.TCP if spec["transport"] == "tcp" else Communication.SHM,
            config=relay,
            graph_address=server.address,
        )
    finally:
        server.stop()
    _emit("result", msgs_per_s=metrics.sample_rate_mean, messages=metrics.num_msgs)


ROLES: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("pyzmq", "sink"): pyzmq_sink,
    ("pyzmq", "source"): pyzmq_source,
    ("zenoh", "sink"): zenoh_sink,
    ("zenoh", "source"): zenoh_source,
    ("iceoryx2", "sink"): iceoryx2_sink,
    ("iceoryx2", "source"): iceoryx2_source,
    ("ezmsg", "run"): ezmsg_run,
}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or (args[0], args[1]) not in ROLES:
        known = ", ".join(f"{library} {role}" for library, role in ROLES)
        sys.exit(f"usage: _examples LIBRARY ROLE SPEC_JSON (one of: {known})")
    ROLES[args[0], args[1]](json.loads(args[2]))


if __name__ == "__main__":
    main()
