"""Limits, defaults and environment variables, in one place.

Every limit ezflow enforces is named here with its default, so that documentation and
error messages can point at one source. Environment variables are read when an object
that depends on them is created (not at import time), so tests can set them per case.

Size: the single home of every limit and default, by the project's rule (docs/limits.md
is checked against it), so it grows with each limit rather than splitting by layer.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from ._exceptions import ConfigurationError

__all__ = [
    "AUTH_NONCE_SIZE",
    "BAD_PEER_LOG_FIRST",
    "BAD_PEER_LOG_INTERVAL",
    "BAD_PEER_LOG_MAX_CHARS",
    "CHILD_STOP_TIMEOUT",
    "COMPAT_MAIN_POLL_INTERVAL",
    "CONNECT_TIMEOUT",
    "CONTROL_MAX_FRAME_SIZE",
    "DATA_CLOSE_TIMEOUT",
    "DATA_WRITE_BUFFER_LIMIT",
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_EZRING_MAX_READERS",
    "DEFAULT_EZRING_SLOT_COUNT",
    "DEFAULT_GRAPH_ADDRESS",
    "DEFAULT_HEARTBEAT_DEADLINE",
    "DEFAULT_LEAKY_QUEUE",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_MAX_IN_FLIGHT_BYTES",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_SHM_INLINE_LIMIT",
    "DEFAULT_SHM_MAX_BYTES",
    "DEFAULT_SHM_SLOT_COUNT",
    "DEFAULT_SHM_SLOT_SIZE",
    "DEFAULT_TELEMETRY_INTERVAL",
    "DISTRIBUTION",
    "EMBEDDED_SERVER_STOP_TIMEOUT",
    "ENV_CHECK_TYPES",
    "ENV_DEBUG",
    "ENV_DRAIN_TIMEOUT",
    "ENV_EVENT_LOOP",
    "ENV_GRAPH_ADDRESS",
    "ENV_HEARTBEAT_DEADLINE",
    "ENV_MAX_MESSAGE_SIZE",
    "ENV_PURE_PYTHON",
    "ENV_SHM_DIR",
    "ENV_START_METHOD",
    "ENV_TELEMETRY_INTERVAL",
    "ENV_TLS_CA",
    "ENV_TLS_CERT",
    "ENV_TLS_KEY",
    "ENV_TOKEN",
    "ENV_TOKEN_FILE",
    "ENV_TRACE",
    "ENV_TRANSPORT",
    "ENV_WATCH_RINGS",
    "EZRING_ATTACH_TIMEOUT",
    "EZRING_CREATE_GRACE",
    "EZRING_POLL_INTERVAL",
    "EZRING_WATCH_INTERVAL",
    "FORKSERVER_ORPHAN_TIMEOUT",
    "FORK_TIMEOUT",
    "FOXGLOVE_BACKLOG",
    "FOXGLOVE_BUSY_BYTES",
    "FOXGLOVE_DEFAULT_PORT",
    "FOXGLOVE_GRAPH_INTERVAL",
    "FOXGLOVE_JSON_LIST_MAX",
    "FOXGLOVE_MAX_TOPICS",
    "FOXGLOVE_NICE",
    "FOXGLOVE_QUEUE",
    "FOXGLOVE_STOP_TIMEOUT",
    "HANDSHAKE_MAX_FRAME_SIZE",
    "HANDSHAKE_TIMEOUT",
    "HEARTBEATS_PER_DEADLINE",
    "INTERRUPT_STOP_TIMEOUT",
    "JSONL_MAX_BYTES",
    "LARGE_ACK_DELAY",
    "MAX_CHANNELS_PER_PUBLISHER",
    "MAX_DRAIN_TIMEOUT",
    "MAX_HEARTBEAT_DEADLINE",
    "MAX_METRICS_CONNECTIONS",
    "MAX_METRICS_REQUEST_SIZE",
    "MAX_PENDING_REQUESTS",
    "MAX_SERVER_CONNECTIONS",
    "MAX_SNAPSHOT_SUBSCRIBERS",
    "MAX_STALL_TIMEOUT",
    "MAX_TELEMETRY_ENTRIES",
    "MAX_TELEMETRY_REPORT_SIZE",
    "MAX_TOPIC_LENGTH",
    "MCAP_CHUNK_SIZE",
    "MCAP_FLUSH_INTERVAL",
    "METRICS_REQUEST_TIMEOUT",
    "MIN_HEARTBEAT_DEADLINE",
    "MIN_TELEMETRY_INTERVAL",
    "MIN_TOKEN_BYTES",
    "OTEL_DEFAULT_ENDPOINT",
    "OTEL_POLL_INTERVAL",
    "OTEL_REMEMBER",
    "OTHER_ADDRESS_HINT",
    "PACED_GAP_NS",
    "PUBLISH_YIELD_BYTES",
    "PUBLISH_YIELD_EVERY",
    "PUBLISH_YIELD_LARGE_BYTES",
    "RECONNECT_MAX_DELAY",
    "RECONNECT_MIN_DELAY",
    "RECONNECT_ROUTE_GRACE",
    "RECONNECT_WAIT_TIMEOUT",
    "RECV_POOL_BUFFERS",
    "RECV_POOL_BYTES",
    "REJOIN_MAX_DELAY",
    "REJOIN_MIN_DELAY",
    "REQUEST_TIMEOUT",
    "ROUTE_APPLY_TIMEOUT",
    "SERVER_CLIENT_BACKLOG",
    "SHM_COPY_NOGIL_BYTES",
    "SHM_COPY_NT_BYTES",
    "SHM_COPY_SPLIT_BYTES",
    "SHM_COPY_THREADS",
    "SHM_FREE_PER_FRAME",
    "SHM_LOAN_ROOM",
    "SHM_MAX_MAPPED_SEGMENTS",
    "SHM_REFUSED_LOG_MAX",
    "SHM_SWEEP_DELAYS",
    "SHUTDOWN_TIMEOUT",
    "START_METHODS",
    "START_TIMEOUT",
    "STREAM_FLUSH_BYTES",
    "STREAM_FLUSH_MESSAGES",
    "TCP_KEEPALIVE_PROBES",
    "TELEMETRY_MAX_WRITE_BUFFER",
    "THREAD_JOIN_TIMEOUT",
    "TIMING_SAMPLE_MASK",
    "TRACE_BUFFER",
    "TRACE_FLUSH_MARGIN",
    "TRACE_FLUSH_MAX_WAIT",
    "TRACE_FLUSH_SETTLE",
    "TRACE_LEASE_CONFIRM_TIMEOUT",
    "TRACE_LEASE_GRACE",
    "TRACE_LEASE_MAX",
    "TRACE_REPORT_MAX",
    "TRACE_SERVER_KEEP",
    "TRANSPORTS",
    "TYPO_GRACE_PERIOD",
    "WAKE_QUEUE_SCAN",
    "ZENOH_ACK_INTERVAL",
    "ZENOH_ACK_TIMEOUT",
    "ZENOH_ANSWER_TIMEOUT",
    "ZENOH_EXPORT_BATCH",
    "ZENOH_EXPORT_BATCH_BYTES",
    "ZENOH_EXPORT_POOLED",
    "ZENOH_EXPORT_POOL_BYTES",
    "ZENOH_FLEET_HOSTS",
    "ZENOH_IMPORT_STALL",
    "ZENOH_IMPORT_TOPICS",
    "ZENOH_INLINE_PUT",
    "ZENOH_LOSSLESS_QUEUE",
    "ZENOH_QUEUE",
    "ZENOH_QUEUE_BYTES",
    "ZENOH_RESTART_FIRST",
    "ZENOH_RESTART_MAX",
    "Address",
    "ShmOptions",
    "TransportName",
    "check_drain_timeout",
    "check_heartbeat_deadline",
    "check_positive",
    "check_stall_timeout",
    "check_telemetry_interval",
    "check_trace_lease_duration",
    "check_transport",
    "check_types_from_env",
    "debug_from_env",
    "drain_timeout_from_env",
    "forkserver_supported",
    "format_address",
    "graph_address_from_env",
    "heartbeat_deadline_from_env",
    "max_message_size_from_env",
    "parse_address",
    "parse_size",
    "shm_dir_from_env",
    "start_method_from_env",
    "telemetry_interval_from_env",
    "transport_from_env",
    "watch_rings_from_env",
]

#: The name ezflow is installed under (``pip install ezflow-pubsub``, its metadata):
#: ``ezflow`` on PyPI is an unrelated project. The package is ``import ezflow``, the
#: command ``ezflow``.
DISTRIBUTION: Final = "ezflow-pubsub"

Address = tuple[str, int]
TransportName = Literal["local", "shm", "tcp"]
TRANSPORTS: Final[tuple[str, ...]] = ("local", "shm", "tcp")

ENV_GRAPH_ADDRESS: Final = "EZFLOW_GRAPH_ADDRESS"
ENV_TRANSPORT: Final = "EZFLOW_TRANSPORT"
ENV_MAX_MESSAGE_SIZE: Final = "EZFLOW_MAX_MESSAGE_SIZE"
ENV_EVENT_LOOP: Final = "EZFLOW_EVENT_LOOP"
#: ``1`` runs ezflow's pure-Python codec even where the optional C extension
#: (``ezflow._core._speedups``) is built; ``0`` or unset uses the extension when it is
#: there (any other value counts as ``1``). Read once, when ezflow is imported
#: (ezflow/_core/_compiled.py); ``ezflow --version`` says which path is active.
ENV_PURE_PYTHON: Final = "EZFLOW_PURE_PYTHON"

#: Unit graphs (ezflow.run, GraphRunner): seconds every unit process has to load,
#: initialize and register its streams; seconds a unit process has to stop after being
#: told to (beyond the drain timeout) before it is killed; seconds a stopping process
#: waits for its ``@thread`` methods; seconds an ``async`` ``shutdown()`` may take before
#: it is cancelled and reported.
START_TIMEOUT: Final = 30.0
CHILD_STOP_TIMEOUT: Final = 12.0
THREAD_JOIN_TIMEOUT: Final = 2.0
SHUTDOWN_TIMEOUT: Final = 5.0
#: Seconds a low-level subscriber (``GraphContext.subscriber``) may have no publisher
#: before ezflow looks for a topic a typo away that has one, and warns once naming it.
TYPO_GRACE_PERIOD: Final = 2.0
#: ``ezflow.run`` / ``ezflow run`` after a second Ctrl-C (or SIGTERM): seconds the unit
#: processes have, with no more draining, to join their threads, run every
#: ``shutdown()`` and exit before they are killed (a third signal kills them at once).
INTERRUPT_STOP_TIMEOUT: Final = 5.0

#: Zenoh bridge (ezflow.zenoh; the core does not import Zenoh): samples a leaky mapping
#: queues at each end (``queue``; a lossless import's window is ZENOH_LOSSLESS_QUEUE),
#: and bytes an import's queue holds at most (it admits one sample when empty, whatever
#: its size); messages and bytes an export packs into one Zenoh sample (a batch stops
#: growing at either; the messages are a leaky export's, a lossless one's batches take
#: half the smallest importer window); seconds a host takes at most to answer a fleet
#: query.
ZENOH_QUEUE: Final = 256
ZENOH_QUEUE_BYTES: Final = 16 * 1024 * 1024
ZENOH_EXPORT_BATCH: Final = 64
ZENOH_EXPORT_BATCH_BYTES: Final = 256 * 1024
ZENOH_ANSWER_TIMEOUT: Final = 5.0
#: Bytes of samples an export puts from the event loop instead of its thread (saving a
#: thread hop), when its thread is idle and (lossless) an importer acknowledges and at
#: most this much is not yet acknowledged: Zenoh's link queue then has room, so the put
#: does not wait (none for a second after one waited more than 5 ms anyway). A lossless
#: export's batch of 64 B messages (half a 2048-message window, ~128 KiB) fits: 64 B in
#: your own process, four alternations with 64 KiB (``python -m ezflow._perf.
#: _zenoh_bridge --rounds 3 --paths direct,in-process --sizes 64`` and with ``bridge``,
#: 2026-11-28): 0.66-0.74x -> 0.73-0.84x direct tcp, the sender 1.5-1.7 -> 1.4-1.5 µs.
ZENOH_INLINE_PUT: Final = 256 * 1024
#: An export builds a sample of this many bytes or more in a reused buffer (by exact
#: size; Zenoh's ``put`` copies the payload before it returns) instead of a new bytes
#: object each time, whose fresh pages cost the process ~120 page faults a MiB; it keeps
#: at most ZENOH_EXPORT_POOL_BYTES of free buffers.
ZENOH_EXPORT_POOLED: Final = 256 * 1024
ZENOH_EXPORT_POOL_BYTES: Final = 8 * 1024 * 1024
#: Seconds Zenoh's delivery thread waits for room in a full lossless import queue while
#: the graph takes nothing from it; then that sample, and every one until the graph takes
#: one again, is dropped and counted (``dropped_local``) - Zenoh's thread is never held
#: for longer (a Zenoh router itself closes a link it cannot send on for 5 s).
ZENOH_IMPORT_STALL: Final = 10.0
#: A mapping that fails (not a bad sample: those are refused one by one) restarts after
#: this many seconds, doubled after each failure in a row up to the maximum.
ZENOH_RESTART_FIRST: Final = 0.1
ZENOH_RESTART_MAX: Final = 5.0
#: Lossless flow control between a bridge pair (docs/wire-format.md): an import
#: acknowledges what its graph took at least every ZENOH_ACK_INTERVAL seconds (and
#: whenever half of its window in messages, or a quarter in bytes, was taken); an export
#: forgets an importer it has not heard from for ZENOH_ACK_TIMEOUT seconds (gone without
#: saying goodbye).
ZENOH_ACK_INTERVAL: Final = 0.5
ZENOH_ACK_TIMEOUT: Final = 10.0
#: Topics (keys) one wildcard import publishes on at most; samples of further keys are
#: refused (cause ``key``). Hosts a fleet announcer remembers (seen and gone).
ZENOH_IMPORT_TOPICS: Final = 1024
ZENOH_FLEET_HOSTS: Final = 1024

#: Where GraphContext looks for (or starts) the graph server when given no address.
DEFAULT_GRAPH_ADDRESS: Final[Address] = ("127.0.0.1", 25990)
#: The way out when another program holds the graph server's port: said by every error
#: that finds the port taken by something that is not an ezflow graph server.
OTHER_ADDRESS_HINT: Final = (
    "another program may hold this port: use another address (port 0 takes a free one): "
    f"`--address 127.0.0.1:0`, {ENV_GRAPH_ADDRESS}=127.0.0.1:0 or "
    "GraphContext('127.0.0.1:0')"
)

#: Largest encoded message a publisher sends or a channel accepts (bytes).
DEFAULT_MAX_MESSAGE_SIZE: Final = 128 * 1024 * 1024
#: Lossless flow control: a publisher waits once a channel holds this many unreleased
#: messages ... A window is worth what it covers of a scheduling hiccup: at 400k
#: messages/s, 512 are 1.3 ms. With 64, two processes of a back-to-back stream took
#: turns instead of running side by side (one wake-up per window; both idle about half
#: the time): the ordinary 64 B program over shm ran at 163-243k msgs/s and 6.5-7.9 µs
#: of CPU a message, against 372-475k and 4.3-5.1 µs with 256-512 (2026-11-27,
#: docs/perf.md). A shared-memory channel also holds at most ``2 * slot_count``
#: messages in blocks (``ShmOptions``): what its ring can hold.
DEFAULT_MAX_IN_FLIGHT: Final = 512
#: ... or this many unreleased encoded bytes (whichever comes first; one message is
#: always allowed, however large).
DEFAULT_MAX_IN_FLIGHT_BYTES: Final = 32 * 1024 * 1024
#: Zenoh bridge: the window of a lossless import that names no ``queue`` (messages it
#: acknowledges room for; ``ZENOH_QUEUE_BYTES`` too, which bounds its memory). A leaky
#: mapping's ``queue`` (``ZENOH_QUEUE``, samples) says how stale its data may grow; a
#: lossless window how much of a stream crosses per acknowledgement round trip (Zenoh
#: both ways and both graphs' windows, 512 messages each) - and a batch sample takes
#: half of it, so Zenoh's cost per sample is shared by that many messages. 64 B
#: through the bridge in your own process, rate against direct tcp (``python -m
#: ezflow._perf._zenoh_bridge --rounds 3 --paths direct,bridge,in-process --sizes 64``,
#: two runs each, 2026-11-28): window 256 0.45-0.46x, 512 0.49-0.60x, 1024 0.55-0.60x,
#: 2048 0.70-0.72x, 4096 0.69-0.71x; the bridge as processes 0.31-0.32x, 0.36-0.42x,
#: 0.44-0.46x, 0.48-0.51x, 0.52-0.55x (docs/fleets.md).
ZENOH_LOSSLESS_QUEUE: Final = 2048
#: Messages a leaky subscriber (or input) keeps when it names no ``queue``: the newest.
DEFAULT_LEAKY_QUEUE: Final = 1

#: A publish that did not have to wait yields to the event loop once per this many
#: messages, so that a tight publishing loop never starves its loop's other tasks. An
#: outlet counts its publishes since the loop last turned (its data connections see
#: the turn): a task publishing to two topics in turn yields once a turn, not once for
#: each topic one right after the other (the second turn writing a message or two and
#: waking their subscriber for them). The ordinary 64 B program on two topics of one
#: shape over tcp, ``-V pair``: 2.52-2.55 -> 2.22-2.24 µs of CPU a message (2026-11-28,
#: perf/HISTORY.md).
PUBLISH_YIELD_EVERY: Final = 64
#: ... or once per this many encoded bytes, so that a publisher of large messages also
#: reads its channels' releases often: the shared-memory blocks they free are reused
#: while still in the CPU's cache, instead of a window's worth of cold ones.
PUBLISH_YIELD_BYTES: Final = 4 * 1024 * 1024
#: ... where a message of ``SHM_COPY_NT_BYTES`` (1 MiB) up to ``PUBLISH_YIELD_BYTES``
#: counts as a quarter of its bytes: it yields once per this many bytes of such
#: messages. Their copy into shm is streamed (it bypasses the cache), so a freed block
#: gains nothing from coming back warm, while each turn of the loop costs the publisher
#: and wakes its subscribers (who take a turn's messages in one wake). The 1 MiB
#: ordinary program over shm, 3 alternations against 4 MiB (load 2-3): publisher 104 ->
#: 90 µs of CPU a message, subscriber 29 -> 15 µs, 8.4k -> 10.7k msgs/s; tcp unchanged.
#: Larger messages yield after each as before: two 24.9 MB frames fill the 32 MiB byte
#: window, and their subscriber must hear of the first before the third can go.
PUBLISH_YIELD_LARGE_BYTES: Final = 16 * 1024 * 1024

#: Unsent bytes a publisher's data connection (tcp or shm socket) may hold beyond what
#: the kernel took. Above it the link counts as full, like a full in-flight window: a
#: lossless publish waits, a leaky link parks (newest message kept, older ones counted as
#: drops) until the backlog has drained to a quarter of it. The in-flight window bounds
#: the backlog too; this bound also holds for a subscriber that stops reading under a
#: larger window or after a mode change (which forgives what was in flight).
DATA_WRITE_BUFFER_LIMIT: Final = 16 * 1024 * 1024

#: "Paced", one rule for the data path (docs/transports.md): a message sent this many
#: nanoseconds (50 µs) or more after the previous one. A data connection schedules no
#: end-of-iteration flush behind a paced message written at once, and a paced publish to
#: channels on this host (shm, or tcp from a loopback or this host's address) by a
#: publisher whose thread slept meanwhile ends with a CPU yield (``ShmOptions.handoff``).
PACED_GAP_NS: Final = 50_000
#: On the stock asyncio loop, a delivery that wakes a waiting ``recv`` queues the
#: waiting task's wake-up in a handle its subscriber keeps (no ``call_soon``: with the
#: caches cold after a paced pause, it costs several microseconds) when the loop's
#: ready queue holds at most this many handles (it checks that the kept one is not
#: among them); with more, ``call_soon`` as usual.
WAKE_QUEUE_SCAN: Final = 8
#: A data connection writes the messages queued in one event-loop iteration early (one
#: vectored write) once this many are queued ... Twice ``PUBLISH_YIELD_EVERY``: a
#: publisher alone on its loop writes each turn's messages in one call at the turn's
#: end (and its first one at once), and the bound holds for publishers that share a
#: turn or publish without yielding. At 16 (a write every 16 messages) the ordinary 64 B
#: program spent 0.2-0.5 µs more CPU a message, both processes together, for the extra
#: system calls and the subscriber's extra wake-ups and reads: 4.20-4.45 -> 3.97-4.23
#: over shm, 4.43-4.83 -> 4.02-4.42 over tcp, 1 KiB and 64 KiB unchanged
#: (`ezflow perf run -s p2p`, 4 alternations, load 3-4, 2026-11-27).
STREAM_FLUSH_MESSAGES: Final = 2 * PUBLISH_YIELD_EVERY
#: ... or this many bytes.
STREAM_FLUSH_BYTES: Final = 256 * 1024
#: Seconds a closing publisher waits, per data connection, for its channel to read up to
#: ``END`` (the last bytes handed to the kernel); then the connection is aborted, logged.
DATA_CLOSE_TIMEOUT: Final = 5.0
#: Recycled large-frame receive buffers per data connection: at most this many ...
RECV_POOL_BUFFERS: Final = 4
#: ... holding at most this many bytes in all (older ones are freed; a buffer is reused
#: only once no message refers to it).
RECV_POOL_BYTES: Final = 64 * 1024 * 1024
#: Seconds a tcp channel that receives large bodies (frames read into their own
#: buffers) waits before acknowledging releases short of a quarter window: while more
#: large bodies arrive within it, it waits on (a quarter window is always acknowledged
#: at once). One ``ACK`` every quarter window for a flowing stream of large messages
#: instead of one a message (each read a read of its own, with loop iterations between
#: them); the publisher is not waiting for these (its window is not full). shm channels
#: wait one loop iteration at a time instead: their ACKs also open the block window.
LARGE_ACK_DELAY: Final = 0.001

#: Largest frame accepted before a peer has completed the handshake.
HANDSHAKE_MAX_FRAME_SIZE: Final = 64 * 1024
#: Largest control-plane frame (graph protocol) after the handshake.
CONTROL_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
#: Connections the graph server holds at once; more are closed on accept, with a log line.
MAX_SERVER_CONNECTIONS: Final = 1024
#: Channels (subscribing processes) one publisher serves at once.
MAX_CHANNELS_PER_PUBLISHER: Final = 1024
#: Bytes of pushed data (routes, answers) a graph-server client may leave unread; a
#: client past it is dropped, logged.
SERVER_CLIENT_BACKLOG: Final = 64 * 1024 * 1024
#: Requests one graph-server client may have waiting for an answer at once; more close
#: its connection, logged.
MAX_PENDING_REQUESTS: Final = 1024
MAX_TOPIC_LENGTH: Final = 512

#: Seconds a peer has to complete the handshake after connecting.
HANDSHAKE_TIMEOUT: Final = 5.0
#: Seconds to open a TCP connection (graph server or publisher).
CONNECT_TIMEOUT: Final = 5.0
#: Seconds a graph request waits for the server's reply.
REQUEST_TIMEOUT: Final = 30.0
#: Seconds the server waits for clients to apply a routing change before it answers the
#: request that caused it anyway (and logs which clients were late).
ROUTE_APPLY_TIMEOUT: Final = 10.0

# -- reconnecting to the graph server (see docs/architecture.md, "Reconnect") ---------------

#: First pause (seconds) between two attempts to reach the graph server after the
#: connection dropped; each failed attempt doubles it up to ``RECONNECT_MAX_DELAY``, and
#: each pause is drawn at random between half and all of it (jitter, so that clients
#: that lost the same server do not retry in lockstep).
RECONNECT_MIN_DELAY: Final = 0.05
#: Longest pause (seconds) between two reconnect attempts.
RECONNECT_MAX_DELAY: Final = 1.0
#: Seconds a call that needs the graph server (``publisher()``, ``subscriber()``,
#: ``connect()``, ``graph()``, ...) waits for a reconnection before it raises
#: ``BrokenResourceError``.
RECONNECT_WAIT_TIMEOUT: Final = 10.0
#: Seconds after a reconnection during which a channel that still receives data is kept
#: although the new server's routes do not list its publisher (yet): the publisher's
#: process is most likely still re-registering.
RECONNECT_ROUTE_GRACE: Final = 10.0

# -- reopening a channel that was cut (see docs/architecture.md, "Rejoin") -----------------

#: First pause (seconds) before a channel whose connection broke without ``END`` (a
#: ``stall_timeout`` cut, a peer declared dead by heartbeats, a broken link) is opened
#: again, while the routes still list its publisher; each failed attempt doubles it up
#: to ``REJOIN_MAX_DELAY``, and each pause is drawn between half and all of it (jitter).
REJOIN_MIN_DELAY: Final = 0.1
#: Longest pause (seconds) between two attempts to reopen a cut channel. Attempts stop
#: when the routes no longer list its publisher (or the context closes).
REJOIN_MAX_DELAY: Final = 2.0
#: Seconds ``GraphContext.aclose`` waits for its embedded server's thread to end.
EMBEDDED_SERVER_STOP_TIMEOUT: Final = 5.0


#: Shared-memory ring of a publisher (see :class:`ShmOptions`): slots ...
DEFAULT_SHM_SLOT_COUNT: Final = 32
#: ... of this many bytes each; larger messages get out-of-line blocks ...
DEFAULT_SHM_SLOT_SIZE: Final = 256 * 1024
#: ... and everything together stays within this many bytes of /dev/shm.
DEFAULT_SHM_MAX_BYTES: Final = 256 * 1024 * 1024
#: Encoded messages up to this size travel inline through the notification socket
#: (copied); larger ones are written to shared memory once and received zero-copy. The
#: crossover measured on the reference machine (docs/perf.md).
DEFAULT_SHM_INLINE_LIMIT: Final = 64 * 1024
#: Bytes a shared-memory loan (``Publisher.loan``) keeps free in its block on each side
#: of the array's data: room for the rest of a message around the array - its header
#: and msgpack meta before, small buffers before or after - so that a loaned array
#: published inside a tuple, list, dict or dataclass is not copied. A message whose
#: other encoded bytes do not fit is copied whole (``ShmStats.loans_copied``). One page:
#: a ``(phase, seq, t_ns, frame)`` tuple needs under 100 bytes, and the array's data
#: then starts on a page boundary of an out-of-line block.
SHM_LOAN_ROOM: Final = 4 * 1024
#: A part of a message at least this large is copied into its shared-memory block with
#: the GIL released (``numpy.copyto``): the process's other threads run during the copy
#: (1.8 ms for a 24.9 MB frame). Smaller copies keep it: they take less time than giving
#: it up and getting it back, and a busy thread could keep it from the event loop for up
#: to the switch interval (5 ms). About 35-60 µs of copy at 1 MiB on the reference machine.
SHM_COPY_NOGIL_BYTES: Final = 1024 * 1024
#: A part of a message at least this large is copied into its shared-memory block with
#: non-temporal (streaming) stores where the C extension can make them (x86-64): stores
#: that bypass the cache instead of first reading every line they write. The block is
#: for another process to read, and a part this large would evict most of the writer's
#: own cache (2 MiB of L2 a core on the reference machine). Measured there (2 processes,
#: load 7): the 24.9 MB frame's copy 2.8-3.5 ms -> 1.9 ms; the publisher of 1 MiB
#: messages 180-185 -> 104-111 µs of CPU a message, its subscriber 58-65 -> 36-44 µs.
SHM_COPY_NT_BYTES: Final = 1024 * 1024
#: A part of a message at least this large is copied into its shared-memory block in
#: pieces by up to ``SHM_COPY_THREADS`` threads at once (the publishing thread and
#: helpers made for that copy, see ``copy_into``; never more than the CPUs the process
#: may run on): one core moves ~13 GB/s on the reference machine, well short of what its
#: memory takes. The 24.9 MB frame's copy 1.9-2.0 ms -> 1.0-1.1 ms with two (2026-11-28,
#: perf/HISTORY.md). Below it, making a thread costs more than it saves.
SHM_COPY_SPLIT_BYTES: Final = 4 * 1024 * 1024
#: ... and how many threads at most (the publishing one included).
SHM_COPY_THREADS: Final = 2
#: Shared-memory segments a receiving process keeps mapped per channel; the least
#: recently used one is unmapped beyond it (arrays still viewing it keep their mapping).
SHM_MAX_MAPPED_SEGMENTS: Final = 64
#: ``FREE`` records (16 bytes each) per frame a channel sends back: a frame stays well
#: under the handshake-time frame limit (``HANDSHAKE_MAX_FRAME_SIZE``); more go in more
#: frames.
SHM_FREE_PER_FRAME: Final = 2048
#: Seconds after a peer's socket or graph connection dropped at which its segments are
#: swept: its flock goes a few milliseconds after death, or later while the kernel tears
#: down a big process.
SHM_SWEEP_DELAYS: Final = (0.05, 0.5, 2.0)


#: The directory of every shared-memory file ezflow makes or opens (segments, ezring
#: rings): ``/dev/shm`` unless set (an absolute path: a private tmpfs, a container
#: mount). Every process of a graph on one host must use the same directory, the C
#: writer of ``c/ezflow_ring.h`` included (it reads the same variable); a process that
#: cannot open a peer's segment there uses tcp for that edge.
ENV_SHM_DIR: Final = "EZFLOW_SHM_DIR"
#: Foreign entries of the shm directory (FIFOs, directories, symbolic links, sockets,
#: other users' files, files of an impossible size under an ezflow name) are refused and
#: each logged once per process; at most this many are remembered (and logged), then
#: one line says that further ones are not.
SHM_REFUSED_LOG_MAX: Final = 256


def shm_dir_from_env() -> str:
    """``EZFLOW_SHM_DIR`` (an absolute path), else ``/dev/shm``; read at each call."""
    text = os.environ.get(ENV_SHM_DIR, "")
    if not text:
        return "/dev/shm"
    if not os.path.isabs(text):
        raise ConfigurationError(
            f"{ENV_SHM_DIR}={text!r} must be an absolute path to a directory (a tmpfs "
            "such as /dev/shm, shared by every process of the graph on this host)"
        )
    return text


#: ezring rings (docs/ezring.md): a reader with nothing to read re-checks the CLOSED flag
#: and the writer's liveness lock this often, in case a wake-up datagram was lost or the
#: writer died (a dead writer sends nothing).
EZRING_POLL_INTERVAL: Final = 0.25
#: ``RingReader.open`` waits this long by default for the ring to exist and be ready.
EZRING_ATTACH_TIMEOUT: Final = 5.0
#: The graph server scans the shm directory for live ezring rings of its own user this
#: often (``GraphServer(watch_rings=...)``): a new ring is found within about this long.
EZRING_WATCH_INTERVAL: Final = 0.5
#: A ring file whose header is not written yet and whose writer's lock nobody holds is
#: left alone for this long since it changed: its writer may be between creating it and
#: taking the lock (two calls a loaded machine can hold apart). Older, its creator died
#: before it started: a sweep removes it.
EZRING_CREATE_GRACE: Final = 10.0
#: Defaults of a ring created by ``RingWriter.create`` (the C writer has the same ones).
DEFAULT_EZRING_SLOT_COUNT: Final = 16
DEFAULT_EZRING_MAX_READERS: Final = 16


@dataclass(frozen=True, slots=True)
class ShmOptions:
    """How a publisher uses shared memory for its same-host edges.

    * *slot_count* slots of *slot_size* bytes form the publisher's ring segment, created
      at its first message that goes through shared memory (or its first loan): a
      publisher of small messages never has one;
    * messages larger than a slot get an *out-of-line* segment of their own, pooled and
      reused after release; the ring and every out-of-line block together never exceed
      *max_bytes* of ``/dev/shm``;
    * encoded messages of at most *inline_limit* bytes skip shared memory and travel
      inline through the notification socket: copying a small message is cheaper than
      leasing a block for it.

    With *handoff* (the default), a paced publish - one that starts ``PACED_GAP_NS`` or
    more after the previous one was sent (and after any yield), time spent waiting for
    room not counted, by a publisher whose thread slept meanwhile (its event loop was
    idle; not busy, not preempted) - that went to at least one subscriber on this host
    (over shm, or over tcp from a loopback address or this host's own) ends with the
    publisher yielding its CPU (``sched_yield``) once every subscriber's copy is
    written. A subscriber process that the message woke on the same CPU then runs at
    once, instead of after the rest of the publisher's event-loop turn; where it was
    woken on another, idle CPU the yield costs one system call. Back-to-back publishing
    yields at most for the first message of a burst.

    A lossless channel holds at most ``2 * slot_count`` messages in blocks that it has
    not yet taken (received by its subscribers), whatever its ``max_in_flight``: the
    ring's slots and as many small out-of-line blocks, what the ring can hold without
    sending messages of its size inline. The publish then waits as for a full window.
    When every usable block is still leased (subscribers keep old messages alive), a
    message travels inline instead: leases never block a publisher, only the
    ``max_in_flight`` window and the block window do. Raises
    :class:`ConfigurationError` for a non-positive size, a negative *inline_limit*, a
    ring larger than *max_bytes*, or a *handoff* that is not a bool.
    """

    slot_count: int = DEFAULT_SHM_SLOT_COUNT
    slot_size: int = DEFAULT_SHM_SLOT_SIZE
    max_bytes: int = DEFAULT_SHM_MAX_BYTES
    inline_limit: int = DEFAULT_SHM_INLINE_LIMIT
    handoff: bool = True

    def __post_init__(self) -> None:
        check_positive(self.slot_count, setting="ShmOptions.slot_count")
        check_positive(self.slot_size, setting="ShmOptions.slot_size")
        check_positive(self.max_bytes, setting="ShmOptions.max_bytes")
        limit = self.inline_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(
                f"ShmOptions.inline_limit={limit!r} must be an integer >= 0 (0: every "
                "message goes through shared memory)"
            )
        if not isinstance(self.handoff, bool):
            raise ConfigurationError(f"ShmOptions.handoff={self.handoff!r} must be True or False")
        if self.slot_count * self.slot_size > self.max_bytes:
            raise ConfigurationError(
                f"ShmOptions: a ring of slot_count={self.slot_count} x slot_size="
                f"{self.slot_size} bytes does not fit in max_bytes={self.max_bytes}; raise "
                "max_bytes or use fewer or smaller slots"
            )


def parse_address(text: str, *, setting: str = "address") -> Address:
    """Parse ``HOST:PORT`` (``[V6HOST]:PORT`` for IPv6) into a ``(host, port)`` tuple.

    Raises :class:`ConfigurationError` naming *setting* when *text* is malformed.
    """
    value = text.strip()
    host: str
    port_text: str
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or value[end + 1 : end + 2] != ":":
            raise ConfigurationError(
                f"{setting}={text!r} is not HOST:PORT; write IPv6 hosts as [::1]:25990"
            )
        host, port_text = value[1:end], value[end + 2 :]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            raise ConfigurationError(
                f"{setting}={text!r} is not HOST:PORT (for example 127.0.0.1:25990)"
            )
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigurationError(
            f"{setting}={text!r}: port {port_text!r} is not a number"
        ) from None
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"{setting}={text!r}: port {port} is outside 0..65535")
    return host, port


def format_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def graph_address_from_env() -> Address:
    """The graph server address from ``EZFLOW_GRAPH_ADDRESS``, else the default."""
    text = os.environ.get(ENV_GRAPH_ADDRESS)
    if not text:
        return DEFAULT_GRAPH_ADDRESS
    return parse_address(text, setting=ENV_GRAPH_ADDRESS)


def transport_from_env(names: Sequence[str] = TRANSPORTS) -> str | None:
    """The transport forced by ``EZFLOW_TRANSPORT`` (one of *names*: by default
    ``local``, ``shm``, ``tcp``; a context passes the registered ones), or ``None`` for
    automatic choice (also for an empty value or ``auto``)."""
    text = os.environ.get(ENV_TRANSPORT, "").strip().lower()
    if text in ("", "auto"):
        return None
    return check_transport(text, setting=ENV_TRANSPORT, names=names)


def check_transport(
    value: str | None, *, setting: str = "transport", names: Sequence[str] = TRANSPORTS
) -> str | None:
    """Validate a transport name against *names* (by default the built-in ones the
    user may force; a context passes the registered ones); ``None`` means automatic."""
    if value is None:
        return None
    if value not in names:
        raise ConfigurationError(
            f"{setting}={value!r} is not a transport; use one of {', '.join(names)}"
            " (or leave it unset for automatic choice)"
        )
    return value


def max_message_size_from_env() -> int:
    """``EZFLOW_MAX_MESSAGE_SIZE`` in bytes (plain integer, or with a K/M/G suffix)."""
    text = os.environ.get(ENV_MAX_MESSAGE_SIZE, "").strip()
    if not text:
        return DEFAULT_MAX_MESSAGE_SIZE
    return parse_size(text, setting=ENV_MAX_MESSAGE_SIZE)


_SUFFIXES: Final = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str, *, setting: str) -> int:
    """Parse a byte count such as ``1048576``, ``512K``, ``64M`` or ``1G``."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    suffix = value[-1:] if value[-1:] in _SUFFIXES else ""
    number = value[: len(value) - len(suffix)]
    try:
        size = int(number) * _SUFFIXES[suffix]
    except ValueError:
        raise ConfigurationError(
            f"{setting}={text!r} is not a byte count; write e.g. 1048576, 512K, 64M or 1G"
        ) from None
    return check_positive(size, setting=setting)


def check_positive(value: int, *, setting: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{setting}={value!r} must be a positive integer")
    return value


# -- liveness (see docs/architecture.md, "Dead peers and stalled edges") ----------------

ENV_HEARTBEAT_DEADLINE: Final = "EZFLOW_HEARTBEAT_DEADLINE"
#: Seconds a graph-server connection or tcp data connection may stay silent (not one byte
#: received) before its peer is declared dead and the connection closed; 0 turns
#: heartbeats off. Each side sends a heartbeat when it has sent nothing for
#: ``deadline / HEARTBEATS_PER_DEADLINE`` (the shorter of its own and its peer's), so a
#: peer whose event loop is blocked for up to about 4/5 of the deadline is not killed.
DEFAULT_HEARTBEAT_DEADLINE: Final = 10.0
#: Shortest and longest accepted deadline (seconds, besides 0 for off).
MIN_HEARTBEAT_DEADLINE: Final = 0.5
MAX_HEARTBEAT_DEADLINE: Final = 3600.0
#: Heartbeats an idle side sends per deadline.
HEARTBEATS_PER_DEADLINE: Final = 5
#: TCP keepalive on graph and tcp data connections, where the platform has the options:
#: the first probe after ``deadline / 2`` idle seconds, then this many probes spread over
#: the other half (so the kernel also gives up on a silent peer within about the deadline).
TCP_KEEPALIVE_PROBES: Final = 3
#: Longest accepted ``stall_timeout`` of a publisher (seconds). The stall timeout itself
#: is off by default: a lossless edge stays lossless unless its publisher opts in.
MAX_STALL_TIMEOUT: Final = 24 * 3600.0


def heartbeat_deadline_from_env() -> float:
    """``EZFLOW_HEARTBEAT_DEADLINE`` in seconds (0: heartbeats off), else the default."""
    text = os.environ.get(ENV_HEARTBEAT_DEADLINE, "").strip()
    if not text:
        return DEFAULT_HEARTBEAT_DEADLINE
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(
            f"{ENV_HEARTBEAT_DEADLINE}={text!r} is not a number of seconds (0: off)"
        ) from None
    return check_heartbeat_deadline(value, setting=ENV_HEARTBEAT_DEADLINE)


def check_heartbeat_deadline(value: float, *, setting: str = "heartbeat_deadline") -> float:
    """0 (off) or a number of seconds between ``MIN_HEARTBEAT_DEADLINE`` and
    ``MAX_HEARTBEAT_DEADLINE``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or (value != 0 and not MIN_HEARTBEAT_DEADLINE <= value <= MAX_HEARTBEAT_DEADLINE)
    ):
        raise ConfigurationError(
            f"{setting}={value!r} must be 0 (heartbeats off) or between "
            f"{MIN_HEARTBEAT_DEADLINE} and {MAX_HEARTBEAT_DEADLINE:g} seconds"
        )
    return float(value)


def check_stall_timeout(value: float | None, *, setting: str = "stall_timeout") -> float | None:
    """``None`` (off: lossless edges wait forever) or a positive number of seconds up to
    ``MAX_STALL_TIMEOUT``."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or not 0 < value <= MAX_STALL_TIMEOUT
    ):
        raise ConfigurationError(
            f"{setting}={value!r} must be None (off) or a number of seconds above 0 and up "
            f"to {MAX_STALL_TIMEOUT:g}"
        )
    return float(value)


# -- stopping a graph (see docs/units.md, "Stopping") ---------------------------------------

ENV_DRAIN_TIMEOUT: Final = "EZFLOW_DRAIN_TIMEOUT"
#: Seconds a stopping graph (NormalTermination, SIGINT, SIGTERM) lets the messages
#: already accepted by lossless edges flow through the units before cutting them off.
DEFAULT_DRAIN_TIMEOUT: Final = 5.0
#: Longest accepted drain timeout (seconds).
MAX_DRAIN_TIMEOUT: Final = 3600.0


def drain_timeout_from_env() -> float:
    """``EZFLOW_DRAIN_TIMEOUT`` in seconds (0: no drain), else the default."""
    text = os.environ.get(ENV_DRAIN_TIMEOUT, "").strip()
    if not text:
        return DEFAULT_DRAIN_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(
            f"{ENV_DRAIN_TIMEOUT}={text!r} is not a number of seconds"
        ) from None
    return check_drain_timeout(value, setting=ENV_DRAIN_TIMEOUT)


def check_drain_timeout(value: float, *, setting: str = "drain_timeout") -> float:
    """0 (stop without draining) or a number of seconds up to ``MAX_DRAIN_TIMEOUT``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or not 0 <= value <= MAX_DRAIN_TIMEOUT
    ):
        raise ConfigurationError(
            f"{setting}={value!r} must be a number of seconds between 0 (no drain) and "
            f"{MAX_DRAIN_TIMEOUT:g}"
        )
    return float(value)


# -- telemetry (see docs/telemetry.md) ------------------------------------------------------

ENV_TELEMETRY_INTERVAL: Final = "EZFLOW_TELEMETRY_INTERVAL"
#: Seconds between two telemetry snapshots of a GraphContext (reported to the graph
#: server and handed to ``on_snapshot`` hooks); 0 turns the periodic snapshot off.
DEFAULT_TELEMETRY_INTERVAL: Final = 1.0
#: Shortest accepted interval; the server ignores reports arriving faster than half of it.
MIN_TELEMETRY_INTERVAL: Final = 0.05
#: Channels plus publishers in one report; the rest are counted as ``truncated``.
MAX_TELEMETRY_ENTRIES: Final = 512
#: Largest encoded report a client sends and the server accepts (bytes).
MAX_TELEMETRY_REPORT_SIZE: Final = 1024 * 1024
#: Subscribers listed per channel in a snapshot (the rest are summed into the channel).
MAX_SNAPSHOT_SUBSCRIBERS: Final = 64
#: Bytes a ``JsonLinesExporter`` file grows to before it is rotated to ``PATH.1`` (at
#: most twice this on disk); ``JsonLinesExporter(path, max_bytes=B)`` changes it.
JSONL_MAX_BYTES: Final = 64 * 1024 * 1024
#: A report is skipped (not queued) while the connection to the server has this many
#: bytes waiting to be written: telemetry never piles up behind a slow server.
TELEMETRY_MAX_WRITE_BUFFER: Final = 256 * 1024
#: A channel times the decoding and the subscribers' handling of the messages whose
#: sequence number ``n`` has ``n & TIMING_SAMPLE_MASK == 0`` (one in 16): the histograms
#: hold those, and ``ChannelStats.decode_seconds`` is their sum times
#: ``TIMING_SAMPLE_MASK + 1``. A power of two minus one.
TIMING_SAMPLE_MASK: Final = 15
#: Prometheus endpoint of the graph server: connections served at once ...
MAX_METRICS_CONNECTIONS: Final = 16
#: ... bytes of request line and headers accepted ...
MAX_METRICS_REQUEST_SIZE: Final = 8 * 1024
#: ... and seconds a client has to send its request.
METRICS_REQUEST_TIMEOUT: Final = 5.0


def telemetry_interval_from_env() -> float:
    """``EZFLOW_TELEMETRY_INTERVAL`` in seconds (0 turns snapshots off), else the default."""
    text = os.environ.get(ENV_TELEMETRY_INTERVAL, "").strip()
    if not text:
        return DEFAULT_TELEMETRY_INTERVAL
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(
            f"{ENV_TELEMETRY_INTERVAL}={text!r} is not a number of seconds"
        ) from None
    return check_telemetry_interval(value, setting=ENV_TELEMETRY_INTERVAL)


def check_telemetry_interval(value: float, *, setting: str = "telemetry_interval") -> float:
    """0 (off) or a number of seconds >= ``MIN_TELEMETRY_INTERVAL``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or (value != 0 and not MIN_TELEMETRY_INTERVAL <= value <= 3600)
    ):
        raise ConfigurationError(
            f"{setting}={value!r} must be 0 (off) or between {MIN_TELEMETRY_INTERVAL} and "
            "3600 seconds"
        )
    return float(value)


