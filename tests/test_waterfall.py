"""``ezflow perf waterfall``: two git refs of a temporary clone, each installed in a venv
of its own, the same short scenarios at both, rendered as tables, JSON and HTML; and
the clear errors for a directory that is no checkout and a ref that is no commit."""

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


def test_waterfall_of_head_1_and_head_runs_and_renders(clone: Path, tmp_path: Path) -> None:
    html = tmp_path / "waterfall.html"
    output = tmp_path / "waterfall.json"
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["COLUMNS"] = "160"
    done = ezflow_cli(
        *("perf", "waterfall", "--base", "HEAD~1", "--new", "HEAD", "--reuse-deps"),
        *("--cache", str(cache), "--hops", "2", "--frame", "200000B"),
        *("--count", "8", "--period", "0.01"),
        # (the p2p scenario is `ezflow perf run -s p2p` of each ref, tested in
        # test_cli_perf.py; its 8 s per ref would double this test)
        *("--no-p2p", "--html", str(html), "-o", str(output)),
        cwd=clone,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    head, base = _git(clone, "rev-parse", "HEAD"), _git(clone, "rev-parse", "HEAD~1")
    assert f"ezflow perf waterfall: HEAD~1 ({base[:10]}) -> HEAD ({head[:10]})" in out
    for line in ("end to end p50", "frames/s (paced)", "1. /hop0 (shm)", "2. /hop1 (shm)"):
        assert line in out
    results = json.loads(output.read_text())
    assert [r["commit"] for r in results] == [base, head]
    for result in results:
        (run,) = result["pipelines"]
        assert run["hops"] == 2 and len(run["end_to_end_ns"]) == 8 and run["traces"] is None
        (traced,) = result["traced"]  # both refs trace: this checkout's code
        assert len(traced["traces"]) == 16
        assert result["p2p"] == []
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for stage in STAGES:
        assert f"&nbsp;&nbsp;{stage}</td>" in page
    assert page.count('<td class=bar><div style="margin-left:') == 2 * 2 * len(STAGES)
    # The venvs are kept per commit; the worktrees are gone.
    assert sorted(p.name for p in cache.iterdir()) == sorted([f"{base}-reuse", f"{head}-reuse"])
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


def test_the_p2p_cells_are_medians_over_rounds_with_gains() -> None:
    base = _ref_result("a", [100.0, 300.0, 200.0], [10.0, 30.0, 20.0])
    new = _ref_result("b", [400.0, 400.0], [5.0, 5.0])
    assert _waterfall.p2p_rows(base, new) == [("shm 64 B tuple recv", 200.0, 400.0, 20.0, 5.0)]
    console = Console(record=True, width=160)
    console.print(_waterfall.render_waterfall([base, new]))
    text = console.export_text()
    (row,) = [line for line in text.splitlines() if "shm 64 B tuple recv" in line]
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    assert cells == ["shm 64 B tuple recv", "200", "400", "2.00x", "20.0 µs", "5.0 µs", "4.00x"]
    assert "no stages at a (aaaaaaaa), b (bbbbbbbb)" in text  # neither traced


def test_waterfall_errors_are_one_line(tmp_path: Path, clone: Path) -> None:
    outside = ezflow_cli("perf", "waterfall", "--base", "HEAD", cwd=tmp_path, timeout=60)
    assert outside.returncode == 1
    assert "is not in a git checkout of ezflow" in outside.stderr
    unknown = ezflow_cli("perf", "waterfall", "--base", "no-such-ref", cwd=clone, timeout=60)
    assert unknown.returncode == 1
    assert "'no-such-ref' is not a commit of" in unknown.stderr
