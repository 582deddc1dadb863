"""Failures as their users read them: their own frames and the line that failed.

A unit that raises, publishes what cannot travel or a message of the wrong type fails
inside ezflow's machinery (an input loop, the codec, a publisher): its traceback is
mostly ezflow's frames, and for a message yielded by an async generator the user's line
(the ``yield``) is not in it at all — the generator was suspended there while ezflow
published. :func:`describe` gives both texts of a failure:

* **short**: the user's frames only (ezflow's, the standard library's and uvloop's left
  out; a :func:`mark_yield_site` frame added), then one line
  ``FILE:LINE: ExceptionType: message`` naming the user's last frame — what
  :class:`~ezflow.UnitError` shows;
* **full**: the whole traceback, as Python prints it — shown instead with
  ``EZFLOW_DEBUG=1`` (or ``ezflow run -v``).

:func:`show_to_user` marks an exception that :func:`ezflow.run` raises to a script:
uncaught, it is printed by :func:`_excepthook` with the user's frames only (and a marked
``KeyboardInterrupt``, after the line that already said what was cut, not at all).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._core._config import debug_from_env

__all__ = [
    "Described",
    "describe",
    "is_internal",
    "mark_yield_site",
    "show_to_user",
]


@functools.cache
def _machinery() -> tuple[str, str, tuple[str, ...]]:
    """ezflow's directory, the standard library's and its site-packages (computed on
    the first failure: importing ezflow does not pay for it)."""
    import sysconfig  # noqa: PLC0415

    paths = sysconfig.get_paths()
    ezflow_dir = str(Path(__file__).resolve().parents[1]) + os.sep
    stdlib = str(Path(paths["stdlib"]).resolve()) + os.sep
    sites = tuple(str(Path(paths[key]).resolve()) + os.sep for key in ("purelib", "platlib"))
    return ezflow_dir, stdlib, sites


#: Attribute of an exception: the user's frame where an async generator yielded the
#: message whose publishing raised it (a ``traceback.FrameSummary``).
_SITE = "_ezflow_yield_site"
#: Attribute of an exception raised out of ``ezflow.run``: print it the user's way.
_SHOWN = "_ezflow_show_to_user"


def is_internal(filename: str) -> bool:
    """Whether a frame of *filename* is machinery rather than the user's code: ezflow's
    own modules, the standard library (not its site-packages), uvloop's Cython and
    frozen modules."""
    if filename.startswith("<frozen") or filename.endswith((".pyx", ".pxd", ".pxi")):
        return True
    ezflow_dir, stdlib, sites = _machinery()
    if filename.startswith(ezflow_dir):
        return True
    return filename.startswith(stdlib) and not filename.startswith(sites)


def mark_yield_site(exc: BaseException, generator: object) -> None:
    """Record on *exc* the line where the async *generator* (a unit's, or one of
    ezflow's wrapping it, as for ezmsg units) is suspended: the ``yield`` of the message
    whose publishing raised *exc*. Never raises."""
    frame = getattr(generator, "ag_frame", None)
    for _ in range(8):  # wrappers are shallow
        if frame is None:
            return
        if not is_internal(frame.f_code.co_filename):
            site = traceback.FrameSummary(
                frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
            )
            with contextlib.suppress(AttributeError):  # an exception with __slots__
                setattr(exc, _SITE, site)
            return
        inner = next(
            (
                value
                for value in frame.f_locals.values()
                if isinstance(value, types.AsyncGeneratorType) and value.ag_frame is not None
            ),
            None,
        )
        frame = inner.ag_frame if inner is not None else None


class Described:
    """The two texts of a failure (see the module docstring): ``short`` and ``full``."""

    __slots__ = ("full", "short")

    def __init__(self, short: str, full: str) -> None:
        self.short = short
        self.full = full


def _trim(te: traceback.TracebackException, seen: set[int]) -> None:
    """Drop the machinery's frames from *te* and the exceptions it chains."""
    if id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list(
        [frame for frame in te.stack if not is_internal(frame.filename)]
    )
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _trim(chained, seen)


def _type_name(tp: type[BaseException]) -> str:
    """``ezflow.X`` for ezflow's public exceptions, the bare name for builtins, else
    ``module.qualname``."""
    if tp.__module__ == "builtins":
        return tp.__qualname__
    package = sys.modules.get("ezflow")
    if tp.__module__.startswith("ezflow.") and getattr(package, tp.__name__, None) is tp:
        return f"ezflow.{tp.__name__}"
    return f"{tp.__module__}.{tp.__qualname__}"


def _exception_line(exc: BaseException) -> str:
    text = str(exc)
    name = _type_name(type(exc))
    return f"{name}: {text}" if text else name


def describe(exc: BaseException) -> Described:
    """The user's and the full text of *exc* (see the module docstring)."""
    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    te = traceback.TracebackException.from_exception(exc)
    _trim(te, set())
    site = getattr(exc, _SITE, None)
    if isinstance(site, traceback.FrameSummary):
        te.stack.append(site)
    tail = "".join(te.format_exception_only())
    body = "".join(te.format())
    if body.endswith(tail):
        body = body[: -len(tail)]
    body = body.replace("Traceback (most recent call last):\n", "", 1) if te.stack else body
    where = f"{te.stack[-1].filename}:{te.stack[-1].lineno}: " if te.stack else ""
    notes = getattr(exc, "__notes__", None)
    extra = "".join(f"{note}\n" for note in notes) if isinstance(notes, list) else ""
    return Described(f"{body}{extra}{where}{_exception_line(exc)}", full)


# -- errors raised out of ezflow.run ------------------------------------------------------

_previous_hook: Callable[..., Any] | None = None


def show_to_user(exc: BaseException) -> BaseException:
    """Mark *exc* (about to be raised out of :func:`ezflow.run`) to be printed the user's
    way if nothing catches it, installing the hook that does (once); returns *exc*."""
    global _previous_hook
    try:
        setattr(exc, _SHOWN, True)
    except AttributeError:  # pragma: no cover - an exception with __slots__
        return exc
    if _previous_hook is None:
        _previous_hook = sys.excepthook
        sys.excepthook = _excepthook
    return exc


def _excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
    previous = _previous_hook if _previous_hook is not None else sys.__excepthook__
    if not getattr(value, _SHOWN, False) or debug_from_env():
        previous(tp, value, tb)
        return
    if isinstance(value, KeyboardInterrupt):
        return  # a second Ctrl-C: the line saying what was cut is out already
    te = traceback.TracebackException(tp, value, tb)
    _trim(te, set())
    tail = "".join(te.format_exception_only())
    body = "".join(te.format())
    if body.endswith(tail):
        body = body[: -len(tail)]
    sys.stderr.write(f"{body}{_exception_line(value)}\n")
    sys.stderr.flush()