# -- run-time type checks (see docs/units.md) ----------------------------------------------

#: ``1`` checks every message a unit publishes against its stream's declared type, ``0``
#: (or unset) does not; ``ezflow.run(check_types=...)`` wins over it.
ENV_CHECK_TYPES: Final = "EZFLOW_CHECK_TYPES"


def check_types_from_env() -> bool:
    """``EZFLOW_CHECK_TYPES``: ``1`` on, ``0`` or unset off."""
    text = os.environ.get(ENV_CHECK_TYPES, "").strip()
    if text in ("", "0"):
        return False
    if text == "1":
        return True
    raise ConfigurationError(f"{ENV_CHECK_TYPES}={text!r} must be 1 (check) or 0 (do not)")


# -- how unit processes start (see docs/architecture.md, "Starting unit processes") ---------

#: ``forkserver`` (the default where it works: Linux with pidfds) forks unit processes
#: from a fork server that imported ezflow and the program's modules once; ``spawn``
#: starts a fresh interpreter per unit process (slower start-up, nothing inherited).
ENV_START_METHOD: Final = "EZFLOW_START_METHOD"
START_METHODS: Final[tuple[str, ...]] = ("forkserver", "spawn")
#: Seconds the fork server has to answer a fork request (its own start included: a fresh
#: interpreter importing the units' modules) before the graph's start fails.
FORK_TIMEOUT: Final = 30.0
#: Seconds a fork server whose program is gone waits for its unit processes to stop by
#: themselves (they see their control sockets close) before it kills them and exits.
FORKSERVER_ORPHAN_TIMEOUT: Final = 15.0


