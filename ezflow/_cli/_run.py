"""``ezflow run MODULE_OR_FILE:OBJECT``: run a graph of units with :func:`ezflow.run`.

*OBJECT* may be

* a :class:`~ezflow.Collection` or :class:`~ezflow.Unit` instance, or a class of one
  (created with no arguments) — run as the one component named *OBJECT*;
* a mapping of names to components;
* a function called with no arguments that returns one of the above, a
  ``(components, connections)`` or ``(components, connections, process_components)``
  tuple, or a dict with the keys ``components``, ``connections``, ``process_components``
  (the keyword arguments of :func:`ezflow.run`).

A ``path/to/file.py`` is imported as the module named after the file (its directory
first on ``sys.path``), so unit processes can import the classes it defines.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Annotated, Any

import typer

from .._core._config import ENV_DEBUG, ENV_TRACE, check_drain_timeout
from .._core._exceptions import ConfigurationError, EzflowError
from .._core._interrupts import InterruptLatch
from .._core._tracing import set_own_rate
from .._units._component import Component
from .._units._errors import GraphDefinitionError, ProcessDiedError, UnitError
from .._units._plan import adaptable, adaptable_class
from .._units._runner import GraphRunner
from .._units._runner import run as run_graph
from ._connection import (
    AddressOption,
    errors,
    fail,
    import_module_or_file,
    print_user_traceback,
    resolve_address,
)

__all__ = ["load_graph", "load_object", "parse_settings", "run"]

_KEYS = ("components", "connections", "process_components")


def load_object(target: str) -> tuple[str, Any]:
    """Import ``MODULE_OR_FILE:OBJECT`` and return ``(OBJECT, the object)``; exits with
    status 2 and one line when it cannot."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        fail(f"{target!r} is not MODULE_OR_FILE:OBJECT (e.g. mypkg.graphs:SYSTEM)", 2)
    module = import_module_or_file(where)
    try:
        return name, getattr(module, name)
    except AttributeError:
        found = _runnable(module)
        fail(
            f"{where} has no attribute {name!r}; "
            + (f"it has: {', '.join(found)}" if found else "it defines no component or function"),
            2,
        )


def _runnable(module: ModuleType) -> list[str]:
    """The names in *module* that ``ezflow run`` could take (components, component
    classes and functions defined there): what to suggest when a name is wrong."""
    names = []
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        if isinstance(value, type):
            if value.__module__ == module.__name__ and (
                issubclass(value, Component) or adaptable_class(value)
            ):
                names.append(key)
        elif _component(value) is not None or (
            inspect.isfunction(value) and value.__module__ == module.__name__
        ):
            names.append(key)
    return names


def _component(obj: Any) -> Any:
    """*obj* as a component of the graph (a class is instantiated), or None: an ezflow
    Component, or another framework's that ezflow.run adapts (an ezmsg Unit or
    Collection, with ezflow-pubsub[ezmsg])."""
    if isinstance(obj, type):
        if issubclass(obj, Component) or adaptable_class(obj):
            return obj()
        return None
    return obj if isinstance(obj, Component) or adaptable(obj) else None


def load_graph(name: str, obj: Any) -> dict[str, Any]:
    """The keyword arguments of :func:`ezflow.run` for *obj* (see the module doc);
    ``GraphDefinitionError`` for anything else."""
    component = _component(obj)
    if component is not None:
        return {"components": {name: component}}
    if callable(obj) and not isinstance(obj, type):
        obj = obj()
        component = _component(obj)
        if component is not None:
            return {"components": {name: component}}
    if isinstance(obj, Mapping):
        if set(obj) and set(obj) <= set(_KEYS) and "components" in obj:
            return dict(obj)
        return {"components": dict(obj)}
    if isinstance(obj, tuple) and 2 <= len(obj) <= 3:
        return dict(zip(_KEYS, obj, strict=False))
    raise GraphDefinitionError(
        f"{name} is a {type(obj).__name__}; ezflow run needs a Collection or Unit (or its "
        "class), a mapping of names to components, or a function returning one of those, "
        "(components, connections[, process_components]) or a dict of ezflow.run arguments"
    )


def parse_settings(specs: list[str]) -> dict[str, dict[str, str]]:
    """``--set PATH.FIELD=VALUE`` options as ``{PATH: {FIELD: VALUE}}`` (the values as
    text: the graph reads them by each field's type); a malformed one exits with
    status 2. A field set twice takes the last value, as options usually do."""
    fields: dict[str, dict[str, str]] = {}
    for spec in specs:
        target, equals, value = spec.partition("=")
        path, dot, field = target.strip().rpartition(".")
        if not equals or not dot or not path or not field.isidentifier():
            fail(
                f"--set {spec!r}: expected PATH.FIELD=VALUE, a component's path and a field "
                "of its settings (e.g. --set SINE.rate=500 or --set PIPELINE/FILTER.cutoff=30)",
                2,
            )
        fields.setdefault(path, {})[field] = value
    return fields


def _print_start_line(runner: GraphRunner) -> None:
    # On stderr, so that a graph's own output on stdout stays clean for pipes.
    errors.print(f"ezflow run: {runner.describe()}", highlight=False, markup=False)


