"""`ezflow perf` end to end: real (tiny) runs in real processes, with a stand-in peer
(tests/_perfpeer.py, which also crashes on purpose), then schema, compare, report and
peers on their results files; bad options; clean-up on Ctrl-C, SIGTERM and a killed
runner."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _waiting import wait_until_sync
from conftest import ezflow_segments, leaked_segments
from rich.console import Console
from typer.testing import CliRunner

from ezflow._cli._app import app
from ezflow._perf import _compare, _report, _runner, _schema, _tables

PEER = f"{sys.executable} {Path(__file__).with_name('_perfpeer.py')}"
#: The tiny configuration: 6 cells (one of them not applicable), ezflow and a peer;
#: 100 KiB so that shm messages go through shared-memory blocks and loans.
TINY = [
    "-s", "relay,spread", "-t", "local,shm,tcp", "--size", "100KiB", "-n", "1",
    "--duration", "0.3", "--latency-samples", "10", "--repeats", "1",
]  # fmt: skip


#: The tiny p2p run: the ordinary program and variants that together change every
#: field (array, uvloop, on_message, a loan inside the tuple), 100 KiB so that shm lends.
TINY_P2P = [
    "-s", "p2p", "-t", "local,shm,tcp", "--size", "100KiB",
    "-V", "ordinary,array+uvloop,on_message+loan", "--duration", "0.2",
    "--latency-samples", "10", "--min-messages", "200", "--repeats", "1",
]  # fmt: skip


def ezflow_cli(
    *args: str, timeout: float = 50, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ezflow", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(os.environ, **env),
    )


def _check_no_leaks(before: set[str]) -> None:
    # The autouse leak check cannot see a module fixture: the same check, here.
    deadline = time.monotonic() + 5
    while (leaked := leaked_segments(before)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not leaked, f"the run left shared-memory segments behind: {sorted(leaked)}"


def _run_all(
    commands: dict[str, tuple[list[str], dict[str, str]]], timeout: float
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run every ``ezflow`` command of *commands* (name -> (arguments, environment
    additions)) at once; their results by name. Each is an interpreter's start-up and a
    few timed windows, mostly waiting: together they take about as long as the longest."""
    started = {
        name: subprocess.Popen([sys.executable, "-m", "ezflow", *args], env=dict(os.environ, **env),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, (args, env) in commands.items()
    }  # fmt: skip
    deadline = time.monotonic() + timeout
    done = {}
    try:
        for name, process in started.items():
            stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done[name] = subprocess.CompletedProcess(
                process.args, process.returncode, stdout, stderr
            )
    finally:
        for process in started.values():
            process.kill()
            process.communicate()
    return done


#: What the stand-in peer's workers of the ``tiny`` run leave in /dev/shm.
LEAVE = f"perf-leftover-test-{os.getpid()}"

#: The module's runs start together, in the first test that needs one of them: it may
#: take this long (the one run that takes longest alone, the p2p, takes about 20 s on a
#: loaded machine).
RUNS_TIMEOUT = 100
pytestmark = pytest.mark.timeout(RUNS_TIMEOUT + 20)


@pytest.fixture(scope="module")
def perf_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """Every `perf run` of this module, run at once: name -> (the finished command, its
    results file). The runs leave no shared memory behind (checked once they have all
    ended).

    * ``tiny``: TINY with the stand-in peer, whose publishers each leave a file in
      /dev/shm (named ``LEAVE-...``) for the runner to sweep;
    * ``p2p``: TINY_P2P with a stand-in peer that crashes once over local (retried) and
      after its figures over shm;
    * ``crash``: p2p over local with a peer that always crashes;
    * ``fanin``: fan-in over N=1 and N=2, local and shm;
    * ``mixed``: the p2p variants ``mixed`` and ``pair`` over shm, 64 B.
    """
    folder = tmp_path_factory.mktemp("perf")
    (folder / "p2p-marks").mkdir()
    (folder / "crash-marks").mkdir()
    crash_once = {"EZFLOW_PERFPEER_CRASH": "local:once,shm:after",
                  "EZFLOW_PERFPEER_MARKS": str(folder / "p2p-marks")}  # fmt: skip
    crash_always = {"EZFLOW_PERFPEER_CRASH": "local:always",
                    "EZFLOW_PERFPEER_MARKS": str(folder / "crash-marks")}  # fmt: skip
    fanin = ["-s", "fanin", "-t", "local,shm", "-n", "1", "-n", "2", "--size", "64B"]
    fanin += ["--duration", "0.1", "--latency-samples", "5", "--repeats", "1"]
    mixed = ["-s", "p2p", "-t", "shm", "--size", "64B", "-V", "mixed,pair", "--duration", "0.2"]
    mixed += ["--latency-samples", "10", "--min-messages", "200", "--repeats", "1"]
    runs = {
        "tiny": ([*TINY, "--peer", PEER], {"EZFLOW_PERFPEER_LEAVE": LEAVE}),
        "p2p": ([*TINY_P2P, "--peer", PEER], crash_once),
        "crash": (
            [*TINY_P2P[:2], "-t", "local", "--size", "64B", *TINY_P2P[8:], "--peer", PEER],
            crash_always,
        ),
        "fanin": (fanin, {}),
        "mixed": (mixed, {}),
    }
    commands = {
        name: (["perf", "run", *args, "-o", str(folder / f"{name}.json")], env)
        for name, (args, env) in runs.items()
    }
    before = ezflow_segments()
    done = _run_all(commands, RUNS_TIMEOUT)
    _check_no_leaks(before)
    return {name: (result, folder / f"{name}.json") for name, result in done.items()}


@pytest.fixture(scope="module")
def perf_run(
    perf_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> tuple[subprocess.CompletedProcess[str], Path]:
    return perf_runs["tiny"]


@pytest.fixture(scope="module")
def p2p_run(
    perf_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The tiny p2p run, with a stand-in peer that crashes once over local (retried)
    and after its figures over shm."""
    result, path = perf_runs["p2p"]
    assert result.returncode == 0, result.stderr
    return result, _schema.load(path)


@pytest.fixture
def perf_results(perf_run: tuple[subprocess.CompletedProcess[str], Path]) -> dict[str, Any]:
    result, path = perf_run
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _cell(document: dict[str, Any], framework: str, suite: str, transport: str) -> dict[str, Any]:
    found: dict[str, Any]
    (found,) = [
        cell
        for cell in document["cells"]
        if (cell["framework"], cell["suite"], cell["transport"]) == (framework, suite, transport)
    ]
    return found


def test_tiny_run_measures_every_cell(
    perf_run: tuple[subprocess.CompletedProcess[str], Path], perf_results: dict[str, Any]
) -> None:
    result, path = perf_run
    assert f"wrote {path}" in result.stdout.replace("\n", "")
    assert "ezflow against its peers" in result.stdout
    assert [fw["name"] for fw in perf_results["frameworks"]] == ["ezflow", "standin"]
    assert len(perf_results["cells"]) == 12
    measured = [("ezflow", "local"), ("ezflow", "shm"), ("ezflow", "tcp"), ("standin", "local")]
    for framework, transport in measured:
        cell = _cell(perf_results, framework, "relay", transport)
        assert cell["status"] == "ok", cell["reason"]
        assert cell["processes"] == (1 if transport == "local" else 2)
        metrics = cell["metrics"]
        assert len(cell["repeats"]) == 1
        assert metrics["drops"] == 0
        assert metrics["msgs_per_s"] > 0 and metrics["mb_per_s"] > 0
        assert metrics["messages"] > 10  # back-to-back, 10 paced and one END at least
        assert 0 < metrics["latency_p50_us"] <= metrics["latency_p99_us"]
        assert metrics["latency_p99_us"] <= metrics["latency_max_us"]
        assert metrics["cpu_s_per_msg"] > 0
    spread = _cell(perf_results, "ezflow", "spread", "tcp")
    assert spread["status"] == "ok" and spread["processes"] == 3
    assert _cell(perf_results, "ezflow", "spread", "local")["status"] == "unavailable"
    refused = _cell(perf_results, "standin", "relay", "tcp")
    assert (refused["status"], refused["reason"]) == (
        "unavailable",
        "the stand-in peer has no tcp",
    )
    assert refused["metrics"] is None
    floor = perf_results["floor"]
    assert floor["memcpy_gb_per_s"] > 0
    assert [entry["size"] for entry in floor["socketpair_rtt_us"]] == [100 * 1024]
    env = perf_results["environment"]
    assert env["packages"]["ezflow"] and env["packages"]["numpy"]
    assert env["event_loop"] in ("uvloop", "asyncio") and env["cores"] >= 1


def test_files_a_peer_leaves_in_dev_shm_are_removed_after_each_cell(
    perf_results: dict[str, Any],
) -> None:
    """The stand-in peer's publishers leave a file in /dev/shm each, as Zenoh's shm does
    (docs/perf.md, Leftovers): the runner removes them after each cell and says so."""
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(LEAVE)]
    for cell in perf_results["cells"]:
        measured = cell["framework"] == "standin" and cell["status"] == "ok"
        assert bool(cell["swept"]) is measured, cell
        assert all(item["name"].startswith(LEAVE + "-") for item in cell["swept"])
        assert all(item["bytes"] == 4096 for item in cell["swept"]) and not cell["unswept"]


def test_real_results_validate(perf_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, path = perf_run
    document = _schema.load(path)
    assert _schema.validate(document) == []
    printed = ezflow_cli("perf", "schema")
    assert printed.returncode == 0
    assert json.loads(printed.stdout) == json.loads(json.dumps(_schema.SCHEMA))


def test_validator_reports_the_path_of_each_problem(perf_results: dict[str, Any]) -> None:
    broken = copy.deepcopy(perf_results)
    ok_cell = next(cell for cell in broken["cells"] if cell["status"] == "ok")
    ok_cell["metrics"]["drops"] = "none"
    ok_cell["suite"] = "ring"
    del broken["environment"]["cpu_model"]
    broken["floor"]["extra"] = 1
    broken["schema"] = "ezflow-perf/0"
    errors = _schema.validate(broken)
    index = broken["cells"].index(ok_cell)
    assert f"$.cells[{index}].metrics.drops: expected integer, got str" in errors
    assert any(
        error.startswith(f"$.cells[{index}].suite: 'ring' is not one of") for error in errors
    )
    assert "$.environment: missing 'cpu_model'" in errors
    assert "$.floor: unexpected field 'extra'" in errors
    assert any(error.startswith("$.schema: must be") for error in errors)
    assert _schema.validate([]) == ["$: expected object, got list"]


def test_files_from_before_p2p_still_load(perf_results: dict[str, Any]) -> None:
    old = copy.deepcopy(perf_results)
    for cell in old["cells"]:
        for name in ("variant", "loop", "crashes", "crash_reasons"):
            del cell[name]
    for name in ("min_messages", "max_duration", "shm_inline_limit"):
        del old["plan"][name]
    del old["floor"]["memcpy_us"]
    assert _schema.validate(old) == []
    assert all(change.verdict == "no change" for change in _compare.compare(old, perf_results))
    assert "relay: against message size" in _report.render(old)
    console = Console(width=200, record=True)
    console.print(_tables.results_table(old["cells"]))
    assert "relay" in console.export_text()


def _scale(cell: dict[str, Any], metric: str, factor: float) -> None:
    """Scale *metric* of *cell*, its median and every round, by *factor*."""
    cell["metrics"][metric] *= factor
    for repeat in cell["repeats"]:
        repeat[metric] *= factor


def _rounds(cell: dict[str, Any], metric: str, values: list[float]) -> None:
    """Give *cell* these rounds of *metric* (the other figures repeated alike)."""
    while len(cell["repeats"]) < len(values):
        cell["repeats"].append(dict(cell["repeats"][0]))
    del cell["repeats"][len(values) :]
    for repeat, value in zip(cell["repeats"], values, strict=True):
        repeat[metric] = value
    cell["metrics"][metric] = float(np.median(values))


def test_compare_flags_regressions_beyond_the_threshold(perf_results: dict[str, Any]) -> None:
    same = _compare.compare(perf_results, perf_results)
    assert same and all(change.verdict == "no change" for change in same)
    slower = copy.deepcopy(perf_results)
    cell = next(c for c in slower["cells"] if c["status"] == "ok" and c["framework"] == "ezflow")
    _scale(cell, "msgs_per_s", 0.5)
    _scale(cell, "latency_p50_us", 1.15)
    changes = {(c.key, c.metric): c for c in _compare.compare(perf_results, slower)}
    key = _compare.cell_key(cell)
    assert changes[key, "msgs_per_s"].verdict == "regression"
    assert changes[key, "msgs_per_s"].gain == pytest.approx(0.5)
    assert changes[key, "latency_p50_us"].verdict == "worse"  # beyond noise, within fail
    assert changes[key, "cpu_s_per_msg"].verdict == "no change"
    cell["status"], cell["reason"], cell["metrics"] = "error", "boom", None
    failed = [c for c in _compare.compare(perf_results, slower) if c.failing]
    assert [(c.key, c.verdict) for c in failed] == [(key, "failed")]


def test_compare_calls_a_difference_inside_the_spread_no_change(
    perf_results: dict[str, Any],
) -> None:
    """Rounds whose ranges overlap, or a gain within the comparison's noise band, are
    no change, however far apart the medians; beyond both, a change."""
    base, new = copy.deepcopy(perf_results), copy.deepcopy(perf_results)
    ok = [c for c in base["cells"] if c["status"] == "ok"]
    for cell in ok:  # every cell varies by about 20 % from round to round
        for metric in ("msgs_per_s", "latency_p50_us", "cpu_s_per_msg"):
            _rounds(cell, metric, [100.0, 110.0, 120.0])
            _rounds(_cell_like(new, cell), metric, [100.0, 110.0, 120.0])
    first, second = ok[0], ok[1]
    _rounds(_cell_like(new, first), "msgs_per_s", [60.0, 75.0, 118.0])  # overlaps: noise
    _rounds(_cell_like(new, second), "msgs_per_s", [77.0, 80.0, 85.0])  # apart, but within
    changes = {(c.key, c.metric): c for c in _compare.compare(base, new)}
    overlapping = changes[_compare.cell_key(first), "msgs_per_s"]
    assert overlapping.gain == pytest.approx(75 / 110)
    assert overlapping.verdict == "no change"
    near = changes[_compare.cell_key(second), "msgs_per_s"]
    assert near.verdict == "no change"  # 1.38x apart, under 3 x the typical spread (0.18)
    _rounds(_cell_like(new, second), "msgs_per_s", [20.0, 21.0, 22.0])  # 5x: a change
    changes = {(c.key, c.metric): c for c in _compare.compare(base, new)}
    assert changes[_compare.cell_key(second), "msgs_per_s"].verdict == "regression"
    assert sum(c.verdict != "no change" for c in changes.values()) == 1
    console = Console(record=True, width=250)
    console.print(_tables.compare_table(list(changes.values()), "base.json", "new.json"))
    shown = console.export_text()
    assert "110 ±9%" in shown  # the median of the rounds, ± half their range
    assert "no change: inside the noise" in shown


def _cell_like(document: dict[str, Any], cell: dict[str, Any]) -> dict[str, Any]:
    key = _compare.cell_key(cell)
    found: dict[str, Any]
    (found,) = [c for c in document["cells"] if _compare.cell_key(c) == key]
    return found


def test_peer_rows_pair_cells(perf_results: dict[str, Any]) -> None:
    rows = _compare.peer_rows(perf_results)
    by_cell = {(row.suite, row.transport): row for row in rows}
    relay_local = by_cell["relay", "local"]
    assert relay_local.peer == "standin"
    assert relay_local.msgs_ratio is not None and relay_local.msgs_ratio > 0
    assert by_cell["relay", "tcp"].note == "standin: the stand-in peer has no tcp"
    assert by_cell["relay", "tcp"].meets_bar is None


SVG = "{http://www.w3.org/2000/svg}"


def _charts(page: str) -> dict[str, ET.Element]:
    """The report's charts by title."""
    found = re.findall(
        r'<svg xmlns="http://www.w3.org/2000/svg" class="chart".*?</svg>', page, re.S
    )
    charts = [ET.fromstring(text) for text in found]
    return {str(chart.get("aria-label")): chart for chart in charts}


def _lines(chart: ET.Element, panel: int, kind: str = "line") -> dict[str, int]:
    """The lines (or floors) of a chart's panel: label -> number of points."""
    group = [g for g in chart.iter(f"{SVG}g") if g.get("class") == "panel"][panel]
    return {
        str(line.findtext(f"{SVG}title")): len(str(line.get("points")).split())
        for line in group.iter(f"{SVG}polyline")
        if line.get("class") == kind
    }


def test_report_is_self_contained_html(perf_results: dict[str, Any]) -> None:
    page = _report.render(perf_results, title="tiny")
    assert page.startswith("<!DOCTYPE html>")
    charts = _charts(page)  # one per suite, not one per suite, transport and figure
    note = " (N=1 only: -n 1 -n 2 -n 4 -n 8 draws N)"
    assert list(charts) == [
        f"relay: against message size{note}",
        f"spread: against message size{note}",
    ]
    relay = charts[f"relay: against message size{note}"]
    # A line per framework and transport (the peer has no tcp), msgs/s then latency.
    lines = {
        "ezflow local": 1,
        "ezflow shm": 1,
        "ezflow tcp": 1,
        "standin local": 1,
        "standin shm": 1,
    }
    assert _lines(relay, 0) == _lines(relay, 1) == lines
    assert _lines(relay, 1, "floor") == {"floor: socketpair RTT/2": 1}  # shm and tcp cross
    assert _lines(relay, 0, "floor") == {}  # no floor for msgs/s
    assert "<script" not in page and "src=" not in page and "href=" not in page
    assert "ezflow against its peers" in page
    assert "the stand-in peer has no tcp" in page
    # The plan as a small table, not as JSON.
    plan = page[page.index('<table class="plan">') : page.index("</table>")]
    assert '<td class="k">paced messages per source</td><td class=n>10</td>' in plan
    assert '"latency_samples"' not in page


def test_report_draws_n_and_no_floor_where_it_does_not_apply(
    perf_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    """A real run over N=1 and N=2: the fan-in chart's x axis is N, a line per transport
    with a point per N; with local cells only, the latency panel has no floor (a local
    cell is no socket: it beats the socketpair floor)."""
    result, path = perf_runs["fanin"]
    assert result.returncode == 0, result.stderr
    document = _schema.load(path)
    (chart,) = _charts(_report.render(document)).values()
    assert chart.get("aria-label") == "fanin: against N"
    ticks = [t.text for t in chart.iter(f"{SVG}text") if (t.text or "").startswith("N=")]
    assert ticks == ["N=1", "N=2"] * 2  # both panels
    assert _lines(chart, 0) == _lines(chart, 1) == {"local": 2, "shm": 2}
    assert _lines(chart, 1, "floor") == {"floor at 64 B: socketpair RTT/2": 2}
    local = copy.deepcopy(document)
    local["cells"] = [cell for cell in local["cells"] if cell["transport"] == "local"]
    (chart,) = _charts(_report.render(local)).values()
    assert _lines(chart, 1) == {"local": 2}
    assert _lines(chart, 1, "floor") == {}


def test_report_summary_explains_and_names_the_biggest_changes(
    perf_results: dict[str, Any],
) -> None:
    plain = _report.render(perf_results, title="tiny")
    summary = plain[plain.index('<section class="summary">') : plain.index("</section>")]
    assert "<b>relay</b>: source -&gt; N relays -&gt; sink" in summary  # what was measured
    assert "<b>CPU µs/msg</b>" in summary and "socketpair round trip / 2" in summary
    assert "--base OLD" in summary  # no base: says how to get the changes
    base = copy.deepcopy(perf_results)
    new = copy.deepcopy(perf_results)
    _scale(_cell(new, "ezflow", "relay", "tcp"), "msgs_per_s", 0.5)  # 2x worse
    _scale(_cell(new, "ezflow", "relay", "local"), "msgs_per_s", 0.8)  # 1.25x worse
    _scale(_cell(new, "ezflow", "relay", "local"), "latency_p50_us", 0.25)  # 4x better
    page = _report.render(new, title="tiny", base=base)
    summary = page[page.index('<section class="summary">') : page.index("</section>")]
    regressions = summary[summary.index("Biggest regressions") : summary.index("Biggest gains")]
    gains = summary[summary.index("Biggest gains") :]
    assert regressions.index("relay tcp") < regressions.index("relay local")  # worst first
    assert "msgs/s" in regressions and "(<b>0.50x</b> worse)" in regressions
    assert "relay local" in gains and "(<b>4.00x</b> better)" in gains
    assert regressions.count("<li>") <= _report.SUMMARY_CHANGES
    assert "no change (inside the noise" in summary
    assert "Figures from different runs are not comparable" in summary
    assert "load averages (1, 5, 15 min)" in summary  # this run's load, start and end


# -- the commands on real files


def test_compare_exit_status(
    perf_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    _, path = perf_run
    same = ezflow_cli("perf", "compare", str(path), str(path))
    assert same.returncode == 0, same.stderr
    assert "no regression beyond 25%" in same.stdout
    document = json.loads(path.read_text())
    cell = _cell(document, "ezflow", "relay", "tcp")
    _scale(cell, "msgs_per_s", 0.6)  # a 40 % drop: beyond the default 25 %
    slower = tmp_path / "slower.json"
    slower.write_text(json.dumps(document))
    failed = ezflow_cli("perf", "compare", str(path), str(slower))
    assert failed.returncode == 1
    assert "regression" in failed.stdout
    assert failed.stderr.strip().splitlines() == [
        "error: 1 regression(s) beyond 25% (first: ezflow/relay/tcp/102400/1 msgs_per_s)"
    ]
    lenient = ezflow_cli("perf", "compare", str(path), str(slower), "--fail", "0.7")
    assert lenient.returncode == 0, lenient.stderr


def test_report_and_peers_commands(
    perf_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    _, path = perf_run
    target = tmp_path / "report.html"
    written = ezflow_cli("perf", "report", str(path), "-o", str(target), "--base", str(path))
    assert written.returncode == 0, written.stderr
    assert "<svg" in target.read_text()
    table = ezflow_cli("perf", "peers", str(path), "--markdown")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("| suite | transport | size | N | peer |")
    assert any(line.startswith("| relay | local | 100 KiB | 1 | standin |") for line in lines)


BAD_OPTIONS = [
    (
        ["run", "-s", "ring"],
        "error: unknown suite 'ring'; use one of fanout, fanin, relay, spread, p2p",
    ),
    (["run", "-t", "udp"], "error: unknown transport 'udp'; use one of local, shm, tcp"),
    (["run", "--size", "1XiB"], "error: size '1XiB' is not a byte count"),
    (["run", "--size", "128MiB"], "error: size '128MiB' must be between 32 B and 64 MiB"),
    (["run", "--duration", "0"], "error: duration 0.0 s must be in (0, 600]"),
    (["run", "-s", "p2p", "-V", "fast"], "error: unknown variant 'fast' in 'fast'"),
    (["run", "-s", "p2p", "--size", "66B"], "error: p2p size 66 B is not a multiple of 4"),
    (["compare", "missing.json", "missing.json"], "error: cannot read missing.json"),
    (["report", "pyproject.toml"], "error: pyproject.toml is not a JSON document"),
    (
        ["run", "--quick", "--peer", "/nonexistent/python peer.py"],
        "error: cannot start framework info (/nonexistent/python): No such file",
    ),
    # Root without `ip` on PATH, or not root: either way nothing is measured.
    (["bridge"], "error: perf bridge needs "),
]


@pytest.mark.parametrize(("args", "message"), BAD_OPTIONS)
def test_bad_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    # In this process, as a usage error needs no child: eleven `ezflow` starts cost 9 s
    # of CPU. No `ip` on PATH, for `perf bridge`.
    result = CliRunner().invoke(app, ["perf", *args], env={"PATH": "/nonexistent"})
    assert result.exit_code == 2, (result.exception, result.stderr)
    assert isinstance(result.exception, SystemExit), result.exception  # (no traceback)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert "Traceback" not in result.stderr


# -- the research benchmarks: `perf sigproc`, `perf startup` (run in tests/test_startup.py),
# `perf bridge` (root and minutes: run by hand, docs/fleets.md)


@pytest.mark.parametrize(
    ("command", "summary", "options"),
    [
        ("sigproc", "ezmsg vs ezflow on one ezmsg-sigproc graph", ["--blocks", "--samples",
                                                                    "--channels", "--rounds"]),
        ("startup", "Start-up of a source -> relay -> sink graph", ["--runs"]),
        ("bridge", "Across two hosts: through the Zenoh bridge", ["--rounds"]),
    ],
)  # fmt: skip
def test_research_benchmarks_are_perf_subcommands(
    command: str, summary: str, options: list[str]
) -> None:
    listed = CliRunner().invoke(app, ["perf", "--help"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and f"{command} " in listed.output
    shown = CliRunner().invoke(app, ["perf", command, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert summary in shown.output
    assert all(option in shown.output for option in options), shown.output
    # Out of range: a usage error naming the option, exit status 2, nothing run.
    bad = CliRunner().invoke(app, ["perf", command, options[-1], "0"], env={"COLUMNS": "200"})
    assert bad.exit_code == 2 and f"error: invalid value for '{options[-1]}'" in bad.output


# -- the p2p suite


def _p2p(document: dict[str, Any], framework: str, transport: str, variant: str) -> dict[str, Any]:
    found: dict[str, Any]
    (found,) = [
        cell
        for cell in document["cells"]
        if (cell["framework"], cell["transport"], _compare.variant_label(cell))
        == (framework, transport, variant)
    ]
    return found


def _sane(cell: dict[str, Any]) -> None:
    """The figures of a measured p2p cell: present, positive, lossless."""
    assert cell["status"] == "ok", cell["reason"]
    metrics = cell["metrics"]
    assert metrics["drops"] == 0
    assert metrics["msgs_per_s"] > 0 and metrics["cpu_s_per_msg"] > 0
    assert metrics["messages"] > 200  # at least --min-messages back to back, 10 paced, END
    assert 0 < metrics["latency_p50_us"] <= metrics["latency_p99_us"] <= metrics["latency_max_us"]
    assert metrics["loaded_latency_p50_us"] > 0


@pytest.mark.parametrize("transport", ["local", "shm", "tcp"])
@pytest.mark.parametrize(
    ("variant", "loop"),
    [("ordinary", "asyncio"), ("array+uvloop", "uvloop"), ("on_message+loan", "asyncio")],
)
def test_p2p_measures_the_ordinary_program_and_its_variants(
    p2p_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
    transport: str,
    variant: str,
    loop: str,
) -> None:
    _, document = p2p_run
    cell = _p2p(document, "ezflow", transport, variant)
    _sane(cell)
    assert cell["clients"] == 1 and cell["crashes"] == 0
    assert cell["processes"] == (1 if transport == "local" else 2)
    assert cell["loop"] == loop  # what the workers ran on, not what was asked


def test_p2p_peers_run_the_ordinary_program_and_crashes_are_counted(
    p2p_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    result, document = p2p_run
    standin = [cell for cell in document["cells"] if cell["framework"] == "standin"]
    assert {_compare.variant_label(cell) for cell in standin} == {"ordinary"}
    retried = _p2p(document, "standin", "local", "ordinary")
    _sane(retried)  # the second attempt worked ...
    assert retried["crashes"] == 1  # ... and the first one is counted, with its reason
    assert (
        "exited with status 1: standin: crashing on purpose over local"
        in (retried["crash_reasons"][0])
    )
    after = _p2p(document, "standin", "shm", "ordinary")
    _sane(after)  # figures kept, crash counted
    assert after["crashes"] == 1
    assert "after its result" in after["crash_reasons"][0]
    assert _p2p(document, "standin", "tcp", "ordinary")["status"] == "unavailable"
    assert "1 crash" in result.stdout  # in the table, never hidden
    assert "crash: " in result.stdout  # and why, under it


def test_p2p_floor_and_tables(
    p2p_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    result, document = p2p_run
    floor = document["floor"]
    assert {(entry["over"], entry["size"]) for entry in floor["paced_one_way_us"]} == {
        ("unix", 100 * 1024),
        ("tcp", 100 * 1024),
    }
    assert all(entry["msgs_per_s"] > 0 for entry in floor["stream_msgs_per_s"])
    assert [entry["size"] for entry in floor["memcpy_us"]] == [100 * 1024]
    assert "the raw floor of p2p" in result.stdout
    for label in ("ordinary", "array+uvloop", "on_message+loan"):
        assert label in result.stdout
    same = _compare.compare(document, document)
    keys = {change.key for change in same}
    assert ("ezflow", "p2p", "shm", 100 * 1024, 1, "array+uvloop") in keys
    assert all(change.verdict == "no change" for change in same)
    page = _report.render(document, title="p2p")
    (chart,) = _charts(page).values()
    assert chart.get("aria-label") == "p2p: against message size"
    lines = _lines(chart, 1)
    assert {
        "ezflow shm on_message+loan",
        "ezflow tcp array+uvloop",
        "standin local ordinary",
    } <= set(lines)
    floors = _lines(chart, 1, "floor")  # per socket, for the transports that cross
    assert floors == {"floor: raw unix socket, paced": 1, "floor: raw tcp socket, paced": 1}
    assert "p2p floor" in page


def test_a_worker_that_always_crashes_fails_its_cell_after_the_retries(
    perf_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    result, path = perf_runs["crash"]
    assert result.returncode == 1
    assert "1 cell(s) failed" in result.stderr
    document = _schema.load(path)
    failed = _p2p(document, "standin", "local", "ordinary")
    assert failed["status"] == "error"
    assert failed["crashes"] == 1 + _runner.CRASH_RETRIES
    assert "crashing on purpose" in failed["reason"]
    _sane(_p2p(document, "ezflow", "local", "ordinary"))


# -- clean-up


def _descendants(pid: int) -> set[int]:
    """Live (non-zombie) descendants of *pid*."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except OSError:
            pass
    return alive


def _start_long_run(output: Path) -> subprocess.Popen[str]:
    """A run that streams for 20 s into *output*."""
    return subprocess.Popen(
        [sys.executable, "-m", "ezflow", "perf", "run", "-s", "relay", "-t", "tcp", "--size",
         "1KiB", "-n", "2", "--duration", "20", "--repeats", "1", "-o", str(output)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait_for_workers(runner: subprocess.Popen[str]) -> None:
    """Return once the runner's relay workers are up."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # the graph server and the two processes of the cell
        if len(_descendants(runner.pid)) >= 3:
            return
        assert runner.poll() is None, runner.communicate()[1]
        time.sleep(0.1)
    pytest.fail("the run did not start its workers")


STOPS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}


@pytest.fixture(scope="module")
def stopped_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[subprocess.Popen[str], set[int], str, Path]]:
    """Three long runs at once, each stopped well into its stream, by each of STOPS:
    (runner, its processes before the stop, its stderr, its results file). The three
    are stopped together, a second after the last one's workers came up: each streams
    back to back until then, so one stopped after the other kept the cores busy longer."""
    folder = tmp_path_factory.mktemp("stops")
    runners = {name: _start_long_run(folder / f"{name}.json") for name in STOPS}
    stopped = {}
    try:
        for runner in runners.values():
            _wait_for_workers(runner)
        time.sleep(1.0)  # well into every stream
        for name, runner in runners.items():
            workers = _descendants(runner.pid)
            assert runner.poll() is None, runner.communicate()[1]
            runner.send_signal(STOPS[name])
            stopped[name] = (runner, workers)
        found = {}
        for name, (runner, workers) in stopped.items():
            _, stderr = runner.communicate(timeout=60)  # seconds, but three at once
            found[name] = (runner, workers, stderr, folder / f"{name}.json")
    finally:
        for runner in runners.values():
            runner.kill()
            runner.communicate()
    return found


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupting_a_run_ends_every_worker(
    sig: str, stopped_runs: dict[str, tuple[subprocess.Popen[str], set[int], str, Path]]
) -> None:
    runner, workers, stderr, output = stopped_runs[sig]
    assert runner.returncode == 128 + STOPS[sig]
    assert "every worker was stopped, no results written" in stderr
    assert not _alive(workers)
    assert not output.exists()


def test_workers_leave_when_the_runner_is_killed(
    stopped_runs: dict[str, tuple[subprocess.Popen[str], set[int], str, Path]],
) -> None:
    runner, workers, _, _ = stopped_runs["SIGKILL"]
    assert runner.returncode == -signal.SIGKILL
    wait_until_sync(lambda: not _alive(workers), "every worker of a killed run gone")


def test_the_mixed_variant_interleaves_a_tuple_and_a_dataclass_stream(
    perf_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    """The mixed cell: the tuple on the cell's topic and a registered dataclass on a
    second one, every other message, read by one task from two subscribers; every
    message of both streams arrives, in order, intact (a message on the wrong stream or
    out of turn is a drop, or disorder or corruption, which make the cell an error)."""
    result, output = perf_runs["mixed"]
    assert result.returncode == 0, result.stderr
    cell = _p2p(_schema.load(output), "ezflow", "shm", "mixed")
    _sane(cell)


def test_the_pair_variant_is_the_mixed_cell_with_one_shape(
    perf_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    """The pair cell, the mixed cell's control: the same two topics and the same
    alternating sink, the tuple on both (a stream left on one topic would leave the sink
    waiting on the other: the cell would end in an error, not measured)."""
    result, output = perf_runs["mixed"]
    assert result.returncode == 0, result.stderr
    cell = _p2p(_schema.load(output), "ezflow", "shm", "pair")
    _sane(cell)
    assert cell["variant"]["message"] == "pair"
