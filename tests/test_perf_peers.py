"""`ezflow perf peers` (ezflow/_perf/_peers): a real peer (pyzmq) in a venv made from
PyPI in a temporary directory, a short run next to ezflow over shm (ipc) and tcp, an
install that fails, a peer that crashes once; the wire layout and the rendezvous the
peers without a graph server share.

The venv is made once for the module (about 15 s with pip's cache, more on a cold
one): the tests that need it have a longer timeout than the default 60 s.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _proc import ezflow_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from ezflow._perf import _runner, _zenoh_bridge
from ezflow._perf._peers import _command, _common, _install, _selfcheck
from ezflow._perf._spec import END, QUICK, Cell, SpecError, Variant

PACKAGE = Path(_install.__file__).resolve().parents[2]
CRASH_PEER = Path(__file__).with_name("_crashpeer.py")
#: Making the venv (cold pip cache: downloads) plus what the test itself runs.
VENV_TIMEOUT = 240


#: Seconds a `perf peers` command may take here.
PEERS_TIMEOUT = 150


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of peer venvs holding a pyzmq venv made from PyPI."""
    root = tmp_path_factory.mktemp("peers")
    _install.ensure(["pyzmq"], install_missing=True, cache=root)
    return root


@pytest.fixture(scope="module")
def peer_runs(
    cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """`perf peers` of pyzmq-sync (quick, 64 B, shm and tcp) and its ``--selfcheck``
    (shm, one round), run at once: name -> (the finished command, its results file).
    Each mostly measures for fixed windows: side by side, they take about as long as
    the longer one."""
    folder = tmp_path_factory.mktemp("peer-runs")
    commands = {
        "peers": ["--quick", "--size", "64B"],
        "selfcheck": ["--selfcheck", "--transports", "shm", "--rounds", "1"],
    }
    with ThreadPoolExecutor(len(commands)) as pool:
        running = {
            name: pool.submit(
                ezflow_cli,
                *("perf", "peers", "--peers", "pyzmq-sync", *options),
                *("--cache-dir", str(cache), "-o", str(folder / f"{name}.json")),
                timeout=PEERS_TIMEOUT,
            )
            for name, options in commands.items()
        }
        return {name: (run.result(), folder / f"{name}.json") for name, run in running.items()}


@pytest.mark.timeout(VENV_TIMEOUT)
def test_install_makes_a_current_venv_that_runs_this_ezflow(cache: Path) -> None:
    venv = cache / "pyzmq"
    peer = _install.PEERS["pyzmq"]
    assert _install.is_current(peer, venv)
    logged: list[str] = []
    commands = _install.ensure(["pyzmq"], install_missing=False, cache=cache, log=logged.append)
    worker = [str(venv / "bin/python"), "-m", "ezflow._perf._peers._pyzmq", "--flavour"]
    assert commands == {"pyzmq-sync": [*worker, "sync"], "pyzmq-asyncio": [*worker, "asyncio"]}
    assert logged == [f"pyzmq: {venv} is current"]  # re-used, not made again (one venv)
    info = subprocess.run(
        [*commands["pyzmq-asyncio"], "info"], capture_output=True, text=True, timeout=60, check=True
    )
    event = json.loads(info.stdout.splitlines()[-1])
    assert event["framework"] == "pyzmq-asyncio"  # the flavour is part of the name
    assert event["version"].startswith("27.")
    one = _install.ensure(["pyzmq-asyncio"], install_missing=False, cache=cache)
    assert one == {"pyzmq-asyncio": [*worker, "asyncio"]}
    bad = subprocess.run(
        [*worker, "fast", "info"], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 1
    assert "pyzmq has no flavour 'fast' (flavours: sync, asyncio)" in bad.stderr
    where = "import ezflow, numpy; print(ezflow.__file__, numpy.__version__)"
    located = subprocess.run(
        [worker[0], "-c", where], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert Path(located[0]).resolve().parent == PACKAGE  # the sources of this tree
    assert located[1] == np.__version__  # ezflow's dependencies pinned to this environment


def test_a_missing_or_outdated_venv_says_to_pass_install(tmp_path: Path) -> None:
    with pytest.raises(_install.PeerSetupError, match=r"peer pyzmq is missing .* --install"):
        _install.ensure(["pyzmq"], install_missing=False, cache=tmp_path)
    stale = tmp_path / "pyzmq"
    stale.mkdir()
    (stale / _install.STAMP).write_text(json.dumps({"peer": "pyzmq", "requirements": []}))
    assert not _install.is_current(_install.PEERS["pyzmq"], stale)
    with pytest.raises(_install.PeerSetupError, match=r"peer pyzmq is outdated .* --install"):
        _install.ensure(["pyzmq"], install_missing=False, cache=tmp_path)
    failed = ezflow_cli(
        "perf", "peers", "--peers", "pyzmq", "--cache-dir", str(tmp_path), timeout=PEERS_TIMEOUT
    )
    assert failed.returncode == 2
    assert "pass --install" in failed.stderr
    assert "Traceback" not in failed.stderr


@pytest.mark.timeout(120)
def test_an_install_that_fails_names_the_peer_and_pip_output(tmp_path: Path) -> None:
    bogus = _install.Peer("pyzmq", "pyzmq==0.0.0.1", "ezflow._perf._peers._pyzmq")
    with pytest.raises(_install.PeerInstallError) as failed:
        _install.ensure(["pyzmq"], install_missing=True, cache=tmp_path, peers={"pyzmq": bogus})
    message = str(failed.value)
    assert message.startswith(f"installing peer pyzmq (pyzmq==0.0.0.1) into {tmp_path / 'pyzmq'}")
    assert "pip exit status 1" in message
    assert "No matching distribution found for pyzmq==0.0.0.1" in message  # pip's own tail
    assert not _install.is_current(bogus, tmp_path / "pyzmq")  # the next --install starts over


@pytest.mark.timeout(VENV_TIMEOUT)
def test_pyzmq_runs_next_to_ezflow_over_shm_and_tcp(
    peer_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    run, output = peer_runs["peers"]
    assert run.returncode == 0, run.stderr
    document = json.loads(output.read_text())
    names = ["ezflow", "pyzmq-sync"]
    assert [framework["name"] for framework in document["frameworks"]] == names
    cells = {(cell["framework"], cell["transport"]): cell for cell in document["cells"]}
    assert set(cells) == {(name, t) for name in names for t in ("shm", "tcp")}
    for cell in cells.values():
        assert cell["status"] == "ok", cell["reason"]
        assert cell["variant"] == Variant().to_json()  # the ordinary program, both sides
        metrics = cell["metrics"]
        assert metrics["msgs_per_s"] > 0
        assert 0 < metrics["latency_p50_us"] <= metrics["latency_p99_us"]
        assert metrics["drops"] == 0
    # One table: a row per metric and transport, ezflow and pyzmq, the ratio, the floor.
    header = next(line for line in run.stdout.splitlines() if "ezflow/pyzmq-sync" in line)
    assert "floor" in header
    assert "crashes" in header
    rows = _command.table_rows(document)
    assert [(row.metric, row.transport) for row in rows] == [
        (metric, transport) for metric, _, _ in _command.METRICS for transport in ("shm", "tcp")
    ]
    for row in rows:
        ours, theirs = row.values["ezflow"], row.values["pyzmq-sync"]
        assert ours is not None
        assert theirs is not None
        assert row.ratios["pyzmq-sync"] == pytest.approx(ours / theirs)
        assert row.lead("pyzmq-sync") in ("ahead", "behind", "even")
        assert row.floor is not None
        assert row.floor > 0
    # The same table again from the file, as markdown.
    again = ezflow_cli("perf", "peers", "--from", str(output), "--markdown", timeout=PEERS_TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert again.stdout == _command.markdown(document)
    lines = again.stdout.splitlines()
    assert lines[:4] == [
        "**msgs/s back-to-back**",
        "",
        "| | 64 B shm | 64 B tcp |",
        "|---|---:|---:|",
    ]
    assert lines[4].startswith("| ezflow | ") and lines[5].startswith("| pyzmq-sync | ")
    assert any(line.startswith("| ezflow / pyzmq-sync | ") for line in lines)


def test_the_latency_floor_is_the_paced_one_way_floor_of_the_raw_socket_beside_it() -> None:
    """The floor of a paced latency row is what the paced cells are: the run's raw
    socket with a message every period (Unix beside shm, tcp beside tcp), not half a
    socketpair round trip (an echo, both ends busy: once 4x the paced floor, once below
    it). A file without the paced floor falls back to the round trip."""
    path = Path(__file__).resolve().parent.parent / "perf/baselines/2026-11-28-peers-s10c.json"
    document = json.loads(path.read_text())
    paced = {(e["over"], e["size"]): e for e in document["floor"]["paced_one_way_us"]}
    rows = {
        (row.metric, row.size, row.transport): row
        for row in _command.table_rows(document)
        if row.metric != "msgs_per_s"
    }
    assert rows
    for (metric, size, transport), row in rows.items():
        key = "p50" if metric == "latency_p50_us" else "p99"
        over = "unix" if transport == "shm" else "tcp"
        assert row.floor == paced[over, size][key]
    del document["floor"]["paced_one_way_us"]
    halves = {e["size"]: e["p50"] / 2 for e in document["floor"]["socketpair_rtt_us"]}
    for row in _command.table_rows(document):
        if row.metric == "latency_p50_us":
            assert row.floor == halves[row.size]


@pytest.mark.timeout(VENV_TIMEOUT)
def test_a_peer_that_crashes_is_retried_and_counted(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EZFLOW_TEST_CRASH_MARK", str(tmp_path / "crashed"))
    python = str(_install.python_of(cache / "pyzmq"))
    plan = dataclasses.replace(QUICK, min_messages=500, max_duration=QUICK.duration)
    cells = [Cell("p2p", "shm", 64, 1, Variant())]
    document = asyncio.run(_runner.run(cells, plan, peers=[[python, str(CRASH_PEER)]]))
    peer = next(cell for cell in document["cells"] if cell["framework"] == "pyzmq-sync")
    assert peer["status"] == "ok"  # the second attempt measured
    assert peer["crashes"] == 1
    assert "exited with status 3" in peer["crash_reasons"][0]
    assert peer["metrics"]["msgs_per_s"] > 0
    console = Console(record=True, width=250)
    console.print(_command.rich_table(document))
    shown = console.export_text()
    rows = [line for line in shown.splitlines() if "msgs/s back-to-back" in line]
    assert rows
    assert all("pyzmq-sync 1" in line for line in rows)
    assert any("crashed:" in line and "status 3" in line for line in _command.notes(document))
    assert "Crashes: pyzmq-sync 1." in _command.markdown(document)


def test_prepare_checks_the_options() -> None:
    request = _command.prepare(None, None, None, None)
    assert request.peers == ("ezmsg", "pyzmq", "zenoh", "iceoryx2")
    frameworks = [
        peer.name if flavour is None else f"{peer.name}-{flavour}"
        for peer, flavour in _install.resolve(request.peers)
    ]
    assert frameworks == [
        "ezmsg",
        "pyzmq-sync",
        "pyzmq-asyncio",
        "zenoh-callback",
        "zenoh-fifo",
        "iceoryx2",
    ]
    assert {(cell.transport, cell.size) for cell in request.cells} == {
        (transport, size) for transport in ("shm", "tcp") for size in (64, 1 << 20, 2160 * 3840 * 3)
    }
    assert all(cell.suite == "p2p" and cell.variant == Variant() for cell in request.cells)
    assert request.plan.repeats == 3
    quick = _command.prepare(["pyzmq,zenoh"], ["64B"], ["tcp"], 2, quick=True)
    assert quick.peers == ("pyzmq", "zenoh")
    assert [(cell.transport, cell.size) for cell in quick.cells] == [("tcp", 64)]
    assert quick.plan == dataclasses.replace(QUICK, repeats=2)
    for args, message in (
        ((["nats"], None, None, None), "unknown peer 'nats'; use one of ezmsg, pyzmq, pyzmq-sync"),
        ((["zenoh-ring"], None, None, None), "unknown peer 'zenoh-ring'"),
        ((None, None, ["local"], None), "unknown transport 'local' for peers"),
        ((None, ["3 bytes"], None, None), "is not a byte count"),
        ((None, None, None, 0), "repeats 0 must be in"),
    ):
        with pytest.raises(SpecError, match=message):
            _command.prepare(*args)


@pytest.mark.parametrize(
    ("shape", "dtype"), [((16,), "float32"), ((262144,), "float32"), ((4, 6, 3), "uint8")]
)
def test_the_wire_layout_round_trips(shape: tuple[int, ...], dtype: str) -> None:
    payload = np.random.default_rng(1).random(shape).astype(dtype) + np.asarray(1, dtype)
    header = _common.encode_header(3, 7, 123456789, payload)
    assert len(header) % 8 == 0  # a payload after it stays aligned
    assert len(header) == _common.header_size(len(shape))
    one = bytearray(header) + payload.tobytes()
    for decoded in (_common.decode(one), _common.decode(header, payload=memoryview(payload))):
        phase, seq, t_ns, array = decoded
        assert (phase, seq, t_ns) == (3, 7, 123456789)
        assert array.dtype == payload.dtype
        assert array.shape == payload.shape
        assert np.array_equal(array, payload)
    bare = bytearray(_common.encode_header(_common.BARE, 0, 0, payload)) + payload.tobytes()
    alone = _common.decode(bare)
    assert isinstance(alone, np.ndarray)
    assert np.array_equal(alone, payload)
    with pytest.raises(ValueError, match="buffer"):
        _common.decode(one[:-1])  # shorter than its header says
    cached = _common.StreamCodec()
    cached.decode(one)
    with pytest.raises(ValueError, match="buffer"):
        cached.decode(one[:-1])  # the cached kind too


_DTYPES = st.sampled_from(["float32", "float64", "uint8", "int16", "complex64", ">i4"])
_SHAPES = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
_MESSAGES = st.tuples(
    st.integers(-1, 3),  # BARE and the four phases
    st.integers(0, 2**62),
    st.integers(-(2**62), 2**62),
    _DTYPES,
    _SHAPES,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_MESSAGES, min_size=1, max_size=12))
def test_the_stream_codec_writes_and_reads_what_the_general_one_does(
    messages: list[tuple[int, int, int, str, tuple[int, ...]]],
) -> None:
    """The cached codec of a stream is pinned to the general encode_header/decode: the
    same header bytes, the same tuples and arrays, whatever kinds a stream changes to
    (each change takes the general path once)."""
    out, into, split = _common.StreamCodec(), _common.StreamCodec(), _common.StreamCodec()
    rng = np.random.default_rng(0)
    for phase, seq, t_ns, dtype, shape in messages:
        payload = (rng.random(shape) * 100).astype(dtype)
        header = out.header(phase, seq, t_ns, payload)
        assert header == _common.encode_header(phase, seq, t_ns, payload)
        one = header + payload.tobytes()
        for got, want in (
            (into.decode(one), _common.decode(one)),
            (
                split.decode(header, 0, payload.tobytes()),
                _common.decode(header, 0, payload.tobytes()),
            ),
        ):
            if phase == _common.BARE:
                assert isinstance(got, np.ndarray)
                got_array, want_array = got, want
            else:
                assert got[:3] == want[:3] == (phase, seq, t_ns)
                got_array, want_array = got[3], want[3]
            assert isinstance(got_array, np.ndarray)
            assert isinstance(want_array, np.ndarray)
            assert got_array.dtype == want_array.dtype == payload.dtype
            assert got_array.shape == want_array.shape == payload.shape
            assert np.array_equal(got_array, payload)


def test_the_stream_codec_costs_less_than_the_general_one() -> None:
    """The point of the cache (the issue measured 3.6-5 us for the general decode): the
    best of several batches, so that a loaded machine does not decide."""
    costs = _selfcheck.codec_costs_us()
    assert costs["encode"] < 0.6 * costs["general_encode"], costs
    assert costs["decode"] < 0.7 * costs["general_decode"], costs


async def test_the_rendezvous_hands_each_subscriber_endpoint_to_publishers() -> None:
    async with _common.rendezvous() as address:
        publisher, subscriber = _common.Rendezvous(address), _common.Rendezvous(address)
        try:
            waiting = asyncio.ensure_future(publisher.get("/perf/x/out"))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # a publisher waits for the first subscriber
            await subscriber.put("/perf/x/out", "ipc://@somewhere")
            assert await asyncio.wait_for(waiting, 5) == ["ipc://@somewhere"]
            await subscriber.put("/perf/x/out", "tcp://127.0.0.1:5555")
            assert await publisher.get("/perf/x/out") == [
                "ipc://@somewhere",
                "tcp://127.0.0.1:5555",
            ]
        finally:
            await publisher.aclose()
            await subscriber.aclose()


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_no_peer_worker_is_imported_outside_the_peer_venvs() -> None:
    workers = {"_ezmsg", "_pyzmq", "_zenoh", "_iceoryx2", "_examples"}
    libraries = {"zmq", "zenoh", "iceoryx2", "ezmsg"}
    peers_dir = PACKAGE / "_perf" / "_peers"
    shared = {"__init__", "_install", "_command", "_common", "_selfcheck"}
    ezmsg_users = {
        PACKAGE / "_units" / "_ezmsg_adapter.py",
        PACKAGE / "_perf" / "_ezmsg_sigproc.py",
    }
    # ezflow[zenoh]'s integration (ezflow/zenoh.py, ezflow/_zenoh/) uses the installed
    # zenoh; its package shares a name with the Zenoh peer worker, not its code.
    # So does the bridge benchmark, whose reference rows run plain zenoh-python.
    zenoh_users = {PACKAGE / "zenoh.py", *(PACKAGE / "_zenoh").glob("*.py")}
    zenoh_users.add(PACKAGE / "_perf" / "_zenoh_bridge.py")
    for path in PACKAGE.rglob("*.py"):
        imported = _imports(path)
        # A peer worker is reached as ..._peers.<worker>, or as .<worker> from _peers/.
        reached = {
            part
            for name in imported
            for part in name.split(".")
            if "_peers" in name.split(".") or path.parent == peers_dir
        }
        # Only the peer workers themselves (and the crash test's) import a peer library.
        if path.parent != peers_dir or path.stem in shared:
            assert not reached & workers, f"{path} imports a peer worker"
            # ezflow[ezmsg]'s adapter and its benchmark use the installed ezmsg.
            expected = {"ezmsg"} if path in ezmsg_users else set()
            expected |= {"zenoh"} if path in zenoh_users else set()
            assert {name.split(".")[0] for name in imported} & libraries <= expected, path
    loaded: Any = subprocess.run(
        [sys.executable, "-c", "import sys, ezflow._cli._perf, ezflow._perf._peers._command,"
         " ezflow._perf._peers._selfcheck;"
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "{'zmq', 'zenoh', 'iceoryx2', 'ezmsg'}))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert loaded.stdout.strip() == "[]"


def test_flavours_name_frameworks_and_resolve_in_order() -> None:
    pyzmq = _install.PEERS["pyzmq"]
    assert pyzmq.frameworks == ("pyzmq-sync", "pyzmq-asyncio")
    assert _install.PEERS["iceoryx2"].frameworks == ("iceoryx2",)
    assert pyzmq.command(Path("/v"), "asyncio")[-2:] == ["--flavour", "asyncio"]
    chosen = _install.resolve(["zenoh-fifo", "pyzmq", "zenoh", "pyzmq-sync"])
    assert [(peer.name, flavour) for peer, flavour in chosen] == [
        ("zenoh", "fifo"), ("pyzmq", "sync"), ("pyzmq", "asyncio"), ("zenoh", "callback"),
    ]  # fmt: skip
    for unknown in ("nats", "pyzmq-fast", "iceoryx2-loan"):
        with pytest.raises(KeyError, match=unknown):
            _install.resolve([unknown])


def _sample(seq: int, phase: int = 0) -> Any:
    """A stand-in for a Zenoh sample (``sample.payload.to_bytes()``)."""
    payload = np.full(4, seq, np.float32)
    data = _common.encode_header(phase, seq, 0, payload) + payload.tobytes()
    return SimpleNamespace(payload=SimpleNamespace(to_bytes=lambda: data))


async def test_zenoh_callbacks_hand_over_early_samples_in_order_then_handle_in_place() -> None:
    """The callback flavour's handler: samples that come before consume() wait in order
    (none lost), later ones are handled in Zenoh's thread, the END settles consume()."""
    zenoh_worker = pytest.importorskip("ezflow._perf._peers._zenoh")  # ezflow[zenoh]
    callbacks = zenoh_worker._Callbacks()
    for seq in range(3):
        callbacks(_sample(seq))  # before consume(): queued
    seen: list[int] = []

    def handle(message: Any) -> bool:
        seen.append(message[1])
        assert np.array_equal(message[3], np.full(4, message[1], np.float32))
        return bool(message[0] == END)

    consuming = asyncio.ensure_future(callbacks.consume(handle))

    def zenoh_thread() -> None:
        for seq in range(3, 50):
            callbacks(_sample(seq))
        callbacks(_sample(50, END))
        callbacks(_sample(51))  # after the end: ignored

    thread = threading.Thread(target=zenoh_thread)
    thread.start()
    await asyncio.wait_for(consuming, 10)
    thread.join(10)
    assert seen == list(range(51))
    failing = zenoh_worker._Callbacks()

    def broken(message: Any) -> bool:
        raise RuntimeError("the sink failed")

    consuming = asyncio.ensure_future(failing.consume(broken))
    await asyncio.sleep(0)
    await asyncio.to_thread(failing, _sample(0))
    with pytest.raises(RuntimeError, match="the sink failed"):
        await asyncio.wait_for(consuming, 10)


@pytest.mark.timeout(VENV_TIMEOUT)
def test_selfcheck_runs_the_library_example_next_to_our_worker(
    peer_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    run, output = peer_runs["selfcheck"]
    document = json.loads(output.read_text())
    assert document["schema"] == _selfcheck.SCHEMA_ID
    assert document["environment"]["load_before"] and document["environment"]["git_revision"]
    (check,) = document["checks"]
    assert (check["framework"], check["transport"], check["size"]) == ("pyzmq-sync", "shm", 64)
    assert check["example"].startswith("pyzmq perf/perf.py thr")
    assert check["gated"]  # the flavour pyzmq's script is written in
    rounds = (check[f"{side}_msgs_per_s"] for side in ("example", "example_message", "worker"))
    assert all(len(values) == 1 and values[0] > 1000 for values in rounds)
    ratio = check["worker_msgs_per_s"][0] / check["example_msgs_per_s"][0]
    assert check["ratio"] == pytest.approx(ratio)
    gate = check["worker_msgs_per_s"][0] / check["example_message_msgs_per_s"][0]
    assert check["passed"] == (gate >= _selfcheck.BAR)
    # Whatever this loaded machine measured, the exit status says it: 1 below the bar.
    assert run.returncode == (0 if check["passed"] else 1), run.stderr
    assert "ezflow perf peers --selfcheck: 64 B" in run.stdout and "pyzmq-sync" in run.stdout
    assert 0 < document["codec_us"] < document["general_codec_us"]
    assert set(document["codec_costs_us"]) == {
        "encode",
        "decode",
        "general_encode",
        "general_decode",
    }
    again = ezflow_cli("perf", "peers", "--from", str(output), "--markdown", timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(_selfcheck.markdown(document))
    assert again.stdout.splitlines()[2].startswith("| pyzmq-sync | shm |")


@pytest.mark.timeout(VENV_TIMEOUT)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_library_example_sink_leaves_when_the_selfcheck_goes_away(
    cache: Path, transport: str
) -> None:
    # A selfcheck killed (SIGKILL) while an example runs closes the example's stdin:
    # a sink whose source never comes must leave then, not wait out its first-message
    # timeout (a minute) as an orphan; a source already did.
    python = str(cache / "pyzmq" / "bin" / "python")
    spec = {"transport": transport, "size": 64, "warmup": 0.1, "window": 0.2, "message": "bytes"}
    with subprocess.Popen(
        [python, "-m", _selfcheck.EXAMPLES, "pyzmq", "sink", json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=PACKAGE.parent,
    ) as sink:
        try:
            assert sink.stdout is not None and sink.stdin is not None
            assert json.loads(sink.stdout.readline())["event"] == "ready"
            sink.stdin.close()  # (what the selfcheck's death does to the pipe)
            assert sink.wait(timeout=10) == 0
        finally:
            if sink.poll() is None:
                sink.kill()


def test_the_selfcheck_bar_applies_to_the_example_carrying_the_same_message() -> None:
    # Zenoh's z_pub_thr moves a fixed payload at 1.5 M msgs/s; carrying the p2p message
    # (built and decoded per message, as our worker does) the same loop makes 500 k.
    check = _selfcheck.Check("zenoh-callback", "zenoh", "shm", True,
                             [1.5e6, 1.4e6], [5.0e5, 5.2e5], [4.5e5, 4.4e5])  # fmt: skip
    assert check.ratio is not None and check.ratio.median < _selfcheck.BAR
    assert check.gate == check.message_ratio
    assert check.passed
    slow = _selfcheck.Check("zenoh-callback", "zenoh", "shm", True,
                            [1.5e6, 1.4e6], [5.0e5, 5.2e5], [3.0e5, 3.1e5])  # fmt: skip
    assert slow.passed is False
    document = {"checks": [slow.to_json()]}
    (line,) = _selfcheck.failures(document)
    assert line == (
        "zenoh-callback over shm: 0.60x of its library's example carrying the p2p message, "
        "below 0.8x"
    )
    # No p2p variant (ezmsg's benchmark sends its own messages): the example as it ships.
    ezmsg = _selfcheck.Check("ezmsg", "ezmsg", "shm", True, [5000.0], [], [3000.0])
    assert ezmsg.passed is False
    (line,) = _selfcheck.failures({"checks": [ezmsg.to_json()]})
    assert "0.60x of its library's example as it ships" in line


def test_perf_bridge_deletes_the_namespaces_of_a_killed_run() -> None:
    """`ezflow perf bridge` names its two namespaces after its pid; a run killed before
    its cleanup leaves them, and the next run deletes those whose process is gone."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead, alive = f"ezbench-a{gone.stdout.strip()}", f"ezbench-b{os.getpid()}"
    try:
        for name in (dead, alive):
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"network namespaces unavailable (needs root and iproute2): {exc}")
    try:
        _zenoh_bridge._sweep_stale()
        listed = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True)
        assert dead not in listed.stdout
        assert alive in listed.stdout
    finally:
        for name in (dead, alive):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
