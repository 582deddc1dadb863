"""Exceptions of the declarative layer, named by cause."""

from __future__ import annotations

from .._core._exceptions import ConfigurationError, EzflowError

__all__ = [
    "Complete",
    "GraphDefinitionError",
    "MessageTypeError",
    "NormalTermination",
    "ProcessDiedError",
    "UnitError",
]


class Complete(Exception):  # a signal, not an error (like StopIteration)
    """Raise from a unit function to end just that function, as ezmsg's ``Complete``.

    The same as returning from it: a ``@publisher`` generator or ``@task`` stops, a
    ``@subscriber`` function is no longer called (its input is read as long as another
    function subscribes to it). An output ends (its subscribers see the end of stream)
    once nothing in the unit may still publish to it. The graph goes on; to end the
    whole graph, raise :class:`NormalTermination`.
    """


class NormalTermination(Exception):  # a signal, not an error
    """Raise from any unit function to end the whole graph normally (ezmsg's
    ``NormalTermination``).

    The graph stops as on Ctrl-C: sources stop, the messages already accepted by
    lossless edges are handled (bounded by the drain timeout), every ``shutdown()``
    runs and :func:`ezflow.run` returns (exit code 0).
    """


class GraphDefinitionError(ConfigurationError):
    """The graph handed to :func:`ezflow.run` (or :class:`ezflow.GraphRunner`) is not
    valid: an unknown stream, two inputs or two outputs connected, mismatched message
    types, duplicate component names, settings of the wrong type, a
    ``process_components`` entry that is not in the graph, ... Raised before anything
    starts; the message names the component or connection and what to do."""


class MessageTypeError(EzflowError, TypeError):
    """With run-time type checks on (``ezflow.run(check_types=True)``,
    ``EZFLOW_CHECK_TYPES=1``, ``ezflow run --check-types``), a unit published a message
    that does not match its ``OutputStream``'s declared type. Raised in the publishing
    unit before anything is sent (so the unit fails with :class:`UnitError`); the
    message names the stream, the declared and the actual type."""


class UnitError(EzflowError):
    """The graph ended because a unit raised (or, for :class:`ProcessDiedError`, a
    process died).

    ``component`` is the path of the unit that failed (``"PIPE/FILTER"``), ``process``
    the name of the process it ran in, ``details`` what failed: the user's frames of the
    traceback (ezflow's own left out; for a message a generator yielded, the ``yield``
    line), then one line ``FILE:LINE: ExceptionType: message``; ``full_traceback`` the
    whole traceback. The message contains all three names and ``details`` (the full
    traceback instead with ``EZFLOW_DEBUG=1``), and names every further failure that
    happened while the graph was stopping.
    """

    def __init__(
        self,
        message: str,
        *,
        component: str,
        process: str,
        details: str,
        full_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.component = component
        self.process = process
        self.details = details
        self.full_traceback = details if full_traceback is None else full_traceback


class ProcessDiedError(UnitError):
    """A process running units exited without being asked to (killed, crashed, or
    exited on its own). ``returncode`` is its exit status (negative: the signal)."""

    def __init__(
        self, message: str, *, component: str, process: str, details: str, returncode: int
    ) -> None:
        super().__init__(message, component=component, process=process, details=details)
        self.returncode = returncode
