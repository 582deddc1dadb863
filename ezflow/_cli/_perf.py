"""``ezflow perf run | compare | report | peers | waterfall | schema``, and the research
benchmarks ``sigproc | startup | bridge`` (each module imported only by its command)."""

from __future__ import annotations

import asyncio
import datetime
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .._core._loop import run_coroutine
from .._perf import _compare, _report, _runner, _schema, _tables, _waterfall
from .._perf._spec import (
    QUICK,
    STANDARD,
    SUITES,
    TRANSPORTS,
    Cell,
    Plan,
    SpecError,
    Variant,
    format_size,
    parse_size,
    parse_variant,
)

__all__ = ["app"]

app = typer.Typer(
    help="Benchmarks: the p2p suite (the program users write, 1 -> 1) and the fan-out, "
    "fan-in, relay and spread suites over local, shm and tcp, next to the raw floor of "
    "the machine (and, on request, peer frameworks).",
    no_args_is_help=True,
)

# Wide tables stay readable when piped or captured (rich uses 80 columns then).
_console = Console() if sys.stdout.isatty() else Console(width=200)
_errors = Console(stderr=True, soft_wrap=True)  # one error, one line

DEFAULT_SIZES = ("64B", "1KiB", "64KiB", "1MiB")
QUICK_SIZES = ("1KiB", "1MiB")
#: ``--variant all``: the ordinary program, each change alone, and all of the fast ones
#: together (what the old headline measured).
ALL_VARIANTS = ("ordinary", "array", "uvloop", "on_message", "loan", "array+uvloop+on_message")


