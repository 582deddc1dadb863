"""Authentication and TLS: the sans-I/O core of every ezflow handshake.

A graph may have a shared secret, the **token** (``EZFLOW_TOKEN``, ``EZFLOW_TOKEN_FILE``,
``GraphContext(token=...)``, ``ezflow ... --token-file``). The graph server and every
data listener (tcp, and the shm notification socket) then require it in their handshake,
by challenge-response; the secret itself never travels, and a listener without a token
is not trusted by a peer that has one (mutual authentication)::

    connecting side (Initiator)                  listening side (Responder)
    hello {..., "nonce": Nc}             --->
                                         <---    challenge {"nonce": Ns,
                                                   "proof": HMAC(token, L_listen | Nc | Ns)}
    checks the listener's proof
    auth {"proof": HMAC(token, L_connect | Nc | Ns)}  --->
                                                 checks it (hmac.compare_digest)
                                         <---    welcome (or an error naming the cause)

``Nc`` and ``Ns`` are ``AUTH_NONCE_SIZE`` random bytes; ``L_listen``/``L_connect`` are
labels naming the protocol and the role (``ezflow/2 graph server``, ``ezflow/2 data
channel``, ...), so a proof made for one role or plane is worthless in another, and a
proof cannot be reflected back to the side that asked for it. Without a token on either
side the listener answers ``hello`` with ``welcome`` as before (no challenge): loopback
graphs behave as they always did.

TLS (optional, standard-library :mod:`ssl`): a certificate, its key and the CA of the
graph (``EZFLOW_TLS_CERT``/``EZFLOW_TLS_KEY``/``EZFLOW_TLS_CA``); both ends present a
certificate and both verify the other's against the CA. Host names are not checked: the
CA is the graph's own, so a certificate it signed is what admits a peer (as etcd or
Kubernetes peer certificates do with a private CA).

Nothing here does I/O on an event loop: files are read when :class:`Credentials` is
built (once per context or server) and the handshake classes only turn messages into
messages.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import ssl
import stat
from dataclasses import dataclass
from typing import Any, Final

from ._config import (
    AUTH_NONCE_SIZE,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TOKEN,
    ENV_TOKEN_FILE,
    MIN_TOKEN_BYTES,
)
from ._exceptions import AuthenticationError, ConfigurationError

__all__ = [
    "Credentials",
    "Initiator",
    "Responder",
    "TlsFiles",
    "Token",
    "is_loopback",
]

#: Roles of a handshake: the listening side's label, then the connecting side's.
_LABELS: Final = {
    "graph": (b"ezflow/2 graph server", b"ezflow/2 graph client"),
    "data": (b"ezflow/2 data publisher", b"ezflow/2 data channel"),
}


class Token:
    """The shared secret of a graph. Its ``repr``/``str`` never show it.

    Build from a ``str`` or ``bytes`` of at least ``MIN_TOKEN_BYTES`` bytes; surrounding
    whitespace is stripped. Raises :class:`ConfigurationError` for a shorter one.
    Generate one with ``python -c "import secrets; print(secrets.token_hex(32))"``.
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: str | bytes, *, setting: str = "token") -> None:
        if isinstance(secret, str):
            secret = secret.encode()
        if not isinstance(secret, bytes):
            raise ConfigurationError(f"{setting} must be a str or bytes")
        secret = secret.strip()
        if len(secret) < MIN_TOKEN_BYTES:
            raise ConfigurationError(
                f"{setting} is {len(secret)} bytes long; a token needs at least "
                f"{MIN_TOKEN_BYTES} (MIN_TOKEN_BYTES). Generate one with: python -c "
                '"import secrets; print(secrets.token_hex(32))"'
            )
        self._secret = secret

    def __repr__(self) -> str:
        return "Token(<hidden>)"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        # A token travels to child processes through the environment, never pickled
        # into a bootstrap or a log record by accident.
        raise TypeError("a Token cannot be pickled; children inherit EZFLOW_TOKEN instead")

    def proof(self, label: bytes, first: bytes, second: bytes) -> bytes:
        """HMAC-SHA256 of *label*, *first* and *second* (fixed-size nonces) under the
        token."""
        return hmac.new(self._secret, label + b"\0" + first + second, hashlib.sha256).digest()

    def check(self, proof: object, label: bytes, first: bytes, second: bytes) -> bool:
        """Whether *proof* is :meth:`proof` of the same inputs (constant-time)."""
        if not isinstance(proof, bytes):
            return False
        return hmac.compare_digest(proof, self.proof(label, first, second))


