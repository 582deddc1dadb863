"""``ezflow perf waterfall``: the same scenarios at two git refs, before and after, per
pipeline, hop and stage.

For each ref: ``git worktree add --detach`` into a temporary directory, a virtualenv of
its own, and the project's install command (``pip install <worktree>``) into it; the
worktree goes once installed. Then, alternating between the refs (``--rounds``), two
scenarios run under each ref's ezflow:

* **pipeline**: ``_pipeline.py`` (this checkout's copy, which needs nothing of ezflow
  but its public API): N hops, one process per relay, a 4K frame by default, paced like
  video. Per frame end to end, frames per second, and - when the ref's ezflow traces -
  every hop's stages;
* **p2p**: ``ezflow perf run -s p2p`` of the ref itself (the ordinary program, a tuple
  under plain ``asyncio.run``): msgs/s and paced one-way p50 per transport and size.

Venvs are kept per commit in a cache directory (``waterfall`` in ezflow's cache
directory, as the peers' venvs: ``~/.cache/ezflow/waterfall``), so a
second run at the same refs installs nothing. ``--reuse-deps`` makes each venv see the
running environment's packages (numpy, uvloop, pip, ...) and installs ezflow alone
(``--no-deps``; pip still fetches the build backend): quick, and what the tests use.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import venv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .._core._exceptions import EzflowError
from .._core._telemetry import format_ns
from .._core._tracing import STAGES
from .._graph._traces import STAGE_STYLES, PathSummary, stage_bar, summarize
from ._peers._install import (
    INSTALL_TIMEOUT,
    cache_root,
    output_tail,
    python_of,
    site_packages,
)
from ._report import _STYLE, _esc

__all__ = [
    "Ref",
    "Scenario",
    "WaterfallError",
    "default_cache",
    "install_ref",
    "render_html",
    "render_waterfall",
    "repository_root",
    "resolve_ref",
    "run_waterfall",
]

PIPELINE_SCRIPT = Path(__file__).with_name("_pipeline.py")
# Seconds a scenario run may take (an install: INSTALL_TIMEOUT, as a peer's).
RUN_TIMEOUT = 600.0


class WaterfallError(EzflowError):
    """A step of ``ezflow perf waterfall`` failed (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class Ref:
    """A git ref as given, the commit it names, and the python of its install."""

    name: str
    commit: str
    python: Path

    @property
    def label(self) -> str:
        return f"{self.name} ({self.commit[:10]})"


@dataclass(frozen=True, slots=True)
class Scenario:
    """What runs at both refs."""

    hops: int = 3
    frame: str = "4k"
    count: int = 60
    period: float = 1 / 30
    p2p: bool = True
    p2p_transports: tuple[str, ...] = ("shm", "tcp")
    p2p_sizes: tuple[str, ...] = ("64B", "1MiB")
    p2p_duration: float = 1.0
    rounds: int = 1


@dataclass(slots=True)
class RefResult:
    """Every run of one ref: pipeline results (``_pipeline.py`` JSON) and p2p cells."""

    ref: Ref
    pipelines: list[dict[str, Any]] = field(default_factory=list)  #: untraced runs
    traced: list[dict[str, Any]] = field(default_factory=list)  #: runs tracing every frame
    p2p: list[dict[str, Any]] = field(default_factory=list)
    p2p_error: str | None = None

    def end_to_end(self) -> list[int]:
        return [ns for run in self.pipelines for ns in run["end_to_end_ns"]]

    def fps(self) -> float | None:
        rates = [run["count"] / run["elapsed"] for run in self.pipelines if run["elapsed"] > 0]
        return statistics.median(rates) if rates else None

    def paths(self) -> list[PathSummary]:
        hops = [hop for run in self.traced for hop in run.get("traces") or ()]
        return summarize(hops)

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref.name,
            "commit": self.ref.commit,
            "pipelines": self.pipelines,
            "traced": self.traced,
            "p2p": self.p2p,
            "p2p_error": self.p2p_error,
        }


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError as exc:
        raise WaterfallError("git is not installed: ezflow perf waterfall needs it") from exc
    if done.returncode != 0:
        raise WaterfallError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def repository_root(start: Path) -> Path:
    """The git checkout *start* is in; :class:`WaterfallError` when none."""
    try:
        return Path(_git(start, "rev-parse", "--show-toplevel"))
    except WaterfallError as exc:
        raise WaterfallError(
            f"{start} is not in a git checkout of ezflow: run ezflow perf waterfall from one"
        ) from exc


