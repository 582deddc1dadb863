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
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _proc import ezflow_cli
from rich.console import Console

from ezflow._perf import _runner
from ezflow._perf._peers import _command, _common, _install
from ezflow._perf._spec import QUICK, Cell, SpecError, Variant

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


@pytest.mark.timeout(VENV_TIMEOUT)
def test_install_makes_a_current_venv_that_runs_this_ezflow(cache: Path) -> None:
    venv = cache / "pyzmq"
    peer = _install.PEERS["pyzmq"]
    assert _install.is_current(peer, venv)
    logged: list[str] = []
    commands = _install.ensure(["pyzmq"], install_missing=False, cache=cache, log=logged.append)
    assert commands == {"pyzmq": [str(venv / "bin/python"), "-m", "ezflow._perf._peers._pyzmq"]}
    assert logged == [f"pyzmq: {venv} is current"]  # re-used, not made again
    info = subprocess.run(
        [*commands["pyzmq"], "info"], capture_output=True, text=True, timeout=60, check=True
    )
    event = json.loads(info.stdout.splitlines()[-1])
    assert event["framework"] == "pyzmq"
    assert event["version"].startswith("27.")
    where = "import ezflow, numpy; print(ezflow.__file__, numpy.__version__)"
    located = subprocess.run(
        [commands["pyzmq"][0], "-c", where], capture_output=True, text=True, timeout=60, check=True
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
def test_pyzmq_runs_next_to_ezflow_over_shm_and_tcp(cache: Path, tmp_path: Path) -> None:
    output = tmp_path / "peers.json"
    run = ezflow_cli(
        "perf", "peers", "--peers", "pyzmq", "--quick", "--size", "64B",
        "--cache-dir", str(cache), "-o", str(output), timeout=PEERS_TIMEOUT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    document = json.loads(output.read_text())
    assert [framework["name"] for framework in document["frameworks"]] == ["ezflow", "pyzmq"]
    cells = {(cell["framework"], cell["transport"]): cell for cell in document["cells"]}
    assert set(cells) == {(name, t) for name in ("ezflow", "pyzmq") for t in ("shm", "tcp")}
    for cell in cells.values():
        assert cell["status"] == "ok", cell["reason"]
        assert cell["variant"] == Variant().to_json()  # the ordinary program, both sides
        metrics = cell["metrics"]
        assert metrics["msgs_per_s"] > 0
        assert 0 < metrics["latency_p50_us"] <= metrics["latency_p99_us"]
        assert metrics["drops"] == 0
    # One table: a row per metric and transport, ezflow and pyzmq, the ratio, the floor.
    header = next(line for line in run.stdout.splitlines() if "ezflow/pyzmq" in line)
    assert "floor" in header
    assert "crashes" in header
    rows = _command.table_rows(document)
    assert [(row.metric, row.transport) for row in rows] == [
        (metric, transport) for metric, _, _ in _command.METRICS for transport in ("shm", "tcp")
    ]
    for row in rows:
        ours, theirs = row.values["ezflow"], row.values["pyzmq"]
        assert ours is not None
        assert theirs is not None
        assert row.ratios["pyzmq"] == pytest.approx(ours / theirs)
        assert row.floor is not None
        assert row.floor > 0
    # The same table again from the file, as markdown.
    again = ezflow_cli("perf", "peers", "--from", str(output), "--markdown", timeout=PEERS_TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert again.stdout == _command.markdown(document)
    assert again.stdout.startswith("| metric | size | transport | ezflow | pyzmq | ezflow/pyzmq |")


@pytest.mark.timeout(VENV_TIMEOUT)
def test_a_peer_that_crashes_is_retried_and_counted(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EZFLOW_TEST_CRASH_MARK", str(tmp_path / "crashed"))
    python = str(_install.python_of(cache / "pyzmq"))
    plan = dataclasses.replace(QUICK, min_messages=500, max_duration=QUICK.duration)
    cells = [Cell("p2p", "shm", 64, 1, Variant())]
    document = asyncio.run(_runner.run(cells, plan, peers=[[python, str(CRASH_PEER)]]))
    peer = next(cell for cell in document["cells"] if cell["framework"] == "pyzmq")
    assert peer["status"] == "ok"  # the second attempt measured
    assert peer["crashes"] == 1
    assert "exited with status 3" in peer["crash_reasons"][0]
    assert peer["metrics"]["msgs_per_s"] > 0
    console = Console(record=True, width=250)
    console.print(_command.rich_table(document))
    shown = console.export_text()
    rows = [line for line in shown.splitlines() if "msgs/s back-to-back" in line]
    assert rows
    assert all("pyzmq 1" in line for line in rows)
    assert any("crashed:" in line and "status 3" in line for line in _command.notes(document))
    assert "| pyzmq 1 |" in _command.markdown(document)


def test_prepare_checks_the_options() -> None:
    request = _command.prepare(None, None, None, None)
    assert request.peers == ("ezmsg", "pyzmq", "zenoh", "iceoryx2")
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
        ((["nats"], None, None, None), "unknown peer 'nats'; use one of ezmsg, pyzmq"),
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
    workers = {"_ezmsg", "_pyzmq", "_zenoh", "_iceoryx2"}
    libraries = {"zmq", "zenoh", "iceoryx2", "ezmsg"}
    peers_dir = PACKAGE / "_perf" / "_peers"
    shared = {"__init__", "_install", "_command", "_common"}
    ezmsg_users = {PACKAGE / "ezmsg.py", PACKAGE / "_perf" / "_ezmsg_sigproc.py"}
    # ezflow[zenoh]'s integration (ezflow/zenoh.py, ezflow/_zenoh/) uses the installed
    # zenoh; its package shares a name with the Zenoh peer worker, not its code.
    zenoh_users = {PACKAGE / "zenoh.py", *(PACKAGE / "_zenoh").glob("*.py")}
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
        [sys.executable, "-c", "import sys, ezflow._cli._perf, ezflow._perf._peers._command;"
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "{'zmq', 'zenoh', 'iceoryx2', 'ezmsg'}))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert loaded.stdout.strip() == "[]"