def _fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, no traceback, exit *code*; *message* as it is (no markup)."""
    _errors.print(f"[red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def _choose(values: list[str] | None, allowed: tuple[str, ...], what: str) -> list[str]:
    """*values* split on commas, each checked against *allowed*; all of them when none."""
    if not values:
        return list(allowed)
    chosen: list[str] = []
    for value in values:
        for item in (part.strip() for part in value.split(",")):
            if item not in allowed:
                _fail(f"unknown {what} {item!r}; use one of {', '.join(allowed)}")
            if item not in chosen:
                chosen.append(item)
    return chosen


def _inline_limit(text: str | None) -> int | None:
    """``--shm-inline-limit``: 0, or a size :func:`parse_size` reads; raises SpecError."""
    if text is None:
        return None
    return 0 if text.strip() == "0" else parse_size(text)


def _variants(values: list[str] | None) -> list[Variant]:
    """The p2p variants of ``--variant`` (comma-separated or repeated; ``all`` for
    :data:`ALL_VARIANTS`), the ordinary program when none; raises SpecError."""
    texts = [part.strip() for value in values or ["ordinary"] for part in value.split(",")]
    expanded = [text for part in texts for text in (ALL_VARIANTS if part == "all" else (part,))]
    return list(dict.fromkeys(parse_variant(text) for text in expanded))


def _cells(
    suites: list[str],
    transports: list[str],
    sizes: list[int],
    clients: list[int],
    variants: list[Variant],
) -> list[Cell]:
    """Every combination; p2p cells by variant (N is 1), the others by N."""
    return [
        Cell(suite, transport, size, n, variant)
        for suite in suites
        for transport in transports
        for size in sizes
        for n, variant in (
            [(1, variant) for variant in variants]
            if suite == "p2p"
            else [(n, None) for n in clients]
        )
    ]


@app.command()
def run(  # noqa: PLR0917 - one parameter per command-line option
    suite: Annotated[
        list[str] | None,
        typer.Option(
            "--suite", "-s", help=f"Suites (repeat or comma-separate): {', '.join(SUITES)}."
        ),
    ] = None,
    transport: Annotated[
        list[str] | None,
        typer.Option("--transport", "-t", help=f"Transports: {', '.join(TRANSPORTS)}."),
    ] = None,
    size: Annotated[
        list[str] | None,
        typer.Option(
            "--size",
            help="Message sizes (repeat or comma-separate) such as 64B, 1KiB, 1MiB, or "
            "frame (a 3840x2160x3 uint8 frame, paced at 10 ms; p2p) "
            f"(default: {', '.join(DEFAULT_SIZES)}; --quick: {', '.join(QUICK_SIZES)}).",
        ),
    ] = None,
    clients: Annotated[
        list[int] | None,
        typer.Option(
            "--clients", "-n", help="N: sinks, sources or relays (default 4; p2p: always 1)."
        ),
    ] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            "--variant",
            "-V",
            help="p2p variants (repeat or comma-separate): ordinary (the default: tuple "
            "message, asyncio.run, recv), or words joined with '+' among array, mixed, pair, "
            "uvloop, on_message, loan, e.g. array+uvloop+on_message; 'all' for "
            f"{', '.join(ALL_VARIANTS)}. Peers run the ordinary program only.",
        ),
    ] = None,
    min_messages: Annotated[
        int | None,
        typer.Option(
            help="p2p: back-to-back runs at least this many messages too (default 20000; "
            "--quick: 5000), within a time limit."
        ),
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Seconds of back-to-back publishing per cell.")
    ] = None,
    count: Annotated[
        int | None, typer.Option(help="At most this many back-to-back messages per source.")
    ] = None,
    latency_samples: Annotated[
        int | None, typer.Option(help="Paced messages per source for the latency figures.")
    ] = None,
    period: Annotated[
        float | None, typer.Option(help="Pacing of the latency phase, in seconds (default 0.001).")
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats",
            "--rounds",
            help="Rounds (default 3): every cell once per round, frameworks back to back; "
            "each figure is the median of the rounds, shown with their spread.",
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="One short round (0.5 s; p2p 5,000 messages), 2 sizes: no spread, a "
            "quick look only.",
        ),
    ] = False,
    peer: Annotated[
        list[str] | None,
        typer.Option(
            help="A peer framework's worker command (speaking the protocol of "
            "ezflow._perf._worker), run back to back with ezflow cell by cell.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Results file (default ezflow-perf-TIME.json)."),
    ] = None,
    loan: Annotated[
        bool,
        typer.Option(
            "--loan/--no-loan",
            help="fanout/fanin/relay/spread: sources fill buffers the framework lends "
            "(ezflow: shared memory, 64 KiB and up) instead of private arrays (p2p: see "
            "--variant loan).",
        ),
    ] = True,
    profile: Annotated[
        Path | None,
        typer.Option(help="Directory for the cProfile statistics of every worker process."),
    ] = None,
    shm_inline_limit: Annotated[
        str | None,
        typer.Option(
            help="ezflow's ShmOptions.inline_limit for every shm publisher, e.g. 0 (every "
            "message through shared memory) or 64MiB (every message inline): run both "
            "across sizes and `compare` them to find the crossover.",
        ),
    ] = None,
) -> None:
    """Run the suites and save the results as JSON (see `ezflow perf schema`)."""
    base = QUICK if quick else STANDARD
    seconds = base.duration if duration is None else duration
    try:
        plan = Plan(
            duration=seconds,
            count=count,
            warmup=min(base.warmup, seconds / 4),
            latency_samples=base.latency_samples if latency_samples is None else latency_samples,
            latency_seconds=base.latency_seconds,
            period=base.period if period is None else period,
            repeats=base.repeats if repeats is None else repeats,
            floor_round_trips=base.floor_round_trips,
            loan=loan,
            min_messages=base.min_messages if min_messages is None else min_messages,
            max_duration=max(base.max_duration, seconds),
            shm_inline_limit=_inline_limit(shm_inline_limit),
        )
        texts = size or (QUICK_SIZES if quick else DEFAULT_SIZES)
        sizes = [parse_size(text) for value in texts for text in value.split(",")]
        cells = _cells(
            _choose(suite, SUITES, "suite"),
            _choose(transport, TRANSPORTS, "transport"),
            list(dict.fromkeys(sizes)),
            list(dict.fromkeys(clients or [4])),
            _variants(variant),
        )
    except SpecError as exc:
        _fail(str(exc))
    peers = [shlex.split(command) for command in peer or ()]
    if any(not command for command in peers):
        _fail("--peer needs a command, e.g. 'python -m mypeer' (see docs/perf.md)")
    if output is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        output = Path(f"ezflow-perf-{stamp}.json")
    if output.parent and not output.parent.is_dir():
        _fail(f"cannot write {output}: {output.parent} is not a directory")
    if profile is not None:
        if not profile.is_dir():
            _fail(f"--profile {profile}: not a directory")
        profile = profile.resolve()
    document = _run_live(cells, plan, peers, None if profile is None else str(profile))
    errors = _schema.validate(document)
    output.write_text(json.dumps(document, indent=1) + "\n")
    compact = _console.width < 150
    title = "ezflow perf: medians"
    _console.print(_tables.results_table(document["cells"], title=title, compact=compact))
    for line in _tables.reasons(document["cells"]):
        _console.print(f"  {line}", highlight=False, markup=False)
    rows = _compare.peer_rows(document)
    if rows:
        _console.print(_tables.peer_table(rows))
    floor = document["floor"]
    p2p_floor = _tables.floor_table(floor)
    if p2p_floor is not None:
        _console.print(p2p_floor)
    rtts = ", ".join(
        f"{format_size(entry['size'])} {entry['p50']:.1f} µs"
        for entry in floor["socketpair_rtt_us"]
    )
    copies = ", ".join(
        f"{format_size(entry['size'])} {entry['us']:.2f} µs" for entry in floor.get("memcpy_us", ())
    )
    _console.print(
        f"floor: socketpair round trip p50 {rtts} (one-way floor = half); one copy {copies}; "
        f"memcpy {floor['memcpy_gb_per_s']:.1f} GB/s",
        highlight=False,
    )
    _console.print(f"wrote {output} in {document['wall_seconds']:.1f} s", highlight=False)
    if errors:  # a bug in the runner, not in what it measured
        _fail(f"the results do not match the schema: {errors[0]}", code=1)
    failed = [cell for cell in document["cells"] if cell["status"] == "error"]
    if failed:
        _fail(f"{len(failed)} cell(s) failed; see the table above", code=1)


def _run_live(
    cells: list[Cell], plan: Plan, peers: list[list[str]], profile: str | None
) -> dict[str, Any]:
    """Run with a progress bar and a live table of the cells measured so far."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_errors,
    )
    task = progress.add_task("starting", total=None)
    done: list[dict[str, Any]] = []
    live = Live(Group(progress), console=_errors, refresh_per_second=4, transient=True)

    def started(total: int) -> None:
        progress.update(task, total=total)

    def step(label: str) -> None:
        progress.update(task, description=label)
        progress.advance(task)

    def cell_done(record: _runner.CellRecord) -> None:
        done.append(record.to_json())
        latest = _tables.results_table(done[-12:], title="latest cells", compact=True)
        live.update(Group(latest, progress))

    def log(message: str) -> None:
        progress.update(task, description=message)

    callbacks = _runner.Progress(started=started, step=step, cell_done=cell_done, log=log)
    command = ["ezflow", *sys.argv[1:]]
    try:
        with live:
            return run_coroutine(
                _runner.run(
                    cells, plan, peers=peers, progress=callbacks, command=command, profile=profile
                )
            )
    except KeyboardInterrupt:
        _fail("interrupted: every worker was stopped, no results written", code=130)
    except asyncio.CancelledError:  # SIGTERM cancels the run the same way
        _fail("terminated: every worker was stopped, no results written", code=143)
    except _runner.WorkerError as exc:  # a framework (--peer) that cannot even start
        _fail(str(exc))