def resolve_ref(repo: Path, ref: str) -> str:
    """The commit *ref* names in *repo*; :class:`WaterfallError` when it names none."""
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except WaterfallError:
        raise WaterfallError(
            f"{ref!r} is not a commit of {repo} (a branch, tag, sha or HEAD~N)"
        ) from None


def _run_step(argv: Sequence[str], what: str, timeout: float, **kwargs: Any) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
        )
    except subprocess.TimeoutExpired as exc:
        raise WaterfallError(f"{what} took more than {timeout:.0f} s") from exc
    if done.returncode != 0:
        tail = output_tail(done.stdout + done.stderr, Path(argv[0]).name)
        raise WaterfallError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return str(done.stdout)


def default_cache() -> Path:
    """Where the venvs of each commit are kept: ``waterfall`` in ezflow's cache
    directory (``$XDG_CACHE_HOME/ezflow``, else ``~/.cache/ezflow``)."""
    return cache_root() / "waterfall"


def install_ref(
    repo: Path,
    name: str,
    commit: str,
    cache: Path,
    *,
    reuse_deps: bool,
    log: Callable[[str], None],
) -> Ref:
    """A virtualenv with *commit*'s ezflow installed: from *cache* when an earlier run
    made it, else made there now (from a temporary worktree, removed afterwards)."""
    venv_dir = cache / f"{commit}{'-reuse' if reuse_deps else ''}"
    python = python_of(venv_dir)
    if (venv_dir / "ezflow-installed").exists() and python.exists():
        log(f"{name}: using the venv of {commit[:10]} in {venv_dir}")
        return Ref(name, commit, python)
    shutil.rmtree(venv_dir, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ezflow-waterfall-") as tmp:
        tree = Path(tmp) / "tree"
        log(f"{name}: checking out {commit[:10]} into a temporary worktree")
        _git(repo, "worktree", "add", "--detach", str(tree), commit)
        try:
            log(f"{name}: creating {venv_dir}")
            # (--reuse-deps: no pip of its own; this environment's serves)
            venv.EnvBuilder(
                with_pip=not reuse_deps, clear=True, symlinks=sys.platform != "win32"
            ).create(venv_dir)
            if reuse_deps:
                # The running environment's packages after the venv's own: ezflow comes
                # from the venv (only .pth files of site dirs run, so an editable
                # ezflow of the running environment stays out).
                paths = dict.fromkeys(
                    [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
                )
                site = site_packages(venv_dir)
                (site / "_ezflow_waterfall_deps.pth").write_text("\n".join(paths) + "\n")
            install = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            if reuse_deps:
                install.append("--no-deps")
            log(f"{name}: pip install {'--no-deps ' if reuse_deps else ''}<worktree>")
            _run_step([*install, str(tree)], f"installing {name} ({commit[:10]})", INSTALL_TIMEOUT)
        except BaseException:
            shutil.rmtree(venv_dir, ignore_errors=True)
            raise
        finally:
            with contextlib.suppress(WaterfallError):
                _git(repo, "worktree", "remove", "--force", str(tree))
    (venv_dir / "ezflow-installed").write_text(commit + "\n")
    return Ref(name, commit, python)


def _clean_env() -> dict[str, str]:
    # The ref's own ezflow, whatever this process was started with.
    env = {k: v for k, v in os.environ.items() if not k.startswith("EZFLOW_")}
    env.pop("PYTHONPATH", None)
    return env


def run_pipeline(ref: Ref, scenario: Scenario, workdir: Path, *, trace: bool) -> dict[str, Any]:
    """One pipeline run under *ref*'s ezflow (*trace*: every frame traced, when that
    ezflow can); its ``_pipeline.py`` result."""
    script = workdir / "_pipeline.py"
    if not script.exists():
        shutil.copyfile(PIPELINE_SCRIPT, script)
    output = workdir / f"pipeline-{ref.commit[:10]}.json"
    argv = [
        str(ref.python),
        str(script),
        *("--hops", str(scenario.hops), "--frame", scenario.frame),
        *("--count", str(scenario.count), "--period", repr(scenario.period), "-o", str(output)),
        *(() if trace else ("--no-trace",)),
    ]
    _run_step(argv, f"the pipeline at {ref.label}", RUN_TIMEOUT, env=_clean_env(), cwd=workdir)
    result: dict[str, Any] = json.loads(output.read_text())
    return result


def run_p2p(ref: Ref, scenario: Scenario, workdir: Path) -> list[dict[str, Any]]:
    """``ezflow perf run -s p2p`` of *ref*; its ok cells."""
    output = workdir / f"p2p-{ref.commit[:10]}.json"
    argv = [
        *(str(ref.python), "-m", "ezflow", "perf", "run", "-s", "p2p"),
        *("-t", ",".join(scenario.p2p_transports), "--size", ",".join(scenario.p2p_sizes)),
        *("--duration", repr(scenario.p2p_duration), "--repeats", "1"),
        *("--min-messages", "2000", "--latency-samples", "200", "-o", str(output)),
    ]
    _run_step(
        argv, f"ezflow perf run -s p2p at {ref.label}", RUN_TIMEOUT, env=_clean_env(), cwd=workdir
    )
    cells = json.loads(output.read_text())["cells"]
    return [cell for cell in cells if cell["status"] == "ok" and cell["framework"] == "ezflow"]


def run_waterfall(
    refs: Sequence[Ref], scenario: Scenario, log: Callable[[str], None]
) -> list[RefResult]:
    """Every scenario at every ref, alternating round by round (drift on a shared machine
    then falls on both alike)."""
    results = [RefResult(ref) for ref in refs]
    with tempfile.TemporaryDirectory(prefix="ezflow-waterfall-runs-") as tmp:
        workdir = Path(tmp)
        for round_ in range(1, scenario.rounds + 1):
            # End to end untraced at both (alike: tracing costs something), then the
            # stages where the ref's ezflow traces.
            for result in results:
                log(f"round {round_}/{scenario.rounds}: pipeline at {result.ref.label}")
                run = run_pipeline(result.ref, scenario, workdir, trace=False)
                result.pipelines.append(run)
                if run.get("can_trace"):
                    log(f"round {round_}/{scenario.rounds}: traced pipeline at {result.ref.label}")
                    result.traced.append(run_pipeline(result.ref, scenario, workdir, trace=True))
            if not scenario.p2p:
                continue
            for result in results:
                if result.p2p_error is not None:
                    continue
                log(f"round {round_}/{scenario.rounds}: p2p at {result.ref.label}")
                try:
                    result.p2p.extend(run_p2p(result.ref, scenario, workdir))
                except WaterfallError as exc:
                    # An old ref without `perf run -s p2p`: the pipeline still compares.
                    result.p2p_error = str(exc).splitlines()[-1]
    return results


def stage_rows(base: RefResult, new: RefResult) -> list[tuple[str, str, int | None, int | None]]:
    """(hop label, "hop total" or a stage, base p50 ns, new p50 ns) for the busiest
    path of each ref, hop by hop, each hop's total first (a ref without traces gives
    None)."""
    paths = [r.paths() for r in (base, new)]
    chosen = [p[0] if p else None for p in paths]
    hops = max((len(p.hops) for p in chosen if p is not None), default=0)
    rows: list[tuple[str, str, int | None, int | None]] = []
    for index in range(hops):
        hop = [p.hops[index] if p is not None and index < len(p.hops) else None for p in chosen]
        known = next(h for h in hop if h is not None)
        label = f"{index + 1}. {known.topic} ({known.transport})"
        totals = [None if h is None else h.total.p50 for h in hop]
        rows.append((label, "hop total", totals[0], totals[1]))
        for name in STAGES:
            values = [None if h is None else h.stages[name].p50 for h in hop]
            rows.append((label, name, values[0], values[1]))
    return rows


def p2p_rows(
    base: RefResult, new: RefResult
) -> list[tuple[str, float | None, float | None, float | None, float | None]]:
    """(cell, base msgs/s, new msgs/s, base p50 µs, new p50 µs) per p2p cell, medians
    over the rounds."""

    def key(cell: dict[str, Any]) -> str:
        variant = cell["variant"]
        return f"{cell['transport']} {cell['size']} B {variant['message']} {variant['receive']}"

    def medians(result: RefResult) -> dict[str, tuple[float, float | None]]:
        grouped: dict[str, list[dict[str, Any]]] = {}
        for cell in result.p2p:
            grouped.setdefault(key(cell), []).append(cell["metrics"])
        out = {}
        for name, metrics in grouped.items():
            rates = [m["msgs_per_s"] for m in metrics if m.get("msgs_per_s") is not None]
            p50s = [m["latency_p50_us"] for m in metrics if m.get("latency_p50_us") is not None]
            out[name] = (
                statistics.median(rates) if rates else 0.0,
                statistics.median(p50s) if p50s else None,
            )
        return out

    before, after = medians(base), medians(new)
    rows = []
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name), after.get(name)
        rows.append(
            (
                name,
                None if b is None else b[0],
                None if a is None else a[0],
                None if b is None else b[1],
                None if a is None else a[1],
            )
        )
    return rows


def median_or_none(values: Sequence[int]) -> float | None:
    return statistics.median(values) if values else None


# -- rendering -------------------------------------------------------------------------------

_BAR = 36


def _time(ns: float | None) -> str:
    return "-" if ns is None else format_ns(int(ns))


def _change(before: float | None, after: float | None) -> str:
    """after vs before as a signed percentage ("-" when either is unknown)."""
    if before is None or after is None or before == 0:
        return "-"
    return f"{(after - before) / before * 100:+.0f} %"


def _gain(before: float | None, after: float | None, *, lower_is_better: bool) -> str:
    if not before or not after:
        return "-"
    ratio = before / after if lower_is_better else after / before
    return f"{ratio:.2f}x"


def _pipeline_title(result: RefResult) -> str:
    if not result.pipelines:
        return "pipeline"
    run = result.pipelines[0]
    frame = "x".join(str(n) for n in run["frame"])
    return (
        f"pipeline: {run['hops']} hops, one process per relay, {frame} uint8 frames "
        f"({run['frame_bytes'] / 1e6:.1f} MB) every {run['period'] * 1e3:.1f} ms, "
        f"{run['count']} frames x {len(result.pipelines)} round(s)"
    )


def summary_rows(base: RefResult, new: RefResult) -> list[tuple[str, str, str, str, str]]:
    """(what, base, new, change, gain) of the pipeline as a whole."""
    rows = []
    e2e = [sorted(r.end_to_end()) for r in (base, new)]
    for name, q in (("end to end p50", 0.5), ("end to end p99", 0.99)):
        values = [v[min(len(v) - 1, int(q * len(v)))] if v else None for v in e2e]
        rows.append(
            (
                name,
                _time(values[0]),
                _time(values[1]),
                _change(values[0], values[1]),
                _gain(values[0], values[1], lower_is_better=True),
            )
        )
    fps = [base.fps(), new.fps()]
    rows.append(
        (
            "frames/s (paced)",
            "-" if fps[0] is None else f"{fps[0]:.1f}",
            "-" if fps[1] is None else f"{fps[1]:.1f}",
            _change(fps[0], fps[1]),
            _gain(fps[0], fps[1], lower_is_better=False),
        )
    )
    return rows


def _span(rows: Sequence[tuple[str, str, int | None, int | None]]) -> int:
    """The longer of the two refs' paths: the sum of their stages (the bars' scale)."""
    stages = [row for row in rows if row[1] != "hop total"]
    return max(1, sum(r[2] or 0 for r in stages), sum(r[3] or 0 for r in stages))


def render_waterfall(results: Sequence[RefResult]) -> RenderableType:
    """The before/after tables (rich) of a two-ref run."""
    base, new = results
    parts: list[RenderableType] = [
        Text(f"ezflow perf waterfall: {base.ref.label} -> {new.ref.label}", style="bold")
    ]
    summary = Table(title=_pipeline_title(base), title_justify="left")
    for column in ("", base.ref.name, new.ref.name, "change", "gain"):
        summary.add_column(column, justify="left" if not column else "right")
    for row in summary_rows(base, new):
        summary.add_row(*row)
    parts.append(summary)
    rows = stage_rows(base, new)
    if rows:
        stages = Table(
            title="where the time goes: p50 per hop and stage, along the pipeline",
            title_justify="left",
        )
        stages.add_column("hop / stage")
        for column in (base.ref.name, new.ref.name, "change"):
            stages.add_column(column, justify="right")
        for ref in (base, new):
            stages.add_column(f"waterfall {ref.ref.name}", no_wrap=True)
        scale = _BAR / _span(rows)
        offsets = [0.0, 0.0]
        for label, stage, before, after in rows:
            if stage == "hop total":
                stages.add_row(
                    Text(label, style="bold"), _time(before), _time(after), _change(before, after)
                )
                continue
            style = STAGE_STYLES[stage]
            bars = []
            for i, value in enumerate((before, after)):
                bars.append(stage_bar(offsets[i], value, scale, style))
                offsets[i] += value or 0
            stages.add_row(
                f"   {stage}", _time(before), _time(after), _change(before, after), *bars
            )
        parts.append(stages)
    missing = [r.ref.label for r in results if not any(run.get("traces") for run in r.traced)]
    if missing:
        parts.append(
            Text(
                f"no stages at {', '.join(missing)}: that ezflow does not trace (end to end only)",
                style="dim",
            )
        )
    p2p = p2p_rows(base, new)
    if p2p:
        table = Table(
            title="p2p, the ordinary program (ezflow perf run -s p2p)", title_justify="left"
        )
        for column in ("cell", f"msgs/s {base.ref.name}", f"msgs/s {new.ref.name}", "gain"):
            table.add_column(column, justify="left" if column == "cell" else "right")
        for column in (f"p50 {base.ref.name}", f"p50 {new.ref.name}", "gain "):
            table.add_column(column, justify="right")
        for name, rate_b, rate_n, p50_b, p50_n in p2p:
            table.add_row(
                name,
                "-" if rate_b is None else f"{rate_b:,.0f}",
                "-" if rate_n is None else f"{rate_n:,.0f}",
                _gain(rate_b, rate_n, lower_is_better=False),
                "-" if p50_b is None else f"{p50_b:.1f} µs",
                "-" if p50_n is None else f"{p50_n:.1f} µs",
                _gain(p50_b, p50_n, lower_is_better=True),
            )
        parts.append(table)
    for result in results:
        if result.p2p_error:
            parts.append(Text(f"p2p at {result.ref.label}: {result.p2p_error}", style="dim"))
    return Group(*parts)


def render_html(results: Sequence[RefResult]) -> str:
    """The same tables as a self-contained HTML page (the perf report's style), each
    stage a bar at its place along the pipeline."""
    base, new = results
    title = f"{base.ref.label} -> {new.ref.label}"
    summary = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i else ''}>{_esc(v)}</td>" for i, v in enumerate(row))
        + "</tr>"
        for row in summary_rows(base, new)
    )
    rows = stage_rows(base, new)
    width = _span(rows)
    offsets = [0.0, 0.0]
    stage_html = []
    for label, stage, before, after in rows:
        if stage == "hop total":
            stage_html.append(
                f"<tr class=hop><td>{_esc(label)}</td><td class=n>{_time(before)}</td>"
                f"<td class=n>{_time(after)}</td><td class=n>{_change(before, after)}</td>"
                "<td></td><td></td></tr>"
            )
            continue
        colour = STAGE_STYLES[stage]
        bars = []
        for i, value in enumerate((before, after)):
            if value is None:
                bars.append("<td></td>")
                continue
            bars.append(
                f'<td class=bar><div style="margin-left:{offsets[i] / width * 100:.2f}%;'
                f'width:{max(value / width * 100, 0.3):.2f}%;background:{colour}"></div></td>'
            )
            offsets[i] += value
        stage_html.append(
            f"<tr><td>&nbsp;&nbsp;{_esc(stage)}</td><td class=n>{_time(before)}</td>"
            f"<td class=n>{_time(after)}</td><td class=n>{_change(before, after)}</td>"
            + "".join(bars)
            + "</tr>"
        )
    p2p = "".join(
        f"<tr><td>{_esc(name)}</td><td class=n>{'-' if b is None else f'{b:,.0f}'}</td>"
        f"<td class=n>{'-' if a is None else f'{a:,.0f}'}</td>"
        f"<td class=n>{_gain(b, a, lower_is_better=False)}</td>"
        f"<td class=n>{'-' if pb is None else f'{pb:.1f}'}</td>"
        f"<td class=n>{'-' if pa is None else f'{pa:.1f}'}</td>"
        f"<td class=n>{_gain(pb, pa, lower_is_better=True)}</td></tr>"
        for name, b, a, pb, pa in p2p_rows(base, new)
    )
    legend = " ".join(
        f'<span style="color:{colour}">&#9632;</span> {name}'
        for name, colour in STAGE_STYLES.items()
    )
    b, n = _esc(base.ref.name), _esc(new.ref.name)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ezflow perf waterfall: {_esc(title)}</title>
