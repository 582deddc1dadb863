"""The accepting side of a handshake (ezflow/_core/_handshake.py), shared by the graph
server and the tcp/shm data servers: its challenge-response steps against the real
connecting side (``Initiator``), and its deadline, without a socket. Over sockets:
test_server.py and test_auth.py (graph), test_tcp.py (data)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ezflow._core._auth import Initiator, Token
from ezflow._core._exceptions import AuthenticationError, ProtocolError
from ezflow._core._handshake import AcceptingHandshake, Challenge

TOKEN = Token("a-token-of-the-graph-32-bytes-long")


def hello(initiator: Initiator) -> dict[str, Any]:
    return {"op": "hello", "protocol": 2, "pid": 1, **initiator.hello_fields()}


def test_without_a_token_the_hello_is_admitted_at_once() -> None:
    handshake = AcceptingHandshake(None, "graph", peer="client")
    message = hello(Initiator(None, "graph", "the graph server"))
    assert handshake.receive(message) is message
    assert not handshake.started


@pytest.mark.parametrize("plane", ["graph", "data"])
def test_with_a_token_the_hello_is_admitted_after_a_right_proof(plane: str) -> None:
    handshake = AcceptingHandshake(TOKEN, plane, peer="client")
    initiator = Initiator(TOKEN, plane, "the listener")
    message = hello(initiator)
    step = handshake.receive(message)
    assert isinstance(step, Challenge) and step.message["op"] == "challenge"
    assert handshake.started
    answer = initiator.answer(step.message)  # the initiator checks our proof
    assert handshake.receive({"op": "auth", **answer}) is message


def test_a_wrong_token_is_refused_either_way() -> None:
    handshake = AcceptingHandshake(TOKEN, "graph", peer="client")
    other = Token("another-token-of-the-graph-32-bytes")
    initiator = Initiator(other, "graph", "the graph server")
    step = handshake.receive(hello(initiator))
    assert isinstance(step, Challenge)
    with pytest.raises(AuthenticationError, match="different tokens"):
        initiator.answer(step.message)  # the peer finds our proof wrong: it says so
    with pytest.raises(AuthenticationError, match="the client found that our tokens differ"):
        handshake.receive({"op": "error", "error": "anything the peer likes"})
    proof = Initiator(other, "graph", "x")
    forged = AcceptingHandshake(TOKEN, "graph", peer="channel")
    forged.receive(hello(proof))
    with pytest.raises(AuthenticationError, match="wrong token"):
        forged.receive({"op": "auth", "proof": b"\0" * 32})


def test_anything_but_auth_after_the_challenge_is_a_protocol_error() -> None:
    handshake = AcceptingHandshake(TOKEN, "data", peer="channel")
    handshake.receive(hello(Initiator(TOKEN, "data", "x")))
    with pytest.raises(ProtocolError, match="expected 'auth' after the challenge, got 'hello'"):
        handshake.receive({"op": "hello"})


def test_a_malformed_nonce_is_an_authentication_error() -> None:
    handshake = AcceptingHandshake(TOKEN, "graph", peer="client")
    with pytest.raises(AuthenticationError):
        handshake.receive({"op": "hello", "nonce": "not bytes"})


async def test_the_deadline_calls_late_once_unless_admitted() -> None:
    late: list[str] = []
    # The slow one is armed last: when its deadline passes, the others' had passed too.
    admitted = AcceptingHandshake(None, "graph", peer="client")
    admitted.arm(0.05, late.append)
    admitted.admit()
    cancelled = AcceptingHandshake(None, "graph", peer="client")
    cancelled.arm(0.05, late.append)
    cancelled.cancel()
    slow = AcceptingHandshake(None, "graph", peer="client")
    slow.arm(0.05, late.append)
    deadline = asyncio.get_running_loop().time() + 10
    while not late:
        assert asyncio.get_running_loop().time() < deadline, "late was never called"
        await asyncio.sleep(0.01)
    assert late == ["handshake not done within 0 s"]
    assert admitted.admitted and not slow.admitted