def _load(path: Path) -> dict[str, Any]:
    try:
        return _schema.load(path)
    except _schema.ResultsError as exc:
        _fail(str(exc))


@app.command()
def compare(
    base: Annotated[Path, typer.Argument(help="Results of the reference run.")],
    new: Annotated[Path, typer.Argument(help="Results of the run to judge.")],
    noise: Annotated[float, typer.Option(help="Gains within 1 ± noise are not colored.")] = 0.10,
    fail: Annotated[
        float,
        typer.Option(help="Exit with status 1 when a figure is worse by more than this."),
    ] = 0.25,
) -> None:
    """Per-cell ratios of NEW over BASE; exit status 1 on a regression beyond --fail."""
    if not 0 <= noise <= fail:
        _fail(f"need 0 <= --noise ({noise}) <= --fail ({fail})")
    changes = _compare.compare(_load(base), _load(new), noise=noise, fail=fail)
    _console.print(_tables.compare_table(changes, base.name, new.name))
    failing = [change for change in changes if change.failing]
    if failing:
        _fail(
            f"{len(failing)} regression(s) beyond {fail:.0%} (first: "
            f"{'/'.join(str(part) for part in failing[0].key if part != '')} "
            f"{failing[0].metric})",
            code=1,
        )
    _console.print(f"no regression beyond {fail:.0%}", highlight=False)


