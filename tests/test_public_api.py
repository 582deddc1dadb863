"""The public surface (ezflow.__all__) and the layering of the private modules."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
from pathlib import Path

import pytest

import ezflow

PACKAGE = Path(ezflow.__file__).parent

# A module may import only from its own layer or the ones listed after it: the CLI is
# outermost, then the perf suites, the Zenoh integration, the Unit/Collection API, the
# Foxglove live view and MCAP (below the units: the Recorder and Replayer import its MCAP
# module lazily), the graph (context, client, server), the transports, and the
# self-contained core.
LAYERS = [
    "_cli",
    "_perf",
    "_otel",
    "_zenoh",
    "_units",
    "_foxglove",
    "_graph",
    "_transports",
    "_core",
]


def test_all_is_exactly_the_public_names() -> None:
    public = {name for name in vars(ezflow) if not name.startswith("_")}
    public -= {"annotations"}  # from __future__
    # submodules, set on the package once something imports them
    public -= {"compat", "ezmsg", "foxglove", "otel", "zenoh"}
    assert set(ezflow.__all__) - {"__version__"} == public
    assert len(ezflow.__all__) == len(set(ezflow.__all__))
    assert ezflow.__all__ == sorted(ezflow.__all__, key=lambda n: (not n.isupper(), n))


@pytest.mark.parametrize("name", sorted(ezflow._MOVED))
def test_moved_names_are_deprecated_aliases_for_one_release(name: str) -> None:
    home = importlib.import_module(ezflow._MOVED[name])
    assert name in home.__all__ and name not in ezflow.__all__
    with pytest.warns(
        DeprecationWarning, match=rf"ezflow\.{name} is deprecated.*use {home.__name__}\.{name}"
    ):
        assert getattr(ezflow, name) is getattr(home, name)
    with pytest.warns(DeprecationWarning):
        exec(f"from ezflow import {name}", {})


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'RingReaderr'"):
        ezflow.RingReaderr  # type: ignore[attr-defined]  # noqa: B018


def test_public_submodules_hold_what_moved_and_nothing_twice() -> None:
    # One public name per thing: a name of ezflow.ezring or ezflow.lowlevel is not also in
    # ezflow.__all__, and each module is reachable after a bare `import ezflow`.
    for module in (ezflow.ezring, ezflow.lowlevel):
        assert not set(module.__all__) & set(ezflow.__all__), module.__name__
        for name in module.__all__:
            assert inspect.getdoc(getattr(module, name)), f"{module.__name__}.{name}"


def test_exported_objects_are_documented() -> None:
    for name in ezflow.__all__:
        obj = getattr(ezflow, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"ezflow.{name} has no docstring"


def test_exceptions_are_named_by_cause_and_share_a_base() -> None:
    errors = [
        ezflow.ClosedResourceError,
        ezflow.BrokenResourceError,
        ezflow.ProtocolError,
        ezflow.MessageTooLargeError,
        ezflow.EzflowTimeoutError,
        ezflow.GraphError,
        ezflow.ConfigurationError,
        ezflow.UnregisteredTypeError,
        ezflow.WouldBlock,
    ]
    for error in errors:
        assert issubclass(error, ezflow.EzflowError)
        assert error.__module__ == "ezflow._core._exceptions"
    assert issubclass(ezflow.EzflowTimeoutError, TimeoutError)
    assert issubclass(ezflow.UnregisteredTypeError, TypeError)
    assert issubclass(ezflow.ConfigurationError, ValueError)
    assert issubclass(ezflow.WouldBlock, asyncio.QueueEmpty)


def test_py_typed_is_shipped() -> None:
    assert (PACKAGE / "py.typed").exists()


def imported_layers(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "ezflow" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_modules_import_downward_only(layer: str) -> None:
    allowed = set(LAYERS[LAYERS.index(layer) :])
    for path in (PACKAGE / layer).rglob("*.py"):
        for imported in imported_layers(path):
            if imported.startswith("_") and imported in LAYERS:
                assert imported in allowed, f"{path.name} ({layer}) imports {imported}"


def test_optional_integrations_stay_in_their_modules() -> None:
    # The core works without the extras: zenoh and ezmsg are imported only by their own
    # modules (and the perf peers, in their own virtualenvs).
    allowed = {
        "zenoh": ("_zenoh", "zenoh.py", "_perf"),
        "ezmsg": ("_units/_ezmsg_adapter.py", "_perf"),
        "foxglove": ("_foxglove", "foxglove.py"),
        "mcap": ("_foxglove", "foxglove.py"),
    }
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module.split(".")[0]]
            for name in names:
                if name in allowed:
                    assert relative.startswith(allowed[name]), f"{relative} imports {name}"


# A module of ezflow/ longer than this says why in a line of its docstring that starts
# with "Size:" (issue 27: one room, one job).
MODULE_LINES = 800


def _size_reason(source: str) -> str | None:
    """The ``Size:`` paragraph of a module's docstring, or None."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    lines = docstring.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Size:"):
            paragraph = []
            for rest in lines[index:]:
                if not rest.strip():
                    break
                paragraph.append(rest.strip())
            return " ".join(paragraph).removeprefix("Size:").strip()
    return None


def test_size_reason_is_read_from_the_docstring_only() -> None:
    assert _size_reason('"""Does X.\n\nSize: one class,\nwhose state.\n\nMore."""') == (
        "one class, whose state."
    )
    assert _size_reason('"""Does X."""\n# Size: in a comment') is None
    assert _size_reason('"""Does X.\n\nSize:\n"""') == ""


def test_no_module_is_over_800_lines_without_a_stated_reason() -> None:
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MODULE_LINES and not _size_reason(source):
            unexplained.append(f"{path.relative_to(PACKAGE.parent)} ({lines} lines)")
    assert not unexplained, (
        f"modules over {MODULE_LINES} lines: split them along their seams, or state why "
        f'one stays this long in a docstring line starting "Size:": {unexplained}'
    )