def run(  # noqa: PLR0917 - one parameter per command-line option
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE_OR_FILE:OBJECT",
            help="What to run, e.g. mypkg.graphs:SYSTEM or graphs/demo.py:make_graph.",
        ),
    ],
    address: AddressOption = None,
    single_process: Annotated[
        bool,
        typer.Option("--single-process", help="Run every unit in this process (ignore placement)."),
    ] = False,
    check_types: Annotated[
        bool,
        typer.Option(
            "--check-types",
            help="Check every published message against its OutputStream's declared type "
            "(a mismatch fails the unit; default: EZFLOW_CHECK_TYPES).",
        ),
    ] = False,
    end_when_done: Annotated[
        bool,
        typer.Option(
            "--end-when-done",
            help="End (exit 0) once every source ended and every message was handled.",
        ),
    ] = False,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            "--drain-timeout",
            metavar="SECONDS",
            help="How long a stopping graph keeps handling accepted messages "
            "(default EZFLOW_DRAIN_TIMEOUT, else 5; 0: no drain).",
        ),
    ] = None,
    trace: Annotated[
        int | None,
        typer.Option(
            "--trace",
            metavar="N",
            min=0,
            help="Trace one message in N that each source publishes, through every hop "
            "(see `ezflow trace`; default EZFLOW_TRACE, else off).",
        ),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Log at INFO level, and show ezflow's own frames in the traceback of a "
            "failure (EZFLOW_DEBUG=1 does too).",
        ),
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="Do not print the start line (graph server and processes)."
        ),
    ] = False,
    set_fields: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="PATH.FIELD=VALUE",
            help="Set a field of a component's settings before the graph starts "
            "(repeatable): the value is read by the field's type; a wrong path, field or "
            "value exits 2 (docs/cli.md).",
        ),
    ] = None,
) -> None:
    """Run a graph of units (a Collection, or a function returning components).

    Once every unit runs it prints one line on stderr: the graph server's address (where
    `ezflow graph`, `top` and `echo` find the graph) and each process with its units
    (--quiet: nothing). It runs until a unit raises NormalTermination, a @main returns,
    every unit is done (--end-when-done), or Ctrl-C / SIGTERM (exit 0). Stopping drains
    what lossless edges accepted for up to --drain-timeout seconds (Ctrl-C prints one
    line saying so); a second Ctrl-C stops at once, says how many messages it cut, runs
    every shutdown() it can and exits 130. A unit that fails or a unit process that dies
    stops the graph and exits 1, with the traceback of your code (the line that failed;
    ezflow's frames too with -v); an invalid graph or a target that cannot be imported
    exits 2 (with the traceback of the error in your code).

    Uses the graph server at --address / EZFLOW_GRAPH_ADDRESS, starting one in this
    process when none answers there (port 0: any free port).

    --set PATH.FIELD=VALUE sets a field of a component's settings (PATH as in topic
    names: SINE, PIPELINE/FILTER), before that component is configured: a collection's
    settings reach its children. The value is read by the field's type: an int, a
    float, true/false for a bool, none for an optional field, one of a Literal's
    values, else a Python literal ((1, 2), [0.5, 1.0]).

    Examples (from a checkout of ezflow; each ends by itself):

        ezflow run examples/units_quickstart.py:graph

        ezflow run examples/signal_pipeline.py:graph --address 127.0.0.1:0

        ezflow run examples/signal_pipeline.py:graph --single-process --quiet

        EZFLOW_GRAPH_ADDRESS=127.0.0.1:0 ezflow run examples/units_quickstart.py:graph -q

        ezflow run examples/nested_collection.py:graph --set PIPELINE.width=2 -a 127.0.0.1:0
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    where = resolve_address(address) if address is not None else None
    if drain_timeout is not None:
        try:
            check_drain_timeout(drain_timeout, setting="--drain-timeout")
        except ConfigurationError as exc:
            fail(str(exc), 2)
    if trace is not None:
        # In the environment too: the graph's unit processes inherit it.
        os.environ[ENV_TRACE] = str(trace)
        set_own_rate(trace, "ezflow run --trace")
    if verbose:
        os.environ[ENV_DEBUG] = "1"  # failures with ezflow's frames (unit processes too)
    settings = parse_settings(set_fields or [])
    try:
        # Until ezflow.run takes Ctrl-C over, one that Python swallows (importing the
        # target can run into it) is not lost (ezflow/_core/_interrupts.py).
        with InterruptLatch(KeyboardInterrupt).installed():
            name, obj = load_object(target)
            arguments = load_graph(name, obj)
            run_graph(
                **arguments,
                graph_address=where,
                force_single_process=single_process,
                check_types=True if check_types else None,
                end_when_done=end_when_done,
                drain_timeout=drain_timeout,
                on_started=None if quiet else _print_start_line,
                settings=settings,
            )
    except typer.Exit:
        raise  # fail() said why
    except GraphDefinitionError as exc:
        fail(str(exc), 2)
    except (UnitError, ProcessDiedError) as exc:
        fail(str(exc), 1)
    except EzflowError as exc:
        fail(str(exc), 1)
    except KeyboardInterrupt:
        # A second Ctrl-C (the line saying what was cut is out), or one while the
        # target was still importing: interrupted, no traceback.
        raise typer.Exit(130) from None
    except Exception as exc:  # raised by the graph's own code: configure(), network()...
        if verbose:
            raise
        print_user_traceback(exc)
        fail(f"the graph could not be built: {type(exc).__name__}: {exc}", 2)