@app.command()
def report(
    results: Annotated[Path, typer.Argument(help="A results file of `ezflow perf run`.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="HTML file (default: RESULTS with .html).")
    ] = None,
    base: Annotated[
        Path | None,
        typer.Option("--base", help="An earlier results file: the summary names the changes."),
    ] = None,
) -> None:
    """Write a self-contained HTML report (tables and plots, no external files), with a
    one-screen summary at the top (with --base: the biggest regressions and gains)."""
    document = _load(results)
    earlier = _load(base) if base is not None else None
    target = output or results.with_suffix(".html")
    try:
        target.write_text(_report.render(document, title=results.name, base=earlier))
    except OSError as exc:
        _fail(f"cannot write {target}: {exc.strerror or exc}")
    _console.print(f"wrote {target}", highlight=False)


@app.command()
def peers(  # noqa: PLR0917 - one parameter per command-line option
    earlier: Annotated[
        Path | None,
        typer.Argument(help="Same as --from: a results file to print, running nothing."),
    ] = None,
    install: Annotated[
        bool,
        typer.Option(
            "--install", help="Create (or refresh) each peer's venv from PyPI when needed."
        ),
    ] = False,
    peer: Annotated[
        list[str] | None,
        typer.Option(
            "--peers", help="Peers (repeat or comma-separate): ezmsg, pyzmq, zenoh, iceoryx2."
        ),
    ] = None,
    size: Annotated[
        list[str] | None,
        typer.Option(
            help="Sizes: 64B, 1MiB, frame, ... (default 64B,1MiB,frame; --quick: 64B,1MiB)."
        ),
    ] = None,
    transports: Annotated[
        list[str] | None, typer.Option("--transports", help="shm, tcp (default both).")
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats",
            "--rounds",
            help="Rounds (default 3; --selfcheck: 3), alternating the frameworks; each "
            "figure is the median of the rounds, shown with their spread.",
        ),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="One short repeat, 64B and 1MiB.")] = False,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Results file (default ezflow-peers-TIME.json)."),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(help="Where the peer venvs live (default $XDG_CACHE_HOME/ezflow/perf-peers)."),
    ] = None,
    results: Annotated[
        Path | None,
        typer.Option("--from", help="Print the table of an earlier results file; run nothing."),
    ] = None,
    markdown: Annotated[bool, typer.Option(help="Print a markdown table.")] = False,
    selfcheck: Annotated[
        bool,
        typer.Option(
            "--selfcheck",
            help="Instead: each peer's own throughput example next to our worker on that "
            "peer (the same loop), 64 B, alternating rounds; exit 1 when a worker is "
            "below 0.8x of its library's example.",
        ),
    ] = False,
) -> None:
    """ezflow's ordinary p2p program next to ezmsg, pyzmq, Zenoh and iceoryx2, in one
    run, each peer in its own venv (--install makes them), with ratios and the floor.

    --selfcheck checks the peer workers against their libraries' own examples instead."""
    from .._perf._peers import _command, _install  # noqa: PLC0415 - only this command

    results = results or earlier
    if selfcheck or (results is not None and _is_selfcheck(results)):
        _selfcheck(results, peer, transports, repeats, output, cache_dir, install, markdown)
        return
    if results is not None:
        document = _load(results)
        if not _command.table_rows(document):
            rows = _compare.peer_rows(document)  # a run of other suites with --peer
            if not rows:
                _fail(f"{results} has no peer framework (run ezflow perf peers)")
            if markdown:
                typer.echo(_tables.peer_markdown(rows), nl=False)
            else:
                _console.print(_tables.peer_table(rows))
            return
    else:
        try:
            request = _command.prepare(peer, size, transports, repeats, quick=quick)
        except SpecError as exc:
            _fail(str(exc))
        if output is None:
            output = Path(f"ezflow-peers-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
        if output.parent and not output.parent.is_dir():
            _fail(f"cannot write {output}: {output.parent} is not a directory")
        try:
            commands = _install.ensure(
                request.peers,
                install_missing=install,
                cache=cache_dir,
                log=lambda line: _errors.print(line, highlight=False, markup=False),
            )
        except (_install.PeerSetupError, _install.PeerInstallError) as exc:
            _fail(str(exc))
        document = _run_live(list(request.cells), request.plan, list(commands.values()), None)
        output.write_text(json.dumps(document, indent=1) + "\n")
    if markdown:
        typer.echo(_command.markdown(document), nl=False)
    else:
        _console.print(_command.rich_table(document))
    for line in _command.notes(document):
        _console.print(f"  {line}", highlight=False, markup=False)
    if results is None:
        _console.print(f"wrote {output} in {document['wall_seconds']:.1f} s", highlight=False)
        errors = _schema.validate(document)
        if errors:  # a bug in the runner, not in what it measured
            _fail(f"the results do not match the schema: {errors[0]}", code=1)
        failed = _command.failures(document)
        if failed:
            _fail(f"{len(failed)} cell(s) failed after every retry; see above", code=1)


def _is_selfcheck(path: Path) -> bool:
    from .._perf._peers import _selfcheck  # noqa: PLC0415

    try:
        return _selfcheck.is_selfcheck(json.loads(path.read_text()))
    except (OSError, ValueError):
        return False  # _load says what is wrong with it


def _selfcheck(  # noqa: PLR0917 - the options of `peers --selfcheck`
    results: Path | None,
    peer: list[str] | None,
    transports: list[str] | None,
    repeats: int | None,
    output: Path | None,
    cache_dir: Path | None,
    install: bool,
    markdown: bool,
) -> None:
    """``ezflow perf peers --selfcheck`` (or ``--from`` a selfcheck file)."""
    from .._perf._peers import _command, _install, _selfcheck  # noqa: PLC0415

    if results is not None:
        document = json.loads(results.read_text())
    else:
        try:
            request = _command.prepare(peer, None, transports, repeats, quick=False)
        except SpecError as exc:
            _fail(str(exc))
        rounds = _selfcheck.ROUNDS if repeats is None else repeats
        if output is None:
            output = Path(f"ezflow-selfcheck-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
        if output.parent and not output.parent.is_dir():
            _fail(f"cannot write {output}: {output.parent} is not a directory")
        try:
            commands = _install.ensure(
                request.peers,
                install_missing=install,
                cache=cache_dir,
                log=lambda line: _errors.print(line, highlight=False, markup=False),
            )
        except (_install.PeerSetupError, _install.PeerInstallError) as exc:
            _fail(str(exc))
        chosen = [t.strip() for value in transports or () for t in value.split(",") if t.strip()]

        def log(line: str) -> None:
            _errors.print(f"[dim]{line}[/]", highlight=False)

        try:
            document = run_coroutine(
                _selfcheck.run(
                    commands,
                    rounds=rounds,
                    transports=chosen or None,
                    cache=cache_dir,
                    log=log,
                    command=["ezflow", *sys.argv[1:]],
                )
            )
        except KeyboardInterrupt:
            _fail("interrupted: every worker was stopped, no results written", code=130)
        output.write_text(json.dumps(document, indent=1) + "\n")
    if markdown:
        typer.echo(_selfcheck.markdown(document), nl=False)
    else:
        _console.print(_selfcheck.rich_table(document))
    for line in _selfcheck.notes(document):
        _console.print(f"  {line}", highlight=False, markup=False)
    if output is not None:
        _console.print(f"wrote {output} in {document['wall_seconds']:.1f} s", highlight=False)
    failed = _selfcheck.failures(document)
    if failed and results is None:
        _fail(f"{len(failed)} check(s) below the bar: {failed[0]}", code=1)


_DEFAULT_WATERFALL_ROUNDS = 5


@app.command()
def waterfall(  # noqa: PLR0917 - one parameter per command-line option
    base: Annotated[str, typer.Option("--base", help="The git ref before (e.g. main, HEAD~3).")],
    new: Annotated[str, typer.Option("--new", help="The git ref after.")] = "HEAD",
    hops: Annotated[int, typer.Option("--hops", min=1, help="Hops of the pipeline.")] = 3,
    frame: Annotated[
        str, typer.Option("--frame", help="The pipeline's frame: 4k, WxHxC or NB (bytes).")
    ] = "4k",
    count: Annotated[int, typer.Option("--count", min=1, help="Frames per pipeline run.")] = 60,
    period: Annotated[
        float, typer.Option("--period", min=0.0, help="Seconds between frames (default 30 fps).")
    ] = 1 / 30,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=1,
            help="Runs per ref, alternating between refs: each figure is their median, "
            "shown with their range, and a change inside the noise is 'no change'.",
        ),
    ] = _DEFAULT_WATERFALL_ROUNDS,
    p2p: Annotated[
        bool, typer.Option("--p2p/--no-p2p", help="Also run `perf run -s p2p` at both refs.")
    ] = True,
    p2p_transport: Annotated[
        str, typer.Option("--p2p-transport", help="p2p transports (comma-separated).")
    ] = "shm,tcp",
    p2p_size: Annotated[
        str, typer.Option("--p2p-size", help="p2p message sizes (comma-separated).")
    ] = "64B,1MiB",
    p2p_duration: Annotated[
        float, typer.Option("--p2p-duration", min=0.1, help="Seconds per p2p cell.")
    ] = 1.0,
    reuse_deps: Annotated[
        bool,
        typer.Option(
            "--reuse-deps",
            help="Install ezflow alone (--no-deps) into venvs that see this environment's "
            "packages: quick and offline.",
        ),
    ] = False,
    cache: Annotated[
        Path | None,
        typer.Option(
            "--cache",
            help="Where the venvs of each commit are kept between runs "
            "(default ~/.cache/ezflow/waterfall, or under XDG_CACHE_HOME).",
        ),
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write the waterfall as an HTML report.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Also write every result as JSON.")
    ] = None,
) -> None:
    """The same pipeline and p2p scenarios at two git refs: where the time moved.

    Each ref is checked out into a temporary worktree and installed, with the project's
    own install command, into a virtualenv of its own (kept in --cache per commit). Then,
    alternating between the refs (--rounds, 5 by default), a pipeline of --hops hops
    (one process per relay, a 4K frame by default, paced at 30 fps) and the ordinary
    p2p program run under each. Prints the pipeline's end to end and frames/s before
    and after, the waterfall of every hop's stages (publish, transport, decode, queue,
    handler) at both refs with the change per stage, and the p2p cells: every figure
    the median of the rounds with their spread, every change with its verdict ("no
    change" when it is inside the noise of the comparison). A ref whose ezflow does not
    trace shows end to end only. Run it from a checkout of ezflow (git is all it needs
    besides).

    Examples:

        ezflow perf waterfall --base main

        ezflow perf waterfall --base HEAD~3 --new HEAD --rounds 3 --html waterfall.html

        ezflow perf waterfall --base v0.1.0 --hops 5 --frame 1920x1080x3 --no-p2p
    """
    scenario = _waterfall.Scenario(
        hops=hops,
        frame=frame,
        count=count,
        period=period,
        p2p=p2p,
        p2p_transports=tuple(t for t in p2p_transport.split(",") if t),
        p2p_sizes=tuple(s for s in p2p_size.split(",") if s),
        p2p_duration=p2p_duration,
        rounds=rounds,
    )

    def log(line: str) -> None:
        _console.print(f"[dim]{line}[/]", highlight=False)

    try:
        repo = _waterfall.repository_root(Path.cwd())
        refs = [
            _waterfall.install_ref(
                repo,
                name,
                _waterfall.resolve_ref(repo, name),
                (cache or _waterfall.default_cache()).expanduser(),
                reuse_deps=reuse_deps,
                log=log,
            )
            for name in (base, new)
        ]
        results = _waterfall.run_waterfall(refs, scenario, log)
    except _waterfall.WaterfallError as exc:
        _fail(str(exc), code=1)
    rows = _waterfall.compare_rows(*results)
    _console.print(_waterfall.render_waterfall(results, rows))
    if output is not None:
        document = {
            "refs": [r.to_json() for r in results],
            "comparison": [row.to_json() for row in rows],
        }
        output.write_text(json.dumps(document, indent=1) + "\n")
        _console.print(f"wrote {output}", highlight=False)
    if html is not None:
        html.write_text(_waterfall.render_html(results, rows))
        _console.print(f"wrote {html}", highlight=False)