def read_token_file(path: str, *, setting: str = ENV_TOKEN_FILE) -> Token:
    """The token in the first line of *path*. Raises :class:`ConfigurationError` when the
    file cannot be read, is readable by group or others, or holds too short a token."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.readline()
    except OSError as exc:
        raise ConfigurationError(f"{setting}={path!r}: cannot read it ({exc})") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigurationError(
            f"{setting}={path!r} is accessible to other users (mode {stat.filemode(mode)}); "
            f"make it private with: chmod 600 {path}"
        )
    return Token(text, setting=f"the token in {setting}={path!r}")


def token_from_env() -> Token | None:
    """``EZFLOW_TOKEN``, else the file named by ``EZFLOW_TOKEN_FILE``, else ``None``."""
    text = os.environ.get(ENV_TOKEN, "")
    if text.strip():
        return Token(text, setting=ENV_TOKEN)
    path = os.environ.get(ENV_TOKEN_FILE, "").strip()
    if path:
        return read_token_file(path)
    return None


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """TLS settings of a process: its certificate and key (PEM files) and the CA (PEM)
    that signed the certificates of every process of the graph. Both ends of each
    connection present their certificate and verify the other's against *ca*."""

    cert: str
    key: str
    ca: str

    @classmethod
    def from_env(cls) -> TlsFiles | None:
        """From ``EZFLOW_TLS_CERT``, ``EZFLOW_TLS_KEY`` and ``EZFLOW_TLS_CA``: all three or
        none (``None``); raises :class:`ConfigurationError` naming the missing ones."""
        values = {
            name: os.environ.get(name, "").strip()
            for name in (ENV_TLS_CERT, ENV_TLS_KEY, ENV_TLS_CA)
        }
        missing = [name for name, value in values.items() if not value]
        if len(missing) == len(values):
            return None
        if missing:
            raise ConfigurationError(
                f"TLS needs {ENV_TLS_CERT}, {ENV_TLS_KEY} and {ENV_TLS_CA} together; "
                f"{', '.join(missing)} not set"
            )
        return cls(values[ENV_TLS_CERT], values[ENV_TLS_KEY], values[ENV_TLS_CA])

    def context(self, *, server: bool) -> ssl.SSLContext:
        """A context for the listening (*server*) or the connecting side: TLS 1.2 or
        later, our certificate loaded, the peer's required and verified against the CA.
        Raises :class:`ConfigurationError` when a file cannot be loaded."""
        purpose = ssl.Purpose.CLIENT_AUTH if server else ssl.Purpose.SERVER_AUTH
        try:
            context = ssl.create_default_context(purpose, cafile=self.ca)
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"TLS: cannot load certificate {self.cert!r}, key {self.key!r} or CA "
                f"{self.ca!r}: {exc}"
            ) from exc
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # The graph's own CA admits a peer; names are not checked (see the module doc).
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        return context


class Credentials:
    """What a process proves itself with: an optional :class:`Token` and optional
    :class:`TlsFiles` (SSL contexts built once, here). ``repr`` hides the token."""

    __slots__ = ("client_ssl", "server_ssl", "tls", "token")

    def __init__(self, token: Token | None = None, tls: TlsFiles | None = None) -> None:
        self.token = token
        self.tls = tls
        #: contexts for listening and for connecting (None without TLS)
        self.server_ssl = None if tls is None else tls.context(server=True)
        self.client_ssl = None if tls is None else tls.context(server=False)

    @classmethod
    def resolve(
        cls, token: Token | str | bytes | None = None, tls: TlsFiles | None = None
    ) -> Credentials:
        """*token* and *tls* when given, else from the environment (``EZFLOW_TOKEN``,
        ``EZFLOW_TOKEN_FILE``, ``EZFLOW_TLS_*``). Raises :class:`ConfigurationError`."""
        if token is None:
            resolved = token_from_env()
        elif isinstance(token, Token):
            resolved = token
        else:
            resolved = Token(token)
        if tls is not None and not isinstance(tls, TlsFiles):
            raise ConfigurationError(f"tls={tls!r} must be an ezflow.TlsFiles")
        return cls(resolved, TlsFiles.from_env() if tls is None else tls)

    def __repr__(self) -> str:
        return f"Credentials(token={'<hidden>' if self.token else None}, tls={self.tls!r})"


