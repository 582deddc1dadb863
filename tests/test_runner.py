"""GraphRunner and ezflow.run with real processes: delivery, start barrier, settings
updates, NormalTermination, failures, signals and dead children."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conftest
import numpy as np
import pytest
from _children import shm_location
from _unit_graphs import (
    Checker,
    Counter,
    CountSettings,
    DiesInInitialize,
    FrameSource,
    Gain,
    GainSettings,
    Relay,
    Sink,
    SinkSettings,
    Window,
)

import ezflow
from ezflow._transports._shmfiles import shm_dir

SCRIPT = str(Path(__file__).with_name("_unit_graphs.py"))
HAVE_DEV_SHM = Path(shm_dir()).is_dir()


# -- in the test process (both event loops), children spawned by the runner ------------


@pytest.mark.skipif(not HAVE_DEV_SHM, reason="needs /dev/shm")
async def test_a_unit_publishes_loaned_frames_without_a_copy(server: ezflow.GraphServer) -> None:
    source = FrameSource()
    runner = ezflow.GraphRunner(
        SOURCE=source, process_components=[source], graph_address=server.address
    )
    async with runner:
        frames = await runner.context.subscriber("SOURCE/OUTPUT", transport="shm")
        first = await asyncio.wait_for(frames.recv(), 10)
        for _ in range(5):
            frame = await asyncio.wait_for(frames.recv(), 10)
            assert frame.shape == (480, 640, 3) and not frame.flags.writeable
            assert np.all(frame == (int(first[0, 0, 0]) + 1) % 256)
            first = frame
        # the very bytes the unit filled, in an out-of-line block of its ring
        where = shm_location(frame)
        pid = runner.processes["SOURCE"]
        assert where is not None and where[0].startswith(f"{shm_dir()}/ezflow-{pid}-")
        assert where[0].endswith("-block")


async def test_10000_messages_in_order_across_two_processes(server: ezflow.GraphServer) -> None:
    count = 10_000
    counter, relay, checker = Counter(count=count), Relay(), Checker(count=count)
    runner = ezflow.GraphRunner(
        components={"COUNT": counter, "RELAY": relay, "CHECK": checker},
        connections=[(counter.OUTPUT, relay.INPUT), (relay.OUTPUT, checker.INPUT)],
        process_components=[relay],
        graph_address=server.address,
    )
    async with runner:
        assert set(runner.processes) == {"RELAY"}
        assert runner.processes["RELAY"] != os.getpid()
        # RELAY -> CHECK crosses processes: shared memory on this host (automatic choice).
        transports = {c.transport for c in runner.context.channels if c.topic == "RELAY/OUTPUT"}
        assert transports == ({"shm"} if HAVE_DEV_SHM else {"tcp"})
        await asyncio.wait_for(runner.wait(), 30)
    assert runner.completed_by == "CHECK"
    assert checker.STATE.expected == count
    assert checker.STATE.out_of_order == 0


async def test_complete_raised_in_another_process_ends_the_graph(
    server: ezflow.GraphServer,
) -> None:
    counter, checker = Counter(count=100), Checker(count=100)
    async with ezflow.GraphRunner(
        COUNT=counter,
        CHECK=checker,
        connections=[(counter.OUTPUT, checker.INPUT)],
        process_components=[checker],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 20)
    assert runner.completed_by == "CHECK"


async def test_start_barrier_loses_nothing_published_at_start(server: ezflow.GraphServer) -> None:
    # The counter (own process) publishes from its first moment; the checker here takes
    # half a second to initialize. Without the barrier the first messages would be lost.
    counter, checker = Counter(count=1000), Checker(count=1000, init_delay=0.5)
    async with ezflow.GraphRunner(
        COUNT=counter,
        CHECK=checker,
        connections=[(counter.OUTPUT, checker.INPUT)],
        process_components=[counter],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 30)
    assert (checker.STATE.expected, checker.STATE.out_of_order) == (1000, 0)


async def test_settings_update_at_run_time_in_another_process(
    server: ezflow.GraphServer,
) -> None:
    gain = Gain(GainSettings(gain=2.0))
    async with ezflow.GraphRunner(
        GAIN=gain, process_components=[gain], graph_address=server.address
    ) as runner:
        output = await runner.context.subscriber("GAIN/OUTPUT")
        source = await runner.context.publisher("GAIN/INPUT")
        await source.publish(1.0)
        assert await asyncio.wait_for(output.recv(), 10) == 2.0
        await runner.update_settings("GAIN", GainSettings(gain=5.0))
        # Settings and samples travel on different edges: poll until the change shows.
        deadline = time.monotonic() + 10
        while True:
            await source.publish(1.0)
            value = await asyncio.wait_for(output.recv(), 10)
            if value == 5.0 or time.monotonic() > deadline:
                break
        assert value == 5.0  # on_settings ran in the GAIN process
        with pytest.raises(ezflow.GraphDefinitionError, match="expects GainSettings"):
            await runner.update_settings("GAIN", CountSettings(count=1))
        with pytest.raises(ezflow.GraphDefinitionError, match="no unit 'NOPE'"):
            await runner.update_settings("NOPE", GainSettings())


async def test_settings_update_in_process_calls_on_settings(server: ezflow.GraphServer) -> None:
    gain = Gain()
    async with ezflow.GraphRunner(GAIN=gain, graph_address=server.address) as runner:
        await runner.update_settings("GAIN", GainSettings(gain=3.0))
        for _ in range(200):
            if gain.STATE.updates:
                break
            await asyncio.sleep(0.01)
        assert GainSettings(gain=3.0) == gain.SETTINGS
        assert (gain.STATE.gain, gain.STATE.updates) == (3.0, 1)
        # Settings of another class on the stream are refused (logged), not applied.
        wrong = await runner.context.publisher("GAIN/INPUT_SETTINGS")
        await wrong.publish(CountSettings(count=3))
        await runner.update_settings("GAIN", GainSettings(gain=4.0))
        for _ in range(200):
            if gain.STATE.updates == 2:
                break
            await asyncio.sleep(0.01)
        assert GainSettings(gain=4.0) == gain.SETTINGS and gain.STATE.updates == 2


async def test_a_raising_unit_fails_the_graph_with_its_path(
    server: ezflow.GraphServer, tmp_path: Path
) -> None:
    counter = Counter(count=1_000_000)
    sink = Sink(SinkSettings(str(tmp_path), raise_after=3))
    runner = ezflow.GraphRunner(
        COUNT=counter,
        SINK=sink,
        connections=[(counter.OUTPUT, sink.INPUT)],
        graph_address=server.address,
    )
    await runner.start()
    with pytest.raises(ezflow.UnitError, match=r"unit SINK failed in subscriber of INPUT") as info:
        await asyncio.wait_for(runner.wait(), 10)
    assert info.value.component == "SINK"
    assert "ValueError: boom from SINK" in info.value.details
    assert (tmp_path / "shutdown-SINK").exists()
    await runner.stop()  # raised once: stopping again is quiet


async def test_initialize_failure_stops_before_start(server: ezflow.GraphServer) -> None:
    class Broken(ezflow.Unit):
        def initialize(self) -> None:
            raise OSError("no such device")

    relay = Relay()
    runner = ezflow.GraphRunner(
        BROKEN=Broken(), RELAY=relay, process_components=[relay], graph_address=server.address
    )
    with pytest.raises(ezflow.UnitError, match=r"unit BROKEN failed in initialize\(\)") as info:
        await runner.start()
    assert "OSError: no such device" in str(info.value)


async def test_a_process_dying_while_starting_is_reported(server: ezflow.GraphServer) -> None:
    doomed, relay = DiesInInitialize(), Relay()
    runner = ezflow.GraphRunner(
        DOOMED=doomed, RELAY=relay, process_components=[doomed], graph_address=server.address
    )
    with pytest.raises(ezflow.ProcessDiedError, match=r"process DOOMED \(pid \d+.*code 3") as info:
        await runner.start()
    assert info.value.returncode == 3


async def test_shutdown_that_hangs_or_raises_is_reported(
    server: ezflow.GraphServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ezflow._units import _host  # noqa: PLC0415

    monkeypatch.setattr(_host, "SHUTDOWN_TIMEOUT", 0.2)

    class Hangs(ezflow.Unit):
        async def shutdown(self) -> None:
            await asyncio.sleep(3600)

    class Raises(ezflow.Unit):
        def shutdown(self) -> None:
            raise RuntimeError("cannot close the device")

    runner = ezflow.GraphRunner(HANGS=Hangs(), RAISES=Raises(), graph_address=server.address)
    await runner.start()
    started = time.monotonic()
    with pytest.raises(ezflow.UnitError) as info:
        await runner.stop()
    assert time.monotonic() - started < 3
    message = str(info.value)
    assert "unit RAISES failed in shutdown()" in message
    assert "RuntimeError: cannot close the device" in message
    assert "unit HANGS failed in shutdown(): did not return within 0.2 s" in message


async def test_thread_complete_and_thread_failure(server: ezflow.GraphServer) -> None:
    class Finisher(ezflow.Unit):
        @ezflow.thread
        def work(self) -> None:
            time.sleep(0.05)
            raise ezflow.NormalTermination

    class Crasher(ezflow.Unit):
        @ezflow.thread
        def work(self) -> None:
            raise KeyError("missing calibration")

    async with ezflow.GraphRunner(DONE=Finisher(), graph_address=server.address) as runner:
        await asyncio.wait_for(runner.wait(), 10)
    assert runner.completed_by == "DONE"
    runner = ezflow.GraphRunner(CRASH=Crasher(), graph_address=server.address)
    await runner.start()
    with pytest.raises(ezflow.UnitError, match=r"unit CRASH failed in work") as info:
        await asyncio.wait_for(runner.wait(), 10)
    assert "KeyError: 'missing calibration'" in info.value.details


async def test_units_that_cannot_be_pickled_are_refused(server: ezflow.GraphServer) -> None:
    relay = Relay()
    relay.callback = lambda: None  # type: ignore[attr-defined]  # a lambda cannot be pickled
    runner = ezflow.GraphRunner(
        RELAY=relay, process_components=[relay], graph_address=server.address
    )
    with pytest.raises(
        ezflow.GraphDefinitionError, match="process RELAY: its units cannot be sent"
    ):
        await runner.start()


async def test_task_thread_and_publish(server: ezflow.GraphServer) -> None:
    class Worker(ezflow.Unit):
        OUTPUT = ezflow.OutputStream(str)

        def initialize(self) -> None:
            self.thread_saw_stop = False

        @ezflow.task
        async def announce(self) -> None:
            await self.publish(self.OUTPUT, "from a task")

        @ezflow.thread
        def spin(self) -> None:
            while self.running:
                time.sleep(0.005)
            self.thread_saw_stop = True

    worker = Worker()
    async with ezflow.GraphRunner(WORKER=worker, graph_address=server.address) as runner:
        out = await runner.context.subscriber("WORKER/OUTPUT")
        # The task may have published before this subscriber existed: publish again.
        await worker.publish(worker.OUTPUT, "direct")
        assert await asyncio.wait_for(out.recv(), 5) == "direct"
    assert worker.thread_saw_stop
    with pytest.raises(ezflow.ClosedResourceError, match="only while the graph runs"):
        await worker.publish(worker.OUTPUT, "late")


async def test_nested_collection_relays_and_process_components(
    server: ezflow.GraphServer,
) -> None:
    class Middle(ezflow.Collection):
        INPUT = ezflow.InputStream(int)
        OUTPUT = ezflow.OutputStream(int)
        FIRST = Relay()
        SECOND = Relay()

        def network(self) -> Any:
            return [
                (self.INPUT, self.FIRST.INPUT),
                (self.FIRST.OUTPUT, self.SECOND.INPUT),
                (self.SECOND.OUTPUT, self.OUTPUT),
            ]

        def process_components(self) -> Any:
            return [self.SECOND]

    counter, middle, checker = Counter(count=500), Middle(), Checker(count=500)
    async with ezflow.GraphRunner(
        COUNT=counter,
        MIDDLE=middle,
        CHECK=checker,
        connections=[(counter.OUTPUT, middle.INPUT), (middle.OUTPUT, checker.INPUT)],
        graph_address=server.address,
    ) as runner:
        assert set(runner.processes) == {"MIDDLE/SECOND"}
        graph = await runner.context.graph()
        assert ["MIDDLE/FIRST/OUTPUT", "MIDDLE/SECOND/INPUT"] in graph["edges"]
        assert not any("MIDDLE/INPUT" in edge for edge in graph["edges"])  # no relay topic
        await asyncio.wait_for(runner.wait(), 20)
    assert (checker.STATE.expected, checker.STATE.out_of_order) == (500, 0)


async def test_main_needs_the_main_thread(server: ezflow.GraphServer) -> None:
    runner = ezflow.GraphRunner(WINDOW=Window(), graph_address=server.address)
    with pytest.raises(ezflow.GraphDefinitionError, match="needs the main thread"):
        await runner.start()


async def test_stop_from_outside_is_graceful(server: ezflow.GraphServer, tmp_path: Path) -> None:
    sink = Sink(SinkSettings(str(tmp_path)))
    relay = Relay()
    runner = ezflow.GraphRunner(
        SINK=sink,
        RELAY=relay,
        connections=[(relay.OUTPUT, sink.INPUT)],
        process_components=[relay],
        graph_address=server.address,
    )
    await runner.start()
    feed = await runner.context.publisher("RELAY/INPUT")
    for i in range(10):
        await feed.publish(i)
    started = time.monotonic()
    await runner.stop()
    assert time.monotonic() - started < 5
    assert (tmp_path / "shutdown-SINK").exists()
    with pytest.raises(RuntimeError, match="started once"):
        await runner.start()


# -- ezflow.run in a child process: signals, exit codes, dead children ------------------


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    return tmp_path


def start_run(
    scenario: str, markers: Path, *, env: dict[str, str] | None = None, **args: Any
) -> subprocess.Popen[str]:
    arguments = {"markers": str(markers), "address": "127.0.0.1:0", **args}
    return subprocess.Popen(
        [sys.executable, SCRIPT, scenario, json.dumps(arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a shell job
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def running(markers: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes started by a test; killed (with their group) if still running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None and process.returncode != -signal.SIGKILL:
            _, err = process.communicate()
            raise AssertionError(f"run exited ({process.returncode}) before {path.name}:\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} after {timeout} s")
        time.sleep(0.02)


def finish(process: subprocess.Popen[str], timeout: float = 5) -> tuple[int, str, str, float]:
    started = time.monotonic()
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err, time.monotonic() - started


@pytest.mark.parametrize(
    "how", ["SIGINT to the process group", "SIGINT to the runner", "SIGTERM to the runner"]
)
def test_signal_stops_everything_with_exit_code_0(
    how: str, markers: Path, running: list[subprocess.Popen[str]]
) -> None:
    process = start_run("forever", markers)
    running.append(process)
    wait_for(markers / "running-SINK", process)
    wait_for(markers / "running-MONITOR", process)
    if how == "SIGINT to the process group":
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    elif how == "SIGINT to the runner":
        os.kill(process.pid, signal.SIGINT)
    else:
        os.kill(process.pid, signal.SIGTERM)
    code, out, err, elapsed = finish(process)
    assert code == 0, err
    assert "run returned" in out
    assert elapsed < 5
    for unit in ("TICKER", "SINK", "MONITOR"):
        assert (markers / f"shutdown-{unit}").exists(), f"{unit}.shutdown() did not run"


def test_raising_unit_exits_non_zero_naming_it(
    markers: Path, running: list[subprocess.Popen[str]]
) -> None:
    process = start_run("forever", markers, raise_after=5)
    running.append(process)
    code, out, err, _ = finish(process, timeout=30)
    assert code == 1
    assert "run returned" not in out
    assert "ezflow.UnitError: unit SINK (process SINK) failed in subscriber of INPUT" in err
    assert 'in on_message\n    raise ValueError(f"boom from {self.path}' in err  # the traceback
    # Printed once, the user's frames only, ending with their file and line.
    err = conftest.without_shm_notices(err)
    assert err.count("boom from SINK at message 4") == 1, err
    assert "/ezflow/" not in err and "asyncio" not in err, err
    assert re.fullmatch(
        rf"{re.escape(SCRIPT)}:\d+: ValueError: boom from SINK at message 4", err.splitlines()[-1]
    ), err
    for unit in ("TICKER", "SINK", "MONITOR"):
        assert (markers / f"shutdown-{unit}").exists(), f"{unit}.shutdown() did not run"


TICKER_SCRIPT = """\
import ezflow
from _cli_graphs import Ticker

