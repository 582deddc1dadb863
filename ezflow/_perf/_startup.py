"""Start-up of a 3-process graph, ezflow vs ezmsg: ``ezflow perf startup``.

(``python -m ezflow._perf._startup`` is the same, kept as an alias.)

The same graph on both: SOURCE publishes 50 small messages as fast as it can, RELAY
forwards them, SINK counts them and ends the graph normally after the last; SOURCE,
RELAY and SINK each in a process of its own, next to the process that called ``run``
(``process_components`` on both: ezmsg's default would run all three in one process).
Each run is a fresh interpreter running a generated script; measured from just before
the interpreter is launched to

* **first**: the first message handled by SINK (``time.time()`` printed by SINK), and
* **exit**: the interpreter having exited (graph stopped, every process gone).

Both packages are compiled to bytecode first, as ``pip install`` leaves them. Runs
alternate between the frameworks (``--runs`` each), and the medians are printed with
their ratio. ezmsg is measured when it is importable here (``ezflow-pubsub[ezmsg]``),
else only ezflow. The machine's load is printed: time on a shared machine is noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["StartupError", "main", "measure", "run"]

MESSAGES = 50
#: A run's deadline (seconds): either framework starts, delivers and exits in about one.
RUN_TIMEOUT = 120.0
#: How much of a failed run's output its error shows (the last lines).
ERROR_LINES = 20


class StartupError(RuntimeError):
    """A run of the benchmark's graph failed or did not end in time."""


_EZFLOW = f"""
import time
import ezflow

class Source(ezflow.Unit):
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.publisher(OUTPUT)
    async def generate(self):
        for i in range({MESSAGES}):
            yield self.OUTPUT, i

class Relay(ezflow.Unit):
    INPUT = ezflow.InputStream(int)
    OUTPUT = ezflow.OutputStream(int)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def relay(self, message):
        yield self.OUTPUT, message

class Sink(ezflow.Unit):
    INPUT = ezflow.InputStream(int)

    def initialize(self):
        self.count = 0

    @ezflow.subscriber(INPUT)
    def on_message(self, message):
        if self.count == 0:
            print("FIRST", time.time(), flush=True)
        self.count += 1
        if self.count == {MESSAGES}:
            raise ezflow.NormalTermination

if __name__ == "__main__":
    source, relay, sink = Source(), Relay(), Sink()
    ezflow.run(
        SOURCE=source, RELAY=relay, SINK=sink,
        connections=[(source.OUTPUT, relay.INPUT), (relay.OUTPUT, sink.INPUT)],
        process_components=[source, relay, sink],
        graph_address="127.0.0.1:0",
    )
"""

_EZMSG = f"""
import time
import ezmsg.core as ez

class Source(ez.Unit):
    OUTPUT = ez.OutputStream(int)

    @ez.publisher(OUTPUT)
    async def generate(self):
        for i in range({MESSAGES}):
            yield self.OUTPUT, i
        raise ez.Complete

class Relay(ez.Unit):
    INPUT = ez.InputStream(int)
    OUTPUT = ez.OutputStream(int)

    @ez.subscriber(INPUT)
    @ez.publisher(OUTPUT)
    async def relay(self, message):
        yield self.OUTPUT, message

class SinkState(ez.State):
    count: int = 0

class Sink(ez.Unit):
    STATE = SinkState
    INPUT = ez.InputStream(int)

    @ez.subscriber(INPUT)
    async def on_message(self, message):
        if self.STATE.count == 0:
            print("FIRST", time.time(), flush=True)
        self.STATE.count += 1
        if self.STATE.count == {MESSAGES}:
            raise ez.NormalTermination

if __name__ == "__main__":
    source, relay, sink = Source(), Relay(), Sink()
    ez.run(
        SOURCE=source, RELAY=relay, SINK=sink,
        connections=((source.OUTPUT, relay.INPUT), (relay.OUTPUT, sink.INPUT)),
        process_components=(source, relay, sink),
    )
"""


def measure(script: Path, env: dict[str, str]) -> tuple[float, float]:
    """(seconds to the first message at SINK, seconds to exit) for one run of *script*."""
    start = time.time()
    try:
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            env=env,
            cwd=script.parent,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise StartupError(f"{script.name} did not end within {RUN_TIMEOUT:.0f} s") from None
    ended = time.time()
    first = [line for line in result.stdout.splitlines() if line.startswith("FIRST ")]
    if result.returncode != 0 or not first:
        tail = (result.stdout + result.stderr).splitlines()[-ERROR_LINES:]
        raise StartupError(
            f"{script.name} failed (exit {result.returncode}"
            f"{', no message reached SINK' if not first else ''}); its last lines:\n"
            + "\n".join(tail)
        )
    return float(first[0].split()[1]) - start, ended - start


def _ezmsg_available() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import ezmsg.core"], capture_output=True, check=False
    )
    return probe.returncode == 0


def _compile_packages(names: list[str]) -> None:
    code = (
        "import compileall, importlib, pathlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    module = importlib.import_module(name + ('.core' if name == 'ezmsg' else ''))\n"
        "    root = pathlib.Path(module.__file__).parent\n"
        "    if name == 'ezmsg':\n"
        "        root = root.parent\n"
        "    compileall.compile_dir(root, quiet=1)\n"
    )
    subprocess.run([sys.executable, "-c", code, *names], check=False, capture_output=True)


def run(runs: int) -> None:
    """Measure *runs* runs per framework and print the medians (ezmsg when importable);
    raises :class:`StartupError` when a run fails."""
    if runs < 1:
        raise StartupError(f"--runs {runs}: need at least 1 run per framework")
    frameworks = {"ezflow": _EZFLOW}
    if _ezmsg_available():
        frameworks["ezmsg"] = _EZMSG
    else:
        print("ezmsg is not importable here: measuring ezflow only")
    # Bytecode first, for both packages, as `pip install` leaves it: without it (an
    # editable install under PYTHONDONTWRITEBYTECODE) every process compiles its imports.
    _compile_packages(list(frameworks))
    env = dict(os.environ, EZMSG_LOGLEVEL="WARNING", PYTHONWARNINGS="ignore")
    env.pop("EZFLOW_GRAPH_ADDRESS", None)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in frameworks}
    with tempfile.TemporaryDirectory(prefix="ezflow-startup-") as tmp:
        scripts = {}
        for name, text in frameworks.items():
            scripts[name] = Path(tmp) / f"startup_{name}.py"
            scripts[name].write_text(text)
        for _ in range(runs):
            for name, script in scripts.items():
                results[name].append(measure(script, env))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'':8} {'first message (s)':>18} {'exit (s)':>10}   (medians of {runs})")
    medians = {}
    for name, measured in results.items():
        first = statistics.median(r[0] for r in measured)
        end = statistics.median(r[1] for r in measured)
        medians[name] = (first, end)
        print(f"{name:8} {first:18.3f} {end:10.3f}")
    if "ezmsg" in medians:
        (f1, e1), (f2, e2) = medians["ezflow"], medians["ezmsg"]
        print(f"{'ratio':8} {f1 / f2:18.2f} {e1 / e2:10.2f}   (ezflow / ezmsg)")


def main(argv: list[str] | None = None) -> None:
    """``python -m ezflow._perf._startup``: the alias of ``ezflow perf startup``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per framework")
    args = parser.parse_args(argv)
    try:
        run(args.runs)
    except StartupError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
