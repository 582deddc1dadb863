"""``ezflow perf peers --selfcheck``: each peer's own throughput example next to our
worker on that peer, on this machine, at 64 B.

Is each peer worker written the way its library's documentation and examples write a
stream? The check runs, in alternating rounds, for every peer (each flavour) and
transport:

* **the library's example** (:mod:`._examples`: pyzmq's ``perf/perf.py thr``, Zenoh's
  ``z_pub_thr``/``z_sub_thr``, the calls of iceoryx2's Python examples in a loop,
  ezmsg's ``ezmsg perf benchmark``), its sink counting what arrives;
* **our worker, the same loop** (``python -m ezflow._perf._peers._NAME throughput``,
  :func:`ezflow._perf._worker.main`): the source publishes the p2p message ``(phase,
  seq, t_ns, payload)`` back to back through the worker's own adapter (its
  publisher, ``publish_function``, codec, subscriber and ``consume``: everything the
  p2p cells use), the sink decodes each message and counts it.

Each library's example also runs carrying the p2p message (``"message": "p2p"``: the
example's own loop, building a new header per message with the harness codec and
decoding it at the sink). Our worker must reach :data:`BAR` of that variant (the median
of the rounds' paired ratios), else the check fails: a worker below it uses its library
worse than the library's own example does (a wrong idiom, a slow adapter). Where no such
variant exists (ezmsg's benchmark sends its own messages), the bar applies to the
example as it ships. The ratio to the example as it ships is always shown: for a library
that moves a fixed payload in well under a microsecond (Zenoh), no Python program that
builds and reads a message per send comes near it, and the table says by how much.

Both sides run the same kind of loop on purpose: the p2p cells add the measurement
itself to every framework alike (a clock read and a tuple per message at the source;
sequence, phase and timing checks at the sink: a few microseconds, as much for ezflow as
for any peer), which at 64 B weighs more than some libraries' whole per-message cost;
``ezflow perf peers`` shows those figures.

The results document (``"schema": "ezflow-perf-selfcheck/1"``) holds every round of
both sides, the environment (machine, load, commit) and the cost of the harness codec
(:class:`._common.StreamCodec`, encode and decode of one 64 B message).

Uses rich: never imported by workers.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from rich.table import Table

from .. import _environment
from .._noise import Figure, figure
from .._runner import SETUP_TIMEOUT, Worker, WorkerError
from .._spec import RATE
from ._common import StreamCodec, encode_header
from ._install import PEERS, Peer, python_of

__all__ = [
    "BAR",
    "SCHEMA_ID",
    "Check",
    "codec_cost_us",
    "codec_costs_us",
    "failures",
    "markdown",
    "notes",
    "plan",
    "rich_table",
    "run",
]

SCHEMA_ID: Final = "ezflow-perf-selfcheck/1"
#: Our worker must reach this fraction of the library's example (medians).
BAR: Final = 0.8
#: The message size of the check, in bytes.
SIZE: Final = 64
#: Seconds of each stream before and while it is counted.
WARMUP: Final = 0.5
WINDOW: Final = 1.5
#: Rounds by default (each side of each check measured once per round, alternating).
ROUNDS: Final = 3
#: Transports each library is checked over (those its worker has).
TRANSPORTS: Final = {"ezmsg": ("shm", "tcp"), "pyzmq": ("shm", "tcp"), "zenoh": ("shm", "tcp"),
                     "iceoryx2": ("shm",)}  # fmt: skip
#: The example module run in each peer's venv.
EXAMPLES: Final = "ezflow._perf._peers._examples"
#: What each library's example is, for the table's notes.
EXAMPLE_NAMES: Final = {
    "pyzmq": "pyzmq perf/perf.py thr (DEALER -> ROUTER, blocking, one frame)",
    "zenoh": "Zenoh examples/z_pub_thr.py + z_sub_thr.py (callback counts)",
    "iceoryx2": "iceoryx2 Python examples' calls in a loop (no throughput example ships)",
    "ezmsg": "ezmsg perf benchmark (relay config, no relay: source unit -> sink unit)",
}


@dataclass(slots=True)
class Check:
    """One peer framework over one transport, round by round (None: that side failed
    in that round): the library's example, the example carrying the p2p message, and
    our worker in the same loop."""

    framework: str
    library: str
    transport: str
    #: Whether the bar applies: the flavour the example is written in (the default one,
    #: e.g. pyzmq-sync); the other flavour is shown for what its idiom costs.
    gated: bool = True
    example: list[float | None] = field(default_factory=list)
    example_message: list[float | None] = field(default_factory=list)
    worker: list[float | None] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> Figure | None:
        """worker / example, round by round (each pair measured back to back)."""
        return _paired(self.worker, self.example)

    @property
    def message_ratio(self) -> Figure | None:
        """worker / the example carrying the p2p message, round by round."""
        return _paired(self.worker, self.example_message)

    @property
    def gate(self) -> Figure | None:
        """The ratio :data:`BAR` applies to: our worker against the library's example
        carrying the same p2p message where that variant exists (both sides then build,
        send, receive and decode the same bytes, and differ only in how they use the
        library), else against the example as it ships (ezmsg's sends its own messages)."""
        if any(self.example_message):
            return self.message_ratio
        return self.ratio

    @property
    def passed(self) -> bool | None:
        """Whether the worker reached :data:`BAR` of the example (:attr:`gate`, the
        median of the rounds' ratios; None: not measured)."""
        gate = self.gate
        return None if gate is None else gate.median >= BAR

    def to_json(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "framework": self.framework,
            "library": self.library,
            "transport": self.transport,
            "size": SIZE,
            "gated": self.gated,
            "example": EXAMPLE_NAMES[self.library],
            "example_msgs_per_s": self.example,
            "example_message_msgs_per_s": self.example_message,
            "worker_msgs_per_s": self.worker,
            "ratio": None if ratio is None else ratio.median,
            "passed": self.passed,
            "notes": self.notes,
        }


def _paired(ours: list[float | None], theirs: list[float | None]) -> Figure | None:
    return figure(a / b for a, b in zip(ours, theirs, strict=False) if a and b)


def plan(frameworks: dict[str, list[str]], transports: Sequence[str] | None = None) -> list[Check]:
    """The checks of *frameworks* (framework name -> worker command, as
    :func:`._install.ensure` returns them) over their library's transports (only
    those in *transports*, when given)."""
    checks = []
    for name in frameworks:
        library, _, flavour = name.partition("-")
        gated = not flavour or flavour == PEERS[library].flavours[0]
        for transport in TRANSPORTS[library]:
            if transports is None or transport in transports:
                checks.append(Check(name, library, transport, gated))
    return checks


def _best_us(work: Callable[[int], object], repeats: int, batch: int) -> float:
    """Microseconds per call of *work*: the best of *repeats* batches (the cost, not
    the machine's noise)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for seq in range(batch):
            work(seq)
        best = min(best, (time.perf_counter() - started) / batch)
    return best * 1e6


def codec_costs_us(repeats: int = 15, batch: int = 2000) -> dict[str, float]:
    """Microseconds per 64 B p2p message of the harness codec: ``encode`` (the header
    and the join into one ``bytes``) and ``decode`` with the codec cached per stream,
    ``general_encode`` and ``general_decode`` with :func:`._common.encode_header` and
    :func:`._common.decode`."""
    from ._common import decode  # noqa: PLC0415

    payload = np.ones(SIZE // 4, np.float32)
    out, into = StreamCodec(), StreamCodec()
    join: Callable[[Any], bytes] = b"".join  # (numpy arrays are buffers)
    message = join((out.header(RATE, 1, 1, payload), payload))
    return {
        "encode": _best_us(
            lambda seq: join((out.header(RATE, seq, seq, payload), payload)), repeats, batch
        ),
        "decode": _best_us(lambda seq: into.decode(message), repeats, batch),
        "general_encode": _best_us(
            lambda seq: join((encode_header(RATE, seq, seq, payload), payload)), repeats, batch
        ),
        "general_decode": _best_us(lambda seq: decode(message), repeats, batch),
    }


def codec_cost_us(repeats: int = 15, batch: int = 2000) -> float:
    """Microseconds to encode and decode one 64 B p2p message with the cached codec
    (the best of *repeats* batches: the cost, not the machine's noise)."""
    payload = np.ones(SIZE // 4, np.float32)
    out, into = StreamCodec(), StreamCodec()
    join: Callable[[Any], bytes] = b"".join  # (numpy arrays are buffers)
    return _best_us(
        lambda seq: into.decode(join((out.header(RATE, seq, seq, payload), payload))),
        repeats,
        batch,
    )


def general_codec_cost_us(repeats: int = 5, batch: int = 2000) -> float:
    """The same with the general :func:`._common.encode_header` and ``decode``."""
    from ._common import decode  # noqa: PLC0415

    payload = np.ones(SIZE // 4, np.float32)
    join: Callable[[Any], bytes] = b"".join  # (numpy arrays are buffers)
    return _best_us(
        lambda seq: decode(join((encode_header(RATE, seq, seq, payload), payload))),
        repeats,
        batch,
    )


async def _result(sink: Worker, timeout: float) -> float:
    event = await sink.event({"result", "unavailable"}, timeout)
    if event["event"] == "unavailable":
        raise WorkerError(f"{sink.name}: unavailable: {event['reason']}")
    return float(event["msgs_per_s"])


MEASURE_TIMEOUT: Final = SETUP_TIMEOUT + WARMUP + WINDOW + 30.0


async def _measure_example(python: str, check: Check, message: str = "bytes") -> float:
    """One round of *check*'s library example (*message*: ``"bytes"``, as it is, or
    ``"p2p"``, carrying the p2p message)."""
    spec = {"transport": check.transport, "size": SIZE, "warmup": WARMUP, "window": WINDOW,
            "message": message}  # fmt: skip
    base = [python, "-m", EXAMPLES, check.library]
    label = f"{check.library} example over {check.transport}"
    if check.library == "ezmsg":
        run = await Worker.start(label, [*base, "run", json.dumps(spec)])
        try:
            return await _result(run, MEASURE_TIMEOUT)
        finally:
            await run.close()
    sink = await Worker.start(f"{label} (sink)", [*base, "sink", json.dumps(spec)])
    source: Worker | None = None
    try:
        ready = await sink.event({"ready"}, SETUP_TIMEOUT)
        spec["endpoint"] = ready["endpoint"]
        source = await Worker.start(f"{label} (source)", [*base, "source", json.dumps(spec)])
        return await _result(sink, MEASURE_TIMEOUT)
    finally:
        await asyncio.gather(
            *(w.close(timeout=2.0) for w in (source, sink) if w is not None),
            return_exceptions=True,
        )


async def _measure_worker(command: list[str], graph: tuple[str, int], check: Check) -> float:
    """One round of our worker on *check*'s framework, the same loop as the example."""
    spec: dict[str, Any] = {
        "graph": list(graph),
        "topic": f"/selfcheck/{uuid.uuid4().hex[:12]}",
        "transport": check.transport,
        "size": SIZE,
        "warmup": WARMUP,
        "window": WINDOW,
        "seed": int.from_bytes(os.urandom(4), "little"),
    }
    label = f"{check.framework} worker over {check.transport}"
    sink = await Worker.start(
        f"{label} (sink)", [*command, "throughput", json.dumps(spec | {"role": "sink"})]
    )
    source: Worker | None = None
    try:
        ready = await sink.event({"ready", "unavailable"}, SETUP_TIMEOUT)
        if ready["event"] == "unavailable":
            raise WorkerError(f"{label}: unavailable: {ready['reason']}")
        source = await Worker.start(
            f"{label} (source)", [*command, "throughput", json.dumps(spec | {"role": "source"})]
        )
        return await _result(sink, MEASURE_TIMEOUT)
    finally:
        await asyncio.gather(
            *(w.close(timeout=3.0) for w in (source, sink) if w is not None),
            return_exceptions=True,
        )


async def run(
    frameworks: dict[str, list[str]],
    *,
    rounds: int = ROUNDS,
    transports: Sequence[str] | None = None,
    cache: Any = None,
    log: Callable[[str], None] = lambda _: None,
    command: Sequence[str] = (),
    peers: dict[str, Peer] | None = None,
) -> dict[str, Any]:
    """Run the checks of *frameworks* (framework name -> worker command) for *rounds*
    alternating rounds; the results document. A side that fails in a round is noted
    in its check (and leaves that round out)."""
    from ._install import cache_dir  # noqa: PLC0415

    table = PEERS if peers is None else peers
    checks = plan(frameworks, transports)
    started = time.perf_counter()
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = list(os.getloadavg())
    graphs: dict[str, Worker] = {}
    addresses: dict[str, tuple[str, int]] = {}
    try:
        for name, worker in frameworks.items():
            graph = await Worker.start(f"{name} rendezvous", [*worker, "graph"])
            graphs[name] = graph
            ready = await graph.event({"ready"}, SETUP_TIMEOUT)
            addresses[name] = (ready["address"][0], int(ready["address"][1]))
        for round_ in range(1, rounds + 1):
            # Per library and transport, back to back: its example as it is, carrying
            # the p2p message (not ezmsg: its example has a message of its own), then
            # each flavour of our worker. The ratios pair each round's measurements.
            examples: dict[tuple[str, str, str], float | None] = {}
            for check in checks:
                python = str(python_of(cache_dir(cache) / table[check.library].name))
                kinds = ("bytes",) if check.library == "ezmsg" else ("bytes", "p2p")
                for kind in kinds:
                    key = (check.library, check.transport, kind)
                    if key not in examples:
                        what = "example" if kind == "bytes" else "example, p2p message"
                        where = f"{check.library} {what} over {check.transport}"
                        log(f"round {round_}/{rounds}: {where}")
                        try:
                            examples[key] = await _measure_example(python, check, kind)
                        except WorkerError as exc:
                            examples[key] = None
                            check.notes.append(f"round {round_}: {what}: {exc}")
                check.example.append(examples[check.library, check.transport, "bytes"])
                check.example_message.append(examples.get((check.library, check.transport, "p2p")))
                log(f"round {round_}/{rounds}: {check.framework} worker over {check.transport}")
                try:
                    check.worker.append(
                        await _measure_worker(
                            frameworks[check.framework], addresses[check.framework], check
                        )
                    )
                except WorkerError as exc:
                    check.worker.append(None)
                    check.notes.append(f"round {round_}: worker: {exc}")
    finally:
        await asyncio.gather(*(g.close() for g in graphs.values()), return_exceptions=True)
    return {
        "schema": SCHEMA_ID,
        "created": created,
        "command": list(command),
        "wall_seconds": time.perf_counter() - started,
        "environment": _environment.capture("asyncio")
        | {
            "load_before": load_before,
            "load_after": list(os.getloadavg()),
        },
        "rounds": rounds,
        "bar": BAR,
        "size": SIZE,
        "warmup": WARMUP,
        "window": WINDOW,
        "codec_us": codec_cost_us(),
        "general_codec_us": general_codec_cost_us(),
        "codec_costs_us": codec_costs_us(),
        "checks": [check.to_json() for check in checks],
    }


def _checks(document: dict[str, Any]) -> list[Check]:
    return [
        Check(
            entry["framework"],
            entry["library"],
            entry["transport"],
            bool(entry.get("gated", True)),
            list(entry["example_msgs_per_s"]),
            list(entry.get("example_message_msgs_per_s") or []),
            list(entry["worker_msgs_per_s"]),
            list(entry["notes"]),
        )
        for entry in document["checks"]
    ]


def failures(document: dict[str, Any]) -> list[str]:
    """One line per gated check that failed or could not be measured."""
    lines = []
    for check in _checks(document):
        if not check.gated:
            continue
        gate = check.gate
        where = f"{check.framework} over {check.transport}"
        if gate is None:
            lines.append(f"{where}: not measured ({'; '.join(check.notes) or 'no rounds'})")
        elif gate.median < BAR:
            example = "carrying the p2p message" if any(check.example_message) else "as it ships"
            lines.append(
                f"{where}: {gate.median:.2f}x of its library's example {example}, below {BAR:g}x"
            )
    return lines


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def _fig(values: list[float | None]) -> str:
    found: Figure | None = figure(values)
    return "—" if found is None else found.text(_rate)


def _ratio_text(found: Figure | None) -> str:
    return "—" if found is None else found.text(lambda value: f"{value:.2f}x")


def _rows(document: dict[str, Any]) -> list[list[str]]:
    rows = []
    for check in _checks(document):
        if not check.gated:
            verdict = "(not gated)"
        else:
            verdict = {True: "pass", False: "FAIL", None: "not measured"}[check.passed]
        rows.append([
            check.framework, check.transport, _fig(check.example),
            _fig(check.example_message), _fig(check.worker), _ratio_text(check.ratio),
            _ratio_text(check.message_ratio), verdict,
        ])  # fmt: skip
    return rows


_HEADER = ["framework", "transport", "library's example msgs/s",
           "example, p2p message msgs/s", "our worker, same loop msgs/s",
           "worker / example", "worker / example, p2p message", f"bar {BAR:g}x"]  # fmt: skip


def rich_table(document: dict[str, Any]) -> Table:
    """The selfcheck table for the terminal."""
    table = Table(
        title=f"ezflow perf peers --selfcheck: {document['size']} B, medians of "
        f"{document['rounds']} round(s) (min-max), same run",
        caption=f"ratios: per round (each pair back to back), their median (min-max). "
        f"The bar applies to the flavour the example is written in, against the example "
        f"carrying the p2p message where it runs (else as it ships). {codec_text(document)}",
        title_justify="left",
        caption_justify="left",
    )
    for index, name in enumerate(_HEADER):
        table.add_column(name, justify="left" if index < 2 else "right", no_wrap=index < 2)
    for row in _rows(document):
        style = {"pass": "green", "FAIL": "bold red"}.get(row[-1], "dim")
        table.add_row(*row[:-1], f"[{style}]{row[-1]}[/]")
    return table


def codec_text(document: dict[str, Any]) -> str:
    """The harness codec's cost, as a sentence."""
    costs = document.get("codec_costs_us")
    if costs:
        return (
            f"Harness codec, cached per stream: encode {costs['encode']:.2f} µs, decode "
            f"{costs['decode']:.2f} µs per message (general: {costs['general_encode']:.2f} "
            f"and {costs['general_decode']:.2f} µs)."
        )
    return (
        f"Harness codec, cached per stream: {document['codec_us']:.2f} µs per message, "
        f"encode + decode (general: {document['general_codec_us']:.2f} µs)."
    )


def markdown(document: dict[str, Any]) -> str:
    """The selfcheck table as GitHub markdown (for docs/perf.md)."""
    lines = ["| " + " | ".join(_HEADER) + " |", "|---|---|---:|---:|---:|---:|---:|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(document)]
    return "\n".join([*lines, "", codec_text(document)]) + "\n"


def notes(document: dict[str, Any]) -> list[str]:
    """What each library's example is, and every round that failed."""
    libraries = list(dict.fromkeys(entry["library"] for entry in document["checks"]))
    lines = [f"{library}: {EXAMPLE_NAMES[library]}" for library in libraries]
    for check in _checks(document):
        lines += [f"{check.framework} over {check.transport}: {note}" for note in check.notes]
    return lines


def is_selfcheck(document: Any) -> bool:
    """Whether *document* is a selfcheck results file."""
    return isinstance(document, dict) and document.get("schema") == SCHEMA_ID