ticker = Ticker()
print("running", flush=True)
ezflow.run(TICKER=ticker)
print("run returned", flush=True)
"""
STOPPING = "stopping: draining up to 5 s; Ctrl-C again to stop now\n"


def test_ctrl_c_while_ezflow_run_starts_prints_one_line(
    tmp_path: Path, running: list[subprocess.Popen[str]]
) -> None:
    # Ctrl-C at once, while unit processes still import, and once the graph runs; three
    # runs at once.
    script = tmp_path / "ticker.py"
    script.write_text(TICKER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    for _ in range(3):
        running.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
                env={**env, "EZFLOW_GRAPH_ADDRESS": "127.0.0.1:0"},
            )
        )
    for delay, process in zip((0.05, 0.2, 0.5), running, strict=True):
        assert process.stdout is not None
        assert process.stdout.readline() == "running\n"
        time.sleep(delay)
        os.killpg(process.pid, signal.SIGINT)
    for delay, process in zip((0.05, 0.2, 0.5), running, strict=True):
        code, out, err, _ = finish(process, timeout=30)
        assert (code, out, conftest.without_shm_notices(err)) == (0, "run returned\n", STOPPING), (
            delay
        )


def test_ctrl_c_while_a_script_imports_ezflow_exits_quietly() -> None:
    code = (
        "import os, signal, threading\n"
        "threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "import ezflow\n"  # takes a few tenths of a second: the Ctrl-C comes meanwhile
        "print('imported')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "")
    # Once imported, Ctrl-C is the program's again (ezflow.run handles it while it runs).
    code = "import signal, ezflow\nassert signal.getsignal(2) is signal.default_int_handler"
    assert subprocess.run([sys.executable, "-c", code], timeout=30, check=False).returncode == 0


def test_killed_child_ends_the_run_with_a_clear_message(
    markers: Path, running: list[subprocess.Popen[str]]
) -> None:
    process = start_run("forever", markers)
    running.append(process)
    wait_for(markers / "running-SINK", process)
    pid = int((markers / "pid-SINK").read_text())
    assert pid != process.pid
    os.kill(pid, signal.SIGKILL)
    code, _out, err, elapsed = finish(process)
    assert code == 1
    assert elapsed < 5
    assert f"ProcessDiedError: process SINK (pid {pid}, units SINK) killed by SIGKILL" in err
    assert (markers / "shutdown-TICKER").exists() and (markers / "shutdown-MONITOR").exists()


def test_children_stop_by_themselves_when_the_runner_is_killed(
    markers: Path, running: list[subprocess.Popen[str]]
) -> None:
    # tcp: what a SIGKILLed runner leaves in /dev/shm is the shm transport's concern
    # (reclaimed by its own crash recovery), not what this test is about.
    process = start_run("forever", markers, env={"EZFLOW_TRANSPORT": "tcp"})
    running.append(process)
    wait_for(markers / "running-SINK", process)
    pid = int((markers / "pid-SINK").read_text())
    helpers = conftest._children(process.pid)  # the fork server (none with spawn)
    process.kill()  # SIGKILL: no cleanup in the runner at all
    process.communicate()
    # The unit process sees its control socket close, stops, runs shutdown() and exits;
    # the fork server it was forked from exits once it is gone.
    wait_for(markers / "shutdown-SINK", process, timeout=5)
    deadline = time.monotonic() + 5
    for left in (pid, *helpers):
        while Path(f"/proc/{left}").exists() and "Z" not in _state(left):
            assert time.monotonic() < deadline, f"process {left} outlived its runner"
            time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


DESIGN_EXAMPLE = """
import ezflow
import numpy as np
import asyncio