def forkserver_supported() -> bool:
    """Whether this platform can run the fork server: ``os.fork``, ``os.pidfd_open``
    (Linux 5.3+) and file-descriptor passing over Unix sockets."""
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "fork")
        and hasattr(os, "pidfd_open")
        and hasattr(socket, "send_fds")
    )


def start_method_from_env() -> str:
    """``EZFLOW_START_METHOD``: ``forkserver`` or ``spawn``; unset, ``forkserver`` where
    :func:`forkserver_supported`, else ``spawn``. ``forkserver`` where it is not
    supported is a :class:`ConfigurationError`."""
    text = os.environ.get(ENV_START_METHOD, "").strip().lower()
    if not text:
        return "forkserver" if forkserver_supported() else "spawn"
    if text not in START_METHODS:
        raise ConfigurationError(
            f"{ENV_START_METHOD}={text!r} is not a start method; use 'forkserver' (fork "
            "unit processes from a fork server, the default) or 'spawn' (a fresh "
            "interpreter per unit process)"
        )
    if text == "forkserver" and not forkserver_supported():
        raise ConfigurationError(
            f"{ENV_START_METHOD}=forkserver needs Linux 5.3+ (pidfds); use 'spawn' here"
        )
    return text


# -- how failures are shown (see docs/units.md) --------------------------------------------