def is_loopback(host: str) -> bool:
    """Whether binding *host* keeps a listener on this host only. A name other than
    ``localhost`` counts as routable (resolving it could block, and could change)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _nonce(message: dict[str, Any], what: str) -> bytes:
    nonce = message.get("nonce")
    if not isinstance(nonce, bytes) or len(nonce) != AUTH_NONCE_SIZE:
        raise AuthenticationError(f"{what} sent no valid nonce")
    return nonce


class Initiator:
    """The connecting side of a handshake on *plane* (``"graph"`` or ``"data"``).

    Put :meth:`hello_fields` in the opening message; pass a ``challenge`` to
    :meth:`answer` (its result goes back as ``auth``); when the listener welcomes us
    without a challenge, call :meth:`welcomed_without_challenge`. Each raises
    :class:`AuthenticationError` with a one-line reason naming *peer* and the fix.
    """

    __slots__ = ("_nonce", "_peer", "_plane", "_token")

    def __init__(self, token: Token | None, plane: str, peer: str) -> None:
        self._token = token
        self._plane = plane
        self._peer = peer
        self._nonce = secrets.token_bytes(AUTH_NONCE_SIZE)

    def hello_fields(self) -> dict[str, Any]:
        return {"nonce": self._nonce}

    def answer(self, challenge: dict[str, Any]) -> dict[str, Any]:
        if self._token is None:
            raise AuthenticationError(
                f"{self._peer} requires a token and we have none; set {ENV_TOKEN} or "
                f"{ENV_TOKEN_FILE} (or --token-file, GraphContext(token=...)) to the "
                "graph's token"
            )
        server_nonce = _nonce(challenge, self._peer)
        listen, connect = _LABELS[self._plane]
        if not self._token.check(challenge.get("proof"), listen, self._nonce, server_nonce):
            raise AuthenticationError(
                f"{self._peer} does not know our token (the two ends have different "
                "tokens); give every process of the graph the same one"
            )
        return {"proof": self._token.proof(connect, self._nonce, server_nonce)}

    def welcomed_without_challenge(self) -> None:
        if self._token is not None:
            raise AuthenticationError(
                f"{self._peer} asks for no token, but we have one: it may not be the "
                "peer we mean; give it the graph's token too (or unset ours)"
            )


class Responder:
    """The listening side of a handshake on *plane* (``"graph"`` or ``"data"``).

    :meth:`challenge` answers a ``hello`` (``None``: no token here, welcome at once);
    :meth:`verify` checks the ``auth`` that follows and raises
    :class:`AuthenticationError` when its proof is wrong.
    """

    __slots__ = ("_client_nonce", "_nonce", "_plane", "_token")

    def __init__(self, token: Token | None, plane: str) -> None:
        self._token = token
        self._plane = plane
        self._nonce = secrets.token_bytes(AUTH_NONCE_SIZE)
        self._client_nonce = b""

    @property
    def required(self) -> bool:
        return self._token is not None

    def challenge(self, hello: dict[str, Any]) -> dict[str, Any] | None:
        if self._token is None:
            return None
        self._client_nonce = _nonce(hello, "peer")
        listen, _ = _LABELS[self._plane]
        return {
            "nonce": self._nonce,
            "proof": self._token.proof(listen, self._client_nonce, self._nonce),
        }

    def verify(self, auth: dict[str, Any]) -> None:
        assert self._token is not None and self._client_nonce, "challenge() comes first"
        _, connect = _LABELS[self._plane]
        if not self._token.check(auth.get("proof"), connect, self._client_nonce, self._nonce):
            raise AuthenticationError("wrong token")
