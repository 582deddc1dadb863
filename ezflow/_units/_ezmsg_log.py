"""Reading the files ezmsg's ``MessageLogger`` writes, without ezmsg.

The format (ezmsg.util.messagelogger / messagecodec): UTF-8 text, one JSON object per
line, ``{"ts": <unix seconds>, "obj": <message>}``; the first line's message is ezmsg's
``LogStart`` marker. Inside a message, JSON objects with a ``"_type"`` key stand for

* ``"_ndarray"``: a numpy array, ``{"dtype", "shape", "data": base64 of its bytes}``;
* ``"module:QualName"``: a dataclass, rebuilt as ``QualName(**other keys)`` (AxisArray
  and its axes are such dataclasses, from ``ezmsg.util.messages.axisarray``);
* ``"_pickle"``: any other object, pickled (base64). Unpickling runs code chosen by
  whoever wrote the file, so it is refused unless asked for (``allow_pickle=True``).

A class is imported only when it is a dataclass; a class that cannot be imported (an
AxisArray without ezmsg installed) is an error naming the class and what to install.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import importlib
import json
import pickle
from collections.abc import Iterator
from functools import reduce
from typing import Any

import numpy as np

from .._core._exceptions import ProtocolError

__all__ = ["is_ezmsg_log", "read_ezmsg_log"]

_TYPE = "_type"
_NDARRAY = "_ndarray"
_PICKLE = "_pickle"
_LOG_START = "ezmsg.util.messagecodec:LogStart"
_LOG_START_MARKER = object()  # what the LogStart line decodes to


def is_ezmsg_log(path: str) -> bool:
    """Whether *path* starts like an ezmsg message log (a JSON object with ``ts``): what
    :class:`~ezflow.units.Replayer` uses to tell it from an ezflow recording."""
    with open(path, "rb") as file:
        first = file.readline(4096)
    return first.lstrip().startswith(b"{") and b'"ts"' in first


def _import_dataclass(name: str, where: str) -> type:
    module_name, _, qualname = name.partition(":")
    try:
        module = importlib.import_module(module_name)
        cls: Any = reduce(getattr, qualname.split("."), module)
    except (ImportError, AttributeError, ValueError) as exc:
        hint = (
            " (pip install 'ezflow-pubsub[ezmsg]' for ezmsg's message classes)"
            if module_name.startswith("ezmsg")
            else " (install or put on sys.path the module that defines it)"
        )
        raise ProtocolError(f"{where}: class {name} cannot be imported: {exc}{hint}") from exc
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ProtocolError(f"{where}: {name} is not a dataclass; refusing to build it")
    return cls


def _decoder(where: str, allow_pickle: bool) -> Any:
    classes: dict[str, type] = {}

    def hook(obj: dict[str, Any]) -> Any:
        kind = obj.get(_TYPE)
        if not isinstance(kind, str):
            return obj
        if kind == _LOG_START:
            return _LOG_START_MARKER  # no message; known without importing ezmsg
        if kind == _NDARRAY:
            raw = base64.b64decode(obj["data"].encode("ascii"), validate=True)
            return np.frombuffer(raw, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"])
        if kind == _PICKLE:
            if not allow_pickle:
                raise ProtocolError(
                    f"{where}: a message was pickled by ezmsg (an object JSON could not "
                    "carry); unpickling runs code from the file, so pass allow_pickle=True "
                    "(ReplayerSettings(allow_pickle=True)) if you trust it"
                )
            return pickle.loads(base64.b64decode(obj["data"].encode("ascii")))
        cls = classes.get(kind)
        if cls is None:
            cls = classes[kind] = _import_dataclass(kind, where)
        fields = {k: v for k, v in obj.items() if k != _TYPE}
        return cls(**fields)

    return hook


def read_ezmsg_log(path: str, *, allow_pickle: bool = False) -> Iterator[tuple[float, Any]]:
    """Iterate ``(offset_seconds, message)`` over an ezmsg message log, offsets from the
    first message's timestamp (as :func:`read_recording` does for ezflow recordings);
    ezmsg's ``LogStart`` line is skipped.

    Messages are yielded one by one as the file is read: a malformed line raises
    :class:`~ezflow.ProtocolError` naming the file and the line, after every message
    before it was yielded. An empty line at the end (a log cut while writing) is fine.
    """
    first_ts: float | None = None
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line, object_hook=_decoder(where, allow_pickle))
            except ProtocolError:
                raise
            except (ValueError, TypeError, KeyError, binascii.Error) as exc:
                raise ProtocolError(
                    f"{where}: not a message of an ezmsg log ({type(exc).__name__}: {exc}); "
                    "the messages before it were read"
                ) from exc
            if not isinstance(record, dict) or "ts" not in record or "obj" not in record:
                raise ProtocolError(f"{where}: not a {{'ts': ..., 'obj': ...}} log line")
            message = record["obj"]
            if message is _LOG_START_MARKER:
                continue
            ts = float(record["ts"])
            if first_ts is None:
                first_ts = ts
            yield max(0.0, ts - first_ts), message