@app.command()
def schema() -> None:
    """Print the JSON schema of a results file."""
    typer.echo(json.dumps(_schema.SCHEMA, indent=2))


@app.command()
def sigproc(
    blocks: Annotated[
        int, typer.Option(min=2, help="AxisArray blocks the source publishes.")
    ] = 2000,
    samples: Annotated[int, typer.Option(min=2, help="Samples (rows) per block.")] = 50,
    channels: Annotated[int, typer.Option(min=1, help="Channels (columns) per block.")] = 8,
    rounds: Annotated[int, typer.Option(min=1, help="Runs per framework, alternating.")] = 3,
) -> None:
    """ezmsg vs ezflow on one ezmsg-sigproc graph (needs the ezmsg extra).

    The same ezmsg system class, unmodified (source -> ButterworthFilter -> Downsample ->
    sink, the filter and the downsampler each in its own process), run by ez.run and by
    ezflow.run in turn, each run a fresh interpreter. Prints AxisArray blocks/s at the
    sink, the median of the rounds per framework, and their ratio (docs/ezmsg.md).
    """
    try:
        from .._perf import _ezmsg_sigproc  # noqa: PLC0415 - imports ezmsg
    except ImportError as exc:
        _fail(
            f"perf sigproc needs ezmsg and ezmsg-sigproc ({exc}): "
            "pip install 'ezflow-pubsub[ezmsg]'"
        )
    try:
        _ezmsg_sigproc.run(blocks, samples, channels, rounds)
    except _ezmsg_sigproc.SigprocError as exc:
        _fail(str(exc), code=1)


