"""Topic names <-> Zenoh key expressions, reversibly.

An ezflow topic is any printable text (``/camera/raw``, ``PIPE/FILTER/OUTPUT``); a Zenoh
key expression is ``/``-separated chunks that may not be empty and may not contain
``*``, ``$``, ``?`` or ``#``. :func:`topic_to_key` keeps the ``/`` structure and escapes
each chunk: ``%`` and the four forbidden characters (and anything not printable) become
``%XX`` (uppercase hex of the UTF-8 bytes), and an empty chunk (a leading, trailing or
doubled ``/``) becomes ``%``. A lone ``%`` cannot come from escaping, so the mapping is
one-to-one; :func:`key_to_topic` inverts it.

An import of a wildcard key expression (``ezflow/*/%/camera/raw`` → ``/robots``) puts each
sample on a topic of its own, :func:`imported_topic`: the import's topic, then the chunks
of the sample's key after the expression's literal prefix, unescaped, empty ones left out
(``ezflow/robot1/%/camera/raw`` → ``/robots/robot1/camera/raw``). Leaving them out is what
a reader of the topic expects: the ``%`` of an exported topic's leading ``/`` would
otherwise make a doubled ``/`` in the middle of the imported one.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from .._core._exceptions import ConfigurationError

__all__ = [
    "check_key_expr",
    "expand_host",
    "imported_topic",
    "key_to_topic",
    "literal_prefix",
    "topic_to_key",
]

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


def literal_prefix(key_expr: str) -> str | None:
    """The chunks of *key_expr* before its first chunk with a wildcard (``*``, ``**``,
    ``$*``), joined with ``/`` (``""`` when the first chunk has one); None when it has
    no wildcard."""
    if "*" not in key_expr:
        return None
    return key_expr.split("*", 1)[0].rpartition("/")[0]


def imported_topic(topic: str, key: str, literal: str) -> str:
    """The topic a sample on *key* arrives on, for an import of a wildcard key
    expression whose :func:`literal_prefix` is *literal*, under *topic*: *topic*, then
    the chunks of *key* after *literal*, each unescaped, empty ones (``%``) left out,
    joined with ``/`` (``("/robots", "ezflow/robot1/%/camera/raw", "ezflow")`` gives
    ``/robots/robot1/camera/raw``). Raises ConfigurationError for a key outside
    *literal*."""
    chunks = key.split("/")
    head = literal.split("/") if literal else []
    if chunks[: len(head)] != head:
        raise ConfigurationError(f"key {key!r} is not under {literal!r}")
    rest = [unquote(c, errors="strict") for c in chunks[len(head) :] if c != _EMPTY]
    return "/".join([topic.rstrip("/"), *(part for part in rest if part)]) or topic


def check_key_expr(key_expr: str, *, wildcards: bool = True) -> None:
    """Raise ConfigurationError (with Zenoh's reason) when Zenoh refuses *key_expr*, or
    when it holds a wildcard and *wildcards* is false (a key to publish on)."""
    import zenoh  # noqa: PLC0415 - this module's other functions do without it

    try:
        zenoh.KeyExpr(key_expr)
    except Exception as exc:  # zenoh raises ZError
        reason = str(exc).split(" at /", 1)[0]  # (Zenoh adds where in its Rust source)
        raise ConfigurationError(f"{key_expr!r} is not a Zenoh key expression: {reason}") from exc
    if not wildcards and "*" in key_expr:
        raise ConfigurationError(f"{key_expr!r} has a wildcard: a key to publish on has none")
