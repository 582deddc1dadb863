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

Every figure is the median of the rounds (``--rounds``, 5 by default, the refs in
alternation) with their range, and each change gets a verdict (:mod:`._noise`):
"no change" when the difference is inside the noise of the comparison, else "better"
or "worse". A ref against itself comes out as no change in every cell.

Venvs are kept per commit in a cache directory (``waterfall`` in ezflow's cache
directory, as the peers' venvs: ``~/.cache/ezflow/waterfall``), so a
second run at the same refs installs nothing. ``--reuse-deps`` makes each venv see the
running environment's packages (numpy, uvloop, pip, ...) and installs ezflow alone
(``--no-deps``; pip still fetches the build backend): quick, and what the tests use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
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
from ._noise import NO_CHANGE, Figure, figure, typical_spread, verdict
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
    "Row",
    "Scenario",
    "WaterfallError",
    "compare_rows",
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
    rounds: int = 5


@dataclass(slots=True)
class RefResult:
    """Every run of one ref: pipeline results (``_pipeline.py`` JSON) and p2p cells."""

    ref: Ref
    pipelines: list[dict[str, Any]] = field(default_factory=list)  #: untraced runs
    traced: list[dict[str, Any]] = field(default_factory=list)  #: runs tracing every frame
    p2p: list[dict[str, Any]] = field(default_factory=list)
    p2p_error: str | None = None

    def end_to_end(self, q: float) -> list[float]:
        """Each round's end-to-end quantile *q* (0.5: the p50), in ns."""
        return [
            _quantile(run["end_to_end_ns"], q) for run in self.pipelines if run["end_to_end_ns"]
        ]

    def fps(self) -> list[float]:
        """Each round's frames per second."""
        return [run["count"] / run["elapsed"] for run in self.pipelines if run["elapsed"] > 0]

    def paths(self) -> list[list[PathSummary]]:
        """Each traced round's pipeline paths, busiest first."""
        return [summarize(run.get("traces") or ()) for run in self.traced]

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
            # The refs in turn, each first in every other round (no ref always runs on
            # a machine the other one warmed up). End to end untraced at both (alike:
            # tracing costs something), then the stages where the ref's ezflow traces.
            order = results if round_ % 2 else results[::-1]
            for result in order:
                log(f"round {round_}/{scenario.rounds}: pipeline at {result.ref.label}")
                run = run_pipeline(result.ref, scenario, workdir, trace=False)
                result.pipelines.append(run)
                if run.get("can_trace"):
                    log(f"round {round_}/{scenario.rounds}: traced pipeline at {result.ref.label}")
                    result.traced.append(run_pipeline(result.ref, scenario, workdir, trace=True))
            if not scenario.p2p:
                continue
            for result in order:
                if result.p2p_error is not None:
                    continue
                log(f"round {round_}/{scenario.rounds}: p2p at {result.ref.label}")
                try:
                    result.p2p.extend(run_p2p(result.ref, scenario, workdir))
                except WaterfallError as exc:
                    # An old ref without `perf run -s p2p`: the pipeline still compares.
                    result.p2p_error = str(exc).splitlines()[-1]
    return results


def _quantile(values: Sequence[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


#: The smallest gain a waterfall calls a change, whatever the spread (as ``compare``'s
#: ``--noise``).
NOISE_FLOOR = 0.1


@dataclass(frozen=True, slots=True)
class Row:
    """One figure at both refs: the rounds of each (median and range), the gain of new
    over base (> 1 is better) and the verdict (:func:`._noise.verdict`)."""

    section: str  #: "pipeline", "stages" or "p2p"
    label: str
    #: A stage name, "hop total", or a p2p figure ("msgs/s", "p50"); "" otherwise.
    part: str
    unit: str  #: "ns", "fps", "msgs/s" or "us"
    higher_is_better: bool
    base: Figure | None
    new: Figure | None
    gain: float | None = None
    verdict: str = NO_CHANGE

    def to_json(self) -> dict[str, Any]:
        def side(found: Figure | None) -> dict[str, Any] | None:
            if found is None:
                return None
            return {"median": found.median, "low": found.low, "high": found.high,
                    "rounds": list(found.samples)}  # fmt: skip

        return {
            "section": self.section, "label": self.label, "part": self.part,
            "unit": self.unit, "base": side(self.base), "new": side(self.new),
            "gain": self.gain, "verdict": self.verdict,
        }  # fmt: skip


def _stage_rows(base: RefResult, new: RefResult) -> list[Row]:
    """Per hop of the busiest path, its total and each stage: p50 per round."""
    sides = [r.paths() for r in (base, new)]
    chosen = [[paths[0] for paths in rounds if paths] for rounds in sides]
    hops = max((len(p.hops) for rounds in chosen for p in rounds), default=0)
    rows = []
    for index in range(hops):
        per_side = [[p.hops[index] for p in rounds if index < len(p.hops)] for rounds in chosen]
        known = next(hop for side in per_side for hop in side)
        label = f"{index + 1}. {known.topic} ({known.transport})"
        totals = [figure(h.total.p50 for h in side) for side in per_side]
        rows.append(Row("stages", label, "hop total", "ns", False, totals[0], totals[1]))
        for name in STAGES:
            found = [figure(h.stages[name].p50 for h in side) for side in per_side]
            rows.append(Row("stages", label, name, "ns", False, found[0], found[1]))
    return rows


def _p2p_key(cell: dict[str, Any]) -> str:
    variant = cell["variant"]
    return f"{cell['transport']} {cell['size']} B {variant['message']} {variant['receive']}"


def _p2p_rows(base: RefResult, new: RefResult) -> list[Row]:
    """Per p2p cell: msgs/s and paced p50, one value per round."""
    grouped: list[dict[str, list[dict[str, Any]]]] = []
    for result in (base, new):
        by_key: dict[str, list[dict[str, Any]]] = {}
        for cell in result.p2p:
            by_key.setdefault(_p2p_key(cell), []).append(cell["metrics"])
        grouped.append(by_key)
    rows = []
    for name in sorted(set(grouped[0]) | set(grouped[1])):
        for metric, part, unit, higher in (
            ("msgs_per_s", "msgs/s", "msgs/s", True),
            ("latency_p50_us", "p50", "us", False),
        ):
            found = [figure(m.get(metric) for m in side.get(name, ())) for side in grouped]
            rows.append(Row("p2p", name, part, unit, higher, found[0], found[1]))
    return rows


def compare_rows(base: RefResult, new: RefResult, *, noise: float = NOISE_FLOOR) -> list[Row]:
    """Every figure of the waterfall at both refs with its gain and verdict: the
    pipeline as a whole (end to end p50 and p99, frames/s), every hop's stages, the
    p2p cells. The noise band is that of this comparison (its typical spread over
    every row with both sides)."""
    rows = [
        Row("pipeline", "end to end p50", "", "ns", False,
            figure(base.end_to_end(0.5)), figure(new.end_to_end(0.5))),
        Row("pipeline", "end to end p99", "", "ns", False,
            figure(base.end_to_end(0.99)), figure(new.end_to_end(0.99))),
        Row("pipeline", "frames/s (paced)", "", "fps", True,
            figure(base.fps()), figure(new.fps())),
        *_stage_rows(base, new),
        *_p2p_rows(base, new),
    ]  # fmt: skip
    spread = typical_spread((r.base, r.new) for r in rows if r.base and r.new)
    judged = []
    for row in rows:
        if row.base is None or row.new is None:
            judged.append(row)
            continue
        gain, said = verdict(
            row.base, row.new, higher_is_better=row.higher_is_better, floor=noise, spread=spread
        )
        judged.append(dataclasses.replace(row, gain=gain, verdict=said))
    return judged


# -- rendering -------------------------------------------------------------------------------

_BAR = 36
_VERDICT_STYLES = {"better": "green", "worse": "red"}


def _time(ns: float | None) -> str:
    return "-" if ns is None else format_ns(int(ns))


def _value(row: Row, value: float) -> str:
    if row.unit == "ns":
        return _time(value)
    if row.unit == "us":
        return f"{value:.1f} µs"
    if row.unit == "fps":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def _side_text(row: Row, found: Figure | None) -> str:
    """The median of the rounds, ``±`` half their range in percent."""
    if found is None:
        return "-"
    return found.text(lambda value: _value(row, value), compact=True)


def _change(row: Row) -> str:
    """New against base as a signed percentage of the medians ("-" when unknown)."""
    if row.base is None or row.new is None or not row.base.median:
        return "-"
    return f"{(row.new.median - row.base.median) / row.base.median * 100:+.0f} %"


def _gain(row: Row) -> str:
    return "-" if row.gain is None else f"{row.gain:.2f}x"


def _verdict_text(row: Row) -> Text:
    return Text(row.verdict, style=_VERDICT_STYLES.get(row.verdict, "dim"))


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


def _span(rows: Sequence[Row]) -> float:
    """The longer of the two refs' paths: the sum of their stage medians (the bars'
    scale)."""
    stages = [row for row in rows if row.part != "hop total"]
    base = sum(r.base.median for r in stages if r.base is not None)
    new = sum(r.new.median for r in stages if r.new is not None)
    return max(1.0, base, new)


_NOISE_NOTE = (
    "Each figure: the median of the rounds, ± half their range (min-max) in % of the "
    f"median. {NO_CHANGE}: inside the noise (ranges that overlap, or a gain within 2-3 times "
    "the typical spread of this comparison, and at least 10 %)."
)


def render_waterfall(
    results: Sequence[RefResult], rows: Sequence[Row] | None = None
) -> RenderableType:
    """The before/after tables (rich) of a two-ref run."""
    base, new = results
    rows = list(rows) if rows is not None else compare_rows(base, new)
    parts: list[RenderableType] = [
        Text(f"ezflow perf waterfall: {base.ref.label} -> {new.ref.label}", style="bold"),
        Text(_NOISE_NOTE, style="dim"),
    ]
    summary = Table(title=_pipeline_title(base), title_justify="left")
    for column in ("", base.ref.name, new.ref.name, "change", "gain", "verdict"):
        summary.add_column(column, justify="left" if column in ("", "verdict") else "right")
    for row in rows:
        if row.section == "pipeline":
            summary.add_row(
                row.label, _side_text(row, row.base), _side_text(row, row.new), _change(row),
                _gain(row), _verdict_text(row),
            )  # fmt: skip
    parts.append(summary)
    stage_rows = [row for row in rows if row.section == "stages"]
    if stage_rows:
        stages = Table(
            title="where the time goes: p50 per hop and stage, along the pipeline",
            title_justify="left",
        )
        stages.add_column("hop / stage")
        for column in (base.ref.name, new.ref.name, "change"):
            stages.add_column(column, justify="right")
        stages.add_column("verdict")
        for ref in (base, new):
            stages.add_column(f"waterfall {ref.ref.name}", no_wrap=True)
        scale = _BAR / _span(stage_rows)
        offsets = [0.0, 0.0]
        for row in stage_rows:
            if row.part == "hop total":
                stages.add_row(
                    Text(row.label, style="bold"), _side_text(row, row.base),
                    _side_text(row, row.new), _change(row), _verdict_text(row),
                )  # fmt: skip
                continue
            style = STAGE_STYLES[row.part]
            bars = []
            for i, found in enumerate((row.base, row.new)):
                value = None if found is None else found.median
                bars.append(stage_bar(offsets[i], value, scale, style))
                offsets[i] += value or 0
            stages.add_row(
                f"   {row.part}", _side_text(row, row.base), _side_text(row, row.new),
                _change(row), _verdict_text(row), *bars,
            )  # fmt: skip
        parts.append(stages)
    missing = [r.ref.label for r in results if not any(run.get("traces") for run in r.traced)]
    if missing:
        parts.append(
            Text(
                f"no stages at {', '.join(missing)}: that ezflow does not trace (end to end only)",
                style="dim",
            )
        )
    p2p = [row for row in rows if row.section == "p2p"]
    if p2p:
        table = Table(
            title="p2p, the ordinary program (ezflow perf run -s p2p)", title_justify="left"
        )
        table.add_column("cell")
        table.add_column("figure")
        for column in (base.ref.name, new.ref.name, "gain"):
            table.add_column(column, justify="right")
        table.add_column("verdict")
        for row in p2p:
            table.add_row(
                row.label, row.part, _side_text(row, row.base), _side_text(row, row.new),
                _gain(row), _verdict_text(row),
            )  # fmt: skip
        parts.append(table)
    for result in results:
        if result.p2p_error:
            parts.append(Text(f"p2p at {result.ref.label}: {result.p2p_error}", style="dim"))
    return Group(*parts)


def render_html(results: Sequence[RefResult], rows: Sequence[Row] | None = None) -> str:
    """The same tables as a self-contained HTML page (the perf report's style), each
    stage a bar at its place along the pipeline."""
    base, new = results
    rows = list(rows) if rows is not None else compare_rows(base, new)
    title = f"{base.ref.label} -> {new.ref.label}"

    def cells(row: Row) -> str:
        return (
            f"<td class=n>{_esc(_side_text(row, row.base))}</td>"
            f"<td class=n>{_esc(_side_text(row, row.new))}</td>"
            f"<td class=n>{_esc(_change(row))}</td><td class=n>{_esc(_gain(row))}</td>"
            f"<td class=v-{_esc(row.verdict.replace(' ', '-'))}>{_esc(row.verdict)}</td>"
        )

    summary = "".join(
        f"<tr><td>{_esc(row.label)}</td>{cells(row)}</tr>"
        for row in rows
        if row.section == "pipeline"
    )
    stage_rows = [row for row in rows if row.section == "stages"]
    width = _span(stage_rows)
    offsets = [0.0, 0.0]
    stage_html = []
    for row in stage_rows:
        if row.part == "hop total":
            stage_html.append(
                f"<tr class=hop><td>{_esc(row.label)}</td>{cells(row)}<td></td><td></td></tr>"
            )
            continue
        colour = STAGE_STYLES[row.part]
        bars = []
        for i, found in enumerate((row.base, row.new)):
            if found is None:
                bars.append("<td></td>")
                continue
            value = found.median
            bars.append(
                f'<td class=bar><div style="margin-left:{offsets[i] / width * 100:.2f}%;'
                f'width:{max(value / width * 100, 0.3):.2f}%;background:{colour}"></div></td>'
            )
            offsets[i] += value
        stage_html.append(
            f"<tr><td>&nbsp;&nbsp;{_esc(row.part)}</td>{cells(row)}" + "".join(bars) + "</tr>"
        )
    p2p = "".join(
        f"<tr><td>{_esc(row.label)}</td><td>{_esc(row.part)}</td>{cells(row)}</tr>"
        for row in rows
        if row.section == "p2p"
    )
    legend = " ".join(
        f'<span style="color:{colour}">&#9632;</span> {name}'
        for name, colour in STAGE_STYLES.items()
    )
    b, n = _esc(base.ref.name), _esc(new.ref.name)
    head = f"<th>{b}</th><th>{n}</th><th>change</th><th>gain</th><th>verdict</th>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ezflow perf waterfall: {_esc(title)}</title>
<style>{_STYLE}
td.bar {{ width: 22em; padding: 0 }} td.bar div {{ height: 0.9em }}
tr.hop td {{ font-weight: bold }} td.v-better {{ color: #080 }} td.v-worse {{ color: #b00 }}
td.v-no-change {{ color: #888 }}
</style></head><body>
<h1>ezflow perf waterfall: {_esc(title)}</h1>
<section class=summary>
<p>The same scenarios at two git refs, each installed in its own virtualenv, run in
alternation. <b>Stages</b> of a hop: publish (room wait, encode, write), transport (to
the receiving process), decode, queue (until the subscriber takes it), handler (until
the publish it causes). Times are medians (p50); <b>change</b> is new against base,
<b>gain</b> how many times better new is. {_esc(_NOISE_NOTE)} Figures from different
runs are not comparable: only the refs of this run, measured in alternation, are.</p>
</section>
<h2>{_esc(_pipeline_title(base))}</h2>
<table><tr><th></th>{head}</tr>{summary}</table>
<h2>Where the time goes</h2>
<p>{legend}</p>
<table><tr><th>hop / stage</th>{head}
<th>waterfall {b}</th><th>waterfall {n}</th></tr>{
        "".join(stage_html) or "<tr><td colspan=8>no stages: neither ref traces</td></tr>"
    }</table>
<h2>p2p, the ordinary program</h2>
<table><tr><th>cell</th><th>figure</th>{head}</tr>{
        p2p or "<tr><td colspan=7>not run</td></tr>"
    }</table>
</body></html>
"""
