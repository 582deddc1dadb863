"""``ezflow perf waterfall``: a ref of a temporary clone against itself, installed in a
venv, the same short scenarios in alternating rounds, rendered as tables, JSON and HTML
with every figure "no change"; the verdicts of rounds that differ; and the clear errors
for a directory that is no checkout and a ref that is no commit."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _proc import ezflow_cli
from rich.console import Console

import ezflow
from ezflow._core._tracing import STAGES
from ezflow._perf import _waterfall

REPO = Path(ezflow.__file__).resolve().parent.parent


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary clone of this repository with its own HEAD~1 (a commit on top of the
    clone's HEAD, so that the test does not depend on the history it is given)."""
    if not (REPO / ".git").exists():
        pytest.skip("not run from a git checkout of ezflow")
    root = tmp_path_factory.mktemp("waterfall")
    target = root / "ezflow"
    subprocess.run(["git", "clone", "-q", str(REPO), str(target)], check=True)
    # HEAD~1 is the tip of this checkout, HEAD a commit that changes nothing of the code.
    (target / "WATERFALL-TEST").write_text("a commit for the test\n")
    _git(target, "add", "WATERFALL-TEST")
    _git(target, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "test")
    yield target
    subprocess.run(["git", "-C", str(target), "worktree", "prune"], check=False)


#: Rounds of the self-comparison: 4 per ref (fewer than 5 rounds widen the noise band).
SELF_ROUNDS = 4


@pytest.mark.timeout(270)  # (28-31 s alone; it timed out at 60 s at load 8)
def test_waterfall_of_a_ref_against_itself_is_no_change_in_every_cell(
    clone: Path, tmp_path: Path
) -> None:
    """HEAD against HEAD: every difference is noise, so every figure of the comparison
    (the pipeline's end to end and frames/s, every hop's stages) says no change; the
    tables, the JSON and the HTML are rendered."""
    html = tmp_path / "waterfall.html"
    output = tmp_path / "waterfall.json"
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["COLUMNS"] = "200"
    done = ezflow_cli(
        *("perf", "waterfall", "--base", "HEAD", "--new", "HEAD", "--reuse-deps"),
        *("--cache", str(cache), "--hops", "2", "--frame", "200000B"),
        *("--count", "8", "--period", "0.01", "--rounds", str(SELF_ROUNDS)),
        # (the p2p scenario is `ezflow perf run -s p2p` of each ref, tested in
        # test_cli_perf.py; its 8 s per ref and round would multiply this test)
        *("--no-p2p", "--html", str(html), "-o", str(output)),
        cwd=clone,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    head = _git(clone, "rev-parse", "HEAD")
    assert f"ezflow perf waterfall: HEAD ({head[:10]}) -> HEAD ({head[:10]})" in out
    for line in ("end to end p50", "frames/s (paced)", "1. /hop0 (shm)", "2. /hop1 (shm)"):
        assert line in out
    document = json.loads(output.read_text())
    refs, rows = document["refs"], document["comparison"]
    assert [r["commit"] for r in refs] == [head, head]
    for result in refs:
        assert len(result["pipelines"]) == len(result["traced"]) == SELF_ROUNDS
        for run, traced in zip(result["pipelines"], result["traced"], strict=True):
            assert run["hops"] == 2 and len(run["end_to_end_ns"]) == 8 and run["traces"] is None
            assert len(traced["traces"]) == 16  # both refs trace: this checkout's code
        assert result["p2p"] == []
    sections = {row["section"] for row in rows}
    assert sections == {"pipeline", "stages"}
    assert len(rows) == 3 + 2 * (1 + len(STAGES))
    for row in rows:
        assert len(row["base"]["rounds"]) == len(row["new"]["rounds"]) == SELF_ROUNDS, row
        assert row["verdict"] == "no change", row
    assert "better" not in out and "worse" not in out
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for stage in STAGES:
        assert f"<tr><td>&nbsp;&nbsp;{stage}</td>" in page
    assert page.count('<td class=bar><div style="margin-left:') == 2 * 2 * len(STAGES)
    assert page.count("<td class=v-no-change>") == len(rows)
    # The venv is kept per commit (one for both sides); the worktree is gone.
    assert sorted(p.name for p in cache.iterdir()) == [f"{head}-reuse"]
    assert _git(clone, "worktree", "list").count("\n") == 0


def _ref_result(name: str, rates: list[float], p50s: list[float]) -> _waterfall.RefResult:
    result = _waterfall.RefResult(_waterfall.Ref(name, name * 8, Path("python")))
    for rate, p50 in zip(rates, p50s, strict=True):
        result.p2p.append(
            {
                "transport": "shm",
                "size": 64,
                "variant": {"message": "tuple", "receive": "recv"},
                "metrics": {"msgs_per_s": rate, "latency_p50_us": p50},
            }
        )
    return result


def test_the_p2p_cells_are_medians_over_rounds_with_spread_and_verdicts() -> None:
    base = _ref_result("a", [180.0, 220.0, 200.0], [10.0, 12.0, 11.0])
    new = _ref_result("b", [400.0, 420.0, 380.0], [10.5, 11.0, 12.5])
    rows = _waterfall.compare_rows(base, new)
    rate, p50 = (row for row in rows if row.section == "p2p")
    assert (rate.label, rate.part) == ("shm 64 B tuple recv", "msgs/s")
    assert rate.base is not None and rate.new is not None
    assert (rate.base.median, rate.base.low, rate.base.high) == (200.0, 180.0, 220.0)
    assert rate.gain == pytest.approx(2.0)
    assert rate.verdict == "better"  # apart, and beyond 3 x the typical spread
    assert p50.verdict == "no change"  # the rounds overlap
    console = Console(record=True, width=160)
    console.print(_waterfall.render_waterfall([base, new], rows))
    text = console.export_text()
    (line,) = [line for line in text.splitlines() if "msgs/s" in line and "shm 64 B" in line]
    cells = [cell.strip() for cell in line.split("│")[1:-1]]
    assert cells == ["shm 64 B tuple recv", "msgs/s", "200 ±10%", "400 ±5%", "2.00x", "better"]
    assert "no stages at a (aaaaaaaa), b (bbbbbbbb)" in text  # neither traced
    assert "no change: inside the noise" in text


def test_waterfall_errors_are_one_line(tmp_path: Path, clone: Path) -> None:
    outside = ezflow_cli("perf", "waterfall", "--base", "HEAD", cwd=tmp_path, timeout=60)
    assert outside.returncode == 1
    assert "is not in a git checkout of ezflow" in outside.stderr
    unknown = ezflow_cli("perf", "waterfall", "--base", "no-such-ref", cwd=clone, timeout=60)
    assert unknown.returncode == 1
    assert "'no-such-ref' is not a commit of" in unknown.stderr