#: ``1`` shows ezflow's own frames in the tracebacks of unit failures and of errors raised
#: out of ``ezflow.run`` (``ezflow run -v`` too); ``0`` or unset shows the user's frames
#: and the line that failed.
ENV_DEBUG: Final = "EZFLOW_DEBUG"


def debug_from_env() -> bool:
    """``EZFLOW_DEBUG``: ``1`` on, ``0`` or unset off; any other value counts as on (a
    debugging switch should not itself fail)."""
    return os.environ.get(ENV_DEBUG, "").strip() not in ("", "0")


# -- tracing (see docs/tracing.md) -----------------------------------------------------------

#: ``N`` traces one message in N that each publisher of a process publishes on its own;
#: ``0`` or unset starts no traces. ``ezflow.set_trace_rate`` and ``ezflow run --trace``
#: set it too; the processes of a unit graph inherit it.
ENV_TRACE: Final = "EZFLOW_TRACE"
#: Finished trace hops a process keeps until the telemetry reporter takes them to the
#: graph server; beyond it the oldest are overwritten (and counted).
TRACE_BUFFER: Final = 4096
#: Trace hops one telemetry report carries at most (the rest wait for the next report).
TRACE_REPORT_MAX: Final = 1024
#: Trace hops the graph server keeps (the newest, from every process), for ``ezflow trace``.
TRACE_SERVER_KEEP: Final = 20_000
#: ``ezflow trace --sample N --duration S``: the graph's trace rate is a *lease* the graph
#: server pushes to every process, of at most this many seconds (a longer look: give
#: the processes a rate of their own, ``EZFLOW_TRACE``) ...
TRACE_LEASE_MAX: Final = 3600.0
#: ... which the server ends on time while it runs; each process also ends it by itself
#: this many seconds after the end the server announced (when the server died, or its
#: word was lost), so that no lease outlives its duration by more than this ...
TRACE_LEASE_GRACE: Final = 1.0
#: ... the server answers a lease request (or its end) once every process confirmed it,
#: or after this many seconds (the others are named in the answer) ...
TRACE_LEASE_CONFIRM_TIMEOUT: Final = 2.0
#: ... after a lease ends, traced messages sent before every process left it may still
#: be on their way: a process's report counts as having every hop of the lease once it
#: was sent this many seconds after the process left the lease ...
TRACE_FLUSH_SETTLE: Final = 0.1
#: ... and ``ezflow trace`` waits for such a report of every process at most the
#: longest report interval plus this margin ...
TRACE_FLUSH_MARGIN: Final = 0.5
#: ... and never more than this many seconds in all.
TRACE_FLUSH_MAX_WAIT: Final = 10.0


