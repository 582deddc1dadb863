"""Topic names <-> Zenoh key expressions, reversibly.

An ezflow topic is any printable text (``/camera/raw``, ``PIPE/FILTER/OUTPUT``); a Zenoh
key expression is ``/``-separated chunks that may not be empty and may not contain
``*``, ``$``, ``?`` or ``#``. :func:`topic_to_key` keeps the ``/`` structure and escapes
each chunk: ``%`` and the four forbidden characters (and anything not printable) become
``%XX`` (uppercase hex of the UTF-8 bytes), and an empty chunk (a leading, trailing or
doubled ``/``) becomes ``%``. A lone ``%`` cannot come from escaping, so the mapping is
one-to-one; :func:`key_to_topic` inverts it.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from .._core._exceptions import ConfigurationError

__all__ = ["expand_host", "key_to_topic", "topic_to_key"]

_SAFE = "".join(
    chr(c) for c in range(0x21, 0x7F) if chr(c) not in "%*$?#/"
)  # printable ASCII that a chunk may hold as it is
_EMPTY = "%"


def _escape_chunk(chunk: str) -> str:
    if not chunk:
        return _EMPTY
    return quote(chunk, safe=_SAFE, encoding="utf-8", errors="strict")


def topic_to_key(topic: str, prefix: str = "") -> str:
    """The key expression of *topic*, under *prefix* (a key expression, may be empty)."""
    key = "/".join(_escape_chunk(chunk) for chunk in topic.split("/"))
    return f"{prefix.rstrip('/')}/{key}" if prefix else key


def key_to_topic(key: str, prefix: str = "") -> str:
    """The topic whose :func:`topic_to_key` (under *prefix*) is *key*; raises
    ConfigurationError for a key outside *prefix*."""
    if prefix:
        head = prefix.rstrip("/") + "/"
        if not key.startswith(head):
            raise ConfigurationError(f"key {key!r} is not under {prefix!r}")
        key = key[len(head) :]
    return "/".join("" if c == _EMPTY else unquote(c, errors="strict") for c in key.split("/"))


def expand_host(text: str, host: str) -> str:
    """*text* with ``{host}`` replaced by *host*, escaped as one key-expression chunk."""
    return text.replace("{host}", _escape_chunk(host).replace("/", "%2F"))
