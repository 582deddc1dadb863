"""Units and graphs for the end-of-stream tests (tests/test_end_of_stream.py).

Importable (unit processes import the classes from here, without pytest), usable as an
``ezflow run`` target (``tests/_eos_graphs.py:chain_from_env``), and runnable as
``python tests/_eos_graphs.py SCENARIO OUTDIR`` for the signal tests: the graph runs with
``ezflow.run`` in that process; it writes ``OUTDIR/running`` once data flows and the
sink writes what it received to ``OUTDIR/received.json`` in ``shutdown()``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ezflow

ENV_RECORD = "EZFLOW_TEST_EOS_RECORD"


class CountSettings(ezflow.Settings):
    count: int = 2000


class Numbers(ezflow.Unit):
    """Publishes 0 .. count-1, then raises Complete (the ezmsg idiom: this publisher is
    done; the graph goes on)."""

    SETTINGS: CountSettings
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, int]]:
        for i in range(self.SETTINGS.count):
            yield self.OUTPUT, i
        raise ezflow.Complete


class BurstSettings(ezflow.Settings):
    marker: str = ""


class Burst(ezflow.Unit):
    """Publishes 0, 1, 2, ... as fast as the edges take them, forever; touches
    `marker` after the first 100 and writes how many were published (accepted) to
    `marker`.sent in shutdown()."""

    SETTINGS: BurstSettings
    OUTPUT = ezflow.OutputStream(int)

    def initialize(self) -> None:
        self.sent = 0

    @ezflow.publisher(OUTPUT)
    async def generate(self) -> AsyncIterator[tuple[Any, int]]:
        while True:
            yield self.OUTPUT, self.sent
            self.sent += 1  # (the yield returned: published)
            if self.sent == 100:
                self.mark()

    def mark(self) -> None:
        if self.SETTINGS.marker:
            Path(self.SETTINGS.marker).touch()

    def shutdown(self) -> None:
        if self.SETTINGS.marker:
            Path(self.SETTINGS.marker + ".sent").write_text(str(self.sent))


class Relay(ezflow.Unit):
    INPUT = ezflow.InputStream(int)
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def relay(self, value: int) -> AsyncIterator[tuple[Any, int]]:
        yield self.OUTPUT, value


class Relays(ezflow.Collection):
    """Five relays, in one process when the collection is placed in one."""

    R0 = Relay()
    R1 = Relay()
    R2 = Relay()
    R3 = Relay()
    R4 = Relay()

    def relays(self) -> list[Relay]:
        return [self.R0, self.R1, self.R2, self.R3, self.R4]


class SinkSettings(ezflow.Settings):
    #: Raise NormalTermination once this many arrived (0: never) ...
    end_after: int = 0
    #: ... in each of the `group_size` sinks of `group` (sinks of one process).
    group: str = ""
    group_size: int = 1
    #: Write what arrived to this file in shutdown() (for graphs run in a child).
    record: str = ""
    #: Seconds each message takes to handle.
    delay: float = 0.0


#: Sinks of a group that got `end_after` messages (sinks of this process).
_FINISHED: dict[str, int] = {}


class Sink(ezflow.Unit):
    """Keeps what arrives; optionally ends the graph after `end_after` messages."""

    SETTINGS: SinkSettings
    INPUT = ezflow.InputStream(int)

    def initialize(self) -> None:
        self.received: list[int] = []

    @ezflow.subscriber(INPUT)
    async def take(self, value: int) -> None:
        settings = self.SETTINGS
        if settings.delay:
            await asyncio.sleep(settings.delay)
        self.received.append(value)
        if len(self.received) == settings.end_after:
            _FINISHED[settings.group] = _FINISHED.get(settings.group, 0) + 1
            if _FINISHED[settings.group] == settings.group_size:
                raise ezflow.NormalTermination

    def shutdown(self) -> None:
        if self.SETTINGS.record:
            Path(self.SETTINGS.record).write_text(json.dumps(self.received))


Graph = tuple[dict[str, ezflow.Component], list[tuple[Any, Any]], list[ezflow.Component]]


def chains(count: int, width: int, sink: SinkSettings) -> tuple[Graph, list[Sink]]:
    """*width* independent chains SOURCEi -> RELAY1 -> RELAY2 -> SINKi (SOURCEi raises
    Complete after *count*): sources and sinks in the runner's process, the first relay
    of every chain in one process, the second in another."""
    first, second = Relays(), Relays()
    components: dict[str, ezflow.Component] = {"RELAY1": first, "RELAY2": second}
    connections: list[tuple[Any, Any]] = []
    sinks = []
    for i, (one, two) in enumerate(zip(first.relays()[:width], second.relays(), strict=False)):
        source, last = Numbers(CountSettings(count)), Sink(sink)
        components[f"SOURCE{i}"], components[f"SINK{i}"] = source, last
        sinks.append(last)
        connections += [
            (source.OUTPUT, one.INPUT),
            (one.OUTPUT, two.INPUT),
            (two.OUTPUT, last.INPUT),
        ]
    return (components, connections, [first, second]), sinks


def chain_from_env() -> Graph:
    """One chain of 2,000 whose sink never ends the graph and records what it got in
    ``$EZFLOW_TEST_EOS_RECORD`` (an ``ezflow run --end-when-done`` target)."""
    graph, _ = chains(2000, 1, SinkSettings(record=os.environ[ENV_RECORD]))
    return graph


def burst(outdir: Path, delay: float) -> Graph:
    """BURST (here) -> RELAY (own process) -> SINK (here): the burst runs until the
    graph stops."""
    source = Burst(BurstSettings(marker=str(outdir / "running")))
    relay = Relay()
    sink = Sink(SinkSettings(record=str(outdir / "received.json"), delay=delay))
    components: dict[str, ezflow.Component] = {"BURST": source, "RELAY": relay, "SINK": sink}
    connections = [(source.OUTPUT, relay.INPUT), (relay.OUTPUT, sink.INPUT)]
    return components, connections, [relay]


if __name__ == "__main__":
    scenario, outdir = sys.argv[1], Path(sys.argv[2])
    components, connections, processes = burst(outdir, 0.2 if scenario == "slow" else 0.0)
    ezflow.run(
        components,
        connections=connections,
        process_components=processes,
        graph_address="127.0.0.1:0",
    )
    print("run returned", flush=True)