def check_trace_lease_duration(value: float, *, setting: str = "duration") -> float:
    """A trace lease's duration: seconds above 0, at most ``TRACE_LEASE_MAX``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or not 0 < value <= TRACE_LEASE_MAX
    ):
        raise ConfigurationError(
            f"{setting}={value!r} must be a number of seconds above 0 and at most "
            f"{TRACE_LEASE_MAX:g} (TRACE_LEASE_MAX); to trace for longer, give the processes "
            "a rate of their own (EZFLOW_TRACE=N, ezflow run --trace N)"
        )
    return float(value)


#: ``ezflow otel``: where an OpenTelemetry collector listens for OTLP over HTTP by
#: default (loopback: sending elsewhere is asked for) ...
OTEL_DEFAULT_ENDPOINT: Final = "http://127.0.0.1:4318"
#: ... seconds between two polls of the graph server (and two metric exports) ...
OTEL_POLL_INTERVAL: Final = 2.0
#: ... and span ids of exported hops remembered, so that a hop the graph server still
#: keeps is not exported twice (at least TRACE_SERVER_KEEP: what one poll returns).
OTEL_REMEMBER: Final = 100_000

#: ``ezflow foxglove`` (ezflow.foxglove; the core does not import the Foxglove SDK): the
#: port its Foxglove WebSocket server listens on by default (Foxglove's own default) ...
FOXGLOVE_DEFAULT_PORT: Final = 8765
#: ... the newest messages the leaky subscriber behind a subscribed Foxglove channel
#: keeps (older ones are dropped and counted: a slow viewer never holds the graph) ...
FOXGLOVE_QUEUE: Final = 2
#: ... the messages the SDK buffers for each viewer (the oldest is dropped when a viewer
#: reads slower than the topic publishes; a 4K RGB frame is 24 MiB, so this bounds
#: memory, not the SDK's default of 1,024) ...
FOXGLOVE_BACKLOG: Final = 16
#: ... bytes a viewer's connection has not yet taken (its socket's send queue) from
#: which it counts as busy; an array of at least this many bytes is not written for
#: viewers while every connected viewer is busy (counted as held): a viewer that stopped
#: reading costs no copies, one that reads slowly gets messages at its own pace ...
FOXGLOVE_BUSY_BYTES: Final = 256 * 1024
#: ... how much it lowers its own CPU priority (``nice``): a viewer is best-effort, the
#: graph's processes get a busy host's CPU first (the viewer's leaky subscribers drop) ...
FOXGLOVE_NICE: Final = 10
#: ... seconds its stop waits for the SDK's server, which waits for every viewer's socket
#: to take what is queued for it: past this, the connections of viewers that stopped
#: reading are shut down (logged), and the stop waits as long again ...
FOXGLOVE_STOP_TIMEOUT: Final = 2.0
#: ... topics it advertises at most (topics beyond are listed as skipped) ...
FOXGLOVE_MAX_TOPICS: Final = 1024
#: ... and seconds between two looks at the graph (new topics, the graph picture and its
#: rates on ``/ezflow/graph``).
FOXGLOVE_GRAPH_INTERVAL: Final = 2.0
#: JSON mapping (ezflow.foxglove, docs/foxglove.md): a numeric array of at most this many
#: elements, all finite, is a JSON list (what Foxglove's Plot panel reads); a larger one
#: is base64 of its bytes (exact, and ~15x faster to write).
FOXGLOVE_JSON_LIST_MAX: Final = 65_536
#: MCAP recordings: bytes of messages per chunk (one compressed, indexed unit: a
#: recording killed mid-way loses at most the chunk it was filling).
MCAP_CHUNK_SIZE: Final = 4 * 1024 * 1024
#: ... and seconds at most between two finished chunks (a slow topic's recording killed
#: mid-way loses at most this much).
MCAP_FLUSH_INTERVAL: Final = 1.0

# -- rings (see docs/ezring.md) ------------------------------------------------------------

#: ``0`` keeps graph servers from registering this user's ezring rings by themselves,
#: ``1`` (or unset) lets them; ``GraphServer(watch_rings=...)`` and ``ezflow serve
#: --[no-]watch-rings`` win over it.
ENV_WATCH_RINGS: Final = "EZFLOW_WATCH_RINGS"


def watch_rings_from_env() -> bool:
    """``EZFLOW_WATCH_RINGS``: ``1`` or unset on, ``0`` off."""
    text = os.environ.get(ENV_WATCH_RINGS, "").strip()
    if text in ("", "1"):
        return True
    if text == "0":
        return False
    raise ConfigurationError(f"{ENV_WATCH_RINGS}={text!r} must be 1 (register rings) or 0 (do not)")


# -- authentication and TLS (see docs/security.md) ------------------------------------------

#: The shared secret of a graph (the token itself). Children of a process inherit it.
ENV_TOKEN: Final = "EZFLOW_TOKEN"
#: A file holding the token (first line; readable by its owner only), for when the secret
#: should not sit in the environment of every process. ``EZFLOW_TOKEN`` wins over it.
ENV_TOKEN_FILE: Final = "EZFLOW_TOKEN_FILE"
#: TLS for the graph connection and tcp data: this process's certificate (PEM) ...
ENV_TLS_CERT: Final = "EZFLOW_TLS_CERT"
#: ... its private key (PEM) ...
ENV_TLS_KEY: Final = "EZFLOW_TLS_KEY"
#: ... and the CA that signed every certificate of the graph (both ends verify).
ENV_TLS_CA: Final = "EZFLOW_TLS_CA"
#: Shortest token accepted (bytes of its UTF-8 text): 16 random bytes are out of reach of
#: guessing, and the handshake never reveals more than an HMAC of the token.
MIN_TOKEN_BYTES: Final = 16
#: Random bytes each side of a challenge-response handshake contributes.
AUTH_NONCE_SIZE: Final = 32

# -- logging of bad connections --------------------------------------------------------------

#: Per cause (authentication failed, protocol violation before or after the handshake,
#: handshake timeout, too many connections, a silent peer...), each listener (the graph
#: server, each data server, the metrics endpoint) logs at most this many bad
#: connections one line each per period of BAD_PEER_LOG_INTERVAL (a period opens with
#: the first of its cause) ...
BAD_PEER_LOG_FIRST: Final = 5
#: ... and counts the rest, with one summary line per this many seconds at most (and
#: one when the listener closes) giving the counts per cause: a flood of hostile
#: connections costs a bounded number of log lines (ezflow._core._peerlog).
BAD_PEER_LOG_INTERVAL: Final = 60.0
#: Characters of one such line at most: what a peer sent (an unknown command's name, a
#: field's value) may be quoted in it, and is cut beyond this.
BAD_PEER_LOG_MAX_CHARS: Final = 1000

# -- ezmsg's API (ezflow.compat.ezmsg) ----------------------------------------------------------

#: Seconds between two looks at ``running`` by an ezmsg ``@main`` (an ezmsg unit, or
#: ezflow.compat.ezmsg's) that returned: as
#: under ezmsg, the graph goes on, and that thread waits for it to stop.
COMPAT_MAIN_POLL_INTERVAL: Final = 0.05