class SineSettings(ezflow.Settings):      # frozen dataclass
    rate: float = 100.0

class Sine(ezflow.Unit):
    SETTINGS = SineSettings
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def generate(self):
        while True:
            await asyncio.sleep(1 / self.SETTINGS.rate); samples = np.ones(8)
            yield self.OUTPUT, samples

class Scale(ezflow.Unit):
    INPUT = ezflow.InputStream(np.ndarray)
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_samples(self, msg):
        yield self.OUTPUT, msg * 2.0

    def shutdown(self):
        print("SCALE shut down", flush=True)

sine, scale = Sine(SineSettings(rate=500)), Scale()
ezflow.run(
    components={"SINE": sine, "SCALE": scale},
    connections=[(sine.OUTPUT, scale.INPUT)],
    process_components=[scale],        # SCALE in its own process -> shm edge
    graph_address="127.0.0.1:0",
)
"""


def test_the_design_example_runs_as_written(
    tmp_path: Path, running: list[subprocess.Popen[str]]
) -> None:
    # The brief's example (the `...` filled in), with no `if __name__ == "__main__":`.
    script = tmp_path / "design.py"
    script.write_text(DESIGN_EXAMPLE)
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    running.append(process)
    # Once ezflow.run started SCALE's process (importing ezflow takes seconds on a
    # loaded machine), and SCALE had time to initialize.
    deadline = time.monotonic() + 30
    while not conftest._children(process.pid):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.5)  # a window: the example keeps running in it (and SCALE starts)
    assert process.poll() is None
    process.send_signal(signal.SIGINT)
    code, out, err, _ = finish(process)
    assert code == 0, err
    assert "SCALE shut down" in out


def test_an_unguarded_graph_runner_gets_a_clear_error(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import ezflow\n"
        "class Idle(ezflow.Unit):\n"
        "    pass\n"
        "async def main():\n"
        "    idle = Idle()\n"
        "    async with ezflow.GraphRunner(IDLE=idle, process_components=[idle],\n"
        "                                  graph_address='127.0.0.1:0'):\n"
        "        pass\n"
        "ezflow.lowlevel.run_coroutine(main())\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 1
    assert "UnitError: unit IDLE (process IDLE) failed while loading in process IDLE" in (
        result.stderr
    )
    assert "start graphs under `if __name__ == '__main__':`" in result.stderr


def test_main_methods_run_in_main_threads(
    markers: Path, running: list[subprocess.Popen[str]]
) -> None:
    process = start_run("with_main", markers)
    running.append(process)
    code, out, err, _ = finish(process, timeout=30)
    assert code == 0, err
    assert "run returned" in out
    assert (markers / "main-thread-HERE").read_text() == "True"
    assert (markers / "main-thread-THERE").read_text() == "True"
    assert int((markers / "pid-THERE").read_text()) != process.pid
    assert (markers / "shutdown-HERE").exists() and (markers / "shutdown-THERE").exists()