@app.command()
def startup(
    runs: Annotated[int, typer.Option(min=1, help="Runs per framework, alternating.")] = 7,
) -> None:
    """Start-up of a source -> relay -> sink graph, ezflow vs ezmsg.

    Each unit in a process of its own, each run a fresh interpreter: seconds from launch
    to the first message at the sink and to the interpreter's exit, medians per
    framework and their ratio; ezflow only when ezmsg is not installed (docs/ezmsg.md).
    """
    from .._perf import _startup  # noqa: PLC0415 - only this command

    try:
        _startup.run(runs)
    except _startup.StartupError as exc:
        _fail(str(exc), code=1)


@app.command()
def bridge(rounds: Annotated[int, typer.Option(min=1, help="Rounds of every cell.")] = 3) -> None:
    """Across two hosts: through the Zenoh bridge vs direct ezflow tcp (needs root,
    iproute2 and the zenoh extra).

    Two network namespaces joined by a veth pair stand for the hosts. Direct tcp, the
    bridge as processes of its own, the bridge inside the publishing and subscribing
    processes, and plain zenoh-python; 64 B and 1 MiB messages: p50 latency of paced
    messages and msgs/s of a burst, medians of the rounds with their spread, each
    path's ratios to direct tcp, and each process's CPU per message of the burst (every
    thread: the figure the load does not decide) (docs/fleets.md).
    """
    from .._perf import _zenoh_bridge  # noqa: PLC0415 - only this command

    try:
        _zenoh_bridge.check_environment()
    except _zenoh_bridge.BridgeError as exc:
        _fail(f"perf bridge {exc}")
    try:
        _zenoh_bridge.run(rounds)
    except _zenoh_bridge.BridgeError as exc:
        _fail(str(exc), code=1)