<style>{_STYLE}
td.bar {{ width: 22em; padding: 0 }} td.bar div {{ height: 0.9em }}
tr.hop td {{ font-weight: bold }}
</style></head><body>
<h1>ezflow perf waterfall: {_esc(title)}</h1>
<section class=summary>
<p>The same scenarios at two git refs, each installed in its own virtualenv, run in
alternation. <b>Stages</b> of a hop: publish (room wait, encode, write), transport (to
the receiving process), decode, queue (until the subscriber takes it), handler (until
the publish it causes). Times are medians (p50); <b>change</b> is new against base,
<b>gain</b> how many times better new is.</p>
</section>
<h2>{_esc(_pipeline_title(base))}</h2>
<table><tr><th></th><th>{b}</th><th>{n}</th><th>change</th><th>gain</th></tr>{summary}</table>
<h2>Where the time goes</h2>
<p>{legend}</p>
<table><tr><th>hop / stage</th><th>{b}</th><th>{n}</th><th>change</th>
<th>waterfall {b}</th><th>waterfall {n}</th></tr>{
        "".join(stage_html) or "<tr><td colspan=6>no stages: neither ref traces</td></tr>"
    }</table>
<h2>p2p, the ordinary program</h2>
<table><tr><th>cell</th><th>msgs/s {b}</th><th>msgs/s {n}</th><th>gain</th>
<th>p50 µs {b}</th><th>p50 µs {n}</th><th>gain</th></tr>{
        p2p or "<tr><td colspan=7>not run</td></tr>"
    }</table>
</body></html>
"""
